r"""``stejax lm export``: a trained run to an artifact of packed integer weights, and back to a model.

An LM artifact is a directory, written atomically (a hidden temporary
directory renamed into place; never overwritten), in the format of
:mod:`stejax.artifacts`: ``weights.safetensors`` and ``manifest.json`` holding
the sha256 and size of the weights file, the model, the configuration, one
entry per tensor and the manifest's own integrity hash. :func:`load_lm_artifact`
re-hashes everything and refuses a changed file with
:class:`stejax.artifacts.ArtifactError`.

Tensors: for each quantised linear ``P`` (``blocks/0/attn/q``), ``P/codes`` (its
kernel's integer codes packed at their bit width, :mod:`stejax.lowbit._packing`)
and ``P/scale`` (float32: one per output channel, per group of the contraction
axis, or one per tensor for ternary); every other parameter (embedding, norms,
head) as float32 under its own name. The dequantised kernel is
``codes * scale`` (``codes / scale`` for ternary, BitNet's arithmetic), which
is bit for bit the fake-quantised kernel the model trained with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.lm._configs import CONFIGS, LMQuant, quantised_paths, quantize_lm
from stejax.lm._model import LMConfig, Transformer
from stejax.lm._quantisers import weight_codes, weight_scale
from stejax.lowbit._packing import offset_container_for, pack, packed_bytes, unpack

__all__ = ["LM_FORMAT", "LMArtifact", "export_lm", "load_lm_artifact", "predicted_size"]

LM_FORMAT = "stejax-lm-artifact/1"
WEIGHTS = "weights.safetensors"


def _codes_and_scale(kernel: np.ndarray, config: LMQuant) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of a kernel ``(in, out)`` and the compact float32 scale, as the fake quantiser computes them."""
    w = jnp.asarray(kernel, jnp.float32)
    if config.weight_bits == 1.58:
        from stejax.estimators.absmean import BITNET_EPS, _absmean_scale

        s = _absmean_scale(w, BITNET_EPS)  # 1/gamma, as in the forward
        return np.asarray(jnp.clip(jnp.round(w * s), -1, 1), np.int8), np.asarray(s, np.float32).reshape(())
    bits = int(config.weight_bits or 0)
    full = weight_scale(w, bits, config.group)
    codes = weight_codes(w, full, bits)
    compact = full[0] if config.group is None else full[:: config.group]
    return np.asarray(codes, np.int8), np.asarray(compact, np.float32)


def _dequantise(codes: np.ndarray, scale: np.ndarray, config: LMQuant) -> jax.Array:
    c = jnp.asarray(codes, jnp.float32)
    if config.weight_bits == 1.58:
        return c / jnp.asarray(scale)
    s = jnp.asarray(scale)
    full = s[None, :] if config.group is None else jnp.repeat(s, config.group, axis=0)
    return c * full


def _flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
    from stejax.train._step import leaf_name

    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return {leaf_name(p): np.asarray(leaf, np.float32) for p, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]}


def _tensors(model: nnx.Module, config: LMQuant) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    params = _flat_params(model)
    tensors: dict[str, np.ndarray] = {}
    table: dict[str, Any] = {}
    quantised = set(quantised_paths(model)) if config.weight_bits is not None else set()
    for name, value in sorted(params.items()):
        site = name.rsplit("/", 1)[0]
        if site in quantised and name.endswith("/kernel"):
            container = offset_container_for(float(config.weight_bits or 0))
            codes, scale = _codes_and_scale(value, config)
            tensors[f"{site}/codes"] = pack(codes, container)
            tensors[f"{site}/scale"] = scale
            table[site] = {
                "container": container,
                "shape": list(value.shape),
                "scale_shape": list(scale.shape),
                "group": config.group,
                "dequantise": "codes / scale" if config.weight_bits == 1.58 else "codes * scale",
                "bytes": packed_bytes(container, value.size),
            }
        else:
            tensors[name] = value
    return tensors, table


def predicted_size(model: nnx.Module, config: LMQuant | str) -> dict[str, int]:
    """The bytes of the weights file before writing it: ``{"weights_file": ..., "codes": ..., "float32": ...}``."""
    from stejax.export import safetensors_file_size

    config = CONFIGS[config] if isinstance(config, str) else config
    tensors, table = _tensors(model, config)
    meta = {"format": LM_FORMAT}
    codes = sum(t["bytes"] for t in table.values())
    return {
        "weights_file": safetensors_file_size({k: (v.shape, v.dtype) for k, v in tensors.items()}, meta),
        "codes": codes,
        "float32": sum(v.nbytes for k, v in tensors.items() if not k.endswith("/codes")),
    }


