"""Export a verified artifact (or a run, through one) to an ONNX file."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stejax.onnx._digits import digits_graph, weight_format_name
from stejax.onnx._graph import save_model

__all__ = ["OnnxExport", "export_onnx", "load_source", "write_digits"]


@dataclasses.dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
      path: the ONNX file.
      source_id: the id (manifest sha256) of the verified artifact it came from.
      weights: ``"int8"``, ``"int4"`` or ``"float"``.
      file_bytes: the file's size.
      metadata: the ``metadata_props`` written into the file.
    """

    path: Path
    source_id: str
    weights: str
    file_bytes: int
    metadata: dict[str, str]


def load_source(source: str | os.PathLike, *, trusted_keys: Iterable[str | os.PathLike] = ()) -> Any:
    """The verified :class:`stejax.artifacts.Artifact` of an artifact directory, or of a run exported to one.

    An artifact directory (it has a ``manifest.json``) is loaded by
    :func:`stejax.artifacts.load_artifact` (every file re-hashed against the
    manifest, the manifest's own hash, the contract); with ``trusted_keys``, its
    signature is checked first (:func:`stejax.artifacts.verify_signature`), as
    ``stejax serve --trust-key`` does. A run directory is exported
    (:func:`stejax.export.export_run`, parity required) and saved as an artifact
    in a temporary directory, then loaded from there the same way; a run has no
    signature, so ``trusted_keys`` refuses it.

    Raises:
      stejax.artifacts.ArtifactError: the artifact does not verify.
      stejax.artifacts.SignatureError: unsigned or not signed by a trusted key.
      ValueError: a run with ``trusted_keys``, or a run whose export fails parity.
    """
    from stejax.artifacts import load_artifact, save_artifact, verify_signature

    root = Path(source)
    keys = tuple(trusted_keys)
    if (root / "manifest.json").exists():
        if keys:
            verify_signature(root, keys)
        return load_artifact(root)
    if keys:
        raise ValueError(
            f"{root}: a run directory carries no signature; with trusted keys only a signed artifact is exported "
            "(stejax export RUN ARTIFACT, then stejax artifact sign)."
        )
    from stejax.export import export_run

    result = export_run(root, require_parity=True)
    tmp = Path(tempfile.mkdtemp(prefix="stejax-onnx-source-"))
    try:
        artifact = save_artifact(result, tmp / "artifact")
        # Everything the graph needs is in memory (the model's weights); the directory can go.
        return dataclasses.replace(artifact, path=root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_onnx(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    float_model: bool = False,
    trusted_keys: Iterable[str | os.PathLike] = (),
    conv: str = "integer",
) -> OnnxExport:
    r"""Write a digits model (an artifact, or a run) as an ONNX file for ONNX Runtime.

    The quantised graph is in QDQ form: integer weight initializers (int8; 2..4-bit
    codes as ONNX INT4; binary codes as int8 :math:`\pm 1`) with their float32 scales
    (per output channel or per tensor) feed ``DequantizeLinear``; each quantised
    input goes through ``QuantizeLinear`` with the learned step (zero point 0; int8
    for signed grids, uint8 after a ReLU), a ``Clip`` of the codes when the grid is
    narrower than the type, and ``DequantizeLinear``. ONNX Runtime's CPU execution
    provider fuses the products into integer kernels (``MatMulIntegerToFloat``,
    ``QLinearConv``). With ``float_model=True``: the same network with the
    dequantised float32 weights and float activations (for size and speed
    comparisons: it does not quantise activations).

    The source is verified first (:func:`load_source`); the file records the source
    artifact's id and weight-file sha256 in ``metadata_props`` and is written
    atomically (never over an existing file).

    Args:
      source: an artifact directory or a training run directory.
      out: the ONNX file to create.
      float_model: write the float32 network instead of the QDQ one.
      trusted_keys: PEM public keys; when given, only an artifact one of them signed is read.
      conv: ``"integer"`` (default): convolutions as ``ConvInteger`` and stejax's float32
        rescale, bit for bit stejax's integer forward; ``"qlinear"``: a convolution whose
        output the next layer quantises to an 8-bit grid in ORT's QDQ convolution
        pattern (``QLinearConv``): much faster on ORT's CPU kernels, but its bias is
        int32 codes and ORT requantises its output, so a code can differ by one near
        a rounding tie.

    Returns:
      An :class:`OnnxExport`.

    Raises:
      FileExistsError: ``out`` exists.
      stejax.onnx.OnnxExportError: a layer with no faithful ONNX form (named).
      stejax.artifacts.ArtifactError, stejax.artifacts.SignatureError: see :func:`load_source`.
    """
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists; an exported ONNX file is never overwritten.")
    artifact = load_source(source, trusted_keys=trusted_keys)
    model = artifact.model
    weights = weight_format_name(model, float_model=float_model)
    files = artifact.manifest.get("files", {})
    metadata = {
        "stejax.source_artifact": artifact.id,
        "stejax.source_weights_sha256": str(files.get("weights.safetensors", {}).get("sha256", "")),
        "stejax.quantization": str(artifact.manifest.get("quantization", {}).get("preset", "")),
    }
    path = write_digits(model, out, float_model=float_model, metadata=metadata, conv=conv)
    metadata = {**metadata, "stejax.weights": weights, "stejax.graph": "float" if float_model else "qdq"}
    return OnnxExport(path, artifact.id, weights, path.stat().st_size, metadata)


def write_digits(
    model: Any, out: str | os.PathLike, *, float_model: bool, metadata: dict[str, str], conv: str = "integer"
) -> Path:
    """Write an :class:`stejax.export.ExportedModel` (already verified) as an ONNX file; ``metadata`` is added."""
    from onnx import TensorProto

    graph, logits = digits_graph(model, float_model=float_model, conv=conv)
    props = {
        **metadata,
        "stejax.weights": weight_format_name(model, float_model=float_model),
        "stejax.graph": "float" if float_model else "qdq",
        "stejax.conv": conv,
    }
    proto = graph.model(
        [("features", TensorProto.FLOAT, ("batch", model.input_shape[0]))],
        [(logits, TensorProto.FLOAT, ("batch", model.n_classes))],
        props,
        doc="stejax digits model: raw float32 features in, float32 logits out.",
    )
    return save_model(proto, out)
