"""Token data in nanoGPT's format: ``train.bin``, ``val.bin`` (uint16 ids, memory-mapped), ``meta.json``.

``prepare`` builds them from local text files with one of the tokenizers of
[`TOKENIZERS`][gpt_uptrain.TOKENIZERS]:

- ``gpt2``: GPT-2's BPE through ``tiktoken`` (the optional extra ``gpt-uptrain[bpe]``); its encoding file
  is downloaded once by ``tiktoken`` and cached (``TIKTOKEN_CACHE_DIR``); offline without that cache it
  fails with a message saying so. Documents are separated by ``<|endoftext|>`` (id 50256).
- ``char``: one id per character of the corpus (nanoGPT's shakespeare_char), the alphabet stored in
  ``meta.json``. Always offline.
- ``byte``: the UTF-8 bytes, 256 ids. Always offline.

The files are concatenated in the order given (one newline between them) and the last ``val_fraction`` of
the tokens is the validation split, as nanoGPT's ``prepare.py`` does.

Batches are a function of ``(seed, iteration, micro-step)`` only
([`TokenData.batch`][gpt_uptrain.TokenData.batch]), so a resumed run and a run split over processes see
exactly the batches of one unbroken run.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from spectraformer_core import Registry

META = "meta.json"
SPLITS = ("train", "val")
#: The metadata of a folder without ``meta.json`` (nanoGPT's OpenWebText files): GPT-2 BPE.
NANOGPT_DEFAULT_META = {"tokenizer": "gpt2", "vocab_size": 50257}


class CharTokenizer:
    """One id per character of a fixed alphabet (sorted, as nanoGPT's shakespeare_char)."""

    name = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CharTokenizer:
        """The alphabet of ``texts`` (``prepare`` adds the newline that separates files)."""
        alphabet: set[str] = set()
        for text in texts:
            alphabet.update(text)
        return cls(sorted(alphabet))

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``.

        Raises:
            ValueError: a character outside the alphabet.
        """
        try:
            return [self.index[c] for c in text]
        except KeyError as error:
            raise ValueError(
                f"text: character {error.args[0]!r} is not in this {self.vocab_size}-character vocabulary"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``."""
        return "".join(self.chars[i] for i in ids)

    def meta(self) -> dict:
        """What ``meta.json`` stores to rebuild the tokenizer."""
        return {"tokenizer": self.name, "vocab_size": self.vocab_size, "chars": self.chars}


class ByteTokenizer:
    """The UTF-8 bytes of the text: ids 0..255 (undecodable byte runs come back as U+FFFD)."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of ``text``."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the bytes ``ids``."""
        return bytes(ids).decode("utf-8", errors="replace")

    def meta(self) -> dict:
        """What ``meta.json`` stores."""
        return {"tokenizer": self.name, "vocab_size": self.vocab_size}


class GPT2Tokenizer:
    """GPT-2's BPE (``tiktoken.get_encoding("gpt2")``), 50257 ids, ``<|endoftext|>`` = 50256."""

    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise RuntimeError(
                "tokenizer 'gpt2': needs the package tiktoken (install the extra: "
                "pip install 'gpt-uptrain[bpe]'); "
                "offline, use --tokenizer char or --tokenizer byte"
            ) from None
        try:
            self.encoding = tiktoken.get_encoding("gpt2")
        except Exception as error:  # tiktoken raises requests/urllib errors of its own choosing offline
            raise RuntimeError(
                "tokenizer 'gpt2': tiktoken could not load the GPT-2 encoding "
                f"({type(error).__name__}: {error}). tiktoken downloads it once and caches it "
                "(TIKTOKEN_CACHE_DIR); "
                "run once with network access, or use --tokenizer char or --tokenizer byte offline"
            ) from error
        self.vocab_size = self.encoding.n_vocab
        self.eot = self.encoding.eot_token

    def encode(self, text: str) -> list[int]:
        """BPE ids of ``text`` (special tokens are encoded as plain text)."""
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``."""
        return self.encoding.decode(list(ids))

    def meta(self) -> dict:
        """What ``meta.json`` stores."""
        return {"tokenizer": self.name, "vocab_size": self.vocab_size}


#: Tokenizer name -> factory from ``(texts, meta)``: ``texts`` when preparing, ``meta`` when reloading.
TOKENIZERS: Registry[Callable[..., object]] = Registry("tokenizer")
TOKENIZERS.register("char")(
    lambda texts=(), meta=None: CharTokenizer(meta["chars"]) if meta else CharTokenizer.fit([*texts, "\n"])
)
TOKENIZERS.register("byte")(lambda texts=(), meta=None: ByteTokenizer())
TOKENIZERS.register("gpt2")(lambda texts=(), meta=None: GPT2Tokenizer())


def tokenizer_from_meta(meta: dict):
    """The tokenizer that ``meta.json`` (or a checkpoint's copy of it) describes."""
    return TOKENIZERS.get(meta["tokenizer"])(meta=meta)


def separator(tokenizer) -> list[int]:
    """Ids put between two files: ``<|endoftext|>`` for GPT-2 BPE, a newline otherwise."""
    return [tokenizer.eot] if isinstance(tokenizer, GPT2Tokenizer) else tokenizer.encode("\n")


def prepare(
    files: Sequence[str | Path],
    out: str | Path,
    *,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    extra_meta: dict | None = None,
) -> dict:
    """Tokenize ``files`` into ``out/train.bin``, ``out/val.bin`` and ``out/meta.json``.

    Args:
        files: UTF-8 text files, concatenated in this order.
        out: the data folder.
        tokenizer: a name of [`TOKENIZERS`][gpt_uptrain.TOKENIZERS].
        val_fraction: the share of tokens (the last ones) that is validation data.
        extra_meta: more fields for ``meta.json`` (e.g. where the corpus came from).

    Returns:
        The content of ``meta.json`` (tokenizer, vocab size, token counts, the files).

    Raises:
        FileNotFoundError: a missing file.
        ValueError: no files, a bad ``val_fraction``, a file that is not UTF-8, too few tokens.
        RuntimeError: the GPT-2 tokenizer is not available (offline without its cache, or no tiktoken).
    """
    if not files:
        raise ValueError("files: expected at least one text file")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected a fraction in (0, 1), got {val_fraction!r}")
    factory = TOKENIZERS.get(tokenizer)
    texts = []
    for file in map(Path, files):
        if not file.is_file():
            raise FileNotFoundError(f"files: {file} does not exist")
        try:
            texts.append(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"files: {file} is not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
    tok = factory(texts=texts)
    if tok.vocab_size > 2**16:
        raise ValueError(f"tokenizer: {tok.vocab_size} ids do not fit uint16 token files")
    sep = separator(tok)
    ids: list[int] = []
    for i, text in enumerate(texts):
        if i:
            ids.extend(sep)
        ids.extend(tok.encode(text))
    n_val = int(len(ids) * val_fraction)
    if n_val < 2 or len(ids) - n_val < 2:
        raise ValueError(f"files: {len(ids)} tokens are too few to split with val_fraction={val_fraction}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    array = np.asarray(ids, dtype=np.uint16)
    array[: len(ids) - n_val].tofile(out / "train.bin")
    array[len(ids) - n_val :].tofile(out / "val.bin")
    meta = {
        **tok.meta(),
        "train_tokens": len(ids) - n_val,
        "val_tokens": n_val,
        "val_fraction": val_fraction,
        "files": [str(f) for f in files],
        **(extra_meta or {}),
    }
    (out / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def stdlib_files(max_chars: int = 1_000_000) -> list[Path]:
    """The quick corpus: Python's own standard library sources, chosen by a fixed rule.

    The top-level modules of ``sysconfig.get_paths()["stdlib"]`` (``*.py`` directly in that folder, no
    packages, no tests), sorted by file name, keeping the files that are pure ASCII, until ``max_chars``
    characters are collected (the file that crosses the limit is the last one taken).

    Raises:
        FileNotFoundError: the standard library sources are not on this machine.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    candidates = sorted(p for p in root.glob("*.py") if p.is_file())
    if not candidates:
        raise FileNotFoundError(f"stdlib: no *.py files under {root}; pass your own text files to prepare")
    chosen, total = [], 0
    for path in candidates:
        raw = path.read_bytes()
        if not raw.isascii():
            continue
        chosen.append(path)
        total += len(raw)
        if total >= max_chars:
            break
    return chosen


class TokenData:
    """The memory-mapped splits of a prepared data folder and the batches drawn from them.

    A folder without ``meta.json`` (nanoGPT's own OpenWebText output) is read as GPT-2 BPE, 50257 ids.

    Raises:
        FileNotFoundError: no ``train.bin`` / ``val.bin`` in ``root``.
        ValueError: a split too short for the block size.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        for name in ("train.bin", "val.bin"):
            if not (self.root / name).is_file():
                raise FileNotFoundError(
                    f"data: {self.root / name} is missing; build the folder with `gpt-uptrain prepare` "
                    "(or nanoGPT's prepare.py)"
                )
        meta = self.root / META
        # nanoGPT's openwebtext/prepare.py writes no metadata: its files are GPT-2 BPE.
        self.meta = (
            json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else dict(NANOGPT_DEFAULT_META)
        )
        self.vocab_size = int(self.meta["vocab_size"])
        self.splits = {
            split: np.memmap(self.root / f"{split}.bin", dtype=np.uint16, mode="r") for split in SPLITS
        }

    def check_block_size(self, block_size: int, splits: Sequence[str] = SPLITS) -> None:
        """Check that each split of ``splits`` has more than ``block_size + 1`` tokens (a window, its target).

        Raises:
            ValueError: naming the split, its length and the block size.
        """
        for split in splits:
            if len(self.splits[split]) <= block_size + 1:
                raise ValueError(
                    f"block_size: {block_size} needs more than {block_size + 1} tokens, but {split}.bin of "
                    f"{self.root} has {len(self.splits[split])}"
                )

    def tokenizer(self):
        """The tokenizer of ``meta.json``."""
        return tokenizer_from_meta(self.meta)

    def batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        *,
        seed: Sequence[int],
        device: torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, ``(batch_size, block_size)`` int64 each, ``y`` shifted by one token.

        The windows start at offsets drawn by ``numpy.random.default_rng(seed)``: the same ``seed`` tuple
        (e.g. ``(run seed, iteration, micro-step)``) gives the same batch everywhere.
        """
        data = self.splits[split]
        self.check_block_size(block_size, (split,))
        starts = np.random.default_rng(list(seed)).integers(0, len(data) - block_size - 1, size=batch_size)
        x = torch.from_numpy(np.stack([data[s : s + block_size] for s in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[s + 1 : s + 1 + block_size] for s in starts]).astype(np.int64))
        if device is not None and device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device or "cpu"), y.to(device or "cpu")
