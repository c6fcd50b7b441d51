import re

import rf_matrices
from rf_matrices.__main__ import main


def test_demo_prints_one_row_of_errors_per_matrix(capsys):
    main(["--features", "64", "256", "--seeds", "2", "--points", "64", "--dim", "8"])
    out = capsys.readouterr().out
    assert "| matrix" in out
    for name in rf_matrices.names():
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} "))
        errors = [float(v) for v in re.findall(r"\| (\d\.\d{4})", row)]
        assert len(errors) == 2, row
        assert 0 < errors[1] < errors[0] < 0.5, row
