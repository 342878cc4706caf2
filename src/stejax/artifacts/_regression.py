"""Regression sets: small fixed inputs with their outputs and loss, stored beside an artifact, checked again later.

A set lives in ``ARTIFACT/regression/`` (``regression.json`` and
``regression.safetensors``), outside the artifact's own manifest, with its own
sha256 of each file and of its canonical JSON, and the id of the artifact it was
recorded for. The cases:

* ``standard_batch``: the first (up to) 32 test examples, with labels and loss;
* ``single_example``: the first test example alone, with its label and loss;
* ``zeros``: one all-zero raw input;
* ``normalizer_zero``: the training mean, which standardises to exactly 0 in
  every feature (ReLU's kink, the sign's tie);
* ``boundary``: rows whose first-layer grid coordinate :math:`v = x_n \\cdot s^{-1}`
  lands exactly on the input quantiser's ties (:math:`k + 1/2`) and clip edges
  (:math:`-Q_N`, :math:`Q_P`) and one step beyond them, found by searching the
  float32 neighbourhood of each target and kept only where the exported model's
  own ``v`` equals the target bit for bit (the set records how many did);
* ``invalid_shape``: an input with one feature too many, and the error it must
  raise (type and message).

:func:`check` recomputes every output with the artifact as loaded now and
compares with ``numpy.allclose`` at the per-dtype tolerances :data:`TOLERANCES`,
always: a different backend or jax/jaxlib version is reported, never assumed to
give the same bits.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.artifacts._store import (
    REGRESSION_DIR,
    Artifact,
    ArtifactError,
    check_files,
    check_integrity,
    environment,
    load_artifact,
    publish,
    read_json,
    sign,
    temp_dir_beside,
    write_file,
)
from stejax.export import _safetensors

__all__ = ["FORMAT", "TOLERANCES", "CaseResult", "RegressionReport", "check", "record"]

FORMAT = "stejax-regression/1"
SET_JSON = "regression.json"
SET_FILE = "regression.safetensors"
STANDARD_BATCH = 32
# How far (in float32 ulps of the raw value) the boundary search walks each way.
_SEARCH_ULPS = 256

# Per-dtype tolerances for np.allclose(now, recorded, rtol, atol). float32: the
# exported path's float work per logit after an exact integer sum is a few
# roundings, but a float32 layer may sum up to hundreds of products in another
# order on another backend; 1e-5 is ~80 ulps. Integers (the predicted classes)
# must be equal, except where the recorded top two logits lie within the float32
# tolerance of each other.
TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"rtol": 1e-5, "atol": 1e-5},
    "bfloat16": {"rtol": 1.6e-2, "atol": 1e-2},
    "float16": {"rtol": 2e-3, "atol": 1e-3},
    "int32": {"rtol": 0.0, "atol": 0.0},
}

# The environment fields whose change is reported.
_COMPARED = ("backend", "device", "jax", "jaxlib")


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case of a regression check.

    Attributes:
      name: the case (``"standard_batch"``, ..., ``"invalid_shape"``).
      passed: whether it held.
      detail: what was compared, at which tolerance, and the worst difference.
      bitwise: whether the outputs (and loss) are also bitwise equal (None for the error case).
    """

    name: str
    passed: bool
    detail: str
    bitwise: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RegressionReport:
    """The outcome of :func:`check`.

    Attributes:
      path: the regression set's directory.
      artifact_id: the id of the artifact checked.
      recorded_environment: where the set was recorded.
      environment: where it was checked.
      differences: ``{field: (recorded, now)}`` for backend, device, jax, jaxlib.
      cases: one :class:`CaseResult` per case, in recorded order.
      problems: set-level failures (a set recorded for another artifact, a file
        that does not verify); a report with problems does not pass.
    """

    path: Path
    artifact_id: str
    recorded_environment: dict[str, str]
    environment: dict[str, str]
    differences: dict[str, tuple[str, str]]
    cases: tuple[CaseResult, ...]
    problems: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(c for c in self.cases if not c.passed)

    def environment_note(self) -> str:
        """One sentence on the environments and how the outputs were compared."""
        if self.differences:
            changed = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.differences.items())
            return (
                f"the environment differs from the recorded one ({changed}): outputs compared with the stated "
                "per-dtype tolerances, not bit for bit"
            )
        return "same backend, device and jax/jaxlib versions as recorded: outputs compared with the stated tolerances"

    def summary(self) -> str:
        if self.problems:
            return f"regression set {self.path}: FAILED ({self.problems[0]})"
        failed = [c.name for c in self.failures]
        state = "passed" if self.passed else f"FAILED ({', '.join(failed)})"
        return f"regression set: {len(self.cases)} cases {state}; {self.environment_note()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "artifact_id": self.artifact_id,
            "passed": self.passed,
            "recorded_environment": self.recorded_environment,
            "environment": self.environment,
            "differences": {k: list(v) for k, v in self.differences.items()},
            "note": self.environment_note(),
            "cases": [c.to_dict() for c in self.cases],
            "problems": list(self.problems),
            "tolerances": TOLERANCES,
        }


