"""``python -m vit_finetune``: the ``vit-finetune`` command."""

import sys

from vit_finetune.cli import main

if __name__ == "__main__":
    sys.exit(main())
