"""The byte-level corpus: text already installed, split by a hash of each file's path, with sha256s."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["SPLITS", "Corpus", "build_corpus", "check_disjoint", "split_of"]

SPLITS = ("train", "validation", "test")
# Of every 1000 hash buckets: validation takes [0, 50), test [50, 100), train the rest.
_BUCKETS = 1000
_VALIDATION_BUCKETS = 50
_TEST_BUCKETS = 50
# A single text file is cut into chunks of this many bytes, each assigned like a file.
CHUNK_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Three byte streams and what they were made of.

    Attributes:
      source: what the bytes are (``"jax 0.10.2 (.py files)"`` or a path).
      root: the directory (or file) read.
      files: per split, the relative paths (or ``file#chunk`` names) in the
        order their bytes are concatenated.
      data: per split, the bytes as a ``uint8`` array.
      sha256: per split, the hex sha256 of its bytes.
    """

    source: str
    root: str
    files: Mapping[str, tuple[str, ...]]
    data: Mapping[str, np.ndarray]
    sha256: Mapping[str, str]

    def describe(self) -> dict[str, object]:
        """A JSON-ready record: source, sizes, sha256s and file lists."""
        return {
            "source": self.source,
            "root": self.root,
            "split_rule": (
                f"bucket = int(sha256(path)[:8 bytes], big-endian) % {_BUCKETS}; validation if bucket < "
                f"{_VALIDATION_BUCKETS}, test if < {_VALIDATION_BUCKETS + _TEST_BUCKETS}, else train"
            ),
            "bytes": {s: int(self.data[s].size) for s in SPLITS},
            "sha256": dict(self.sha256),
            "files": {s: list(self.files[s]) for s in SPLITS},
        }


def split_of(name: str) -> str:
    """The split of a file, from the sha256 of its relative path (``/``-separated).

    The same path always lands in the same split, on every machine, whatever
    other files exist.

    Example:
      >>> split_of("jax/numpy/__init__.py") in SPLITS
      True
    """
    bucket = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % _BUCKETS
    if bucket < _VALIDATION_BUCKETS:
        return "validation"
    if bucket < _VALIDATION_BUCKETS + _TEST_BUCKETS:
        return "test"
    return "train"


def check_disjoint(files: Mapping[str, tuple[str, ...]]) -> None:
    """Raise ValueError if a file appears in two splits (or twice in one).

    Raises:
      ValueError: naming the file and both splits.
    """
    seen: dict[str, str] = {}
    for split in SPLITS:
        for name in files.get(split, ()):
            if name in seen:
                raise ValueError(
                    f"corpus leak: {name!r} is in both {seen[name]!r} and {split!r}; "
                    "expected every file in exactly one split."
                )
            seen[name] = split


def _default_root() -> tuple[Path, str]:
    import jax

    version = importlib.metadata.version("jax")
    return Path(jax.__file__).resolve().parent, f"jax {version} (.py files of the installed package)"


def _is_text(data: bytes) -> bool:
    return b"\x00" not in data[:8192]


def build_corpus(path: str | os.PathLike | None = None, *, max_bytes: int | None = None) -> Corpus:
    """Read the corpus and split it by file.

    With no ``path``: every ``.py`` file of the installed jax package (the
    version ``requirements/constraints.txt`` pins), so the same bytes come out
    on every machine with that pin. With a directory: every file in it that
    holds no NUL byte in its first 8 KiB. With one text file: its chunks of
    64 KiB, named ``file#<index>``, each assigned like a file. Files are read
    in sorted order of their relative paths and concatenated within a split.

    Args:
      path: a directory or a text file, or None for the jax sources.
      max_bytes: keep only files (in sorted order) until this many bytes are
        read, for tiny test corpora; None keeps everything.

    Returns:
      The :class:`Corpus`.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: the corpus is empty, or a split has no bytes.
    """
    if path is None:
        root, source = _default_root()
        names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())
        pieces = [(n, (root / n).read_bytes()) for n in names]
    else:
        root = Path(path)
        if not root.exists():
            raise FileNotFoundError(f"--corpus {root}: no such file or directory; expected a directory or text file.")
        source = str(root)
        if root.is_file():
            data = root.read_bytes()
            pieces = [
                (f"{root.name}#{i // CHUNK_BYTES}", data[i : i + CHUNK_BYTES]) for i in range(0, len(data), CHUNK_BYTES)
            ]
        else:
            names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
            pieces = [(n, b) for n in names if _is_text(b := (root / n).read_bytes())]
    if max_bytes is not None:
        kept, total = [], 0
        for name, data in pieces:
            if total >= max_bytes:
                break
            kept.append((name, data))
            total += len(data)
        pieces = kept
    files: dict[str, list[str]] = {s: [] for s in SPLITS}
    chunks: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    for name, data in pieces:
        split = split_of(name)
        files[split].append(name)
        chunks[split].append(data)
    frozen = {s: tuple(files[s]) for s in SPLITS}
    check_disjoint(frozen)
    joined = {s: b"".join(chunks[s]) for s in SPLITS}
    empty = [s for s in SPLITS if not joined[s]]
    if empty:
        raise ValueError(
            f"corpus {source}: the {', '.join(empty)} split(s) got no bytes from {len(pieces)} file(s); "
            "expected enough files (or a text file long enough) for each split to get some."
        )
    return Corpus(
        source=source,
        root=str(root),
        files=frozen,
        data={s: np.frombuffer(joined[s], dtype=np.uint8) for s in SPLITS},
        sha256={s: hashlib.sha256(joined[s]).hexdigest() for s in SPLITS},
    )