# ------------------------------------------------------------------------------ the cases


def _loss(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mean softmax cross-entropy in float32 (jax.nn.log_softmax)."""
    logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.asarray(labels)[:, None], axis=1)
    return np.asarray(-jnp.mean(picked), np.float32)


def _boundary_inputs(art: Artifact) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Rows whose first-layer grid coordinates sit exactly on ties and clip edges; ``(rows, targets, info)``.

    ``targets`` is ``(rows, features)`` float32, NaN where a cell holds no target
    (it holds the training mean: standardised 0).
    """
    model = art.model
    layer = model.layers[0]
    mean = np.asarray(model.weights["normalizer"]["mean"], np.float32)
    std = np.asarray(model.weights["normalizer"]["std"], np.float32)
    empty = np.zeros((0, mean.size), np.float32)
    if layer.inputs.method not in ("lsq", "round_no_ste"):
        note = f"layer 0's input is {layer.inputs.method or 'float'}: no rounding ties to hit"
        return empty, empty, {"targets": [], "hit": [], "note": note}
    lo, hi = layer.inputs.levels
    recip = np.float32(1) / np.float32(np.asarray(model.weights["layers"][0]["a_step"]))
    # The clip edges, one step beyond them, and every rounding tie k + 1/2 from lo - 1/2 to hi + 1/2.
    targets = np.concatenate([[lo - 1, lo, hi, hi + 1], np.arange(lo, hi + 1) + 0.5]).astype(np.float32)
    load = np.zeros(mean.size, np.int64)
    cells: list[tuple[int, int, np.float32, np.float32]] = []
    for t in targets:
        # Walk the float32 raw values around mean + std * t / recip, ulp by ulp, for one
        # whose standardised value times recip is exactly t, as the exported model
        # computes it. A hit depends on the float32 grids of x, x - mean and the
        # product, so some targets have none.
        x0 = (mean.astype(np.float64) + std.astype(np.float64) * (float(t) / float(recip))).astype(np.float32)
        candidates = [x0]
        up = down = x0
        for _ in range(_SEARCH_ULPS):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            candidates += [up, down]
        xs = np.stack(candidates)
        hit = ((xs - mean) / std) * recip == t
        features = np.flatnonzero(hit.any(axis=0))
        if features.size:
            j = int(features[np.argmin(load[features])])
            cells.append((int(load[j]), j, xs[hit[:, j].argmax(), j], t))
            load[j] += 1
    n_rows = max(int(load.max()), 1)
    rows = np.tile(mean, (n_rows, 1))
    on = np.full((n_rows, mean.size), np.nan, np.float32)
    for r, j, x, t in cells:
        rows[r, j], on[r, j] = x, t
    _, records = model.compiled_trace(model.weights, jnp.asarray(rows))
    v = np.asarray(records[0]["v"]).reshape(n_rows, -1)
    placed = ~np.isnan(on)
    if not np.array_equal(v[placed], on[placed]):
        raise ArtifactError(
            "regress record: the exported model's first-layer v misses a boundary target it should hit."
        )
    hit_targets = sorted(float(t) for _, _, _, t in cells)
    info = {
        "grid": [lo, hi],
        "targets": [float(t) for t in targets],
        "hit": hit_targets,
        "note": (
            f"{len(hit_targets)} of {targets.size} first-layer targets hit exactly (clip edges {lo}, {hi}, one step "
            f"beyond, and the ties k + 1/2); the others are not reachable on the float32 grid of (x - mean) / std * "
            "(1/step)"
        ),
    }
    return rows, on, info


def _invalid_shape(art: Artifact) -> tuple[np.ndarray, dict[str, str]]:
    bad = np.zeros((1, art.model.input_shape[0] + 1), np.float32)
    try:
        art.model.compiled_apply(art.model.weights, jnp.asarray(bad))
    except (TypeError, ValueError) as e:
        return bad, {"type": type(e).__name__, "message": str(e)}
    raise ArtifactError(
        f"regress record: the model accepted an input of shape {bad.shape}; it must refuse it (a wrong shape)."
    )


def standard_cases(art: Artifact) -> tuple[str, ...]:
    """The case names :func:`record` writes for ``art``'s model, in order; :func:`check` demands all of them.

    ``boundary`` is written exactly when the first layer rounds its input (its
    search always yields at least one row, the training mean, then).
    """
    layer = art.model.layers[0]
    boundary = ("boundary",) if layer.inputs.method in ("lsq", "round_no_ste") else ()
    return ("standard_batch", "single_example", "zeros", "normalizer_zero", *boundary, "invalid_shape")


def _case_entries(meta: dict[str, Any], where: Path, expected: tuple[str, ...]) -> list[dict[str, Any]]:
    """The set's case entries, each checked for shape, refusing a set that lacks a standard case."""
    cases = meta.get("cases")
    if not isinstance(cases, list):
        raise ArtifactError(f"{where}: 'cases' must be a list of case entries; got {cases!r}.")
    for i, entry in enumerate(cases):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ArtifactError(f"{where}: case entry {i} must be an object with a string 'name'; got {entry!r}.")
        if ("error" in entry) != (entry["name"] == "invalid_shape"):
            raise ArtifactError(
                f"{where}: case entry {i} ({entry['name']!r}): only 'invalid_shape' records an 'error', and it must; "
                f"got {entry!r}."
            )
        error = entry.get("error")
        if "error" in entry and not (
            isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)
        ):
            raise ArtifactError(
                f"{where}: case entry {i} ({entry['name']!r}): 'error' must be an object with string 'type' and "
                f"'message'; got {error!r}."
            )
    names = [entry["name"] for entry in cases]
    missing = [name for name in expected if name not in names]
    if missing:
        raise ArtifactError(
            f"{where}: the set lacks the standard case(s) {missing}; a set for this model holds {list(expected)} "
            f"(it has {names}). Record a full set with `stejax regress record`."
        )
    return cases


