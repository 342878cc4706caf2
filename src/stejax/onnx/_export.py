"""Export a verified artifact (or a run, through one) to an ONNX file."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stejax.onnx._digits import CONVS, digits_graph, qlinear_convs, weight_format_name
from stejax.onnx._graph import OnnxExportError, save_model

__all__ = [
    "LOGIT_TOLERANCE",
    "OnnxExport",
    "OnnxParity",
    "OnnxSpeed",
    "digits_proto",
    "export_onnx",
    "load_source",
    "write_digits",
]

# The stated parity of a graph with QLinearConv nodes against stejax's integer forward, checked at export on
# the artifact's parity inputs: every logit within this fraction of the largest |logit|, and the same class
# except at a near tie. A graph without them (conv="integer", or a model with no convolution) is checked bit
# for bit.
LOGIT_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class OnnxParity:
    """An exported file's logits in ONNX Runtime against stejax's integer forward, on the artifact's parity inputs.

    Attributes:
      examples: the inputs compared (the artifact's parity set: its test split).
      agree: examples whose predicted class is the same.
      near_ties: examples whose class differs where stejax's two largest logits are closer than twice
        ``max_abs_diff`` (a difference within the tolerance can swap them).
      max_abs_diff: the largest |logit difference|.
      max_abs_logit: the largest |logit| stejax computes.
      tolerance: the bound ``max_abs_diff`` must keep: 0 for a bit-exact graph, else
        :data:`LOGIT_TOLERANCE` times ``max_abs_logit``.
      accuracy: (stejax's, ONNX Runtime's) accuracy on the parity set's labels.
    """

    examples: int
    agree: int
    near_ties: int
    max_abs_diff: float
    max_abs_logit: float
    tolerance: float
    accuracy: tuple[float, float]

    @property
    def passed(self) -> bool:
        """Every logit within the tolerance, and every differing class a near tie."""
        return self.max_abs_diff <= self.tolerance and self.agree + self.near_ties == self.examples

    def summary(self) -> str:
        """One line: the classes, the logits against the tolerance, the accuracies."""
        if self.tolerance == 0:
            bound = "bit for bit" if self.max_abs_diff == 0 else "expected bit for bit"
        else:
            share = self.tolerance / self.max_abs_logit
            bound = f"tolerance {share:.0%} of the largest |logit| {self.max_abs_logit:.3g}: {self.tolerance:.3g}"
        ties = f" ({self.near_ties} other(s) at a near tie)" if self.near_ties else ""
        return (
            f"parity with stejax's integer forward on {self.examples} test inputs: the same class for "
            f"{self.agree}{ties}; max |logit difference| {self.max_abs_diff:.3g} ({bound}); accuracy "
            f"{100 * self.accuracy[0]:.2f}% (stejax) and {100 * self.accuracy[1]:.2f}% (ONNX Runtime)"
        )


def _parity(proto: Any, artifact: Any, *, exact: bool) -> OnnxParity:
    """Run ``proto`` in ONNX Runtime on the artifact's parity inputs and compare with stejax's integer forward."""
    from stejax.onnx._runtime import open_runtime

    x = np.asarray(artifact.evidence.inputs, np.float32)
    labels = np.asarray(artifact.evidence.labels)
    want = np.asarray(artifact.model.apply(artifact.model.weights, x), np.float32)
    got = np.asarray(open_runtime(proto.SerializeToString()).run(None, {"features": x})[0], np.float32)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    max_diff = float(diff.max(initial=0.0))
    top2 = np.sort(want, axis=1)[:, -2:] if want.shape[1] > 1 else np.zeros((len(want), 2), np.float32)
    same = got.argmax(1) == want.argmax(1)
    near = ~same & (top2[:, 1] - top2[:, 0] <= 2 * max_diff)
    scale = float(np.abs(want).max(initial=0.0))
    return OnnxParity(
        examples=len(x),
        agree=int(same.sum()),
        near_ties=int(near.sum()),
        max_abs_diff=max_diff,
        max_abs_logit=scale,
        tolerance=0.0 if exact else LOGIT_TOLERANCE * scale,
        accuracy=(float((want.argmax(1) == labels).mean()), float((got.argmax(1) == labels).mean())),
    )


@dataclasses.dataclass(frozen=True)
class OnnxSpeed:
    """ONNX Runtime's time for the exported graph and for its float32 twin, measured at export on this machine.

    Both run the artifact's parity inputs as one batch on the CPU execution provider with the same threads
    (which sleep between calls rather than spin, so that one runtime's pool does not slow the other's):
    untimed calls first, then interleaved rounds (one call of each per round); the medians in milliseconds.

    Attributes:
      batch: the inputs per call.
      threads: ONNX Runtime's intra-op threads.
      quantised_ms: the exported graph's median time per call.
      float_ms: the float32 graph's median time per call.
    """

    batch: int
    threads: int
    quantised_ms: float
    float_ms: float

    @property
    def float_over_quantised(self) -> float:
        """The exported graph's throughput over the float32 graph's (above 1: faster than float)."""
        return self.float_ms / self.quantised_ms

    def summary(self) -> str:
        """One line: both times and their ratio, and whether the exported graph is the slower."""
        ratio = self.float_over_quantised
        verdict = "faster than" if ratio >= 1 else "slower than"
        return (
            f"ONNX Runtime on this machine ({self.threads} threads, a batch of {self.batch}): "
            f"{self.quantised_ms:.3g} ms for this file, {self.float_ms:.3g} ms for the float32 graph: {ratio:.2f}× "
            "float's throughput, "
            f"{verdict} float"
        )


def _speed(proto: Any, float_proto: Any, x: np.ndarray, *, threads: int = 2, rounds: int = 15) -> OnnxSpeed:
    import time

    from stejax.onnx._runtime import open_runtime

    # The two runtimes take turns on the same cores: neither pool spins while the other runs.
    runtimes = [
        open_runtime(p.SerializeToString(), threads=threads, allow_spinning=False) for p in (proto, float_proto)
    ]
    for runtime in runtimes:  # the first calls allocate and tune
        for _ in range(3):
            runtime.run(None, {"features": x})
    times: list[list[float]] = [[], []]
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            start = time.perf_counter()
            runtimes[i].run(None, {"features": x})
            times[i].append(1e3 * (time.perf_counter() - start))
    quantised, float_ = (float(np.median(t)) for t in times)
    return OnnxSpeed(len(x), threads, quantised, float_)


@dataclasses.dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
      path: the ONNX file.
      source_id: the id (manifest sha256) of the verified artifact it came from.
      weights: ``"int8"``, ``"int4"`` or ``"float"``.
      file_bytes: the file's size.
      metadata: the ``metadata_props`` written into the file.
      conv: how integer convolutions were written (``"qlinear"`` or ``"integer"``).
      qlinear_convs: the layers written as ORT's ``QLinearConv`` (empty: the graph is bit-exact).
      parity: the check made before writing (None for the float32 network).
      speed: with ``time_it``, the file's speed in ONNX Runtime against the float32 graph (None otherwise).
    """

    path: Path
    source_id: str
    weights: str
    file_bytes: int
    metadata: dict[str, str]
    conv: str = "qlinear"
    qlinear_convs: tuple[int, ...] = ()
    parity: OnnxParity | None = None
    speed: OnnxSpeed | None = None


def load_source(source: str | os.PathLike, *, trusted_keys: Iterable[str | os.PathLike] = ()) -> Any:
    """The verified :class:`stejax.artifacts.Artifact` of an artifact directory, or of a run exported to one.

    An artifact directory (it has a ``manifest.json``) is loaded by
    :func:`stejax.artifacts.load_artifact` (every file re-hashed against the
    manifest, the manifest's own hash, the contract); with ``trusted_keys``, its
    signature is checked first (:func:`stejax.artifacts.verify_signature`), as
    ``stejax serve --public-key`` does. A run directory is exported
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
            "(stejax export RUN --out ARTIFACT, then stejax artifact sign)."
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
    conv: str = "qlinear",
    time_it: bool = False,
) -> OnnxExport:
    r"""Write a digits model (an artifact, or a run) as an ONNX file for ONNX Runtime, its parity checked first.

    The quantised graph is in QDQ form: integer weight initializers (int8; 2..4-bit
    codes as ONNX INT4; binary codes as int8 :math:`\pm 1`) with their float32 scales
    (per output channel or per tensor) feed ``DequantizeLinear``; each quantised
    input goes through ``QuantizeLinear`` with the learned step (zero point 0; int8
    for signed grids, uint8 for unsigned ones; sign codes as uint8 0 and 2 with zero
    point 1), a ``Clip`` to the grid's ends when it is narrower than the type (on the
    integer codes after a ``QLinearConv``), and ``DequantizeLinear``. ONNX Runtime's CPU execution
    provider fuses the products into integer kernels (``MatMulIntegerToFloat``,
    ``QLinearConv``, ``ConvInteger``). With ``float_model=True``: the same network with the
    dequantised float32 weights and float activations (for size and speed
    comparisons: it does not quantise activations).

    Before the file is written, ONNX Runtime runs the quantised graph on the
    artifact's parity inputs (its test split) beside stejax's integer forward
    (:class:`OnnxParity`): a graph with ``QLinearConv`` nodes must keep every
    logit within :data:`LOGIT_TOLERANCE` of the largest |logit| and the same class
    except at a near tie; any other graph must agree bit for bit. A graph that
    fails is not written (:class:`~stejax.onnx.OnnxExportError`).

    The source is verified first (:func:`load_source`); the file records the source
    artifact's id and weight-file sha256 and the parity in ``metadata_props`` and is written
    atomically (never over an existing file).

    Args:
      source: an artifact directory or a training run directory.
      out: the ONNX file to create.
      float_model: write the float32 network instead of the QDQ one.
      trusted_keys: PEM public keys; when given, only an artifact one of them signed is read.
      conv: ``"qlinear"`` (default): each integer convolution whose output the next layer
        quantises (an unsigned grid of up to 8 bits, or sign: every preset) in ORT's QDQ
        convolution pattern (``QLinearConv``), the fast one on ORT's CPU kernels, its output
        requantised into the next layer's uint8 codes; its bias is int32 codes and ORT requantises its
        output, so a next-layer code can differ by one near a rounding tie (the stated
        tolerance above). ``"integer"``: convolutions as ``ConvInteger`` and stejax's float32
        rescale, bit for bit stejax's integer forward, and many times slower in ORT.
      time_it: also time the quantised file against its float32 graph in ONNX Runtime on this
        machine (:class:`OnnxSpeed`; about a second): which is faster depends on the CPU.

    Returns:
      An :class:`OnnxExport`.

    Raises:
      FileExistsError: ``out`` exists.
      stejax.onnx.OnnxExportError: a layer with no faithful ONNX form (named), or a graph
        whose parity check fails (the figures, and ``conv="integer"`` when it had ``QLinearConv`` nodes).
      ValueError: an unknown ``conv``.
      stejax.artifacts.ArtifactError, stejax.artifacts.SignatureError: see :func:`load_source`.
    """
    if conv not in CONVS:
        raise ValueError(f"export_onnx: conv must be one of {list(CONVS)}; got {conv!r}.")
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
    qlinear = () if float_model or conv != "qlinear" else qlinear_convs(model)
    parity = None
    if float_model:
        proto = digits_proto(model, float_model=True, metadata=metadata, conv=conv)
    else:
        proto = digits_proto(model, float_model=False, metadata=metadata, conv=conv)
        parity = _parity(proto, artifact, exact=not qlinear)
        if not parity.passed:
            instead = " conv='integer' (--conv integer) writes the bit-exact graph." if qlinear else ""
            raise OnnxExportError(f"{out}: not written; {parity.summary()}.{instead}")
        metadata["stejax.parity"] = parity.summary()
        _set_props(proto, {"stejax.parity": metadata["stejax.parity"]})
    speed = None
    if time_it and not float_model:
        twin = digits_proto(model, float_model=True, metadata={}, conv=conv)
        speed = _speed(proto, twin, np.asarray(artifact.evidence.inputs, np.float32))
    path = save_model(proto, out)
    metadata = {
        **metadata,
        "stejax.weights": weights,
        "stejax.graph": "float" if float_model else "qdq",
        "stejax.conv": conv,
    }
    return OnnxExport(path, artifact.id, weights, path.stat().st_size, metadata, conv, qlinear, parity, speed)


def _set_props(proto: Any, props: dict[str, str]) -> None:
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def digits_proto(model: Any, *, float_model: bool, metadata: dict[str, str], conv: str) -> Any:
    """The checked ``onnx.ModelProto`` of an :class:`stejax.export.ExportedModel`; ``metadata`` is added."""
    from onnx import TensorProto

    graph, logits = digits_graph(model, float_model=float_model, conv=conv)
    props = {
        **metadata,
        "stejax.weights": weight_format_name(model, float_model=float_model),
        "stejax.graph": "float" if float_model else "qdq",
        "stejax.conv": conv,
    }
    return graph.model(
        [("features", TensorProto.FLOAT, ("batch", model.input_shape[0]))],
        [(logits, TensorProto.FLOAT, ("batch", model.n_classes))],
        props,
        doc="stejax digits model: raw float32 features in, float32 logits out.",
    )


def write_digits(model: Any, out: str | os.PathLike, *, float_model: bool, metadata: dict[str, str], conv: str) -> Path:
    """Write an :class:`stejax.export.ExportedModel` (already verified) as an ONNX file, unchecked; see
    :func:`digits_proto`."""
    return save_model(digits_proto(model, float_model=float_model, metadata=metadata, conv=conv), out)
