"""The digits comparison's acceptance targets, judged in its report (``stejax compare``).

They are the project's own bar for its reference pipeline, not part of the library:
:func:`stejax.train.compare` evaluates them on its summary and writes the result into
``report.json`` and ``report.md`` (``targets``, ``targets_set_for``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["TARGETS", "TARGETS_SET_FOR", "Target"]


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of the comparison, as data.

    Attributes:
      name: the target as the report states it.
      preset: the configuration it is about.
      kind: ``"at_least"`` (mean test accuracy >= ``threshold`` percent),
        ``"at_most"`` (mean test accuracy <= ``threshold`` percent), ``"delta"``
        (the mean over seeds of the paired difference, this configuration's
        test accuracy minus float's on the same seed and split, >= ``threshold``
        percentage points; ``threshold`` is negative, scoring above float meets
        it) or ``"step_ratio"`` (the median of the per-round ratios of this
        configuration's step time over float's, interleaved, <= ``threshold``).
      threshold: the bound, in the unit ``kind`` says.
    """

    name: str
    preset: str
    kind: str
    threshold: float

    def evaluate(self, summary: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Judge the target on a comparison's summary.

        Returns:
          ``{"target", "preset", "value", "unit", "measured", "met"}``: the value in
          its unit (percent, percentage points float minus the configuration, or
          times float's step), a sentence ``measured`` for the report, and ``met``;
          ``met`` is None (and ``value`` None) when a needed configuration was not run.
        """
        out: dict[str, Any] = {"target": self.name, "preset": self.preset, "value": None, "met": None}
        needs = [self.preset] + (["float"] if self.kind in ("delta", "step_ratio") and self.preset != "float" else [])
        if any(p not in summary for p in needs):
            return {**out, "unit": "", "measured": f"not run (needs {', '.join(needs)})"}
        mine = summary[self.preset]
        # A hair of slack so that a value equal to the bound in decimal is not
        # refused for its binary rounding.
        eps = 1e-9
        if self.kind in ("at_least", "at_most"):
            value = 100 * mine["test_accuracy_mean"]
            met = value >= self.threshold - eps if self.kind == "at_least" else value <= self.threshold + eps
            return {**out, "value": value, "unit": "%", "measured": f"{value:.2f}%", "met": met}
        if self.kind == "delta":
            value = mine["delta_vs_float_mean"]
            ci = mine.get("delta_vs_float_ci95")
            interval = f" (95% CI {ci[0]:+.2f} to {ci[1]:+.2f})" if ci is not None else " (one seed: no interval)"
            measured = f"{value:+.2f} points vs float{interval}"
            return {**out, "value": value, "unit": "points", "measured": measured, "met": value >= self.threshold - eps}
        value = mine["step_ratio_vs_float_p50"]
        return {
            **out,
            "value": value,
            "unit": "x float",
            "measured": f"{value:.3f} x float",
            "met": value <= self.threshold + eps,
        }


TARGETS: tuple[Target, ...] = (
    Target("float >= 98%", "float", "at_least", 98.0),
    Target("w8a8 paired delta vs float >= -0.2 points", "w8a8", "delta", -0.2),
    Target("w4a4 paired delta vs float >= -0.3 points", "w4a4", "delta", -0.3),
    Target("w2a2 paired delta vs float >= -0.5 points", "w2a2", "delta", -0.5),
    Target("w1a32 paired delta vs float >= -0.5 points", "w1a32", "delta", -0.5),
    Target("w1a1 paired delta vs float >= -1.5 points", "w1a1", "delta", -1.5),
    Target("w4a4_no_ste at or below 25%", "w4a4_no_ste", "at_most", 25.0),
    Target("w4a4 step <= 1.10 x float step", "w4a4", "step_ratio", 1.10),
)

# What the targets were set for: the default recipe, a split per seed, 10 seeds.
TARGETS_SET_FOR = (
    "the default recipe (TrainConfig(): the CNN 32-64 on the 8x8 digits), a split per seed, mean over 10 seeds"
)