def record(path: str | os.PathLike) -> Path:
    """Record the regression set of the artifact at ``path`` into ``path/regression/`` (atomically).

    The artifact is loaded (verified) first; each case's inputs, outputs and (for
    labelled cases) loss are computed with the jitted exported model.

    Returns:
      The regression set's directory.

    Raises:
      ArtifactError: the artifact does not verify.
      FileExistsError: a regression set exists already (it is never overwritten).
    """
    art = load_artifact(path)
    target = art.path / REGRESSION_DIR
    if target.exists():
        raise FileExistsError(f"regress record: {target} exists; a regression set is never overwritten.")
    apply = art.model.compiled_apply
    ev = art.evidence
    n = min(STANDARD_BATCH, ev.inputs.shape[0])
    mean = np.asarray(art.model.weights["normalizer"]["mean"], np.float32)
    boundary, boundary_targets, boundary_info = _boundary_inputs(art)
    cases: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        ("standard_batch", ev.inputs[:n], ev.labels[:n]),
        ("single_example", ev.inputs[:1], ev.labels[:1]),
        ("zeros", np.zeros((1, *art.model.input_shape), np.float32), None),
        ("normalizer_zero", mean[None, :], None),
    ]
    if "boundary" in standard_cases(art):
        cases.append(("boundary", boundary, None))
    tensors: dict[str, np.ndarray] = {}
    entries = []
    for name, x, labels in cases:
        logits = np.asarray(apply(art.model.weights, jnp.asarray(x)))
        tensors[f"{name}/inputs"] = np.ascontiguousarray(x, np.float32)
        tensors[f"{name}/logits"] = logits
        tensors[f"{name}/classes"] = logits.argmax(axis=1).astype(np.int32)
        entry: dict[str, Any] = {"name": name, "shape": list(x.shape), "loss": None}
        if labels is not None:
            tensors[f"{name}/labels"] = np.asarray(labels, np.int32)
            tensors[f"{name}/loss"] = _loss(logits, labels)
            entry["loss"] = float(tensors[f"{name}/loss"])
        if name == "boundary":
            entry["boundary"] = boundary_info
            tensors["boundary/targets"] = boundary_targets
        entries.append(entry)
    bad, error = _invalid_shape(art)
    tensors["invalid_shape/inputs"] = bad
    entries.append({"name": "invalid_shape", "shape": list(bad.shape), "error": error})
    data = _safetensors.encode(tensors, {"format": FORMAT})
    manifest = sign(
        {
            "format": FORMAT,
            "artifact_id": art.id,
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "environment": environment(),
            "tolerances": TOLERANCES,
            "cases": entries,
            "boundary": boundary_info,
            "files": {SET_FILE: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}},
        }
    )
    tmp = temp_dir_beside(art.path, "regression")
    try:
        write_file(tmp / SET_FILE, data)
        write_file(tmp / SET_JSON, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _compare(name: str, now: np.ndarray, then: np.ndarray) -> tuple[bool, bool, str]:
    """(passed, bitwise, detail) of ``now`` against ``then`` at the dtype's tolerance."""
    if now.shape != then.shape or now.dtype != then.dtype:
        return (
            False,
            False,
            f"{name}: now {now.dtype.name} {list(now.shape)}, recorded {then.dtype.name} {list(then.shape)}",
        )
    tol = TOLERANCES[then.dtype.name]
    bitwise = bool(np.array_equal(now.reshape(-1).view(np.uint8), then.reshape(-1).view(np.uint8)))
    ok = bool(np.allclose(now, then, rtol=tol["rtol"], atol=tol["atol"], equal_nan=False))
    diff = float(np.max(np.abs(now.astype(np.float64) - then.astype(np.float64)))) if now.size else 0.0
    return ok, bitwise, f"{name} max |diff| {diff:.3g} (rtol {tol['rtol']:g}, atol {tol['atol']:g})"


def _check_classes(now_logits: np.ndarray, rec_logits: np.ndarray, rec_classes: np.ndarray) -> tuple[bool, str]:
    now = now_logits.argmax(axis=1).astype(np.int32)
    differ = now != rec_classes
    if not differ.any():
        return True, "classes equal"
    tol = TOLERANCES["float32"]
    top2 = np.sort(rec_logits, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    ambiguous = margin <= tol["atol"] + tol["rtol"] * np.abs(top2[:, 1])
    if (differ & ~ambiguous).any():
        row = int(np.flatnonzero(differ & ~ambiguous)[0])
        return False, f"row {row}: class {int(now[row])}, recorded {int(rec_classes[row])} (margin {margin[row]:.3g})"
    return True, f"{int(differ.sum())} class(es) changed where the recorded top two logits tie within the tolerance"


def check(path: str | os.PathLike, *, regression: str | os.PathLike | None = None) -> RegressionReport:
    """Recompute the regression set of the artifact at ``path`` and compare with what was recorded.

    Args:
      path: the artifact directory (loaded and verified first).
      regression: the set's directory (default ``path/regression``). A set
        recorded for another artifact is reported as a problem.

    Returns:
      A :class:`RegressionReport`; it passes when every case is within
      :data:`TOLERANCES` and the set verifies.

    Raises:
      ArtifactError: the artifact does not verify, or there is no regression set.
    """
    art = load_artifact(path)
    root = Path(regression) if regression is not None else art.path / REGRESSION_DIR
    if not root.is_dir():
        raise ArtifactError(f"{root}: no regression set; record one with `stejax regress record {art.path}`.")
    meta = read_json(root / SET_JSON)
    here = environment()
    problems: list[str] = []
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{root / SET_JSON}: format {meta.get('format')!r}; this version reads {FORMAT!r}.")
    check_integrity(meta, root / SET_JSON)
    files = check_files(root, meta.get("files"), extra_ok=(SET_JSON,))
    try:
        tensors, _ = _safetensors.decode(files[SET_FILE], str(root / SET_FILE))
    except _safetensors.SafetensorsError as e:
        raise ArtifactError(str(e)) from None
    if meta.get("artifact_id") != art.id:
        problems.append(f"the set was recorded for artifact {meta.get('artifact_id')}; this is {art.id}")
    recorded_env = {k: str(v) for k, v in meta.get("environment", {}).items()}
    differences = {k: (recorded_env.get(k, "?"), here[k]) for k in _COMPARED if recorded_env.get(k) != here[k]}
    apply = art.model.compiled_apply
    results = []
    for entry in _case_entries(meta, root / SET_JSON, standard_cases(art)):
        name = entry["name"]
        x = tensors.get(f"{name}/inputs")
        if x is None:
            results.append(CaseResult(name, False, f"{name}: the set lacks its inputs"))
            continue
        if "error" in entry:
            results.append(_check_error(apply, art, x, entry["error"]))
            continue
        lacking = [k for k in ("logits", "classes") if f"{name}/{k}" not in tensors]
        if lacking:
            results.append(CaseResult(name, False, f"{name}: the set lacks its {' and '.join(lacking)}"))
            continue
        try:
            logits = np.asarray(apply(art.model.weights, jnp.asarray(x)))
        except (TypeError, ValueError) as e:
            results.append(CaseResult(name, False, f"{name}: the model refused the recorded input ({e})"))
            continue
        ok, bitwise, detail = _compare("logits", logits, tensors[f"{name}/logits"])
        classes_ok, classes_detail = (
            _check_classes(logits, tensors[f"{name}/logits"], tensors[f"{name}/classes"]) if ok else (True, "")
        )
        details = [detail] + ([classes_detail] if classes_detail else [])
        if f"{name}/loss" in tensors:
            loss_ok, loss_bitwise, loss_detail = _compare(
                "loss", _loss(logits, tensors[f"{name}/labels"]), tensors[f"{name}/loss"]
            )
            ok, bitwise = ok and loss_ok, bitwise and loss_bitwise
            details.append(loss_detail)
        if name == "boundary":
            _, records = art.model.compiled_trace(art.model.weights, jnp.asarray(x))
            v = np.asarray(records[0]["v"]).reshape(x.shape[0], -1)
            targets = tensors["boundary/targets"]
            placed = ~np.isnan(targets)
            hits = int((v[placed] == targets[placed]).sum())
            ok = ok and hits == int(placed.sum())
            details.append(f"{hits} of {int(placed.sum())} first-layer inputs still exactly on their tie or clip edge")
        results.append(CaseResult(name, ok and classes_ok, f"{name}: " + "; ".join(details), bitwise))
    return RegressionReport(
        path=root,
        artifact_id=art.id,
        recorded_environment=recorded_env,
        environment=here,
        differences=differences,
        cases=tuple(results),
        problems=tuple(problems),
    )


def _check_error(apply, art: Artifact, x: np.ndarray, expected: dict[str, str]) -> CaseResult:
    want = f"{expected['type']}: {expected['message']}"
    try:
        apply(art.model.weights, jnp.asarray(x))
    except (TypeError, ValueError) as e:
        got = f"{type(e).__name__}: {e}"
        return CaseResult("invalid_shape", got == want, f"invalid_shape: raised {got!r}; recorded {want!r}")
    return CaseResult("invalid_shape", False, f"invalid_shape: shape {list(x.shape)} was accepted; recorded {want!r}")
