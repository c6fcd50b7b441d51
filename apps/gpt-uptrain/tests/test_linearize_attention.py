"""``gpt-uptrain linearize-attention``: rows x seeds x variants on a tiny HF GPT-2 teacher, report, resume."""

import dataclasses
import math
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel

from app_common.checkpoint import load_checkpoint
from app_common.records import CHECKPOINT, RECORD, finished_record, run_dir
from app_common.results import read_jsonl
from gpt_uptrain import GPT, GPTConfig, TokenData, build_model, cli, prepare
from gpt_uptrain import linearize_attention as lin
from gpt_uptrain.cli import main
from gpt_uptrain.train import load_model, run_name

TEXT = "def f(x):\n    return x * 2 + 1\n\nclass A:\n    pass\n" * 80
ATTENTIONS = ("trigrf-orf", "hedgehog")
WINDOWS = (0, 8)
SEEDS = (0, 1)
ROWS = [(a, w) for a in ATTENTIONS for w in WINDOWS]
#: The experiment's flags: 4 steps per variant, 2 of them transfer in the third; decode at 16 and 32.
FLAGS = ["--attention", *ATTENTIONS, "--windows", *map(str, WINDOWS), "--seeds", *map(str, SEEDS)]
FLAGS += ["--attention-features", "8", "--steps", "4", "--transfer-steps", "2", "--context", "16"]
FLAGS += ["--batch-size", "3", "--gradient-accumulation-steps", "1", "--eval-batches", "2"]
FLAGS += ["--entropy-batches", "2", "--decode-contexts", "16", "32", "--new-tokens", "4", "--device", "cpu"]


def config_of(root, **overrides):
    settings = {
        "out": root / "out", "weights": str(root / "gpt2"), "data": root / "data", "attention": ATTENTIONS,
        "windows": WINDOWS, "seeds": SEEDS, "attention_features": 8, "steps": 4, "transfer_steps": 2,
        "context": 16, "batch_size": 3, "gradient_accumulation_steps": 1, "eval_batches": 2,
        "entropy_batches": 2, "decode_contexts": (16, 32), "new_tokens": 4, "device": "cpu",
    }  # fmt: skip
    return lin.LinearizeAttentionConfig(**settings | overrides)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A tiny GPT-2 written by ``transformers``, a character corpus, and the finished experiment's folder."""
    root = tmp_path_factory.mktemp("linearize-attention")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    (root / "corpus.txt").write_text(TEXT)
    prepare([root / "corpus.txt"], root / "data", tokenizer="char")
    args = ["linearize-attention", "--weights", str(root / "gpt2"), "--data", str(root / "data")]
    args += ["--out", str(root / "out")]
    assert main([*args, *FLAGS, "--plot", str(root / "elsewhere" / "plot.png")]) == 0
    return root, args


def summaries(root):
    return {(r["attention"], r["window"]): r for r in read_jsonl(root / "out" / lin.RESULTS)}


def test_every_row_reports_its_variants_over_the_seeds(experiment):
    root, _ = experiment
    found = summaries(root)
    assert sorted(found) == sorted(ROWS)
    for (attention, _), summary in found.items():
        variants = ("swap", "swap_finetune") if attention == "trigrf-orf" else lin.VARIANTS
        assert set(summary["val_loss"]) == set(variants)
        for stats in summary["val_loss"].values():
            assert len(stats["seeds"]) == len(SEEDS)
            assert all(math.isfinite(v) for v in stats["seeds"])
            assert stats["mean"] == pytest.approx(sum(stats["seeds"]) / len(SEEDS))
            assert stats["spread"] == pytest.approx(max(stats["seeds"]) - min(stats["seeds"]))
        assert set(summary["decode_ms"]) == {"16", "32", "teacher"}
        assert all(
            summary["decode_ms"][c] > 0 and summary["decode_ms"]["teacher"][c] > 0 for c in ("16", "32")
        )
    lines = (root / "out" / f"{lin.TABLE}.md").read_text().splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    assert [tuple(c[:2]) for c in cells[2:]] == [(a, str(w)) for a, w in ROWS]
    assert [c[4] for c in cells[2:]] == ["refused", "refused", *(c[4] for c in cells[4:])]
    assert (root / "out" / f"{lin.TABLE}.csv").is_file()


