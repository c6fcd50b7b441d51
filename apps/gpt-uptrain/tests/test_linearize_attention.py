"""``gpt-uptrain linearize-attention``: the three variants per pair on a tiny HF GPT-2 teacher, resume."""

import math

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel

import rf_attention
from app_common.records import finished_record
from app_common.results import read_jsonl
from gpt_uptrain import GPT, TokenData, build_model, cli, prepare
from gpt_uptrain import linearize_attention as lin
from gpt_uptrain.cli import main
from gpt_uptrain.train import run_name, transfer_attention

TEXT = "def f(x):\n    return x * 2 + 1\n\nclass A:\n    pass\n" * 80
PAIRS = ("posrf-orf", "oprf-fastfoodl")
#: The experiment's flags: 5 steps per variant, 2 of them transfer in the third.
FLAGS = ["--attention", *PAIRS, "--attention-features", "8", "--steps", "5", "--transfer-steps", "2"]
FLAGS += ["--eval-batches", "2", "--prompt-tokens", "4", "--new-tokens", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A tiny GPT-2 written by ``transformers``, a character corpus, and the finished experiment's folder."""
    root = tmp_path_factory.mktemp("linearize-attention")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    (root / "corpus.txt").write_text(TEXT)
    prepare([root / "corpus.txt"], root / "data", tokenizer="char")
    args = [
        "linearize-attention",
        "--weights",
        str(root / "gpt2"),
        "--data",
        str(root / "data"),
        "--out",
        str(root / "out"),
    ]
    assert main([*args, *FLAGS]) == 0
    return root, args


def records(root):
    return {r["pair"]: r for r in read_jsonl(root / "out" / lin.RESULTS)}


def config_of(root):
    return lin.LinearizeAttentionConfig(
        out=root / "out", weights=str(root / "gpt2"), data=root / "data", attention=PAIRS,
        attention_features=8, steps=5, transfer_steps=2, eval_batches=2, prompt_tokens=4, new_tokens=4,
        device="cpu",
    )  # fmt: skip


def test_every_pair_reports_the_three_variants(experiment):
    root, _ = experiment
    found = records(root)
    assert sorted(found) == sorted(PAIRS)
    for record in found.values():
        assert set(record["val_loss"]) == set(lin.VARIANTS)
        assert all(math.isfinite(v) for v in record["val_loss"].values())
        assert len(record["mse_before"]) == len(record["mse_after"]) == 2  # one per block
        assert record["decode_ms"]["converted"] > 0
        assert record["decode_ms"]["teacher"] > 0
    table = (root / "out" / f"{lin.TABLE}.md").read_text()
    assert all(f"| {pair} " in table for pair in PAIRS)


def test_gap_closed_is_the_share_of_the_swap_to_teacher_gap(experiment):
    root, _ = experiment
    for record in records(root).values():
        loss, teacher = record["val_loss"], record["teacher_val_loss"]
        for variant in lin.VARIANTS[1:]:
            share = (loss["swap"] - loss[variant]) / (loss["swap"] - teacher)
            assert record["gap_closed"][variant] == pytest.approx(100 * share)


def test_variants_take_equal_total_steps_transfer_included(experiment):
    root, _ = experiment
    config = config_of(root)
    taken = {}
    for variant in lin.VARIANTS[1:]:
        run = config.variant(PAIRS[0], variant, root / "data", root / "gpt2")
        record = finished_record(root / "out", run_name(run))
        taken[variant] = record["steps"] + record["details"]["transfer"].get("steps", 0)
    assert record["details"]["transfer"]["steps"] == 2
    assert taken == {"swap_finetune": 5, "transfer_finetune": 5}


def test_transfer_stage_changes_only_the_feature_maps(experiment):
    root, _ = experiment
    config = config_of(root)
    run = config.variant(PAIRS[0], "transfer_finetune", root / "data", root / "gpt2")
    data = TokenData(root / "data")
    model = build_model(run, data, torch.device("cpu"))
    maps = {id(p) for p in rf_attention.transfer.feature_map_parameters(model)}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    transfer_attention(model, data, run, torch.device("cpu"))
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert changed == {n for n, p in model.named_parameters() if id(p) in maps}
    teacher = dict(GPT.from_pretrained(root / "gpt2").named_parameters())
    kept = [n for n, p in model.named_parameters() if id(p) not in maps]
    assert "transformer.h.0.mlp.c_fc.weight" in kept
    assert "transformer.h.0.attn.qkv.weight" in kept
    assert all(torch.equal(model.get_parameter(n), teacher[n]) for n in kept)


def test_a_rerun_reuses_finished_runs(experiment, monkeypatch):
    root, args = experiment
    before = records(root)

    def refuse(*_args, **_kw):
        raise AssertionError("a finished run trained again")

    monkeypatch.setattr(lin, "train", refuse)
    assert main([*args, *FLAGS]) == 0
    after = records(root)
    assert sorted(after) == sorted(PAIRS)
    for pair in PAIRS:
        assert after[pair]["val_loss"] == before[pair]["val_loss"]
        assert after[pair]["mse_after"] == before[pair]["mse_after"]


def test_each_variant_is_an_ordinary_train_run_named_by_its_identity(experiment):
    root, _ = experiment
    config = config_of(root)
    for (pair, variant), run in lin.variant_runs(config, root / "data", root / "gpt2").items():
        record = finished_record(root / "out", run_name(run))
        assert record is not None, (pair, variant)
        assert record["config"]["model"]["attention"] == pair


def test_a_shard_reports_only_pairs_whose_variants_all_finished(experiment, tmp_path, monkeypatch):
    root, args = experiment
    out = tmp_path / "sharded"
    ran = []

    def count(run):
        ran.append(run.name)

    monkeypatch.setattr(lin, "train", count)
    shard_args = [a if a != str(root / "out") else str(out) for a in args]
    assert main([*shard_args, *FLAGS, "--shard", "0/2"]) == 0
    assert len(ran) == len(PAIRS)  # every other cell of the (pair x variant) grid
    assert not (out / lin.RESULTS).read_text().strip()  # no pair has both of its variants


def test_the_old_command_name_says_it_is_deprecated_and_runs_the_same_command(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(cli, "_linearize_attention", lambda args: ran.append(cli.command_config(args)))
    assert main(["linearize", "--steps", "7", "--transfer-steps", "3"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "gpt-uptrain linearize is deprecated: it is now gpt-uptrain linearize-attention"
    ]
    assert ran == [lin.LinearizeAttentionConfig(steps=7, transfer_steps=3)]


def test_transfer_steps_must_leave_fine_tuning_steps():
    with pytest.raises(ValueError, match="--transfer-steps"):
        lin.LinearizeAttentionConfig(steps=5, transfer_steps=5)
