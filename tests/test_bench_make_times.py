"""benchmarks/make_times.py: the wall time's text and the suite's budget."""

from __future__ import annotations

from helpers import benchmark_script


def _script():
    return benchmark_script("make_times")


def test_the_suite_is_judged_against_twelve_minutes_and_the_demo_against_nothing():
    script = _script()
    assert script.minutes(970.7) == "16 min 11 s" and script.minutes(59.6) == "1 min 00 s"
    assert script.targets("test", 719.0) == {"target": "≤ 12 min 00 s", "met": True}
    assert script.targets("test", 721.0) == {"target": "≤ 12 min 00 s", "met": False}
    assert script.targets("demo", 10_000.0) == {}