def export_lm(
    model: nnx.Module, config: LMQuant | str, out: str | os.PathLike, *, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` (trained under ``config``) as an artifact directory ``out``.

    Args:
      model: the trained model (float or quantised; the float parameters are read).
      config: its configuration (name or :class:`LMQuant`).
      out: the artifact directory; must not exist.
      extra: JSON-ready facts for the manifest (the run it came from, metrics).

    Returns:
      ``out``.

    Raises:
      FileExistsError: ``out`` exists.
    """
    from stejax.artifacts import environment, publish_dir, seal_manifest, staging_dir, write_file_durably
    from stejax.export import encode_safetensors

    config = CONFIGS[config] if isinstance(config, str) else config
    target = Path(out)
    if target.exists():
        raise FileExistsError(f"{target} exists; artifacts are never overwritten.")
    tensors, table = _tensors(model, config)
    data = encode_safetensors(tensors, {"format": LM_FORMAT})
    import hashlib

    manifest = seal_manifest(
        {
            "format": LM_FORMAT,
            "model": model.config.to_dict(),  # type: ignore[attr-defined]
            "config": config.to_dict(),
            "quantised": table,
            "files": {WEIGHTS: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}},
            "predicted_weights_bytes": predicted_size(model, config)["weights_file"],
            "environment": environment(),
            "extra": extra or {},
        }
    )
    tmp = staging_dir(target, "lm-export")
    write_file_durably(tmp / WEIGHTS, data)
    write_file_durably(tmp / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    publish_dir(tmp, target)
    return target


class LMArtifact:
    """A loaded LM artifact: its manifest and the model rebuilt from the packed codes.

    Attributes:
      manifest: the verified manifest.
      config: the :class:`LMQuant` configuration.
      model: the model with the dequantised kernels and the configuration's
        input quantisers (rules with no weight quantiser: the kernels are
        already the fake-quantised values); what ``stejax lm sample`` runs.
      float_model: the same dequantised weights with no quantiser at all.
    """

    def __init__(self, manifest: dict[str, Any], config: LMQuant, model: nnx.Module, float_model: nnx.Module):
        self.manifest = manifest
        self.config = config
        self.model = model
        self.float_model = float_model


def read_lm_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of :func:`export_lm`'s directory, after its integrity and format checks (no file is hashed).

    Raises:
      stejax.artifacts.ArtifactError: an edited manifest or another format.
    """
    from stejax.artifacts import ArtifactError, check_manifest_integrity, read_json_object

    root = Path(path)
    manifest = read_json_object(root / "manifest.json")
    check_manifest_integrity(manifest, root / "manifest.json")
    if manifest.get("format") != LM_FORMAT:
        raise ArtifactError(f"{root / 'manifest.json'}: format {manifest.get('format')!r}; expected {LM_FORMAT!r}.")
    return manifest


def read_lm_tensors(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest and the stored tensors of :func:`export_lm`'s directory, after the manifest check.

    Everything is read at once; :func:`iter_lm_tensors` reads one tensor at a time.

    Raises:
      stejax.artifacts.ArtifactError: a missing, changed or unlisted file, an
        edited manifest, another format, or a weights file that is not safetensors.
    """
    from stejax.artifacts import ArtifactError, check_listed_files
    from stejax.export import SafetensorsError, decode_safetensors

    root = Path(path)
    manifest = read_lm_manifest(root)
    files = check_listed_files(root, manifest.get("files"))
    try:
        tensors, _ = decode_safetensors(files[WEIGHTS], str(root / WEIGHTS))
    except SafetensorsError as e:
        raise ArtifactError(str(e)) from None
    return manifest, tensors


_CHUNK = 1 << 22  # bytes hashed at a time where a file is only hashed


def _changed(path: Path, digest: str, expected: str) -> Exception:
    from stejax.artifacts import ArtifactError

    return ArtifactError(f"{path}: sha256 {digest}; the manifest says {expected} (the file was changed).")


def _check_listing(root: Path, files: Any) -> None:
    """What :func:`stejax.artifacts.check_listed_files` checks, reading only the files other than the weights."""
    import hashlib
    import stat

    from stejax.artifacts import ArtifactError

    where = root / "manifest.json"
    if not isinstance(files, dict) or WEIGHTS not in files:
        raise ArtifactError(f"{where}: 'files' must map file names to {{sha256, bytes}}, {WEIGHTS!r} among them.")
    for name, entry in files.items():
        if not isinstance(name, str) or name in ("", ".", "..", "manifest.json") or "/" in name or "\\" in name:
            raise ArtifactError(f"{where}: 'files' lists {name!r}; expected a plain file name inside the directory.")
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not isinstance(entry.get("bytes"), int)
        ):
            raise ArtifactError(f"{where}: files[{name!r}] must hold 'sha256' (str) and 'bytes' (int); got {entry!r}.")
        path = root / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise ArtifactError(f"{path}: listed in the manifest but missing.") from None
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{path}: expected a regular file (a link or a directory is not followed).")
        if info.st_size != entry["bytes"]:
            raise ArtifactError(
                f"{path}: {info.st_size} bytes; the manifest says {entry['bytes']} (truncated or extended)."
            )
        if name != WEIGHTS:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
            if digest.hexdigest() != entry["sha256"]:
                raise _changed(path, digest.hexdigest(), entry["sha256"])
    allowed = {"manifest.json", *files}
    for entry in sorted(os.listdir(root)):
        if entry not in allowed:
            raise ArtifactError(
                f"{root / entry}: not listed in the manifest; an artifact holds only {sorted(allowed)}."
            )


def iter_lm_tensors(path: str | os.PathLike, manifest: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """The stored tensors of :func:`export_lm`'s directory, one at a time, in the file's order.

    ``manifest`` is :func:`read_lm_manifest`'s. Each tensor is read into an array of its own (native byte
    order, writable) and nothing else of the weights file is held: a caller that moves each one elsewhere
    (onto a device) and drops it holds about one tensor at a time. Every byte read is hashed; after the last
    tensor, a weights file whose sha256 is not the manifest's raises, so a caller that takes the tensors to
    the end has used only the file the manifest lists (a file changed while it was read included).

    Raises:
      stejax.artifacts.ArtifactError: a missing, changed, truncated or unlisted file (the sha256 only after the
        last tensor), or a weights file that is not safetensors.
    """
    import hashlib
    import struct

    from stejax.artifacts import ArtifactError
    from stejax.export import SafetensorsError, safetensors_layout
    from stejax.export._safetensors import MAX_HEADER_BYTES

    root = Path(path)
    files = manifest.get("files")
    _check_listing(root, files)
    expected: dict[str, Any] = files[WEIGHTS]  # type: ignore[index]  # checked just above
    where = root / WEIGHTS
    digest = hashlib.sha256()
    with open(where, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected["bytes"]:
            raise ArtifactError(
                f"{where}: {size} bytes; the manifest says {expected['bytes']} (truncated or extended)."
            )
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        head += f.read(min(n, MAX_HEADER_BYTES, max(size - 8, 0)))
        digest.update(head)
        try:
            start, spans, _ = safetensors_layout(head, size, str(where))
        except SafetensorsError as e:
            while chunk := f.read(_CHUNK):  # a changed file is named as such, before its header's faults
                digest.update(chunk)
            if digest.hexdigest() != expected["sha256"]:
                raise _changed(where, digest.hexdigest(), expected["sha256"]) from None
            raise ArtifactError(str(e)) from None
        f.seek(start)
        for begin, end, name, dtype, shape in spans:
            raw = np.empty(end - begin, np.uint8)
            if f.readinto(raw.data) != raw.size:
                raise ArtifactError(f"{where}: ended inside tensor {name!r} while it was read (truncated).")
            digest.update(raw.data)
            value = raw.view(dtype).reshape(shape)
            yield name, value if dtype.isnative else value.astype(dtype.newbyteorder("="))
            del raw, value
    if digest.hexdigest() != expected["sha256"]:
        raise _changed(where, digest.hexdigest(), expected["sha256"])


def load_lm_artifact(path: str | os.PathLike) -> LMArtifact:
    """Verify and load :func:`export_lm`'s directory.

    Raises:
      stejax.artifacts.ArtifactError: a missing, changed or unlisted file, an
        edited manifest, another format, or a tensor that does not fit the model.
    """
    from stejax.artifacts import ArtifactError

    root = Path(path)
    manifest, tensors = read_lm_tensors(root)
    config = LMQuant(**manifest["config"])
    model_config = LMConfig(**manifest["model"])
    model = Transformer(model_config, rngs=nnx.Rngs(0))
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def fill(p: Any, leaf: Any) -> jax.Array:
        from stejax.train._step import leaf_name

        name = leaf_name(p)
        site = name.rsplit("/", 1)[0]
        if site in manifest["quantised"] and name.endswith("/kernel"):
            entry = manifest["quantised"][site]
            context = f"load_lm_artifact: {root / WEIGHTS}: tensor {site + '/codes'!r}"
            try:
                n = int(np.prod(entry["shape"]))
                codes = unpack(tensors[f"{site}/codes"], entry["container"], n, context=context)
            except ValueError as e:
                raise ArtifactError(str(e)) from None
            value = _dequantise(codes.reshape(entry["shape"]), tensors[f"{site}/scale"], config)
        elif name in tensors:
            value = jnp.asarray(tensors[name])
        else:
            raise ArtifactError(f"{root / WEIGHTS}: lacks {name!r}, a parameter of the model.")
        if value.shape != np.shape(leaf):
            raise ArtifactError(f"{root / WEIGHTS}: {name!r} has shape {value.shape}; expected {np.shape(leaf)}.")
        return value

    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(fill, pure))
    nnx.update(model, state)
    return LMArtifact(manifest, config, quantize_lm(model, config, weights=False), model)