def test_the_teacher_fine_tuned_like_the_variants_is_the_reference_in_the_report(experiment):
    root, _ = experiment
    config = config_of(root)
    losses = []
    for seed in SEEDS:
        run = lin.teacher_finetune_run(config, seed, root / "data", root / "gpt2")
        swap = config.variant(ROWS[0], seed, "swap_finetune", root / "data", root / "gpt2")
        record = finished_record(root / "out", run_name(run))
        assert record["config"]["model"]["attention"] == "softmax"
        assert record["steps"] == swap.steps
        assert record["config"]["model"]["block_size"] == 16
        losses.append(record["metrics"]["val_loss"])
    teacher = next(iter(summaries(root).values()))["teacher"]
    assert teacher["finetuned_val_loss"]["seeds"] == losses
    assert "The teacher fine-tuned like swap + FT" in (root / "out" / f"{lin.TABLE}.md").read_text()


def test_trigrf_transfer_is_recorded_as_refused_and_its_other_variants_run(experiment):
    root, _ = experiment
    config = config_of(root)
    for window in WINDOWS:
        summary = summaries(root)[("trigrf-orf", window)]
        assert "signs" in summary["refused"]["transfer_finetune"]
        assert "transfer_finetune" not in summary["gap_closed"]
        for seed in SEEDS:
            swap = config.variant(("trigrf-orf", window), seed, "swap_finetune", root / "data", root / "gpt2")
            assert finished_record(root / "out", run_name(swap)) is not None
            refused = config.variant(
                ("trigrf-orf", window), seed, "transfer_finetune", root / "data", root / "gpt2"
            )
            assert not run_dir(root / "out", run_name(refused)).exists()
    table = (root / "out" / f"{lin.TABLE}.md").read_text()
    assert "trigrf-orf window 0: transfer refused:" in table
    assert lin.transfer_refusal("hedgehog", 8) is None


def test_gap_closed_and_the_difference_are_computed_per_seed(experiment):
    root, _ = experiment
    summary = summaries(root)[("hedgehog", 8)]
    loss, teacher = summary["val_loss"], summary["teacher_val_loss"]
    for variant in lin.TRAINED:
        shares = [
            100 * (swap - x) / (swap - teacher)
            for swap, x in zip(loss["swap"]["seeds"], loss[variant]["seeds"], strict=True)
        ]
        assert summary["gap_closed"][variant]["seeds"] == pytest.approx(shares)
    difference = summary["transfer_minus_swap"]
    assert difference["mean"] == pytest.approx(
        loss["transfer_finetune"]["mean"] - loss["swap_finetune"]["mean"]
    )
    assert difference["spread"] == max(loss["transfer_finetune"]["spread"], loss["swap_finetune"]["spread"])
    cuts = [
        [100 * (1 - a / b) for b, a in zip(before, after, strict=True)]
        for before, after in zip(summary["mse_before"], summary["mse_after"], strict=True)
    ]
    assert len(cuts) == len(SEEDS)
    assert len(cuts[0]) == 2  # one per block
    assert summary["mse_cut"] == pytest.approx([(c0 + c1) / 2 for c0, c1 in zip(*cuts, strict=True)])


def test_variants_use_the_context_and_batch_and_take_equal_total_steps(experiment):
    root, _ = experiment
    config = config_of(root)
    for seed in SEEDS:
        taken = {}
        for variant in lin.TRAINED:
            run = config.variant(("hedgehog", 8), seed, variant, root / "data", root / "gpt2")
            record = finished_record(root / "out", run_name(run))
            assert record["config"]["model"]["block_size"] == 16
            assert record["config"]["model"]["attention_window"] == 8
            assert record["config"]["model"]["seed"] == seed
            assert (record["config"]["batch_size"], record["config"]["gradient_accumulation_steps"]) == (3, 1)
            taken[variant] = record["steps"] + record["details"]["transfer"].get("steps", 0)
        assert taken == {"swap_finetune": 4, "transfer_finetune": 4}


