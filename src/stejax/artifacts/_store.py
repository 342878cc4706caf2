"""The artifact directory: atomic writes, and loading that re-checks everything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.export import ExportedModel, ExportResult, ParitySet, _safetensors, quantisation_method
from stejax.export._configs import model_config_from_dict
from stejax.export._convert import layer_specs
from stejax.export._export import WEIGHTS_FORMAT, encode_evidence
from stejax.export._model import LayerSpec, tensor_table, unflatten_weights
from stejax.model import QATConfig, preset

__all__ = [
    "FORMAT",
    "MANIFEST",
    "PARITY_FILE",
    "REGRESSION_DIR",
    "WEIGHTS_FILE",
    "Artifact",
    "ArtifactError",
    "check_listed_files",
    "check_manifest_integrity",
    "environment",
    "load_artifact",
    "publish_dir",
    "read_json_object",
    "save_artifact",
    "seal_manifest",
    "staging_dir",
    "write_file_durably",
]

FORMAT = "stejax-artifact/1"
MANIFEST = "manifest.json"
WEIGHTS_FILE = "weights.safetensors"
PARITY_FILE = "parity.safetensors"
REGRESSION_DIR = "regression"
# The OpenSSF model signing signature, beside the files it signs (see stejax.artifacts._signing).
SIGNATURE_FILE = "model.sig"
MAX_MANIFEST_BYTES = 16 << 20
_ID = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ArtifactError(ValueError):
    """An artifact that does not verify: the message says what, where, what was expected and what came."""


@dataclasses.dataclass(frozen=True, eq=False)
class Artifact:
    """A verified artifact, as :func:`load_artifact` returns it.

    Attributes:
      id: the artifact's id, the sha256 (hex) of its canonical manifest (see
        :func:`manifest_digest`); it changes with any byte of any file.
      path: the directory.
      manifest: the parsed ``manifest.json``.
      model: the :class:`stejax.export.ExportedModel`, weights on the default device.
      evidence: the :class:`stejax.export.ParitySet` kept for re-checking parity.
    """

    id: str
    path: Path
    manifest: dict[str, Any]
    model: ExportedModel
    evidence: ParitySet

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def method(self) -> str:
        """How the quantised weights came to be: ``"qat"``, ``"float"`` or a PTQ method (``"gptq"``...).

        As :func:`stejax.export.quantisation_method` reads the manifest (``"qat"``
        or ``"float"`` for one written before the method was recorded).
        """
        return quantisation_method(self.manifest["quantization"])

    def file_bytes(self) -> dict[str, int]:
        """Every file under the artifact's directory and its size in bytes, by path relative to it.

        The whole artifact as it sits on disk: ``weights.safetensors``,
        ``parity.safetensors`` (the parity evidence, usually many times the
        weights), ``manifest.json``, and the regression set's files once recorded.
        """
        return {
            str(p.relative_to(self.path)): p.lstat().st_size
            for p in sorted(self.path.rglob("*"), key=lambda p: (len(p.relative_to(self.path).parts), str(p)))
            if p.is_file() and not p.is_symlink()
        }


def environment() -> dict[str, str]:
    """Where this runs: backend, device, jax, jaxlib, numpy, Python, platform, stejax."""
    import jaxlib

    from stejax import __version__

    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "stejax": __version__,
    }


# ------------------------------------------------------------------------------ canonical manifest


def canonical(data: Mapping[str, Any]) -> bytes:
    """The canonical JSON bytes: sorted keys, no spaces, ASCII, no NaN or infinity."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The sha256 of the canonical JSON of ``manifest`` without its ``"integrity"`` entry: the artifact's id."""
    return hashlib.sha256(canonical({k: v for k, v in manifest.items() if k != "integrity"})).hexdigest()


