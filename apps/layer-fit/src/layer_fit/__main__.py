"""``python -m layer_fit``."""

import sys

from layer_fit.cli import main

sys.exit(main())
