import re

import rf_features
import rf_matrices
from rf_features.__main__ import main


def test_demo_prints_one_row_per_component_and_matrix_pair(capsys):
    main(["--features", "16", "256", "--seeds", "2", "--points", "16", "--dim", "8"])
    out = capsys.readouterr().out
    for component in rf_features.names():
        for matrix in rf_matrices.names():
            row = next(
                line for line in out.splitlines() if re.match(rf"\| {component} +\| {matrix} +\|", line)
            )
            errors = [float(v) for v in re.findall(r"(\d\.\d\de[+-]\d\d)", row)]
            assert len(errors) == 2, row
            assert errors[1] < errors[0], row


def test_norm_table_shows_the_error_growing_with_the_norms_of_queries_and_keys(capsys):
    options = ["--norms", "0.5", "10", "--features", "16", "--seeds", "3", "--points", "8", "--dim", "8"]
    main([*options, "--components", "posrf", "trigrf", "--matrices", "orf"])
    out = capsys.readouterr().out
    for component in ("posrf", "trigrf"):
        row = next(line for line in out.splitlines() if re.match(rf"\| {component} +\| orf +\|", line))
        small, large = (float(v) for v in re.findall(r"(\d\.\d\de[+-]\d\d)", row))
        assert small < 0.5 < large, row