def seal_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its ``"integrity"`` entry (re)computed: the sha256 of the rest, the artifact's id.

    Not a signature (anyone can recompute it): it catches edits, and
    :func:`check_manifest_integrity` checks it on load. Signing is :func:`sign_artifact`.
    """
    body = {k: v for k, v in manifest.items() if k != "integrity"}
    return {
        **body,
        "integrity": {
            "algorithm": "sha256",
            "of": "the canonical JSON (sorted keys, separators ',' ':', ASCII) of this manifest without 'integrity'",
            "sha256": manifest_digest(body),
        },
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------ durable writes


def write_file_durably(path: Path, data: bytes) -> None:
    """Create ``path`` (never overwrite: FileExistsError), write ``data`` and fsync it.

    With :func:`staging_dir` and :func:`publish_dir`, the way every artifact kind is
    written: files into a staging directory, then one atomic rename.
    """
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(target: Path, what: str) -> Path:
    """A fresh hidden directory ``.NAME.WHAT-partial-XXXX`` beside ``target`` (same file system: an atomic rename).

    Write the files into it (:func:`write_file_durably`), then :func:`publish_dir`.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{what}-partial-{secrets.token_hex(6)}"
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, target: Path) -> None:
    """fsync ``tmp``, rename it to ``target`` and fsync the parent: a crash leaves no target or a whole one.

    Raises:
      FileExistsError: ``target`` exists (artifacts are never overwritten).
    """
    fsync_dir(tmp)
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"{target} exists; artifacts are never overwritten.")
    os.rename(tmp, target)
    fsync_dir(target.parent)


# ------------------------------------------------------------------------------ save


def _json_ready(value: Any, where: str) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_ready(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return _json_ready(value.item(), where)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"manifest: {where} is a {type(value).__name__}; only JSON values are stored.")


def _parent_id(parent: str | os.PathLike | None) -> str | None:
    if parent is None:
        return None
    if isinstance(parent, str) and _ID.fullmatch(parent):
        return parent
    return load_artifact(parent).id


