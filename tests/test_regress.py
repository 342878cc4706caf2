"""Regression sets (stejax.regress): record beside an artifact, check with explicit per-dtype tolerances."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from artifact_runs import copy_artifact, resign
from stejax.artifacts import ArtifactError, load_artifact
from stejax.artifacts._store import sign
from stejax.export import _safetensors
from stejax.regress import TOLERANCES, check, record


def _set(root):
    return root / "regression" / "regression.json", root / "regression" / "regression.safetensors"


def _edit_set(root, edit_meta=None, edit_tensors=None):
    """Change a recorded set and re-sign it (as if it had been recorded that way)."""
    meta_path, data_path = _set(root)
    meta = json.loads(meta_path.read_text())
    if edit_tensors is not None:
        tensors, m = _safetensors.decode(data_path.read_bytes(), "set")
        tensors = edit_tensors(dict(tensors))
        data = _safetensors.encode(tensors, m)
        data_path.write_bytes(data)
        import hashlib

        meta["files"]["regression.safetensors"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if edit_meta is not None:
        edit_meta(meta)
    meta_path.write_text(json.dumps(sign(meta)))


def test_record_then_check_passes_bit_for_bit_here(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a", regression=False)
    path = record(root)
    assert path == root / "regression"
    meta = json.loads(_set(root)[0].read_text())
    names = [case["name"] for case in meta["cases"]]
    assert names == ["standard_batch", "single_example", "zeros", "normalizer_zero", "boundary", "invalid_shape"]
    assert meta["artifact_id"] == load_artifact(root).id
    assert meta["tolerances"] == TOLERANCES and meta["tolerances"]["float32"] == {"rtol": 1e-5, "atol": 1e-5}
    assert {"backend", "device", "jax", "jaxlib"} <= set(meta["environment"])
    assert meta["cases"][0]["shape"] == [32, 64] and isinstance(meta["cases"][0]["loss"], float)
    error = meta["cases"][-1]["error"]
    assert error["type"] == "ValueError" and "got shape (1, 65)" in error["message"]
    report = check(root)
    assert report.passed, report.summary()
    assert report.differences == {} and "same backend" in report.environment_note()
    assert all(c.bitwise for c in report.cases if c.name != "invalid_shape")
    assert len(report.cases) == 6
    # Loading the artifact still works: the regression set is the one directory it allows beside its files.
    load_artifact(root)


def test_boundary_rows_sit_exactly_on_ties_and_clip_edges(tmp_path):
    root = copy_artifact("w8a8", tmp_path / "a")
    meta = json.loads(_set(root)[0].read_text())
    boundary = meta["boundary"]
    assert boundary["grid"] == [-128, 127]
    hit = boundary["hit"]
    assert {-128.0, 127.0} <= set(hit) or {-129.0, 128.0} & set(hit)  # a clip edge or one beyond it
    assert sum(1 for t in hit if t % 1 == 0.5) >= 20  # many ties k + 1/2
    tensors, _ = _safetensors.decode(_set(root)[1].read_bytes(), "set")
    art = load_artifact(root)
    _, records = jax.jit(art.model.trace)(art.model.weights, jnp.asarray(tensors["boundary/inputs"]))
    v = np.asarray(records[0]["v"]).reshape(tensors["boundary/targets"].shape)
    placed = ~np.isnan(tensors["boundary/targets"])
    np.testing.assert_array_equal(v[placed], tensors["boundary/targets"][placed])
    # On a tie inside the grid the code is the even neighbour (round half to even); beyond it, the clip edge.
    codes = np.asarray(records[0]["codes"]).reshape(v.shape)[placed]
    on = v[placed]
    inside = (on % 1 == 0.5) & (on < 127)
    assert inside.sum() >= 20 and np.all(codes[inside] % 2 == 0)
    assert np.all(codes[on > 127] == 127) and np.all(codes[on < -128] == -128)


def test_record_never_overwrites(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    with pytest.raises(FileExistsError, match="regression exists; a regression set is never overwritten"):
        record(root)


def test_check_applies_the_tolerance_not_bitwise_equality(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    atol, rtol = TOLERANCES["float32"]["atol"], TOLERANCES["float32"]["rtol"]

    def nudge(by):
        def edit(tensors):
            logits = tensors["zeros/logits"].copy()
            logits[0, 0] += np.float32(by)
            tensors["zeros/logits"] = logits
            return tensors

        return edit

    _edit_set(root, edit_tensors=nudge(0.5 * atol))
    report = check(root)
    zeros = next(c for c in report.cases if c.name == "zeros")
    assert report.passed and zeros.passed and zeros.bitwise is False
    _edit_set(root, edit_tensors=nudge(10 * (atol + rtol * 10)))
    report = check(root)
    zeros = next(c for c in report.cases if c.name == "zeros")
    assert not report.passed and not zeros.passed
    assert "zeros: logits max |diff|" in zeros.detail and [c.name for c in report.failures] == ["zeros"]


def test_check_reports_a_different_backend_and_jax_version(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def elsewhere(meta):
        meta["environment"]["backend"] = "gpu"
        meta["environment"]["jaxlib"] = "0.0.1"

    _edit_set(root, edit_meta=elsewhere)
    report = check(root)
    assert report.passed
    assert report.differences["backend"] == ("gpu", jax.default_backend())
    assert report.differences["jaxlib"][0] == "0.0.1"
    assert "not bit for bit" in report.environment_note() and "backend gpu ->" in report.summary()


def test_check_fails_on_a_changed_shape(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def wider(tensors):
        tensors["standard_batch/logits"] = np.zeros((32, 11), np.float32)
        return tensors

    _edit_set(root, edit_tensors=wider)
    report = check(root)
    case = report.cases[0]
    assert not case.passed and "logits: now float32 [32, 10], recorded float32 [32, 11]" in case.detail


def test_check_fails_on_a_different_error(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def other_error(meta):
        meta["cases"][-1]["error"]["message"] = "something else"

    _edit_set(root, edit_meta=other_error)
    report = check(root)
    assert [c.name for c in report.failures] == ["invalid_shape"]
    assert "recorded 'ValueError: something else'" in report.failures[0].detail


def test_check_refuses_a_tampered_set(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    data = bytearray(_set(root)[1].read_bytes())
    data[-3] ^= 0x10
    _set(root)[1].write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"regression\.safetensors: sha256 .* the manifest says"):
        check(root)


def test_check_names_a_set_recorded_for_another_artifact(tmp_path):
    a = copy_artifact("w4a4", tmp_path / "a")
    b = copy_artifact("w8a8", tmp_path / "b", regression=False)
    report = check(b, regression=a / "regression")
    assert not report.passed
    assert report.problems[0].startswith(f"the set was recorded for artifact {load_artifact(a).id}")


def test_check_needs_a_set(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a", regression=False)
    with pytest.raises(ArtifactError, match=r"no regression set; record one with `stejax regress record"):
        check(root)


def test_an_artifact_with_a_changed_weight_fails_its_regression_set(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    path = root / "weights.safetensors"
    tensors, meta = _safetensors.decode(path.read_bytes(), "w")
    tensors = dict(tensors)
    tensors["layers/2/b"] = tensors["layers/2/b"] + np.float32(0.25)
    path.write_bytes(_safetensors.encode(tensors, meta))
    resign(root, files=("weights.safetensors",))
    report = check(root)
    assert not report.passed
    assert "recorded for artifact" in report.problems[0]
    assert {c.name for c in report.failures} >= {"standard_batch", "zeros"}


def test_check_refuses_a_set_that_lacks_standard_cases(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def weaken(meta):
        meta["cases"] = [c for c in meta["cases"] if c["name"] not in ("zeros", "boundary")]

    _edit_set(root, edit_meta=weaken)
    with pytest.raises(
        ArtifactError,
        match=r"regression\.json: the set lacks the standard case\(s\) \['zeros', 'boundary'\]; a set for this "
        r"model holds \['standard_batch', 'single_example', 'zeros', 'normalizer_zero', 'boundary', 'invalid_shape'\]",
    ):
        check(root)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda cases: cases[1].pop("name"), r"case entry 1 must be an object with a string 'name'; got \{"),
        (lambda cases: cases.__setitem__(2, "zeros"), r"case entry 2 must be an object with a string 'name'; got 'z"),
        (lambda cases: cases[0].__setitem__("error", {}), r"case entry 0 \('standard_batch'\): only 'invalid_shape'"),
        (lambda cases: cases[-1]["error"].pop("type"), r"case entry 5 \('invalid_shape'\): 'error' must be an obj"),
    ],
)
def test_check_names_a_malformed_case_entry(tmp_path, edit, message):
    root = copy_artifact("w4a4", tmp_path / "a")
    _edit_set(root, edit_meta=lambda meta: edit(meta["cases"]))
    with pytest.raises(ArtifactError, match=r"regression\.json: " + message):
        check(root)


def test_check_fails_a_case_whose_outputs_are_missing(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    _edit_set(root, edit_tensors=lambda t: {k: v for k, v in t.items() if k != "zeros/logits"})
    report = check(root)
    assert [c.name for c in report.failures] == ["zeros"]
    assert report.failures[0].detail == "zeros: the set lacks its logits"
