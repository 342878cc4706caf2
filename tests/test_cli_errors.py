"""Bad input files: every command answers with one line naming the file and the problem, exit code 2.

Exit code 2 means the input could not be read as what it should be (a truncated or
pickled safetensors file, broken JSON, the wrong kind of directory); exit code 1 is
kept for a check's verdict on an input that was read (a failed verification, gate,
regression or diagnosis).
"""

from __future__ import annotations

import pickle
import re
import shutil
import signal
import threading

import pytest
from click.testing import CliRunner

from artifact_runs import copy_artifact, run_dir
from stejax.cli import main


def _run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    # An uncaught exception would be in result.exception with a traceback; a clean error is SystemExit.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def _pickle(path):
    path.write_bytes(pickle.dumps({"layers/0/w": [[0.0]]}, protocol=4))


def _break_json(path):
    path.write_text('{"mean": [0.0, 1.0', encoding="utf-8")


CORRUPTIONS = {
    "truncated params": ("params.safetensors", _truncate, r"params\.safetensors: the safetensors header length is"),
    "pickled params": ("params.safetensors", _pickle, r"params\.safetensors: a pickle \(protocol 4\), not safetensors"),
    "broken normalizer": ("normalizer.json", _break_json, r"normalizer\.json: not valid JSON \(.* at line 1, column"),
    "broken config": ("config.json", _break_json, r"config\.json: not valid JSON"),
    "missing config": ("config.json", lambda p: p.unlink(), r"config\.json: no such file; expected a run's config"),
}


@pytest.fixture(scope="module")
def run():
    return run_dir("w2a2")


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("command", ["export", "diagnose"])
def test_a_corrupted_run_directory(corruption, command, run, tmp_path):
    name, corrupt, match = CORRUPTIONS[corruption]
    bad = shutil.copytree(run, tmp_path / "run")
    corrupt(bad / name)
    args = ("export", bad, "--out", tmp_path / "art") if command == "export" else ("diagnose", bad)
    result = _run(*args)
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert str(bad) in line
    assert re.search(match, line), line
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize("command", ["export", "diagnose"])
def test_an_artifact_directory_where_a_run_directory_is_expected(command, tmp_path):
    artifact = copy_artifact("w2a2", tmp_path / "artifact")
    args = ("export", artifact, "--out", tmp_path / "art") if command == "export" else ("diagnose", artifact)
    result = _run(*args)
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert f"{artifact}: an artifact directory (it holds manifest.json), not a run directory" in line


def test_a_missing_user_module_file_for_verify(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _run("verify", "./nothere.py:f", "--reference", "./nothere.py:r", "--derivative", "./nothere.py:d")
    assert result.exit_code == 2
    assert "nothere.py: does not exist" in result.output and "Traceback" not in result.output


def test_serve_exits_with_the_reason_when_the_start_up_artifact_is_refused(tmp_path, monkeypatch):
    # Right after `stejax export`: no regression set, so the gate refuses it; without admin endpoints
    # nothing could replace it, so serve stops instead of answering /readyz 503 for ever.
    import uvicorn

    monkeypatch.delenv("STEJAX_ADMIN_TOKEN", raising=False)
    # The real server, without uvicorn's logging configuration: that would bind handlers to the
    # CliRunner's captured stream, which is closed when the command returns.
    real_run = uvicorn.run

    def run_at_most_two_minutes(app, **kwargs):
        # Without the fix the server would run for ever: stop it, and the exit code says so.
        def stop():
            server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
            if server is not None:
                server.should_exit = True

        watchdog = threading.Timer(120, stop)
        watchdog.start()
        try:
            real_run(app, **kwargs, log_config=None)
        finally:
            watchdog.cancel()

    monkeypatch.setattr(uvicorn, "run", run_at_most_two_minutes)
    bare = copy_artifact("w2a2", tmp_path / "bare", regression=False)
    result = _run("serve", bare, "--port", "0", "--buckets", "1", "--log-level", "critical")
    assert result.exit_code == 1, result.output
    assert f"artifact {bare} was refused at start-up" in " ".join(result.output.split())
    assert "no regression set" in result.output and "No admin endpoint is on" in " ".join(result.output.split())
    assert "http://127.0.0.1:0" not in result.output and "http://127.0.0.1:" in result.output


def test_export_says_the_next_command(run, tmp_path):
    out = tmp_path / "art"
    result = _run("export", run, "--out", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"next: stejax regress record {out}" in text


ARTIFACT_CORRUPTIONS = {
    "truncated weights": ("weights.safetensors", _truncate),
    "pickled weights": ("weights.safetensors", _pickle),
    "broken manifest": ("manifest.json", _break_json),
}


@pytest.mark.parametrize("corruption", list(ARTIFACT_CORRUPTIONS))
@pytest.mark.parametrize("command", [("artifact", "verify"), ("regress", "check")])
def test_a_corrupted_artifact_is_a_failed_verification_in_one_line(corruption, command, tmp_path):
    # An artifact is verified as a whole (every file against its recorded sha256): a damaged file is
    # the verification's verdict, exit 1, in one line naming the file.
    name, corrupt = ARTIFACT_CORRUPTIONS[corruption]
    artifact = copy_artifact("w2a2", tmp_path / "artifact")
    corrupt(artifact / name)
    result = _run(*command, artifact)
    assert result.exit_code == 1, result.output
    line = _one_line(result)
    assert str(artifact / name) in line, line