def save_artifact(
    result: ExportResult,
    out: str | os.PathLike,
    *,
    parent: str | os.PathLike | None = None,
) -> Artifact:
    """Write an exported model as an artifact directory, atomically, and load it back verified.

    The directory holds ``weights.safetensors`` (the integer weights and scales),
    ``parity.safetensors`` (the test inputs, the fake-quantised logits and the
    parity bounds) and ``manifest.json``: the format, the model contract, the
    quantisation, the sha256 and size of every file, the environment, the
    training metrics, the verification results (parity, sizes) and the parent's
    id, signed by the sha256 of its own canonical JSON (the artifact's id).

    Everything is written into a hidden directory beside ``out``, each file
    fsynced, then the directory is renamed to ``out``: a crash leaves either no
    artifact or a whole one (and a hidden ``.*-partial-*`` directory to remove).

    Args:
      result: :func:`stejax.export.export_run`'s result.
      out: the artifact directory to create; it must not exist.
      parent: the parent artifact (its id, or its directory, which is verified).

    Returns:
      The written :class:`Artifact`, loaded back by :func:`load_artifact`.

    Raises:
      FileExistsError: ``out`` exists.
      ArtifactError: the parent does not verify, or the written weight file's size
        is not the predicted one.
    """
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"save_artifact: {out} exists; artifacts are never overwritten.")
    parent_id = _parent_id(parent)
    evidence = encode_evidence(result.evidence)
    tmp = staging_dir(out, "save")
    try:
        write_file_durably(tmp / WEIGHTS_FILE, result.weights_file)
        write_file_durably(tmp / PARITY_FILE, evidence)
        on_disk = (tmp / WEIGHTS_FILE).stat().st_size
        if on_disk != result.size.predicted_file_bytes:
            raise ArtifactError(
                f"save_artifact: {WEIGHTS_FILE} is {on_disk} bytes on disk; the size report predicted "
                f"{result.size.predicted_file_bytes}."
            )
        if len(evidence) != result.size.evidence_file_bytes:
            raise ArtifactError(
                f"save_artifact: {PARITY_FILE} is {len(evidence)} bytes; the size report says "
                f"{result.size.evidence_file_bytes}."
            )
        files = {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "role": role}
            for name, data, role in (
                (WEIGHTS_FILE, result.weights_file, "the exported weights and scales (safetensors)"),
                (PARITY_FILE, evidence, "parity evidence: test inputs, fake-quant logits, bounds (safetensors)"),
            )
        }
        manifest = {
            "format": FORMAT,
            "parent": parent_id,
            "contract": result.contract,
            "quantization": result.quantization,
            "files": files,
            "environment": environment(),
            "training": result.training,
            "verification": {
                "parity": result.parity.to_dict(),
                "size": {**result.size.to_dict(), "file_bytes_on_disk": on_disk},
            },
        }
        manifest = seal_manifest(_json_ready(manifest, "manifest"))
        write_file_durably(tmp / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_artifact(out)


# ------------------------------------------------------------------------------ load


def _fail(where: Path | str, message: str) -> ArtifactError:
    return ArtifactError(f"{where}: {message}")


def _reject_constant(name: str):
    raise ValueError(f"the non-JSON constant {name}")


def read_json_object(path: Path, *, limit: int = MAX_MANIFEST_BYTES) -> dict[str, Any]:
    """A JSON object from a regular file of at most ``limit`` bytes (no NaN, no infinity, no link followed).

    Raises:
      ArtifactError: a missing file, a link or directory, a file over ``limit``,
        invalid JSON or not an object; the message names the file.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise _fail(path, "missing.") from None
    if not stat.S_ISREG(info.st_mode):
        raise _fail(path, "expected a regular file (not a link or a directory).")
    if info.st_size > limit:
        raise _fail(path, f"{info.st_size} bytes; at most {limit} are read.")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(path, f"not valid JSON ({e}).") from None
    if not isinstance(data, dict):
        raise _fail(path, f"expected a JSON object; got {type(data).__name__}.")
    return data


def check_manifest_integrity(manifest: dict[str, Any], where: Path) -> str:
    """The manifest's id, after checking its ``integrity`` entry (:func:`seal_manifest`) against its content.

    Raises:
      ArtifactError: no entry, or a content whose sha256 differs (an edit); ``where`` names the file.
    """
    integrity = manifest.get("integrity")
    recorded = integrity.get("sha256") if isinstance(integrity, dict) else None
    if not isinstance(recorded, str):
        raise _fail(where, "no integrity.sha256 entry; the manifest is not signed.")
    try:
        actual = manifest_digest(manifest)
    except ValueError as e:
        raise _fail(where, f"cannot be put in canonical form ({e}).") from None
    if actual != recorded:
        raise _fail(
            where,
            f"the content's sha256 is {actual}; integrity.sha256 says {recorded}: the manifest was edited after it "
            "was written.",
        )
    return actual


def check_listed_files(root: Path, files: Any, *, extra_ok: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Re-hash every file a manifest lists, refuse unlisted ones; ``{name: bytes}``.

    ``files`` is the manifest's ``{"NAME": {"sha256": ..., "bytes": ...}}``; a file
    must be a regular file inside ``root`` of that size and sha256; ``extra_ok``
    names entries of ``root`` allowed without a listing (a regression folder, a signature).

    Raises:
      ArtifactError: the file and what differs (missing, size, sha256, a link, an unlisted entry).
    """
    where = root / MANIFEST
    if not isinstance(files, dict) or not files:
        raise _fail(where, f"'files' must map file names to {{sha256, bytes}}; got {files!r}.")
    out = {}
    for name, entry in files.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == MANIFEST:
            raise _fail(where, f"'files' lists {name!r}; expected a plain file name inside the directory.")
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not isinstance(entry.get("bytes"), int)
        ):
            raise _fail(where, f"files[{name!r}] must hold 'sha256' (str) and 'bytes' (int); got {entry!r}.")
        path = root / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise _fail(path, "listed in the manifest but missing.") from None
        if not stat.S_ISREG(info.st_mode):
            raise _fail(path, "expected a regular file (a link or a directory is not followed).")
        data = path.read_bytes()
        if len(data) != entry["bytes"]:
            raise _fail(path, f"{len(data)} bytes; the manifest says {entry['bytes']} (truncated or extended).")
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise _fail(path, f"sha256 {digest}; the manifest says {entry['sha256']} (the file was changed).")
        out[name] = data
    allowed = {MANIFEST, *files, *extra_ok}
    for entry in sorted(os.listdir(root)):
        if entry not in allowed:
            raise _fail(root / entry, f"not listed in the manifest; an artifact holds only {sorted(allowed)}.")
    return out


def _expect(condition: bool, where: Path, message: str) -> None:
    if not condition:
        raise _fail(where, message)


