"""``python -m lra_bench`` (and ``torchrun ... -m lra_bench train ...``): the ``lra-bench`` command."""

import sys

from lra_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
