"""The LRA tokenizations: ListOps symbols, bytes (Text, Retrieval) and gray pixels (Image, Pathfinder).

Token id 0 is padding and nothing else, in every task:

- ListOps: ``0`` padding, then the operators ``[MAX [MIN [MED [SM``, the closing ``]`` and the digits
  ``0``-``9`` (ids 1 to 15, `LISTOPS_VOCAB`). The parentheses of the release's strings carry no
  information and are dropped.
- Text and Retrieval: byte ``b`` of the UTF-8 text becomes ``b + 1`` (vocabulary of 257).
- Image and Pathfinder: gray value ``v`` in ``0..255`` becomes ``v + 1`` (vocabulary of 257), so a black
  pixel is token 1, never padding.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

PAD_ID = 0
"""The padding token of every task."""

LISTOPS_OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
"""The operator tokens of the LRA ListOps release, bracket included."""

LISTOPS_CLOSE = "]"
"""The token closing an operator's argument list."""

LISTOPS_VOCAB = ("<pad>", *LISTOPS_OPERATORS, LISTOPS_CLOSE, *(str(d) for d in range(10)))
"""ListOps vocabulary: ``LISTOPS_VOCAB[i]`` is the symbol of token id ``i`` (16 ids, 0 = padding)."""

_LISTOPS_IDS = {symbol: i for i, symbol in enumerate(LISTOPS_VOCAB) if i != PAD_ID}
_LISTOPS_IGNORED = frozenset({"(", ")"})

BYTE_VOCAB_SIZE = 257
"""Vocabulary size of the byte-level tasks: padding plus 256 byte values."""

PIXEL_VOCAB_SIZE = 257
"""Vocabulary size of the pixel tasks: padding plus 256 gray values."""

# ITU-R 601 luma weights, as tf.image.rgb_to_grayscale uses them.
_GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)


def listops_symbols(source: str) -> list[str]:
    """The meaningful symbols of a ListOps source string: operators, digits and ``]``, in order.

    ``"( ( [MAX 2 9 ) ] )"`` gives ``["[MAX", "2", "9", "]"]``.

    Raises:
        ValueError: a symbol that is none of the above, nor a parenthesis.
    """
    symbols = []
    for symbol in source.split():
        if symbol in _LISTOPS_IGNORED:
            continue
        if symbol not in _LISTOPS_IDS:
            raise ValueError(
                f"source: unknown ListOps symbol {symbol!r}; expected one of "
                f"{', '.join(LISTOPS_VOCAB[1:])} or a parenthesis"
            )
        symbols.append(symbol)
    return symbols


def tokenize_listops(source: str) -> np.ndarray:
    """Token ids (``int64``, no padding) of a ListOps source string in the release's format.

    Example:
        >>> tokenize_listops("( ( [MAX 2 9 ) ] )").tolist()
        [1, 8, 15, 5]
    """
    return np.array([_LISTOPS_IDS[s] for s in listops_symbols(source)], dtype=np.int64)


def detokenize_listops(tokens: ArrayLike) -> str:
    """The symbols of ListOps token ids, space-separated (padding dropped, no parentheses)."""
    ids = np.asarray(tokens).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= len(LISTOPS_VOCAB)):
        raise ValueError(f"tokens: expected ids in [0, {len(LISTOPS_VOCAB)}), got {ids.min()}..{ids.max()}")
    return " ".join(LISTOPS_VOCAB[i] for i in ids.tolist() if i != PAD_ID)


def tokenize_bytes(data: bytes | str) -> np.ndarray:
    """Byte-level token ids: byte ``b`` becomes ``b + 1`` (a ``str`` is encoded as UTF-8 first)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + 1


def detokenize_bytes(tokens: ArrayLike) -> bytes:
    """The bytes of byte-level token ids (padding dropped)."""
    ids = np.asarray(tokens).reshape(-1)
    ids = ids[ids != PAD_ID]
    if ids.size and (ids.min() < 1 or ids.max() > 256):
        raise ValueError(f"tokens: expected byte ids in [1, 256], got {ids.min()}..{ids.max()}")
    return bytes((ids - 1).astype(np.uint8).tobytes())


def tokenize_pixels(image: ArrayLike) -> np.ndarray:
    """Pixel token ids of a gray ``uint8`` image, row-major: gray value ``v`` becomes ``v + 1``."""
    pixels = np.asarray(image)
    if pixels.dtype != np.uint8:
        raise ValueError(f"image: expected a uint8 gray image, got dtype {pixels.dtype}")
    return pixels.reshape(-1).astype(np.int64) + 1


def rgb_to_gray(images: ArrayLike) -> np.ndarray:
    """Gray ``uint8`` images from RGB ``uint8`` images ``(..., 3)``, as ``tf.image.rgb_to_grayscale``.

    ``gray = floor((0.2989 r + 0.5870 g + 0.1140 b) / 255 * 255.5)`` in float32, which is TensorFlow's
    conversion (scale to [0, 1], weigh, scale back by ``255 + 0.5`` and truncate) that the LRA used.
    """
    rgb = np.asarray(images)
    if rgb.dtype != np.uint8 or rgb.shape[-1:] != (3,):
        raise ValueError(f"images: expected uint8 (..., 3), got {rgb.dtype} {tuple(rgb.shape)}")
    scaled = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    gray = scaled @ _GRAY_WEIGHTS
    return np.clip(np.floor(gray * np.float32(255.5)), 0, 255).astype(np.uint8)