def _layers_from_manifest(manifest: dict[str, Any], where: Path) -> tuple[tuple[LayerSpec, ...], tuple[int, ...], int]:
    contract = manifest.get("contract")
    if not isinstance(contract, dict):
        raise _fail(where, "no 'contract' object.")
    try:
        layers = tuple(LayerSpec.from_dict(d) for d in contract["layers"])
        model_config = model_config_from_dict(contract["model_config"])
        quantization = manifest["quantization"]
        # The whole configuration when recorded (any QAT configuration), else the preset's name.
        qat = QATConfig.from_dict(quantization["qat"]) if "qat" in quantization else preset(quantization["preset"])
        if qat.name != quantization["preset"]:
            raise ValueError(
                f"quantization.qat is named {qat.name!r} but quantization.preset is {quantization['preset']!r}"
            )
        quantisation_method(quantization)  # a recorded method must be a known one
        input_shape = tuple(int(v) for v in contract["input"]["shape"])
        n_classes = int(contract["output"]["n_classes"])
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(where, f"the contract does not describe a model ({type(e).__name__}: {e}).") from None
    expected = layer_specs(model_config, qat)
    for i, (got, want) in enumerate(zip(layers, expected, strict=False)):
        _expect(
            got == want,
            where,
            f"contract layer {i} is {got.to_dict()}; model_config and preset {qat.name!r} give {want.to_dict()}.",
        )
    _expect(
        len(layers) == len(expected),
        where,
        f"the contract has {len(layers)} layers; model_config and preset {qat.name!r} give {len(expected)}.",
    )
    _expect(
        input_shape == (model_config.in_features,) and n_classes == model_config.n_classes,
        where,
        f"the contract's input shape {input_shape} and {n_classes} classes do not match model_config "
        f"({model_config.in_features} features, {model_config.n_classes} classes).",
    )
    table = {n: {"shape": list(s), "dtype": d.name} for n, (s, d, _) in tensor_table(layers, input_shape[0]).items()}
    recorded = {n: {"shape": t.get("shape"), "dtype": t.get("dtype")} for n, t in contract.get("tensors", {}).items()}
    _expect(
        recorded == table,
        where,
        f"contract.tensors {_first_difference(recorded, table)}.",
    )
    return layers, input_shape, n_classes


def _first_difference(got: dict[str, Any], want: dict[str, Any]) -> str:
    for name in want:
        if name not in got:
            return f"lacks {name!r} (expected {want[name]})"
        if got[name] != want[name]:
            return f"says {name!r} is {got[name]}; the layers need {want[name]}"
    extra = [n for n in got if n not in want]
    return f"holds {extra[0]!r}, which the layers do not store" if extra else "differ"


def _check_tensors(path: Path, arrays: dict[str, np.ndarray], table: dict[str, tuple[tuple[int, ...], np.dtype]]):
    for name, (shape, dtype) in table.items():
        if name not in arrays:
            raise _fail(path, f"lacks tensor {name!r} (shape {list(shape)}, {np.dtype(dtype).name}).")
        a = arrays[name]
        if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
            raise _fail(
                path,
                f"tensor {name!r} is {a.dtype.name} {list(a.shape)}; the contract says "
                f"{np.dtype(dtype).name} {list(shape)}.",
            )
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            i = int(np.flatnonzero(~np.isfinite(a.reshape(-1)))[0])
            if not (name == "tolerance" and np.isposinf(a.reshape(-1)[i])):
                raise _fail(path, f"tensor {name!r} holds {a.reshape(-1)[i]} at flat index {i}; expected finite.")
    extra = [n for n in arrays if n not in table]
    if extra:
        raise _fail(path, f"holds tensor {extra[0]!r}, which the contract does not list.")


def _nonzero(path: Path, arrays: dict[str, np.ndarray], names: list[str], *, positive: bool = False) -> None:
    for name in names:
        if name not in arrays:
            continue
        bad = ~(arrays[name] > 0) if positive else arrays[name] == 0
        if bad.any():
            what = "positive" if positive else "non-zero (a step divides)"
            raise _fail(path, f"tensor {name!r} must be {what}; got {arrays[name].reshape(-1)[np.argmax(bad)]}.")


