"""Generation decodes token by token through the attention's ``step`` and equals rerunning the model."""

import pytest
import torch

from gpt_uptrain import GPT, GPTConfig

TINY = {"block_size": 16, "vocab_size": 23, "n_layer": 2, "n_head": 2, "n_embd": 32, "seed": 0}
ATTENTIONS = ["softmax", "oprf-orf", "saderf-fastfoodl", "trigrf-orf"]


def trained_model(attention):
    """A model whose OPRF/SADERF running statistics moved away from their defaults."""
    model = GPT(GPTConfig(**TINY, attention=attention))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=gen))
    return model.eval()


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_prefill_and_steps_give_the_logits_of_the_full_forward(attention):
    model = trained_model(attention)
    idx = torch.randint(
        0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        full, _ = model(idx)
        logits, states = model.decode(idx[:, :5], torch.arange(5))
        steps = [logits]
        for t in range(5, TINY["block_size"]):
            logits, states = model.decode(idx[:, t : t + 1], torch.tensor([t]), states)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


def rerun_greedy(model, idx, new_tokens):
    """The plain reference: rerun the model on the cropped context for every token, take the argmax."""
    for _ in range(new_tokens):
        logits, _ = model(idx[:, -model.config.block_size :])
        idx = torch.cat([idx, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_greedy_generation_equals_rerunning_the_model_also_past_block_size(attention):
    model = trained_model(attention)
    start = torch.randint(0, TINY["vocab_size"], (2, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = rerun_greedy(model, start, 20)  # 24 > block_size: the window slides
    out = model.generate(start, 20, top_k=1)
    assert torch.equal(out, expected)


def test_generate_calls_the_attention_step_once_per_new_token_within_the_block(monkeypatch):
    model = trained_model("oprf-orf")
    calls = []
    attn = model.transformer.h[0].attn
    original = attn.step

    def counting(x, state):
        calls.append(x.shape[1])
        return original(x, state)

    monkeypatch.setattr(attn, "step", counting)
    with torch.no_grad():
        model.generate(torch.zeros(1, 3, dtype=torch.long), 10, generator=torch.Generator().manual_seed(0))
    assert calls == [1] * 9  # the prompt is prefilled, then one position per token
