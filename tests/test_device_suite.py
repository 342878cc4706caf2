"""The device suite's runner (benchmarks/device_suite.py): each module's XLA compilations counted."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _suite():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device_suite.py"
    spec = importlib.util.spec_from_file_location("device_suite", path)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    return suite


def test_the_counter_gives_each_module_its_compilations():
    suite = _suite()
    counter = suite.Counter()
    counter.listen(suite.COMPILE_EVENT, 0.5)
    counter.pytest_runtest_logstart("tests/test_a.py::one", None)
    counter.listen(suite.COMPILE_EVENT, 0.25)
    counter.listen(suite.COMPILE_EVENT, 0.25)
    counter.listen("/jax/some/other/event", 3.0)
    counter.listen_event(suite.CACHE_HIT_EVENT)
    counter.pytest_collection_finish(type("S", (), {"items": [type("I", (), {"nodeid": "tests/test_a.py::one"})]}))
    (row,) = counter.rows()
    assert counter.programs == {"(collection)": 1, "tests/test_a.py": 2}
    assert counter.test_programs == {"(collection)": 1, "tests/test_a.py::one": 2}
    assert {k: row[k] for k in ("programs", "compiles", "cache_hits", "compile_seconds")} == {
        "programs": 2,
        "compiles": 1,
        "cache_hits": 1,
        "compile_seconds": 0.5,
    }