def load_artifact(path: str | os.PathLike) -> Artifact:
    """Load an artifact directory, verifying everything; refuse anything that does not match.

    In order: ``manifest.json`` (a bounded, regular JSON file of the known format,
    whose ``integrity.sha256`` matches its canonical content), every listed file
    (present, regular, of the recorded size and sha256; no unlisted file but the
    ``regression/`` directory and the signature ``model.sig``, which this does not
    check: see :func:`stejax.artifacts.verify_signature`), each safetensors file's header (checked here:
    header length bounded and inside the file, offsets inside the data, byte
    counts equal to shape times dtype, no overlap, no hole; a pickle is named as
    one and never read), and the contract (layers consistent with the model
    config and the preset, tensors with the layers, the weights' names, shapes and
    dtypes with the contract; scales positive, floats finite).

    Args:
      path: the artifact directory.

    Returns:
      The :class:`Artifact`.

    Raises:
      ArtifactError: the first problem found, with the file (and tensor or field),
        what was expected and what came.
    """
    root = Path(path)
    if not root.is_dir():
        raise _fail(root, "not a directory; an artifact is a directory with a manifest.json.")
    where = root / MANIFEST
    manifest = read_json_object(where)
    _expect(
        manifest.get("format") == FORMAT,
        where,
        f"format {manifest.get('format')!r}; this version reads {FORMAT!r}.",
    )
    artifact_id = check_manifest_integrity(manifest, where)
    files = check_listed_files(root, manifest.get("files"), extra_ok=(REGRESSION_DIR, SIGNATURE_FILE))
    for name in (WEIGHTS_FILE, PARITY_FILE):
        _expect(name in files, where, f"'files' lacks {name!r}.")
    regression = root / REGRESSION_DIR
    if regression.exists() or regression.is_symlink():
        _expect(regression.is_dir() and not regression.is_symlink(), regression, "expected a directory.")
    layers, input_shape, n_classes = _layers_from_manifest(manifest, where)
    try:
        arrays, meta = _safetensors.decode(files[WEIGHTS_FILE], str(root / WEIGHTS_FILE))
        evidence_arrays, _ = _safetensors.decode(files[PARITY_FILE], str(root / PARITY_FILE))
    except _safetensors.SafetensorsError as e:
        raise ArtifactError(str(e)) from None
    _expect(
        meta.get("format") == WEIGHTS_FORMAT,
        root / WEIGHTS_FILE,
        f"__metadata__.format is {meta.get('format')!r}; expected {WEIGHTS_FORMAT!r}.",
    )
    table = {n: (s, d) for n, (s, d, _) in tensor_table(layers, input_shape[0]).items()}
    _check_tensors(root / WEIGHTS_FILE, arrays, table)
    # A trained step may come out negative (a degenerate run, e.g. without an estimator); it is what
    # the model computes with, but a zero step or scale would divide by zero.
    _nonzero(root / WEIGHTS_FILE, arrays, ["normalizer/std"], positive=True)
    steps = [f"layers/{i}/a_step" for i in range(len(layers))]
    steps += [f"layers/{i}/w_scale" for i, layer in enumerate(layers) if layer.weights.method != "sign"]
    _nonzero(root / WEIGHTS_FILE, arrays, steps)
    n = evidence_arrays.get("inputs", np.zeros((0,))).shape[0]
    evidence_table = {
        "inputs": ((n, *input_shape), np.dtype(np.float32)),
        "labels": ((n,), np.dtype(np.int32)),
        "reference_logits": ((n, n_classes), np.dtype(np.float32)),
        "tolerance": ((n, n_classes), np.dtype(np.float32)),
    }
    _check_tensors(root / PARITY_FILE, evidence_arrays, evidence_table)
    weights = unflatten_weights({k: jnp.asarray(v) for k, v in arrays.items()}, len(layers))
    try:
        model = ExportedModel(layers=layers, weights=weights, input_shape=input_shape, n_classes=n_classes)
    except (TypeError, ValueError) as e:
        raise _fail(root / WEIGHTS_FILE, str(e)) from None
    evidence = ParitySet(**{k: np.array(v) for k, v in evidence_arrays.items()})
    return Artifact(id=artifact_id, path=root, manifest=manifest, model=model, evidence=evidence)


# The names used before the public ones above (stejax.artifacts re-exports those); kept for callers.
sign = seal_manifest
write_file = write_file_durably
temp_dir_beside = staging_dir
publish = publish_dir
read_json = read_json_object
check_integrity = check_manifest_integrity
check_files = check_listed_files