def test_only_the_transfer_variant_depends_on_the_transfer_lr(tmp_path):
    names = {}
    for lr in (1e-2, 3e-2):
        config = config_of(tmp_path, transfer_lr=lr)
        names[lr] = {
            v: run_name(config.variant(("hedgehog", 0), 0, v, tmp_path / "data", tmp_path / "gpt2"))
            for v in lin.TRAINED
        }
    assert names[1e-2]["swap_finetune"] == names[3e-2]["swap_finetune"]
    assert names[1e-2]["transfer_finetune"] != names[3e-2]["transfer_finetune"]


def test_entropy_of_causal_attention_matches_a_hand_computed_case():
    # One head, three positions, Dh = 1 with scale 1: scores q_i * k_j.
    q = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    k = torch.tensor([[0.0], [math.log(3.0)], [5.0]], dtype=torch.float64)
    entropy = lin.causal_attention_entropy(q, k, scale=1.0)
    # Row 0 sees one key: 0. Row 1: weights 1 and 3 -> (1/4, 3/4). Row 2: weights 1, 9, e^10.
    p2 = torch.tensor([1.0, 9.0, math.exp(10.0)], dtype=torch.float64)
    p2 = p2 / p2.sum()
    expected = [0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), float(-(p2 * p2.log()).sum())]
    assert entropy.dtype == torch.float64
    assert entropy.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    flat = lin.causal_attention_entropy(torch.zeros(2, 5, 4), torch.randn(2, 5, 4))
    assert flat.mean().item() == pytest.approx(lin.uniform_causal_entropy(5), rel=1e-12)
    assert lin.uniform_causal_entropy(5) == pytest.approx(sum(math.log(i + 1) for i in range(5)) / 5)


def test_the_teacher_entropy_is_in_the_report_and_below_uniform(experiment):
    root, _ = experiment
    teacher = next(iter(summaries(root).values()))["teacher"]
    assert len(teacher["entropy"]) == 2
    assert all(0 < h <= teacher["uniform_entropy"] + 1e-9 for h in teacher["entropy"])
    assert teacher["uniform_entropy"] == pytest.approx(lin.uniform_causal_entropy(16))
    text = (root / "out" / f"{lin.TABLE}.md").read_text()
    assert f"{teacher['entropy'][0]:.2f} / {teacher['entropy'][1]:.2f} nats" in text


def test_the_plot_is_written_where_asked(experiment):
    root, _ = experiment
    assert (root / "elsewhere" / "plot.png").stat().st_size > 0


def test_a_rerun_trains_and_measures_nothing_again(experiment, monkeypatch):
    root, args = experiment
    before = summaries(root)

    def refuse(*_args, **_kw):
        raise AssertionError("trained or measured again")

    monkeypatch.setattr(lin, "train", refuse)
    monkeypatch.setattr(lin, "decode_ms", refuse)
    monkeypatch.setattr(lin, "evaluate", refuse)
    monkeypatch.setattr(lin, "teacher_attention_entropy", refuse)
    assert main([*args, *FLAGS]) == 0
    assert summaries(root) == before
    assert (root / "out" / lin.PLOT).is_file()


def test_a_windowed_hedgehog_gpt_round_trips_through_its_checkpoint_and_the_teacher_folder(experiment):
    root, _ = experiment
    config = config_of(root)
    run = config.variant(("hedgehog", 8), SEEDS[0], "transfer_finetune", root / "data", root / "gpt2")
    model, _ = load_model(run_dir(root / "out", run_name(run)) / CHECKPOINT)
    assert model.config.attention_window == 8
    assert model.transformer.h[0].attn.window == 8
    assert model.transformer.h[0].attn.feature_map.window_logit is not None
    saved = load_checkpoint(run_dir(root / "out", run_name(run)) / CHECKPOINT)["model"]
    tensors = {n: p for n, p in model.state_dict().items() if isinstance(p, torch.Tensor)}  # not extra state
    assert "transformer.h.0.attn.feature_map.window_logit" in tensors
    assert all(torch.equal(saved[n], p) for n, p in tensors.items())
    model.eval()
    idx = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    logits, states = model.decode(idx[:, :3], torch.arange(3))
    steps = [logits]
    for t in range(3, 16):
        logits, states = model.decode(idx[:, t : t + 1], torch.tensor([t]), states)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), model(idx)[0], rtol=1e-4, atol=1e-4)
    fresh = build_model(run, TokenData(root / "data"), torch.device("cpu"))
    teacher = GPT.from_pretrained(root / "gpt2", block_size=16)
    kept = dict(teacher.named_parameters())
    assert fresh.transformer.h[1].attn.feature_map.window_logit is not None
    assert all(torch.equal(p, kept[n]) for n, p in fresh.named_parameters() if n in kept)


