"""The wall time of the README's two commands, `make demo` and `make test`, recorded as a results file.

Run from the repository root, on a machine doing nothing else (after `make setup`, so that the time is the
command's own and not the installation's):

    .venv/bin/python benchmarks/make_times.py demo     # writes docs/results/make_demo.json
    .venv/bin/python benchmarks/make_times.py test     # writes docs/results/make_test.json

It runs ``make TARGET`` once and records its wall time and the CPU time of its children, with the load
average before and after (the Recorder's), so a page can say how long each command takes and under what load.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from stejax.bench.results import Figure, Recorder

RUNS = {
    "demo": "stejax demo --out demo-out: the digits QAT comparison, 7 configurations × 10 seeds, 2 workers",
    "test": "lint (ruff, mypy) beside the strict docs build, then pytest -n 2",
}


# The suite's time budget on a quiet 2-core machine (CONTRIBUTING.md).
TEST_BUDGET_S = 12 * 60


def targets(target: str, wall: float) -> dict[str, object]:
    """The target a command's wall time is judged against, with its verdict; none for ``demo``."""
    if target != "test":
        return {}
    return {"target": f"≤ {minutes(TEST_BUDGET_S)}", "met": wall <= TEST_BUDGET_S}


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(RUNS), help="the make target to time")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    name = f"make_{options.target}"
    recorder = Recorder(name, command=f"python benchmarks/make_times.py {options.target}")
    start = time.perf_counter()
    done = subprocess.run(["make", options.target], check=False)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        print(f"make {options.target} failed (exit {done.returncode}); nothing written", file=sys.stderr)
        return done.returncode
    recorder.write(
        options.results / f"{name}.json",
        rows=[
            {
                "target": f"make {options.target}",
                "runs": RUNS[options.target],
                "wall": minutes(wall),
                "user_cpu": minutes(usage.ru_utime),
                "cores": os.cpu_count(),
            }
        ],
        columns=[("target", "target"), ("runs", "what it runs"), ("wall", "wall time"), ("user_cpu", "user CPU")],
        figures={"wall": Figure(round(wall, 1), minutes(wall), **targets(options.target, wall))},
    )
    print(f"make {options.target}: {minutes(wall)} wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
