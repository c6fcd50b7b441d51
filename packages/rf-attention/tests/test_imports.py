from spectraformer_core.testing import assert_no_import_cycle


def test_rf_attention_has_no_import_cycle():
    assert_no_import_cycle("rf_attention")
