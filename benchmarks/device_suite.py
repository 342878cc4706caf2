"""The numerics test suite on an accelerator, in one process, counted: `make test-device`.

Run from the repository root, with the JAX of the accelerator installed (a TPU or GPU build):

    python benchmarks/device_suite.py [--results DIR] [pytest options]

It runs the modules that exercise numerics (:data:`MODULES`: every estimator family through the verifier, the
verifier and its mutants, the platform contract, integer training products, the NNX rules, the language model's
training step and decoding with its compiled Pallas kernels, spiking networks and vector quantisation) on the device
JAX picks, in one process (one program at a time holds a TPU), with the suite's own warning policy. Tests that need
what the device lacks (float64 on a TPU) are selected out with their reason; see ``tests/conftest.py``. With
``--results DIR`` it writes ``DIR/device_suite.json``: per module the tests run, passed, failed and selected out,
the time, the programs the module built and how many XLA compiled, and each failure's test id and message. The
exit status is pytest's.

On an accelerator the suite's time is mostly XLA compilation: the per-module count of compiled programs says where
it goes.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# The estimators, spiking networks and vector quantisation first, the compiled language-model kernels last.
MODULES = (
    "tests/test_platform.py",
    "tests/test_core.py",
    "tests/test_binary.py",
    "tests/test_latent.py",
    "tests/test_snn.py",
    "tests/test_vq.py",
    "tests/test_lowbit_matmul.py",
    "tests/test_lowbit_products.py",
    "tests/test_verify.py",
    "tests/test_verify_broken.py",
    "tests/test_flax_rules.py",
    "tests/test_lm.py",
    "tests/test_lm_decode.py",
    "tests/test_lowbit_kernels.py",
)
# Without xdist (one process holds the chip) and without the run's extra options for it.
PYTEST_ARGS = ("-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=-ra --strict-markers --import-mode=importlib")
# JAX's monitoring events: a program compiled by XLA, and one read from the persistent compilation cache instead.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class Counter:
    """A pytest plugin that counts each test's outcome and time per module, and the module's XLA compilations.

    A program to compile counts for the module of the test being set up, run or torn down (one before the first
    test counts for ``(collection)``): ``programs`` all of them, ``cache_hits`` those read from JAX's persistent
    compilation cache, ``compiles`` the rest, which XLA compiled, and ``compile_seconds`` the time of all of them.
    Feed it JAX's monitoring events with :meth:`listen` and :meth:`listen_event`.
    """

    def __init__(self) -> None:
        self.outcome: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.failure: dict[str, str] = {}
        self.seconds: collections.Counter[str] = collections.Counter()
        self.collected: list[str] = []
        self.module = "(collection)"
        self.test = "(collection)"
        self.test_programs: collections.Counter[str] = collections.Counter()
        self.names: collections.Counter[str] = collections.Counter()
        self.name_seconds: collections.Counter[str] = collections.Counter()
        self.programs: collections.Counter[str] = collections.Counter()
        self.compile_seconds: collections.Counter[str] = collections.Counter()
        self.cache_hits: collections.Counter[str] = collections.Counter()
        self.gc_seconds = 0.0
        self._gc_start = 0.0

    def collecting(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` entry: adds up the time the garbage collector runs."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_start

    def listen(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            name = str(kwargs.get("fun_name", "?"))
            self.names[name] += 1
            self.name_seconds[name] += duration_secs
            self.programs[self.module] += 1
            self.test_programs[self.test] += 1
            self.compile_seconds[self.module] += duration_secs

    def listen_event(self, event: str, **_: Any) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits[self.module] += 1

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.module = nodeid.split("::", 1)[0]
        self.test = nodeid

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.skipped:
            self.outcome[report.nodeid] = "selected_out"
            self.reason[report.nodeid] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        elif report.failed:
            self.outcome[report.nodeid] = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            self.failure[report.nodeid] = f"{report.when}: {' '.join(message.split())[:300]}"
        elif report.when == "call" and report.nodeid not in self.outcome:
            self.outcome[report.nodeid] = "passed"

    def rows(self) -> list[dict[str, Any]]:
        """One row per module collected; a test with no outcome (the run stopped first) counts as not run."""
        per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for nodeid in self.collected:
            per[nodeid.split("::", 1)[0]]["not_run"] += nodeid not in self.outcome
        for nodeid, outcome in self.outcome.items():
            per[nodeid.split("::", 1)[0]][outcome] += 1
        rows = []
        for module in sorted(per, key=lambda m: MODULES.index(m) if m in MODULES else len(MODULES)):
            c = per[module]
            total = sum(c.values())
            rows.append(
                {
                    "module": module,
                    "tests": total,
                    "passed": c["passed"],
                    "failed": c["failed"],
                    "selected_out": c["selected_out"],
                    "not_run": c["not_run"],
                    "run_share": (c["passed"] + c["failed"]) / total if total else 0.0,
                    "seconds": round(self.seconds[module], 1),
                    "programs": self.programs[module],
                    "compiles": self.programs[module] - self.cache_hits[module],
                    "compile_seconds": round(self.compile_seconds[module], 1),
                    "cache_hits": self.cache_hits[module],
                    "failures": {n: m for n, m in sorted(self.failure.items()) if n.split("::", 1)[0] == module},
                }
            )
        return rows


class FreezeBetweenModules:
    """A pytest plugin that takes what the modules run so far left alive out of the garbage collector's passes.

    The process's heap grows with every module (compiled programs, traced functions, fixtures' results) and each
    of the collector's full passes walks all of it again. At each module's first test, ``gc.freeze()`` moves
    everything alive into the permanent generation, so later passes walk only what later modules make. What is
    garbage at that instant (a cycle not yet collected) stays until the process ends.
    """

    def __init__(self) -> None:
        self.module = ""

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        module = nodeid.split("::", 1)[0]
        if module != self.module:
            self.module = module
            gc.freeze()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None, metavar="DIR", help="write DIR/device_suite.json")
    options, extra = parser.parse_known_args(argv)
    import jax

    from stejax.bench.results import Figure, Recorder
    from stejax.verify import measure_platform, platform_contract

    command = "make test-device" + (f" (python benchmarks/device_suite.py {' '.join(extra)})" if extra else "")
    recorder = Recorder("device_suite", command=command)
    counter = Counter()
    jax.monitoring.register_event_duration_secs_listener(counter.listen)
    jax.monitoring.register_event_listener(counter.listen_event)
    gc.callbacks.append(counter.collecting)
    start = time.perf_counter()
    status = pytest.main([*PYTEST_ARGS, *extra, *MODULES], plugins=[counter, FreezeBetweenModules()])
    wall = time.perf_counter() - start
    rows = counter.rows()
    totals = {k: sum(r[k] for r in rows) for k in ("tests", "passed", "failed", "selected_out", "not_run")}
    programs, hits = sum(counter.programs.values()), sum(counter.cache_hits.values())
    compiles = programs - hits
    # An interrupted run has neither shown 0 failures nor finished in time.
    complete = status != pytest.ExitCode.INTERRUPTED and totals["not_run"] == 0
    share = (totals["passed"] + totals["failed"]) / totals["tests"] if totals["tests"] else 0.0
    reasons = sorted({r for r in counter.reason.values() if r})
    print(
        f"{jax.default_backend()}: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['selected_out']} selected out, {totals['not_run']} not run of {totals['tests']} in {wall:.0f} s; "
        f"{programs} programs: {compiles} compiled, {hits} read from the persistent cache "
        f"({sum(counter.compile_seconds.values()):.0f} s); garbage collection {counter.gc_seconds:.0f} s"
    )
    print("The programs built most often, by name:")
    for name, n in counter.names.most_common(30):
        print(f"  {n:5d} {counter.name_seconds[name]:7.1f} s  {name}")
    print("The tests that built the most programs (a module-scoped fixture counts for its first test):")
    for nodeid, n in counter.test_programs.most_common(30):
        print(f"  {n:5d} {nodeid}")
    for row in rows:
        print(
            f"  {row['module']}: {row['seconds']:.0f} s, {row['programs']} programs: {row['compiles']} compiled, "
            f"{row['cache_hits']} read from the persistent cache ({row['compile_seconds']:.0f} s)"
        )
    if options.results is not None:
        contract = platform_contract()
        recorder.write(
            options.results / "device_suite.json",
            rows=rows,
            columns=[
                ("module", "module"),
                ("tests", "tests"),
                ("passed", "passed"),
                ("failed", "failed"),
                ("selected_out", "selected out"),
                ("not_run", "not run"),
                ("seconds", "s", "{:.0f}"),
                ("compiles", "compilations"),
            ],
            figures={
                "passed": Figure(totals["passed"], f"{totals['passed']:,} passed"),
                "failed": Figure(
                    totals["failed"], f"{totals['failed']} failed", target="0", met=complete and totals["failed"] == 0
                ),
                "selected_out": Figure(totals["selected_out"], f"{totals['selected_out']} selected out"),
                "not_run": Figure(totals["not_run"], f"{totals['not_run']} not run", target="0", met=complete),
                "compiles": Figure(compiles, f"{compiles:,} compilations of {programs:,} programs"),
                "run_share": Figure(
                    round(share, 3), f"{share:.1%} of the tests run", target=">= 80%", met=share >= 0.8
                ),
                "wall_minutes": Figure(
                    round(wall / 60, 1), f"{wall / 60:.1f} min", target="<= 10 min", met=complete and wall <= 600
                ),
            },
            notes=(
                f"One process on {jax.devices()[0].device_kind} ({jax.default_backend()}); "
                + (
                    "the run was interrupted at its time limit: the tests it did not reach count as not run. "
                    if status == pytest.ExitCode.INTERRUPTED
                    else "no test aborted the process. "
                )
                + f"Programs: {programs:,}; compiled by XLA: {compiles:,}; read from JAX's persistent cache: "
                f"{hits:,}. Garbage collection: {counter.gc_seconds:.0f} s (what each module leaves alive is "
                "frozen at the next module's first test). "
                f"Selected out, with reasons: {'; '.join(reasons) or 'none'}. "
                f"The platform contract applied: {contract.to_dict()}. "
                f"Measured against XLA:CPU in the same process: {measure_platform()}."
            ),
        )
    return int(status)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
