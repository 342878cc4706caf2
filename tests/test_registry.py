"""The release gate and the local registry (stejax.artifacts.gate, Registry): promote, rollback, nothing deleted."""

from __future__ import annotations

import json
import textwrap

import pytest

from artifact_runs import copy_artifact, kill_at, pristine, resign
from stejax.artifacts import ArtifactError, Registry, RegistryError, estimators_used, gate, load_artifact
from stejax.export import _safetensors

DTYPES = ("float32",)


def test_gate_names_every_check(tmp_path):
    root = copy_artifact("w1a1", tmp_path / "a")
    report = gate(root, estimator_dtypes=DTYPES)
    assert report.passed, report.summary()
    names = [c.name for c in report.checks]
    assert names == [
        "artifact",
        "estimator[lsq]",
        "estimator[magnitude_aware_sign]",
        "estimator[sign_ste]",
        "regression",
        "parity",
    ]
    assert report.artifact_id == load_artifact(root).id and report.failures == ()
    assert "same class 269/269" in report.checks[-1].detail


def test_estimators_used_follow_the_quantisers():
    assert estimators_used(pristine("w4a4").model.layers) == ("lsq",)
    assert estimators_used(pristine("w1a1").model.layers) == ("lsq", "magnitude_aware_sign", "sign_ste")


