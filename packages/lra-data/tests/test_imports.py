from spectraformer_core.testing import assert_no_import_cycle


def test_lra_data_has_no_import_cycle():
    assert_no_import_cycle("lra_data")
