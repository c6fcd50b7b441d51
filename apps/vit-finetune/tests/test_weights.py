"""Checkpoint reading and the timm / Hugging Face mappings, against plain functional references."""

import json
import struct
import sys

import pytest
import torch
import torch.nn.functional as F

from vit_finetune import (
    ViT,
    ViTConfig,
    build_model,
    hf_to_timm,
    load_pretrained,
    read_checkpoint,
    read_safetensors,
)

CONFIG = ViTConfig(image_size=8, patch_size=4, dim=12, depth=2, num_heads=3, mlp_dim=20, num_classes=5)


def reference_tokens(p, x, config, eps, attention):
    """A ViT forward written from a checkpoint's tensors ``p`` (a dict of getters), up to the final norm."""
    h = F.conv2d(x, p["patch_w"], p["patch_b"], stride=config.patch_size).flatten(2).transpose(1, 2)
    h = torch.cat([p["cls"].expand(x.shape[0], -1, -1), h], 1) + p["pos"]
    heads, dh = config.num_heads, config.dim // config.num_heads
    for i in range(config.depth):
        u = F.layer_norm(h, (config.dim,), p[f"{i}.ln1_w"], p[f"{i}.ln1_b"], eps)
        q, k, v = attention(p, i, u)
        b, n, _ = u.shape
        q, k, v = (t.view(b, n, heads, dh).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / dh**0.5
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, config.dim)
        h = h + F.linear(out, p[f"{i}.proj_w"], p[f"{i}.proj_b"])
        u = F.layer_norm(h, (config.dim,), p[f"{i}.ln2_w"], p[f"{i}.ln2_b"], eps)
        h = h + F.linear(
            F.gelu(F.linear(u, p[f"{i}.fc1_w"], p[f"{i}.fc1_b"])), p[f"{i}.fc2_w"], p[f"{i}.fc2_b"]
        )
    return F.layer_norm(h, (config.dim,), p["norm_w"], p["norm_b"], eps)


def random_hf_state(config, prefix="vit."):
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    d, m = config.dim, config.mlp_dim
    s = {
        "embeddings.cls_token": r(1, 1, d),
        "embeddings.position_embeddings": r(1, 1 + config.grid_size**2, d),
        "embeddings.patch_embeddings.projection.weight": r(d, 3, config.patch_size, config.patch_size),
        "embeddings.patch_embeddings.projection.bias": r(d),
        "layernorm.weight": 1 + r(d),
        "layernorm.bias": r(d),
        "pooler.dense.weight": r(d, d),
        "pooler.dense.bias": r(d),
    }
    for i in range(config.depth):
        L = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            s[f"{L}attention.attention.{name}.weight"], s[f"{L}attention.attention.{name}.bias"] = (
                r(d, d),
                r(d),
            )
        s[f"{L}attention.output.dense.weight"], s[f"{L}attention.output.dense.bias"] = r(d, d), r(d)
        s[f"{L}intermediate.dense.weight"], s[f"{L}intermediate.dense.bias"] = r(m, d), r(m)
        s[f"{L}output.dense.weight"], s[f"{L}output.dense.bias"] = r(d, m), r(d)
        for ln in ("layernorm_before", "layernorm_after"):
            s[f"{L}{ln}.weight"], s[f"{L}{ln}.bias"] = 1 + r(d), r(d)
    return {prefix + k: v for k, v in s.items()}


def test_hugging_face_checkpoint_maps_onto_the_same_function():
    config = ViTConfig(**{**CONFIG.__dict__, "norm_eps": 1e-12})
    state = random_hf_state(config)
    model = ViT(config).eval()
    load_pretrained(model, state)
    s = {k.removeprefix("vit."): v for k, v in state.items()}
    p = {
        "patch_w": s["embeddings.patch_embeddings.projection.weight"],
        "patch_b": s["embeddings.patch_embeddings.projection.bias"],
        "cls": s["embeddings.cls_token"],
        "pos": s["embeddings.position_embeddings"],
        "norm_w": s["layernorm.weight"],
        "norm_b": s["layernorm.bias"],
    }
    for i in range(config.depth):
        L = f"encoder.layer.{i}."
        for ours, theirs in [
            ("ln1", "layernorm_before"),
            ("ln2", "layernorm_after"),
            ("proj", "attention.output.dense"),
            ("fc1", "intermediate.dense"),
            ("fc2", "output.dense"),
        ]:
            p[f"{i}.{ours}_w"], p[f"{i}.{ours}_b"] = s[f"{L}{theirs}.weight"], s[f"{L}{theirs}.bias"]

    def attention(p, i, u):  # HF: three separate projections
        a = f"encoder.layer.{i}.attention.attention."
        return [F.linear(u, s[f"{a}{n}.weight"], s[f"{a}{n}.bias"]) for n in ("query", "key", "value")]

    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            model.forward_features(x), reference_tokens(p, x, config, 1e-12, attention)
        )


