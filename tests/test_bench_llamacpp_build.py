"""benchmarks/llamacpp_build.py: the pin it builds and the Makefile's flags it builds with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return benchmark_script("llamacpp_build")


def test_it_builds_the_pinned_version_with_the_makefiles_flags(tmp_path):
    script = _script()
    constraints = ROOT / "requirements" / "constraints.txt"
    pin = re.search(r"^llama-cpp-python==(\S+)", constraints.read_text("utf-8"), re.MULTILINE)
    assert pin is not None and script.pinned_version(constraints) == pin.group(1)
    makefile = (ROOT / "Makefile").read_text("utf-8")
    flags = re.search(r"^LLAMACPP_CFLAGS := .*?,(-mno-amx[^)]*)\)", makefile, re.MULTILINE)
    assert flags is not None and script.build_flags("x86_64") == flags.group(1)
    assert script.build_flags("aarch64") == ""
    (tmp_path / "c.txt").write_text("numpy==2.0\n")
    with pytest.raises(SystemExit, match="llama-cpp-python==VERSION"):
        script.pinned_version(tmp_path / "c.txt")
