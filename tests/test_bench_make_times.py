"""benchmarks/make_times.py: the wall time's text and the suite's budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _script():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "make_times.py"
    spec = importlib.util.spec_from_file_location("make_times", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_is_judged_against_twelve_minutes_and_the_demo_against_nothing():
    script = _script()
    assert script.minutes(970.7) == "16 min 11 s" and script.minutes(59.6) == "1 min 00 s"
    assert script.targets("test", 719.0) == {"target": "≤ 12 min 00 s", "met": True}
    assert script.targets("test", 721.0) == {"target": "≤ 12 min 00 s", "met": False}
    assert script.targets("demo", 10_000.0) == {}
