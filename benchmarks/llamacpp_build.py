"""The cost of compiling llama.cpp once, as ``make llamacpp`` does, recorded as a results file.

The ``gguf`` extra's llama-cpp-python compiles llama.cpp from source while it installs (pip's wheel cache keeps
the build afterwards). This builds the pinned version's wheel into a temporary folder, bypassing the cache, with
the flags the Makefile passes, and records the wall time and the CPU time (user + system) of the build:

    .venv/bin/python benchmarks/llamacpp_build.py        # writes docs/results/llamacpp_build.json

The CPU time is the build's own; the wall time depends on the machine's other work (the load is recorded).
Needs the package index (pip downloads the source distribution).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stejax.bench.results import Figure, Recorder

ROOT = Path(__file__).resolve().parents[1]


def pinned_version(constraints: Path) -> str:
    """The ``llama-cpp-python==X`` pin of the constraints file."""
    found = re.search(r"^llama-cpp-python==(\S+)", constraints.read_text("utf-8"), re.MULTILINE)
    if found is None:
        raise SystemExit(f"llamacpp_build: expected a line 'llama-cpp-python==VERSION' in {constraints}; found none.")
    return found.group(1)


def build_flags(machine: str) -> str:
    """The compiler flags of the Makefile's ``llamacpp`` target: no AMX kernels on x86-64."""
    return "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if machine in ("x86_64", "amd64") else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    version = pinned_version(ROOT / "requirements" / "constraints.txt")
    flags = build_flags(platform.machine())
    recorder = Recorder("llamacpp_build", command="python benchmarks/llamacpp_build.py")
    with tempfile.TemporaryDirectory(prefix="llamacpp-build-") as out:
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-cache-dir"]
        command += ["--no-binary", "llama-cpp-python", "--wheel-dir", out, f"llama-cpp-python=={version}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, check=False, env={**os.environ, "CFLAGS": flags, "CXXFLAGS": flags})
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            print(f"llamacpp_build: pip wheel failed (exit {done.returncode}); nothing written", file=sys.stderr)
            return done.returncode
        wheels = list(Path(out).glob("llama_cpp_python-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"llamacpp_build: expected one llama_cpp_python wheel in {out}; found {wheels}.")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cores = os.cpu_count() or 1
    recorder.write(
        options.results / "llamacpp_build.json",
        rows=[
            {
                "package": f"llama-cpp-python {version}",
                "wall_s": wall,
                "cpu_s": cpu,
                "cores": cores,
                "cpu_s_per_core": cpu / cores,
            }
        ],
        columns=[
            ("package", "package"),
            ("wall_s", "wall s", "{:.0f}"),
            ("cpu_s", "CPU s", "{:.0f}"),
            ("cpu_s_per_core", f"CPU s / {cores} cores", "{:.0f}"),
        ],
        figures={
            "build_minutes": Figure(
                wall / 60,
                f"{wall / 60:.0f} minutes of wall time",
                note=f"on {cores} cores; the machine's load is in the file",
            ),
            "build_cpu_minutes": Figure(cpu / 60, f"{cpu / 60:.1f} CPU-minutes"),
        },
        notes=(
            "One build of llama-cpp-python's wheel from its source distribution (pip wheel, no cache), with the "
            f"Makefile's compiler flags ({flags or 'none'}): the wall time, and the CPU time (user + system) of "
            "pip and the compiler. The wall time depends on the machine's other work; the CPU time does not."
        ),
    )
    print(f"llama-cpp-python {version}: {wall / 60:.1f} min wall, {cpu / 60:.1f} CPU-min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
