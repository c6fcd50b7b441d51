"""The leaf helpers every spectraformer package shares (and the only place they are defined).

- [`make_generator`][spectraformer_core.make_generator]: the ``torch.Generator`` a part draws from, from
``seed`` or ``generator``;
- [`check_int`][spectraformer_core.check_int], [`check_positive_int`][spectraformer_core.check_positive_int]:
integer checks whose errors name the argument;
- [`Registry`][spectraformer_core.Registry]: a family of interchangeable parts keyed by short lowercase names;
- [`resolve_device`][spectraformer_core.resolve_device]: ``"auto" | "cpu" | "cuda[:i]"`` as a
``torch.device``;
- [`markdown_table`][spectraformer_core.markdown_table]: a plain-text Markdown table;
- [`load_pickle`][spectraformer_core.load_pickle]: a downloaded pickle of numpy arrays, read without running
code from the file;
- [`spectraformer_core.testing`][spectraformer_core.testing]: the relative-error comparison the tests share.
"""

from spectraformer_core.device import DEVICES, resolve_device
from spectraformer_core.registry import Registry
from spectraformer_core.seeding import make_generator
from spectraformer_core.tables import markdown_table
from spectraformer_core.unpickling import ALLOWED_PICKLE_GLOBALS, RefusedGlobalError, load_pickle
from spectraformer_core.validation import check_int, check_positive_int

__all__ = [
    "ALLOWED_PICKLE_GLOBALS",
    "DEVICES",
    "RefusedGlobalError",
    "Registry",
    "check_int",
    "check_positive_int",
    "load_pickle",
    "make_generator",
    "markdown_table",
    "resolve_device",
]
