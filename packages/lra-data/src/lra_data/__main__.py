"""``python -m lra_data``: the ``lra-data`` command."""

from lra_data.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
