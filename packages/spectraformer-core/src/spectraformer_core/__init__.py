"""The leaf helpers every spectraformer package shares (and the only place they are defined).

- :func:`make_generator`: the ``torch.Generator`` a part draws from, from ``seed`` or ``generator``;
- :func:`check_int`, :func:`check_positive_int`: integer checks whose errors name the argument;
- :class:`Registry`: a family of interchangeable parts keyed by short lowercase names;
- :func:`resolve_device`: ``"auto" | "cpu" | "cuda[:i]"`` as a ``torch.device``;
- :func:`markdown_table`: a plain-text Markdown table.
"""

from spectraformer_core.device import DEVICES, resolve_device
from spectraformer_core.registry import Registry
from spectraformer_core.seeding import make_generator
from spectraformer_core.tables import markdown_table
from spectraformer_core.validation import check_int, check_positive_int

__all__ = [
    "DEVICES",
    "Registry",
    "check_int",
    "check_positive_int",
    "make_generator",
    "markdown_table",
    "resolve_device",
]
