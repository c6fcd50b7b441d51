import pytest
import torch

from rf_matrices import fwht, hadamard_matrix, next_power_of_two


@pytest.mark.parametrize("n", [1, 2, 4, 32, 64, 256, 2048])
def test_fwht_equals_the_dense_sylvester_hadamard_product(n):
    x = torch.randn(3, 5, n, dtype=torch.float64)
    torch.testing.assert_close(fwht(x), x @ hadamard_matrix(n).T)


def test_normalized_hadamard_is_orthogonal_and_fwht_an_involution():
    h = hadamard_matrix(64)
    torch.testing.assert_close(h @ h.T, torch.eye(64, dtype=torch.float64))
    x = torch.randn(7, 64, dtype=torch.float64)
    torch.testing.assert_close(fwht(fwht(x)), x)


def test_fwht_rejects_a_length_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 12"):
        fwht(torch.randn(12))


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (3, 4), (32, 32), (33, 64)])
def test_next_power_of_two(n, expected):
    assert next_power_of_two(n) == expected
