from spectraformer_core.testing import assert_no_import_cycle


def test_the_benchmarks_have_no_import_cycle():
    assert_no_import_cycle("spectraformer_benchmarks")