def test_timm_checkpoint_loads_by_name_onto_the_same_function():
    torch.manual_seed(1)
    source = ViT(CONFIG)
    with torch.no_grad():
        for param in source.parameters():
            param.normal_(0, 0.3)
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    state["head.weight"] = torch.randn(21843, CONFIG.dim)  # the in21k head is dropped
    model = ViT(CONFIG).eval()
    load_pretrained(model, state)
    assert torch.count_nonzero(model.head.weight) == 0
    s = source.state_dict()
    p = {
        "patch_w": s["patch_embed.proj.weight"],
        "patch_b": s["patch_embed.proj.bias"],
        "cls": s["cls_token"],
        "pos": s["pos_embed"],
        "norm_w": s["norm.weight"],
        "norm_b": s["norm.bias"],
    }
    for i in range(CONFIG.depth):
        for ours, theirs in [
            ("ln1", "norm1"),
            ("ln2", "norm2"),
            ("proj", "attn.proj"),
            ("fc1", "mlp.fc1"),
            ("fc2", "mlp.fc2"),
        ]:
            p[f"{i}.{ours}_w"], p[f"{i}.{ours}_b"] = (
                s[f"blocks.{i}.{theirs}.weight"],
                s[f"blocks.{i}.{theirs}.bias"],
            )

    def attention(p, i, u):  # timm: one qkv projection, split in q, k, v order
        return F.linear(u, s[f"blocks.{i}.attn.qkv.weight"], s[f"blocks.{i}.attn.qkv.bias"]).chunk(3, dim=-1)

    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), reference_tokens(p, x, CONFIG, 1e-6, attention))


def test_hf_to_timm_stacks_query_key_value_in_that_order():
    state = random_hf_state(CONFIG, prefix="")
    out = hf_to_timm(state)
    d = CONFIG.dim
    q = state["encoder.layer.1.attention.attention.query.weight"]
    v = state["encoder.layer.1.attention.attention.value.bias"]
    torch.testing.assert_close(out["blocks.1.attn.qkv.weight"][:d], q)
    torch.testing.assert_close(out["blocks.1.attn.qkv.bias"][2 * d :], v)
    assert not any(k.startswith("pooler") for k in out)


def test_a_checkpoint_of_another_shape_is_refused_with_the_mismatches():
    state = ViT(ViTConfig(image_size=8, patch_size=4, dim=8, depth=2, num_heads=2, mlp_dim=20)).state_dict()
    with pytest.raises(ValueError, match=r"does not fit the model.*shape mismatches"):
        load_pretrained(ViT(CONFIG), state)


def write_safetensors(path, tensors):
    """The file format written by hand: u64 header length, JSON header, raw little-endian data."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
    for name, t in tensors.items():
        raw = (
            t.contiguous().view(torch.uint8).numpy().tobytes()
            if t.dtype == torch.bfloat16
            else t.numpy().tobytes()
        )
        header[name] = {
            "dtype": names[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))


def test_safetensors_reader_returns_the_tensors_written(tmp_path):
    tensors = {"a.weight": torch.randn(3, 4), "b": torch.arange(5), "c": torch.randn(2, 2).to(torch.bfloat16)}
    write_safetensors(tmp_path / "model.safetensors", tensors)
    for read in (read_safetensors(tmp_path / "model.safetensors"), read_checkpoint(tmp_path)):
        assert read.keys() == tensors.keys()
        for k, v in tensors.items():
            assert read[k].dtype == v.dtype
            assert torch.equal(read[k], v)


def test_torch_checkpoints_are_unwrapped_and_bad_files_named(tmp_path):
    torch.save({"model": {"w": torch.ones(2)}}, tmp_path / "x.pth")
    assert torch.equal(read_checkpoint(tmp_path / "x.pth")["w"], torch.ones(2))
    (tmp_path / "bad.safetensors").write_bytes(b"\x05")
    with pytest.raises(ValueError, match=r"bad\.safetensors: not a readable safetensors file"):
        read_checkpoint(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        read_checkpoint(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else None)


def test_pretrained_model_without_weights_offline_says_how_to_get_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed (the `hub` extra)
    with pytest.raises(
        ValueError, match=r"no --weights given.*timm/vit_base_patch16_224.augreg_in21k.*--weights PATH"
    ):
        build_model("vit_base_patch16_224.augreg_in21k", num_classes=10)
    with pytest.raises(ValueError, match="unknown model 'vit-huge'"):
        build_model("vit-huge", num_classes=10)


def test_transformers_vit_maps_onto_the_same_function_when_transformers_is_installed(tmp_path):
    transformers = pytest.importorskip("transformers")  # optional: not a dependency of vit-finetune
    torch.manual_seed(0)
    hf_config = transformers.ViTConfig(
        hidden_size=12,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=20,
        image_size=8,
        patch_size=4,
    )
    hf = transformers.ViTModel(hf_config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.3)
    hf.save_pretrained(tmp_path)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state
    config = ViTConfig(**{**CONFIG.__dict__, "norm_eps": 1e-12})
    for state in (hf.state_dict(), read_checkpoint(tmp_path)):  # in-memory names and the file's names
        model = ViT(config).eval()
        load_pretrained(model, state)
        with torch.no_grad():
            torch.testing.assert_close(model.forward_features(x), expected, rtol=1e-4, atol=1e-4)
