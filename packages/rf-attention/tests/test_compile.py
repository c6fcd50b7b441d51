"""``torch.compile`` (inductor, CPU) of one random-feature attention and one baseline equals eager."""

import shutil

import pytest
import torch

import rf_attention

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="torch.compile's CPU backend (inductor) needs a C compiler (cc or gcc); none on this platform",
)


@needs_compiler
# Dynamo's notice that it traces through rf_matrices' lru_cache'd Hadamard factor (a constant; safe)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("name", ["oprf-fastfoodl", "nystromformer"])
def test_compiled_module_equals_eager(name):
    torch.manual_seed(0)
    attn = rf_attention.create(name, 32, 2, num_features=16, seed=0).eval()
    x = torch.randn(2, 40, 32)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    with torch.no_grad():
        eager = attn(x, key_padding_mask=mask)
        compiled = torch.compile(attn)(x, key_padding_mask=mask)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
