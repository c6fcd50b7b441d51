"""``python -m gpt_uptrain`` (and ``torchrun ... -m gpt_uptrain train ...``): the ``gpt-uptrain`` command."""

import sys

from gpt_uptrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
