import json
import os
import pickle

import pytest

from lra_data import load
from lra_data.cli import main


def generate_short_listops(out, n):
    """``lra-data generate`` of ``n`` ListOps training examples of 3 to 30 tokens under ``out``."""
    args = ["--n", str(n), "--out", str(out), "--min-length", "3", "--max-length", "30"]
    assert main(["generate", "--task", "listops", *args]) == 0


def test_help_lists_the_three_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("prepare", "generate", "info"):
        assert command in out


def test_generate_help_lists_the_generator_fields(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    for flag in ("--max-depth", "--max-args", "--min-length", "--operator-prob", "--num-distractors"):
        assert flag in out


@pytest.mark.parametrize("command", ["prepare", "generate"])
def test_subcommand_help_shows_the_attributes_one_per_line_without_markup(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "\nAttributes:\n    task: " in out
    assert "\n    out: " in out
    for markup in ("``", "][", "[`", ":class:", ":data:"):
        assert markup not in out


def test_prepare_writes_a_cache_that_load_reads(tmp_path, listops_release, capsys):
    assert (
        main(["prepare", "--task", "listops", "--source", str(tmp_path), "--out", str(tmp_path / "c")]) == 0
    )
    out = capsys.readouterr().out
    assert "train: 4 examples" in out
    assert len(load("listops", "train", tmp_path / "c")) == 4


def test_generate_then_info_prints_the_manifest_as_json(tmp_path, capsys):
    args = ["generate", "--task", "listops", "--n", "12", "--val", "2", "--test", "3", "--out", str(tmp_path)]
    assert main([*args, "--min-length", "5", "--max-length", "60", "--max-depth", "4", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "listops"), "--verify"]) == 0
    captured = capsys.readouterr()
    manifest = json.loads(captured.out)
    assert manifest["task"] == "listops"
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 12, "val": 2, "test": 3}
    assert manifest["source"]["config"]["max_length"] == 60
    assert "verified train, val, test" in captured.err


def test_info_on_a_root_prints_every_task_cache(tmp_path, capsys):
    main(["generate", "--task", "pathfinder", "--n", "2", "--out", str(tmp_path), "--num-distractors", "0"])
    generate_short_listops(tmp_path, 2)
    capsys.readouterr()
    main(["info", str(tmp_path)])
    manifests = json.loads(capsys.readouterr().out)
    assert set(manifests) == {"listops", "pathfinder"}
    assert manifests["pathfinder"]["source"]["config"]["num_distractors"] == 0


def test_generate_refuses_options_of_the_other_generator(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--task", "listops", "--n", "2", "--out", str(tmp_path), "--num-segments", "3"])
    assert exit_info.value.code == 2
    assert "--num-segments: options of the pathfinder generator, not of listops" in capsys.readouterr().err


def test_errors_exit_with_status_2_and_a_message_naming_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--task", "text", "--source", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "lra-data prepare: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["info", str(tmp_path)])
    assert "no manifest.json there nor in its subfolders" in capsys.readouterr().err


def test_prepare_refuses_a_crafted_cifar_batch_without_running_it(tmp_path, cifar, lra_files, capsys):
    marker = tmp_path / "marker"
    with (cifar / "test_batch").open("wb") as f:
        pickle.dump({b"data": lra_files.SystemCall(f"touch {marker}"), b"labels": [0]}, f)
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--task", "image", "--source", str(tmp_path), "--out", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    assert f"test_batch: refused global {os.system.__module__}.system" in capsys.readouterr().err
    assert not marker.exists()


def test_corrupted_cache_fails_info_verify(tmp_path, capsys):
    generate_short_listops(tmp_path, 3)
    path = tmp_path / "listops" / "val.tokens_0.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 2
    path.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exit_info:
        main(["info", str(tmp_path), "--verify"])
    assert exit_info.value.code == 2
    assert "val.tokens_0.bin: SHA-256 does not match" in capsys.readouterr().err
