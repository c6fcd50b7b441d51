import pytest
import torch

import rf_matrices
from rf_matrices import DenseWeightMatrix
from spectraformer_core import Registry

PAPER_MATRICES = {"base", "orf", "sorf", "qmc", "mm", "sgq", "fastfood", "fastfoodl"}


def test_every_paper_matrix_is_registered():
    assert set(rf_matrices.names()) >= PAPER_MATRICES


def test_names_filter_by_shell_pattern():
    assert rf_matrices.names("fast*") == ["fastfood", "fastfoodl"]


def test_unknown_name_error_lists_the_known_names():
    with pytest.raises(ValueError, match=r"(?s)unknown weight matrix .gaussian.*base, fastfood"):
        rf_matrices.create("gaussian", 8, 4)


def test_create_accepts_the_class_itself_and_any_case():
    assert isinstance(rf_matrices.create(rf_matrices.ORF, 8, 4, seed=0), rf_matrices.ORF)
    assert isinstance(rf_matrices.create("ORF", 8, 4, seed=0), rf_matrices.ORF)


def test_user_registers_a_matrix_without_editing_the_package():
    @rf_matrices.register("test-rademacher")
    class Rademacher(DenseWeightMatrix):
        def sample(self):
            g = self.generator
            bits = torch.randint(0, 2, (self.num_features, self.dim), generator=g)
            return bits.double() * 2 - 1

    try:
        w = rf_matrices.create("test-rademacher", 16, 4, seed=0)
        assert set(w.matrix().unique().tolist()) == {-1.0, 1.0}
        assert "test-rademacher" in rf_matrices.names()
    finally:
        rf_matrices.WEIGHT_MATRICES.unregister("test-rademacher")


def test_registering_a_taken_name_needs_override():
    registry = Registry("thing")
    registry.register("a")(int)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(float)
    registry.register("a", override=True)(float)
    assert registry.get("a") is float


@pytest.mark.parametrize("bad", ["", "Upper", "with space", None])
def test_registry_names_must_be_lowercase_words(bad):
    with pytest.raises(ValueError, match="name: expected a non-empty lowercase string"):
        Registry("thing").register(bad)