def test_with_context_keeps_the_weights_and_the_trained_positions():
    config = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, attention="hedgehog",
                           attention_window=4, attention_features=4, learnable_attention=True)  # fmt: skip
    model = GPT(config)
    longer = lin.with_context(model, 20)
    assert longer.config == dataclasses.replace(config, block_size=20)
    idx = torch.randint(0, 11, (1, 8))
    torch.testing.assert_close(longer(idx)[0], model(idx)[0], rtol=0, atol=0)
    assert lin.with_context(model, 8) is model


def test_a_shard_reports_only_rows_whose_runs_all_finished(experiment, tmp_path, monkeypatch):
    root, args = experiment
    out = tmp_path / "sharded"
    ran = []
    monkeypatch.setattr(lin, "train", lambda run: ran.append(run.name))
    shard_args = [a if a != str(root / "out") else str(out) for a in args]
    assert main([*shard_args, *FLAGS, "--shard", "0/2"]) == 0
    refused = {row: lin.transfer_refusal(*row) for row in ROWS}
    cells = lin.variant_runs(config_of(root), root / "data", root / "gpt2", refused)
    assert len(cells) == len(ROWS) * len(SEEDS) * 2 - len(WINDOWS) * len(SEEDS)  # trigrf's transfers refused
    assert len(ran) == (len(SEEDS) + len(cells) + 1) // 2  # every other cell, the references first
    assert not (out / lin.RESULTS).read_text().strip()
    text = (out / f"{lin.TABLE}.md").read_text()
    assert "Not finished yet: trigrf-orf window 0" in text
    assert "ms/token: timed once every row has finished" in text  # this call trained: nothing timed


def test_a_call_that_trains_nothing_reports_and_times_the_finished_rows(experiment, tmp_path):
    root, args = experiment
    out = tmp_path / "partial"
    shutil.copytree(root / "out", out)
    (out / lin.MEASURED).unlink()
    config = config_of(root, out=out)
    refused = {row: lin.transfer_refusal(*row) for row in ROWS}
    cells = list(lin.variant_runs(config, root / "data", root / "gpt2", refused))
    index = cells.index(("hedgehog", 8, SEEDS[1], "transfer_finetune"))
    unfinished = config.variant(("hedgehog", 8), SEEDS[1], "transfer_finetune", root / "data", root / "gpt2")
    (run_dir(out, run_name(unfinished)) / RECORD).unlink()
    shard_args = [a if a != str(root / "out") else str(out) for a in args]
    assert main([*shard_args, *FLAGS, "--shard", f"{(index + 1) % 2}/2"]) == 0  # the other shard's cells
    reported = {(r["attention"], r["window"]): r for r in read_jsonl(out / lin.RESULTS)}
    assert sorted(reported) == sorted(ROWS[:3])
    assert all(r["decode_ms"]["32"] > 0 for r in reported.values())
    assert "Not finished yet: hedgehog window 8." in (out / f"{lin.TABLE}.md").read_text()


def test_the_old_command_name_says_it_is_deprecated_and_runs_the_same_command(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(cli, "_linearize_attention", lambda args: ran.append(cli.command_config(args)))
    assert main(["linearize", "--steps", "7", "--transfer-steps", "3"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "gpt-uptrain linearize is deprecated: it is now gpt-uptrain linearize-attention"
    ]
    assert ran == [lin.LinearizeAttentionConfig(steps=7, transfer_steps=3)]


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"steps": 5, "transfer_steps": 5}, "--transfer-steps"),
        ({"windows": (0, 0)}, "--windows"),
        ({"windows": (0, 64), "context": 64}, "--windows"),
        ({"seeds": ()}, "--seeds"),
        ({"decode_contexts": (16, 4), "new_tokens": 4}, "--decode-contexts"),
        ({"attention": ("softmax",)}, "--attention"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, flag):
    with pytest.raises(ValueError, match=flag):
        lin.LinearizeAttentionConfig(**settings)
