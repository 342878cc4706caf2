"""The large byte corpus built from pinned wheels: the manifest, the sha256 checks, the members kept, the dedupe,
the split, the written bytes and their hashes, the memory-mapped loader, `build_corpus` on a built corpus and
`stejax lm corpus`. Every wheel here is made in the test with zipfile; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.lm import (
    SPLITS,
    CorpusWheel,
    build_corpus,
    build_wheel_corpus,
    load_corpus,
    read_corpus_manifest,
    split_of,
)

ROOT = Path(__file__).resolve().parents[1]
FETCH = "pip download --no-deps --only-binary=:all: --require-hashes -r"


def _modules_in_every_split(prefix: str, per_split: int = 2) -> list[str]:
    """Member names under ``prefix`` such that each split gets ``per_split`` of them (checked by split_of)."""
    chosen: dict[str, list[str]] = {s: [] for s in SPLITS}
    for i in range(100_000):
        name = f"{prefix}/mod{i}.py"
        split = split_of(f"alpha/{name}")
        if len(chosen[split]) < per_split:
            chosen[split].append(name)
        if all(len(v) == per_split for v in chosen.values()):
            return sorted(n for v in chosen.values() for n in v)
    raise AssertionError("no names for every split")


DUPLICATE = b"# the same bytes under two paths\nVALUE = 42\n"


def _members() -> dict[str, dict[str, bytes]]:
    """Per distribution (as the manifest names it), the wheel's members."""
    alpha = {
        name: f"def f{i}():\n    return {i}\n".encode() * (i + 3)
        for i, name in enumerate(_modules_in_every_split("alpha"))
    }
    alpha |= {
        "alpha/__init__.py": b"",  # empty: skipped
        "alpha/copy.py": DUPLICATE,
        "alpha/blob.txt": b"text\x00with a NUL byte\n",  # a text suffix, binary bytes: skipped
        "alpha/_speedups.cpython-311-x86_64-linux-gnu.so": b"\x7fELF not text",
        "alpha/data/table.json": b'{"not": "a text suffix"}\n',
        "alpha/README.md": b"# alpha\n\nA package.\n",
        "alpha-1.0.dist-info/METADATA": b"Name: alpha\nVersion: 1.0\n",
        "alpha-1.0.dist-info/RECORD": b"alpha/__init__.py,,\n",
        "alpha-1.0.dist-info/licenses/LICENSE.txt": b"The alpha licence.\n",
    }
    beta = {
        "beta_tools/nested/deep/copy_of.py": DUPLICATE,
        "beta_tools/nested/deep/guide.rst": b"Guide\n=====\n\nNested text.\n",
        "beta_tools/NOTES.TXT": b"upper-case suffix\n",
        "beta_tools-2.0.data/scripts/tool.py": b"print('tool')\n",
    }
    return {"alpha": alpha, "beta-tools": beta}


def _write_wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


VERSIONS = {"alpha": "1.0", "beta-tools": "2.0"}


