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

On an accelerator the suite's time is mostly XLA compilation, and many tests build a program an earlier test
compiled already: the run compiles each distinct program once and shares its executable in memory
(:class:`SharedPrograms`; ``--compile-every-program`` compiles every one).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

MODULES = (
    "tests/test_platform.py",
    "tests/test_core.py",
    "tests/test_binary.py",
    "tests/test_latent.py",
    "tests/test_products.py",
    "tests/test_int_products.py",
    "tests/test_verify.py",
    "tests/test_verify_broken.py",
    "tests/test_flax_rules.py",
    "tests/test_lm.py",
    "tests/test_lm_decode.py",
    "tests/test_lm_kernels.py",
    "tests/test_snn.py",
    "tests/test_vq.py",
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
    compilation cache, ``shared`` those given the executable of the same program compiled earlier in the run
    (:class:`SharedPrograms`), ``compiles`` the rest, which XLA compiled. Feed it JAX's monitoring events with
    :meth:`listen` and :meth:`listen_event`.
    """

    def __init__(self) -> None:
        self.outcome: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.failure: dict[str, str] = {}
        self.seconds: collections.Counter[str] = collections.Counter()
        self.collected: list[str] = []
        self.module = "(collection)"
        self.programs: collections.Counter[str] = collections.Counter()
        self.compile_seconds: collections.Counter[str] = collections.Counter()
        self.cache_hits: collections.Counter[str] = collections.Counter()
        self.shared: collections.Counter[str] = collections.Counter()

    def listen(self, event: str, duration_secs: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            self.programs[self.module] += 1
            self.compile_seconds[self.module] += duration_secs

    def listen_event(self, event: str, **_: Any) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits[self.module] += 1

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.module = nodeid.split("::", 1)[0]

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
                    "compiles": self.programs[module] - self.cache_hits[module] - self.shared[module],
                    "compile_seconds": round(self.compile_seconds[module], 1),
                    "cache_hits": self.cache_hits[module],
                    "shared": self.shared[module],
                    "failures": {n: m for n, m in sorted(self.failure.items()) if n.split("::", 1)[0] == module},
                }
            )
        return rows


class SharedPrograms:
    """Within one run, XLA compiles each distinct program once: a program compiled again is the same executable.

    Many tests build their own functions (fresh closures, fresh ``jax.jit``) that lower to a program an earlier
    test compiled already. XLA compiles a program to the same executable every time: it depends only on the
    program, the compile options, the backend and the devices, which is what JAX's persistent compilation cache
    keys its entries by (here with the source locations too, so that a shared executable is the very one the
    program compiles to, names and all). Inside ``with SharedPrograms():`` JAX's compile step
    (``jax._src.compiler.compile_or_get_cached``) is wrapped: a program with the key of one compiled before in the
    block gets that executable back, held in memory. Nothing is serialised, compressed or written (on a TPU,
    writing each executable to JAX's on-disk cache costs about what compiling it does), and nothing outlives the
    block. A program with host callbacks, or compiled with a profile, is compiled as JAX would. :attr:`shared`
    counts the
    compilations saved.
    """

    def __init__(self, counter: Counter | None = None) -> None:
        self.executables: dict[tuple[str, tuple[int, ...]], Any] = {}
        self.shared = 0
        self.counter = counter

    def __enter__(self) -> SharedPrograms:
        from jax._src import cache_key, compilation_cache, compiler
        from jax._src import config as jax_config

        self._original = original = compiler.compile_or_get_cached

        def compile_once(backend, computation, devices, compile_options, host_callbacks, *rest, **kwargs):
            profiled = any(a is not None for a in rest[1:]) or kwargs.get("pgle_profiler") is not None
            key = None
            if not host_callbacks and not profiled:
                try:
                    with jax_config.compilation_cache_include_metadata_in_key(True):
                        digest = compilation_cache.get_cache_key(
                            computation, devices, compile_options, backend, cache_key.IgnoreCallbacks.NO
                        )
                    key = (digest, tuple(d.id for d in devices.flat))
                except Exception:  # a program JAX cannot key: compiled as JAX would
                    key = None
            if key is not None and key in self.executables:
                self.shared += 1
                if self.counter is not None:
                    self.counter.shared[self.counter.module] += 1
                return self.executables[key]
            executable = original(backend, computation, devices, compile_options, host_callbacks, *rest, **kwargs)
            if key is not None:
                self.executables[key] = executable
            return executable

        compiler.compile_or_get_cached = compile_once
        return self

    def __exit__(self, *exc: object) -> None:
        from jax._src import compiler

        compiler.compile_or_get_cached = self._original
        self.executables.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None, metavar="DIR", help="write DIR/device_suite.json")
    parser.add_argument(
        "--compile-every-program",
        action="store_true",
        help="compile a program again when a test builds it again (by default the run compiles each program once)",
    )
    options, extra = parser.parse_known_args(argv)
    import jax

    from stejax.bench.results import Figure, Recorder
    from stejax.verify import measure_platform, platform_contract

    flags = [*(["--compile-every-program"] if options.compile_every_program else []), *extra]
    command = "make test-device" + (f" (python benchmarks/device_suite.py {' '.join(flags)})" if flags else "")
    recorder = Recorder("device_suite", command=command)
    counter = Counter()
    shared = SharedPrograms(counter)
    jax.monitoring.register_event_duration_secs_listener(counter.listen)
    jax.monitoring.register_event_listener(counter.listen_event)
    start = time.perf_counter()
    with contextlib.nullcontext() if options.compile_every_program else shared:
        status = pytest.main([*PYTEST_ARGS, *extra, *MODULES], plugins=[counter])
    wall = time.perf_counter() - start
    rows = counter.rows()
    totals = {k: sum(r[k] for r in rows) for k in ("tests", "passed", "failed", "selected_out", "not_run")}
    programs, hits = sum(counter.programs.values()), sum(counter.cache_hits.values())
    compiles = programs - hits - shared.shared
    # An interrupted run has neither shown 0 failures nor finished in time.
    complete = status != pytest.ExitCode.INTERRUPTED and totals["not_run"] == 0
    share = (totals["passed"] + totals["failed"]) / totals["tests"] if totals["tests"] else 0.0
    reasons = sorted({r for r in counter.reason.values() if r})
    print(
        f"{jax.default_backend()}: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['selected_out']} selected out, {totals['not_run']} not run of {totals['tests']} in {wall:.0f} s; "
        f"{programs} programs: {compiles} compiled, {shared.shared} shared, {hits} read from the disk cache "
        f"({sum(counter.compile_seconds.values()):.0f} s)"
    )
    for row in rows:
        print(
            f"  {row['module']}: {row['seconds']:.0f} s, {row['programs']} programs: {row['compiles']} compiled, "
            f"{row['shared']} shared, {row['cache_hits']} read from the disk cache ({row['compile_seconds']:.0f} s)"
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
                + (
                    "Every program was compiled, however often the tests built it. "
                    if options.compile_every_program
                    else f"A program built again in the run was compiled once and its executable shared, held in "
                    f"memory for this run only ({shared.shared:,} of {programs:,} programs; nothing carries across "
                    f"runs). "
                )
                + f"Programs: {programs:,}; compiled by XLA: {compiles:,}; read from JAX's persistent cache: "
                f"{hits:,}. " + f"Selected out, with reasons: {'; '.join(reasons) or 'none'}. The platform contract "
                f"applied: {contract.to_dict()}. Measured against XLA:CPU in the same process: "
                f"{measure_platform()}."
            ),
        )
    return int(status)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
