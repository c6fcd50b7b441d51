"""The causal figure and table read a measure.json with eager, compiled and SDPA points."""

import json

from spectraformer_benchmarks import causal


def test_figure_and_table_take_compiled_points_beside_eager_and_sdpa(tmp_path):
    results = [
        {"attention": name, "n": n, "quantity": "time", "seconds": seconds * n / 1024}
        for name, seconds in (("softmax", 0.02), ("posrf-orf", 0.01), ("posrf-orf@inductor", 0.005))
        for n in causal.SPEED_LENGTHS
    ]
    (tmp_path / "measure.json").write_text(json.dumps({"machine": "m", "command": "c", "results": results}))
    png = causal.plot(tmp_path, tmp_path / "causal.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = {
        line.split("|")[1].strip(): line
        for line in causal.table(tmp_path).splitlines()
        if line.startswith("| `")
    }
    assert "2.00x" in rows["`posrf-orf`"]
    assert "4.00x" in rows["`posrf-orf@inductor`"]
