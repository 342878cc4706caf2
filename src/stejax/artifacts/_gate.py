"""The release gate: everything an artifact must pass before a registry makes it current."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["GateCheck", "GateReport", "estimators_used", "gate"]


@dataclasses.dataclass(frozen=True)
class GateCheck:
    """One named outcome of the gate.

    Attributes:
      name: ``"artifact"``, ``"estimator[<name>]"``, ``"regression"`` or ``"parity"``.
      passed: whether it held.
      detail: what was checked and, on failure, why it failed.
    """

    name: str
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GateReport:
    """The gate's verdict on one artifact.

    Attributes:
      path: the artifact directory.
      artifact_id: its id (None when it did not load).
      checks: the :class:`GateCheck` outcomes, in the order they ran.
    """

    path: Path
    artifact_id: str | None
    checks: tuple[GateCheck, ...]

    @property
    def passed(self) -> bool:
        """Every check passed (and there was at least one)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failures(self) -> tuple[GateCheck, ...]:
        """The checks that failed, each with why."""
        return tuple(c for c in self.checks if not c.passed)

    def summary(self) -> str:
        if self.passed:
            return f"gate passed: all {len(self.checks)} checks ({', '.join(c.name for c in self.checks)})"
        return "gate FAILED: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "artifact_id": self.artifact_id,
            "passed": self.passed,
            "checks": [c.to_dict() for c in self.checks],
        }


def estimators_used(layers: Iterable[Any]) -> tuple[str, ...]:
    """The catalog estimators a model's quantisers are built on, in first-use order.

    LSQ weights and inputs use ``lsq``; binary weights ``magnitude_aware_sign``;
    binary inputs ``sign_ste``; PACT inputs ``pact``. ``round_no_ste`` is plain ``jnp.round`` (no estimator).
    """
    names: list[str] = []
    for layer in layers:
        for method, name in (
            (layer.weights.method, {"lsq": "lsq", "sign": "magnitude_aware_sign"}),
            (layer.inputs.method, {"lsq": "lsq", "sign": "sign_ste", "pact": "pact"}),
        ):
            if method in name and name[method] not in names:
                names.append(name[method])
    return tuple(names)


@functools.lru_cache(maxsize=64)
def _estimator_report(name: str, dtypes: tuple[str, ...] | None):
    # An estimator's verification depends on its code and the dtypes only, neither
    # of which changes within a process: verify each once per process.
    from stejax.verify import check_estimator

    return check_estimator(name, dtypes=dtypes)


def gate(path: str | os.PathLike, *, estimator_dtypes: Iterable[Any] | None = None) -> GateReport:
    """Run the release gate on an artifact directory; never raises for a bad artifact, reports it.

    The checks, in order:

    * ``artifact``: :func:`load_artifact` (every hash, the safetensors headers, the contract);
    * ``estimator[<name>]``: :func:`stejax.verify.check_estimator` for each catalog
      estimator the model's quantisers use (:func:`estimators_used`), once per
      process for each estimator and set of dtypes;
    * ``regression``: :func:`stejax.regress.check` of the artifact's regression set
      (it must have one);
    * ``parity``: the exported model recomputed on the stored test inputs predicts
      the fake-quantised model's class for every example, every logit within its
      stored bound, and the recorded parity report passed.

    When the artifact does not load, the other checks are reported as not run
    (failed), so the report still names every check.

    Args:
      path: the artifact directory.
      estimator_dtypes: the dtypes for the estimator checks (default: every
        dtype :func:`stejax.verify.check_estimator` checks).

    Returns:
      A :class:`GateReport`.
    """
    from stejax.artifacts._regression import check as regress_check
    from stejax.artifacts._store import ArtifactError, load_artifact
    from stejax.export import check_parity_set

    root = Path(path)
    checks: list[GateCheck] = []
    try:
        art = load_artifact(root)
    except ArtifactError as e:
        not_run = "not run: the artifact did not load"
        return GateReport(
            root,
            None,
            (
                GateCheck("artifact", False, str(e)),
                GateCheck("estimators", False, not_run),
                GateCheck("regression", False, not_run),
                GateCheck("parity", False, not_run),
            ),
        )
    checks.append(GateCheck("artifact", True, f"{art.id}: every file's sha256, the headers and the contract verify"))

    dtypes = None if estimator_dtypes is None else tuple(str(d) for d in estimator_dtypes)
    names = estimators_used(art.model.layers)
    for name in names:
        report = _estimator_report(name, dtypes)
        checks.append(GateCheck(f"estimator[{name}]", report.ok, report.summary()))
    if not names:
        methods = sorted({layer.weights.method for layer in art.model.layers})
        checks.append(GateCheck("estimators", True, f"no catalog estimator in use (weights: {', '.join(methods)})"))

    try:
        regression = regress_check(root)
        checks.append(GateCheck("regression", regression.passed, regression.summary()))
    except ArtifactError as e:
        checks.append(GateCheck("regression", False, str(e)))

    passed, detail = check_parity_set(art.model, art.model.weights, art.evidence)
    recorded = art.manifest.get("verification", {}).get("parity", {})
    if not recorded.get("passed"):
        passed = False
        detail = f"the recorded parity report did not pass ({recorded.get('same_class')} same class); " + detail
    checks.append(GateCheck("parity", passed, detail))
    return GateReport(root, art.id, tuple(checks))