def test_gate_fails_without_a_regression_set(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a", regression=False)
    report = gate(root, estimator_dtypes=DTYPES)
    assert not report.passed
    assert [c.name for c in report.failures] == ["regression"]
    assert "no regression set" in report.failures[0].detail


def test_gate_fails_on_parity_evidence_that_disagrees(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    path = root / "parity.safetensors"
    tensors, meta = _safetensors.decode(path.read_bytes(), "p")
    tensors = dict(tensors)
    logits = tensors["reference_logits"].copy()
    logits[3] = logits[3][::-1]  # another predicted class for example 3
    tensors["reference_logits"] = logits
    path.write_bytes(_safetensors.encode(tensors, meta))
    resign(root, files=("parity.safetensors",))
    # The regression set belongs to the old id now; record the gate's view of both failures.
    report = gate(root, estimator_dtypes=DTYPES)
    failed = {c.name: c.detail for c in report.failures}
    assert "parity" in failed and "example 3: class" in failed["parity"]


def test_gate_reports_an_artifact_that_does_not_load(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    (root / "manifest.json").write_text("{}")
    report = gate(root, estimator_dtypes=DTYPES)
    assert not report.passed and report.artifact_id is None
    assert report.failures[0].name == "artifact" and "format None" in report.failures[0].detail
    assert all("not run" in c.detail for c in report.failures[1:])


def test_promote_rollback_and_nothing_deleted(tmp_path):
    a = copy_artifact("w4a4", tmp_path / "a")
    b = copy_artifact("w8a8", tmp_path / "b")
    registry = Registry(tmp_path / "registry")
    assert registry.current() is None and registry.list() == ()
    first = registry.promote(a, estimator_dtypes=DTYPES)
    assert first.previous_id is None and first.gate.passed
    assert registry.current().id == first.artifact.id == load_artifact(a).id
    assert first.artifact.path == tmp_path / "registry" / "artifacts" / first.artifact.id
    second = registry.promote(b, estimator_dtypes=DTYPES)
    assert second.previous_id == first.artifact.id
    assert registry.current_id() == second.artifact.id
    assert [(e.id, e.status) for e in registry.list()] == [
        (first.artifact.id, "previous"),
        (second.artifact.id, "current"),
    ]
    back = registry.rollback()
    assert back.id == first.artifact.id == registry.current().id
    assert [(e.id, e.status) for e in registry.list()] == [
        (first.artifact.id, "current"),
        (second.artifact.id, "retired"),
    ]
    # Nothing deleted: both copies are there and verify, and the events say what happened.
    for entry in registry.list():
        assert load_artifact(entry.path).id == entry.id
        assert (entry.path / "regression" / "regression.json").exists()
    assert [e["event"] for e in registry.events()] == ["promote", "promote", "rollback"]
    assert registry.list()[0].preset == "w4a4" and registry.list()[1].promoted is not None
    with pytest.raises(RegistryError, match=r"has no previous artifact to go back to"):
        registry.rollback()
    # Promoting the retired one again makes it current, with the other as previous.
    again = registry.promote(b, estimator_dtypes=DTYPES)
    assert again.previous_id == first.artifact.id and registry.current_id() == second.artifact.id


def test_current_refuses_an_artifact_rewritten_and_resigned_after_promotion(tmp_path):
    registry = Registry(tmp_path / "registry")
    promoted = registry.promote(copy_artifact("w4a4", tmp_path / "a"), estimator_dtypes=DTYPES).artifact
    manifest = json.loads((promoted.path / "manifest.json").read_text())
    manifest["training"]["report"]["test_accuracy"] = 0.999
    (promoted.path / "manifest.json").write_text(json.dumps(manifest))
    resign(promoted.path)  # a consistent artifact again, under another id
    assert load_artifact(promoted.path).id != promoted.id
    with pytest.raises(ArtifactError, match=rf"promoted artifact {promoted.id}, but the directory now holds"):
        registry.current()


def test_promote_refuses_a_failing_artifact_and_keeps_the_current(tmp_path):
    good = copy_artifact("w4a4", tmp_path / "good")
    bare = copy_artifact("w8a8", tmp_path / "bare", regression=False)
    registry = Registry(tmp_path / "registry")
    registry.promote(good, estimator_dtypes=DTYPES)
    with pytest.raises(
        RegistryError, match=r"promote refused: .*bare: gate FAILED: regression: .*no regression set"
    ) as e:
        registry.promote(bare, estimator_dtypes=DTYPES)
    assert [c.name for c in e.value.report.failures] == ["regression"]
    tampered = copy_artifact("w8a8", tmp_path / "tampered")
    data = bytearray((tampered / "weights.safetensors").read_bytes())
    data[100] ^= 0xFF
    (tampered / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(RegistryError, match=r"gate FAILED: artifact: .*weights\.safetensors: sha256"):
        registry.promote(tampered, estimator_dtypes=DTYPES)
    assert registry.current_id() == load_artifact(good).id
    assert [e.id for e in registry.list()] == [load_artifact(good).id]
    assert [e["event"] for e in registry.events()] == ["promote", "refused", "refused"]
    with pytest.raises(RegistryError, match="is current already"):
        registry.promote(good, estimator_dtypes=DTYPES)


def test_rollback_refuses_a_previous_artifact_that_no_longer_verifies(tmp_path):
    registry = Registry(tmp_path / "registry")
    first = registry.promote(copy_artifact("w4a4", tmp_path / "a"), estimator_dtypes=DTYPES)
    second = registry.promote(copy_artifact("w8a8", tmp_path / "b"), estimator_dtypes=DTYPES)
    weights = first.artifact.path / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(ArtifactError, match=r"weights\.safetensors: \d+ bytes; the manifest says"):
        registry.rollback()
    assert registry.current_id() == second.artifact.id


_KILLED_PROMOTE = textwrap.dedent(
    """
    import sys, time
    from stejax.artifacts import Registry, _registry
    real = _registry.write_file

    def pause_after_first(path, data):
        real(path, data)
        print("COPIED", path.name, flush=True)
        time.sleep(120)

    _registry.write_file = pause_after_first
    Registry(sys.argv[1]).promote(sys.argv[2], estimator_dtypes=("float32",))
    """
)


def test_a_promote_killed_part_way_leaves_the_current_artifact_loadable_and_verified(tmp_path):
    registry = Registry(tmp_path / "registry")
    current = registry.promote(copy_artifact("w4a4", tmp_path / "a"), estimator_dtypes=DTYPES).artifact
    candidate = copy_artifact("w8a8", tmp_path / "b")
    kill_at(_KILLED_PROMOTE, [str(registry.root), str(candidate)], "COPIED")
    assert registry.current_id() == current.id
    assert [e.id for e in registry.list()] == [current.id]  # the partial copy is hidden
    hidden = [p.name for p in (registry.root / "artifacts").iterdir() if p.name.startswith(".")]
    assert len(hidden) == 1 and "copy-partial" in hidden[0]
    assert registry.current().id == current.id
    report = gate(registry.current().path, estimator_dtypes=DTYPES)
    assert report.passed, report.summary()
    # The interrupted promotion can simply be run again.
    assert registry.promote(candidate, estimator_dtypes=DTYPES).artifact.id == load_artifact(candidate).id
    state = json.loads((registry.root / "state.json").read_text())
    assert state["previous"] == [current.id]


def test_the_registry_state_is_validated(tmp_path):
    registry = Registry(tmp_path / "registry")
    registry.root.mkdir()
    (registry.root / "state.json").write_text(json.dumps({"format": "other", "current": None, "previous": []}))
    with pytest.raises(RegistryError, match=r"state\.json: expected \{format: 'stejax-registry/1'"):
        registry.current()


def test_a_torn_last_event_line_is_reported_ignored_and_appended_after(tmp_path):
    a = copy_artifact("w4a4", tmp_path / "a")
    b = copy_artifact("w8a8", tmp_path / "b")
    registry = Registry(tmp_path / "registry")
    registry.promote(a, estimator_dtypes=DTYPES)
    log = registry.root / "events.jsonl"
    before = registry.list()
    with open(log, "ab") as f:
        f.write(b'{"time": "2025')  # a crash mid-append
    assert [e["event"] for e in registry.events()] == ["promote"]
    assert registry.list() == before
    assert registry.torn_tail() == f"{log}: line 2 (14 bytes, no newline) is torn, a write cut short; it is ignored."
    registry.promote(b, estimator_dtypes=DTYPES)
    lines = log.read_bytes().split(b"\n")
    assert lines[1] == b'{"time": "2025' and json.loads(lines[2])["event"] == "torn"
    assert json.loads(lines[2])["line"] == 2 and json.loads(lines[3])["event"] == "promote"
    assert [e["event"] for e in registry.events()] == ["promote", "torn", "promote"]
    assert registry.torn_tail() is None
    assert [e.status for e in registry.list()] == ["previous", "current"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"time": "2025\n', r"line 1: not valid JSON"),
        (b"[1, 2]\n", r"line 1: expected a JSON object; got list"),
        (b'{"event": "promote", "time": "t"}\n', r"line 1: 'id' must be a string; got None"),
    ],
)
def test_a_malformed_complete_event_line_is_an_error_naming_the_line(tmp_path, line, message):
    registry = Registry(tmp_path / "registry")
    registry.root.mkdir()
    (registry.root / "events.jsonl").write_bytes(line + b'{"event": "rollback", "time": "t", "id": "x"}\n')
    with pytest.raises(RegistryError, match=r"events\.jsonl: " + message):
        registry.list()