@pytest.fixture
def wheels(tmp_path) -> tuple[Path, Path]:
    """A folder with the two wheels and a manifest that pins them by their real sha256."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    lines = ["# two wheels made by the test"]
    for name, members in _members().items():
        wheel = _write_wheel(folder, name, VERSIONS[name], members)
        lines.append(f"{name}=={VERSIONS[name]} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}")
    manifest = tmp_path / "corpus.txt"
    manifest.write_text("\n".join(lines) + "\n")
    return folder, manifest


def _expected_files() -> dict[str, bytes]:
    """The corpus paths and bytes the build must keep, worked out here from the members."""
    rename = {"alpha-1.0.dist-info": "alpha.dist-info", "beta_tools-2.0.data": "beta_tools.data"}
    kept = {}
    for name, members in _members().items():
        for member, data in members.items():
            top, _, rest = member.partition("/")
            path = f"{name}/{rename.get(top, top)}/{rest}"
            if member.lower().endswith((".py", ".md", ".rst", ".txt")) and data and b"\x00" not in data:
                kept[path] = data
    del kept[
        "beta-tools/beta_tools/nested/deep/copy_of.py"
    ]  # the later path with the same bytes as alpha/alpha/copy.py
    return kept


def test_the_build_keeps_text_drops_duplicates_and_splits_by_path(wheels, tmp_path):
    folder, manifest = wheels
    built = build_wheel_corpus(folder, tmp_path / "corpus", manifest=manifest)
    listing = json.loads((tmp_path / "corpus" / "files.json").read_text())
    expected = _expected_files()
    found = {path: size for s in SPLITS for path, size in listing["files"][s]}
    assert found == {path: len(data) for path, data in expected.items()}
    assert "alpha/alpha.dist-info/licenses/LICENSE.txt" in found  # no version in the path
    assert "beta-tools/beta_tools.data/scripts/tool.py" in found
    assert "beta-tools/beta_tools/NOTES.TXT" in found
    for split in SPLITS:
        names = [path for path, _ in listing["files"][split]]
        assert names == sorted(names)
        assert all(split_of(path) == split for path in names), split
        assert built.files[split] == len(names) >= 2
    assert listing["duplicates"] == [
        ["beta-tools/beta_tools/nested/deep/copy_of.py", "alpha/alpha/copy.py", len(DUPLICATE)]
    ]
    assert (built.duplicates, built.duplicate_bytes) == (1, len(DUPLICATE))
    record = json.loads((tmp_path / "corpus" / "corpus.json").read_text())
    assert record["duplicates"]["files"] == 1 and record["duplicates"]["bytes"] == len(DUPLICATE)
    assert record["members"]["skipped"] | {"rule": None} == {"other_suffix": 4, "binary": 1, "empty": 1, "rule": None}
    assert [w["filename"] for w in record["wheels"]] == [
        "alpha-1.0-py3-none-any.whl",
        "beta_tools-2.0-py3-none-any.whl",
    ]
    assert built.wheels == read_corpus_manifest(manifest)


def test_each_split_is_its_files_in_sorted_order_and_its_sha256_is_recorded(wheels, tmp_path):
    folder, manifest = wheels
    out = tmp_path / "corpus"
    built = build_wheel_corpus(folder, out, manifest=manifest)
    record = json.loads((out / "corpus.json").read_text())
    expected = _expected_files()
    for split in SPLITS:
        data = (out / f"{split}.bin").read_bytes()
        golden = b"".join(expected[path] for path in sorted(expected) if split_of(path) == split)
        assert data == golden
        assert record["splits"][split] == {
            "bytes": len(data),
            "files": built.files[split],
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        assert built.sha256[split] == hashlib.sha256(data).hexdigest()
    assert record["bytes"] == sum(len(d) for d in expected.values())
    assert not list(out.glob("*.partial"))


def test_load_corpus_memory_maps_the_bytes_read_only(wheels, tmp_path):
    folder, manifest = wheels
    out = tmp_path / "corpus"
    built = build_wheel_corpus(folder, out, manifest=manifest)
    for verify in (False, True):
        corpus = load_corpus(out, verify=verify)
        for split in SPLITS:
            array = corpus.data[split]
            assert isinstance(array, np.memmap) and array.dtype == np.uint8
            assert not array.flags.writeable
            assert array.tobytes() == (out / f"{split}.bin").read_bytes()
            assert corpus.sha256[split] == built.sha256[split]
            assert len(corpus.files[split]) == built.files[split]
    assert corpus.source.startswith("the text of 2 pinned wheels")


def test_load_corpus_checks_sizes_and_with_verify_sha256s(wheels, tmp_path):
    folder, manifest = wheels
    out = tmp_path / "corpus"
    built = build_wheel_corpus(folder, out, manifest=manifest)
    test_bin = out / "test.bin"
    data = bytearray(test_bin.read_bytes())
    data[0] ^= 0xFF
    test_bin.write_bytes(bytes(data))
    load_corpus(out)  # same size: only verify reads the bytes
    changed = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(ValueError, match=rf"test.bin has sha256 {changed}; expected {built.sha256['test']}"):
        load_corpus(out, verify=True)
    test_bin.write_bytes(bytes(data[:-1]))
    with pytest.raises(ValueError, match=rf"test.bin has {len(data) - 1} bytes; expected {len(data)}"):
        load_corpus(out)
    with pytest.raises(FileNotFoundError, match=r"no corpus\.json; expected a directory written by `stejax lm corpus`"):
        load_corpus(tmp_path)


def test_a_wheel_with_another_sha256_is_refused_naming_the_file_and_both_hashes(wheels, tmp_path):
    folder, manifest = wheels
    wheel = folder / "beta_tools-2.0-py3-none-any.whl"
    pinned = hashlib.sha256(wheel.read_bytes()).hexdigest()
    _write_wheel(folder, "beta-tools", "2.0", {"beta_tools/other.py": b"x = 1\n"})
    found = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert found != pinned
    with pytest.raises(ValueError) as error:
        build_wheel_corpus(folder, tmp_path / "corpus", manifest=manifest)
    message = str(error.value)
    assert "beta-tools==2.0" in message and wheel.name in message
    assert f"has sha256 {found}" in message and f"expected sha256 {pinned}" in message
    assert FETCH in message
    assert not (tmp_path / "corpus").exists()  # every wheel is checked before anything is written


def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(wheels, tmp_path):
    folder, manifest = wheels
    (folder / "alpha-1.0-py3-none-any.whl").unlink()
    with pytest.raises(FileNotFoundError) as error:
        build_wheel_corpus(folder, tmp_path / "corpus", manifest=manifest)
    message = str(error.value)
    assert "corpus wheel alpha==1.0: no alpha-1.0-*.whl in" in message
    assert f"{FETCH} {manifest.as_posix()} -d {folder.as_posix()}" in message and "make corpus" in message
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build_wheel_corpus(tmp_path / "nowhere", tmp_path / "corpus", manifest=manifest)


def test_building_twice_gives_the_same_bytes(wheels, tmp_path):
    folder, manifest = wheels
    first = build_wheel_corpus(folder, tmp_path / "a", manifest=manifest)
    second = build_wheel_corpus(folder, tmp_path / "b", manifest=manifest)
    again = build_wheel_corpus(folder, tmp_path / "a", manifest=manifest)  # over an earlier build
    assert first.sha256 == second.sha256 == again.sha256
    for name in ("corpus.json", "files.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_build_corpus_on_a_built_corpus_loads_it_as_a_directory_of_those_files_would_read(wheels, tmp_path):
    folder, manifest = wheels
    out = tmp_path / "corpus"
    build_wheel_corpus(folder, out, manifest=manifest)
    # The same files as a plain directory: build_corpus reads them the old way, into memory.
    plain = tmp_path / "plain"
    for path, data in _expected_files().items():
        (plain / path).parent.mkdir(parents=True, exist_ok=True)
        (plain / path).write_bytes(data)
    total = sum(len(d) for d in _expected_files().values())
    for max_bytes in (None, total // 2, total - 40, 10**9):
        mapped, read = build_corpus(out, max_bytes=max_bytes), build_corpus(plain, max_bytes=max_bytes)
        assert mapped.files == read.files and mapped.sha256 == read.sha256
        for split in SPLITS:
            assert isinstance(mapped.data[split], np.memmap)
            assert np.array_equal(mapped.data[split], read.data[split])
    assert sum(len(f) for f in build_corpus(out, max_bytes=total // 2).files.values()) < len(_expected_files())
    # One byte keeps one file: two splits get nothing, refused as for a plain directory.
    with pytest.raises(ValueError, match=r"split\(s\) got no bytes"):
        build_corpus(plain, max_bytes=1)
    with pytest.raises(ValueError, match=r"split\(s\) got no bytes from the files within max_bytes=1;"):
        build_corpus(out, max_bytes=1)


def test_the_cli_builds_and_prints_each_split(wheels, tmp_path):
    folder, manifest = wheels
    out = tmp_path / "corpus"
    args = ["lm", "corpus", "--wheels", str(folder), "--out", str(out), "--manifest", str(manifest)]
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    built = load_corpus(out, verify=True)
    for split in SPLITS:
        row = re.search(rf"{split}\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*([0-9a-f]+)", result.output)
        assert row is not None, result.output
        assert row.groups() == (str(len(built.files[split])), str(built.data[split].size), built.sha256[split][:16])
    assert f"exact duplicates dropped: 1 file(s), {len(DUPLICATE)} bytes" in " ".join(result.output.split())
    (folder / "alpha-1.0-py3-none-any.whl").unlink()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "Error: corpus wheel alpha==1.0: no alpha-1.0-*.whl" in result.output and "Traceback" not in result.output


def test_a_malformed_manifest_line_is_refused_with_its_number(tmp_path):
    manifest = tmp_path / "corpus.txt"
    manifest.write_text("# pinned\nalpha==1.0 --hash=sha256:" + "0" * 64 + "\nbeta>=2.0\n")
    with pytest.raises(ValueError, match=r"corpus.txt line 3: 'beta>=2.0'; expected one pinned wheel"):
        read_corpus_manifest(manifest)
    manifest.write_text("alpha==1.0 --hash=sha256:" + "0" * 64 + "\nAlpha==1.1 --hash=sha256:" + "1" * 64 + "\n")
    with pytest.raises(ValueError, match="line 2: alpha is listed twice"):
        read_corpus_manifest(manifest)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_corpus_manifest(tmp_path / "missing.txt")


def test_the_committed_manifest_pins_every_wheel_by_one_sha256():
    path = ROOT / "requirements" / "corpus.txt"
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) >= 20
    for line in lines:
        assert line.count("--hash=") == 1 and line.count("--hash=sha256:") == 1, line
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][^\s=]* --hash=sha256:[0-9a-f]{64}", line), line
    wheels = read_corpus_manifest(path)
    assert len(wheels) == len(lines) == len({w.name for w in wheels})
    assert all(isinstance(w, CorpusWheel) and len(w.sha256) == 64 for w in wheels)
    assert len({w.sha256 for w in wheels}) == len(wheels)
