"""What diagnose found: one outcome per stage, and the first failure with its reason."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "Report", "StageResult"]

# The stages in the order they run: the eager pipeline (jit disabled), then the
# transformations added back one at a time.
STAGES: tuple[str, ...] = ("data", "keys", "shapes", "forward", "loss", "gradients", "update", "jit", "vmap", "grad")

PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"


@dataclasses.dataclass(frozen=True)
class StageResult:
    """The outcome of one stage.

    Attributes:
      stage: one of :data:`STAGES`.
      status: ``"passed"``, ``"failed"`` or ``"not run"`` (after an earlier failure).
      what: what the stage checked, one sentence.
      why: what it found: the reason for a failure, or notes on a pass.
      seconds: the stage's wall time.
    """

    stage: str
    status: str
    what: str
    why: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclasses.dataclass(frozen=True)
class Report:
    """The outcome of :func:`stejax.diagnose.diagnose`.

    Attributes:
      pipeline: the pipeline's name.
      first_failure: the first stage that failed (one of :data:`STAGES`), or None.
      why: the reason for the first failure ("" when all passed).
      nan_origin: for a failure with a NaN or infinity, the operation that made the
        first one (from a re-run under ``jax.debug_nans``), else None.
      stages: every stage's :class:`StageResult`, in order.
      examples: the number of examples of the batch the stages ran on.
      tolerances: the tolerances of the transformation stages, per dtype.
    """

    pipeline: str
    first_failure: str | None
    why: str
    nan_origin: str | None
    stages: tuple[StageResult, ...]
    examples: int
    tolerances: dict[str, dict[str, float]]

    @property
    def ok(self) -> bool:
        """True when every stage passed."""
        return self.first_failure is None

    def stage(self, name: str) -> StageResult:
        """The result of the stage ``name``."""
        for result in self.stages:
            if result.stage == name:
                return result
        raise KeyError(f"no stage {name!r}; the stages are {list(STAGES)}.")

    def summary(self) -> str:
        """One paragraph: the verdict and, on failure, the stage and the reason."""
        if self.ok:
            return f"{self.pipeline}: all {len(self.stages)} stages passed on {self.examples} example(s)."
        text = f"{self.pipeline}: the first failure is at stage '{self.first_failure}': {self.why}"
        if self.nan_origin:
            text += f" Origin: {self.nan_origin}."
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (format ``stejax-diagnose/1``)."""
        return {
            "format": "stejax-diagnose/1",
            "pipeline": self.pipeline,
            "ok": self.ok,
            "first_failure": self.first_failure,
            "why": self.why,
            "nan_origin": self.nan_origin,
            "examples": self.examples,
            "tolerances": self.tolerances,
            "stages": [dataclasses.asdict(s) for s in self.stages],
        }

    def to_markdown(self) -> str:
        """The report as Markdown: the verdict, then one table row per stage."""
        lines = [f"# stejax diagnose: {self.pipeline}", "", self.summary(), ""]
        lines += ["| stage | outcome | checked | found |", "|---|---|---|---|"]
        for s in self.stages:
            cells = [s.stage, s.status, s.what, s.why or ""]
            lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
        tol = ", ".join(f"{k}: rtol {v['rtol']:g}, atol {v['atol']:g}" for k, v in self.tolerances.items())
        lines += ["", f"Tolerances of jit, vmap and grad against eager: {tol}; integer and key leaves exact."]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``diagnose.json`` and ``diagnose.md`` into ``out_dir`` (created); return both paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path, md_path = out / "diagnose.json", out / "diagnose.md"
        json_path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        md_path.write_text(self.to_markdown(), encoding="utf-8")
        return json_path, md_path
