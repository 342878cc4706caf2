"""The artifact command line: stejax export, stejax artifact {verify,promote,rollback,current,list}, regress."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from artifact_runs import copy_artifact, run_dir
from stejax.artifacts import load_artifact
from stejax.cli import main


class _Ran:
    """A CliRunner result with its output's whitespace folded (rich wraps lines at the terminal width)."""

    def __init__(self, result):
        self.exit_code = result.exit_code
        self.output = " ".join(result.output.split())


def _run(*args):
    return _Ran(CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False))


def test_export_verify_and_regress(tmp_path):
    out = tmp_path / "artifact"
    result = _run("export", run_dir("w2a2"), "--out", out)
    assert result.exit_code == 0, result.output
    assert "int2x4" in result.output and "1/16" in result.output
    assert "parity passed: same class 269/269 (100.00%)" in result.output
    artifact = load_artifact(out)
    sizes = artifact.file_bytes()
    total = sum(sizes.values())
    assert f"artifact {artifact.id} written to" in result.output and f": {total} B on disk" in result.output
    assert f"ships parity.safetensors, {sizes['parity.safetensors']} B of parity evidence" in result.output
    for name, n in sizes.items():
        assert re.search(rf"{re.escape(name)} │ {n} │", result.output), name
    verify = _run("artifact", "verify", out)
    assert verify.exit_code == 0 and f"verified: {artifact.id} (w2a2: hidden layers" in verify.output
    assert "w2a2: w2a2" not in verify.output
    assert _run("regress", "record", out).exit_code == 0
    check = _run("regress", "check", out)
    assert check.exit_code == 0, check.output
    assert "6 cases passed" in check.output
    again = _run("export", run_dir("w2a2"), "--out", out)
    assert again.exit_code == 1 and "exists; artifacts are never overwritten" in again.output


def test_export_refuses_an_existing_out_before_exporting(tmp_path, monkeypatch):
    def export_run(*args, **kwargs):
        raise AssertionError("export_run ran although OUT exists")

    monkeypatch.setattr("stejax.export.export_run", export_run)
    out = tmp_path / "artifact"
    out.mkdir()
    result = _run("export", run_dir("w2a2"), "--out", out)
    assert result.exit_code == 1
    assert f"{out} exists; artifacts are never overwritten. Nothing was exported." in result.output


def test_verify_exits_non_zero_on_a_tampered_artifact(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["parent"] = "0" * 64
    (root / "manifest.json").write_text(json.dumps(manifest))
    result = _run("artifact", "verify", root)
    assert result.exit_code == 1
    assert "edited after it was written" in result.output
    missing = _run("artifact", "verify", tmp_path / "nowhere")
    assert missing.exit_code == 1 and "not a directory" in missing.output


def test_regress_check_exits_non_zero_on_a_regression(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    meta_path = root / "regression" / "regression.json"
    meta = json.loads(meta_path.read_text())
    meta["cases"][-1]["error"]["message"] = "another message"
    from stejax.artifacts._store import sign

    meta_path.write_text(json.dumps(sign(meta)))
    result = _run("regress", "check", root)
    assert result.exit_code == 1 and "FAILED (invalid_shape)" in result.output


def test_a_weakened_or_malformed_regression_set_is_a_clean_cli_error(tmp_path):
    from stejax.artifacts._store import sign

    root = copy_artifact("w4a4", tmp_path / "a")
    meta_path = root / "regression" / "regression.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(sign({**meta, "cases": [c for c in meta["cases"] if c["name"] != "zeros"]})))
    weak = _run("regress", "check", root)
    assert weak.exit_code == 1
    assert "Error: ArtifactError: " in weak.output and "lacks the standard case(s) ['zeros']" in weak.output
    promoted = _run("artifact", "promote", root, "--registry", tmp_path / "registry", "--estimator-dtypes", "float32")
    assert promoted.exit_code == 1
    assert "FAILED" in promoted.output and "lacks the standard case(s) ['zeros']" in promoted.output
    meta_path.write_text(json.dumps(sign({**meta, "cases": [{"shape": [1, 64]}, *meta["cases"]]})))
    malformed = _run("regress", "check", root)
    assert malformed.exit_code == 1 and "regression.json: case entry 0 must be an object" in malformed.output
    assert "Traceback" not in malformed.output


def test_registry_commands(tmp_path):
    a = copy_artifact("w4a4", tmp_path / "a")
    b = copy_artifact("w8a8", tmp_path / "b")
    registry = tmp_path / "registry"
    typo = _run("artifact", "current", "--registry", registry)
    assert typo.exit_code == 2 and f"no registry at {registry} (no such directory)" in typo.output
    registry.mkdir()
    empty = _run("artifact", "current", "--registry", registry)
    assert empty.exit_code == 1 and "nothing promoted yet" in empty.output
    nothing = _run("artifact", "rollback", "--registry", registry)
    assert nothing.exit_code == 1 and "no previous artifact" in nothing.output
    first = _run("artifact", "promote", a, "--registry", registry, "--estimator-dtypes", "float32")
    assert first.exit_code == 0, first.output
    assert "estimator[lsq]" in first.output and "previous: none" in first.output
    second = _run("artifact", "promote", b, "--registry", registry, "--estimator-dtypes", "float32")
    assert second.exit_code == 0, second.output
    id_a, id_b = load_artifact(a).id, load_artifact(b).id
    assert id_b in _run("artifact", "current", "--registry", registry).output
    listing = _run("artifact", "list", "--registry", registry).output
    assert id_a[:12] in listing and "previous" in listing and "current" in listing
    back = _run("artifact", "rollback", "--registry", registry)
    assert back.exit_code == 0 and f"current: {id_a} (rolled back)" in back.output
    assert "retired" in _run("artifact", "list", "--registry", registry).output
    with open(registry / "events.jsonl", "ab") as f:
        f.write(b'{"time": "2025')  # a crash mid-append
    torn = _run("artifact", "list", "--registry", registry)
    assert torn.exit_code == 0 and "retired" in torn.output
    assert "line 4 (14 bytes, no newline) is torn, a write cut short; it is ignored." in torn.output
    bare = copy_artifact("w8a8", tmp_path / "bare", regression=False)
    refused = _run("artifact", "promote", bare, "--registry", registry, "--estimator-dtypes", "float32")
    assert refused.exit_code == 1
    assert "FAILED" in refused.output and "no regression set" in refused.output
    assert id_a in _run("artifact", "current", "--registry", registry).output
