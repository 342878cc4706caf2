"""Trained runs, exports and artifacts shared by the export/artifact test modules, built once per process.

Small on purpose: an MLP of two 32-wide hidden layers (and a CNN of 4 and 8
channels), two epochs at a constant learning rate on the digits split of
``data_seed=0``, so that a run trains in seconds; the tests are about export,
not accuracy.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from stejax.artifacts import Artifact, save_artifact
from stejax.artifacts._store import sign
from stejax.export import ExportResult, export_run
from stejax.regress import record
from stejax.train import TrainConfig, load_splits, train

TINY = TrainConfig(
    model="mlp", hidden=(32, 32), dropout=0.0, batch_size=64, epochs=2, schedule="constant", patience=None
)
TINY_CNN = dataclasses.replace(TINY, model="cnn", channels=(4, 8))

_ROOT = Path(tempfile.mkdtemp(prefix="stejax-artifact-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.cache
def splits():
    return load_splits(TINY)


def run_dir(preset: str, model: str = "mlp") -> Path:
    return _run_dir(preset, model)


@functools.cache
def _run_dir(preset: str, model: str) -> Path:
    config = dataclasses.replace(TINY if model == "mlp" else TINY_CNN, preset=preset)
    out = _ROOT / "runs" / f"{model}-{preset}"
    train(config, splits=splits(), out_dir=out)
    return out


def exported(preset: str, model: str = "mlp") -> ExportResult:
    return _exported(preset, model)


@functools.cache
def _exported(preset: str, model: str) -> ExportResult:
    return export_run(run_dir(preset, model), splits=splits())


def pristine(preset: str, model: str = "mlp", *, regression: bool = True) -> Artifact:
    """A saved artifact (with its regression set); copy it before changing anything."""
    return _pristine(preset, model, regression)


@functools.cache
def _pristine(preset: str, model: str, regression: bool) -> Artifact:
    out = _ROOT / "artifacts" / f"{model}-{preset}{'' if regression else '-bare'}"
    artifact = save_artifact(exported(preset, model), out)
    if regression:
        record(out)
    return artifact


def copy_artifact(preset: str, dest: Path, model: str = "mlp", *, regression: bool = True) -> Path:
    shutil.copytree(pristine(preset, model, regression=regression).path, dest)
    return dest


def resign(root: Path, *, files: tuple[str, ...] = ()) -> None:
    """Re-hash ``files`` into the manifest and re-sign it: a writer that hashes whatever it is given."""
    manifest = json.loads((root / "manifest.json").read_text())
    for name in files:
        data = (root / name).read_bytes()
        manifest["files"][name] = {
            **manifest["files"][name],
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    (root / "manifest.json").write_text(json.dumps(sign(manifest), indent=2))


def rewrite_header(path: Path, edit) -> None:
    """Replace a safetensors file's JSON header by ``edit(header_dict)``, keeping the data bytes."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    text = json.dumps(edit(header)).encode()
    text += b" " * ((-(8 + len(text))) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])


def kill_at(script: str, args: list[str], marker: str) -> None:
    """Run ``python -c script *args`` and SIGKILL it as soon as it prints a line starting with ``marker``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith(marker), proc.stderr.read() if not line else line
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
