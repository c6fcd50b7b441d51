from spectraformer_core.testing import assert_no_import_cycle


def test_app_common_has_no_import_cycle():
    assert_no_import_cycle("app_common")
