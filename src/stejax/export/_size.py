"""The size report: bytes stored per layer against float32, the weight file's size predicted from the formats,
and the parity evidence the artifact ships beside it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from stejax.export import _safetensors
from stejax.export._model import ExportedModel, LayerSpec
from stejax.lowbit._packing import CONTAINERS

__all__ = ["LayerSize", "SizeReport", "size_report"]


@dataclasses.dataclass(frozen=True)
class LayerSize:
    """One layer's stored bytes.

    Attributes:
      index: the layer.
      weight_shape: the weight's shape.
      count: the number of weights.
      container: how the weights are stored (``int8``, ``int4x2``, ``int2x4``,
        ``bin1x8``, ``int16`` or ``float32``).
      bits: bits stored per weight (the container's field width; 32 for float32).
      float32_bytes: the weights' bytes in float32, ``4 * count``.
      weight_bytes: the stored weight bytes, ``ceil(count * bits / 8)``.
      scale_bytes: the weight scale(s), float32.
      bias_bytes: the bias, float32.
      step_bytes: the input step, float32 (0 for a float or sign input).
    """

    index: int
    weight_shape: tuple[int, ...]
    count: int
    container: str
    bits: int
    float32_bytes: int
    weight_bytes: int
    scale_bytes: int
    bias_bytes: int
    step_bytes: int

    @property
    def ratio(self) -> float:
        """Stored weight bytes over float32 bytes (1/4 for int8, 1/32 for binary)."""
        return self.weight_bytes / self.float32_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio}


@dataclasses.dataclass(frozen=True)
class SizeReport:
    """The weight file's size, layer by layer and in all, and the parity evidence's.

    An artifact holds more than the weights: ``parity.safetensors`` (the test
    inputs, their fake-quantised logits and bounds, kept so the gate can re-check
    parity) is usually many times the weight file; see :attr:`evidence_file_bytes`.

    Attributes:
      layers: one :class:`LayerSize` per layer.
      normalizer_bytes: the normaliser's mean and std, float32.
      header_bytes: the safetensors JSON header (padded), and its 8-byte length.
      predicted_file_bytes: the file size predicted from the formats alone
        (shapes, containers, the header the writer will emit).
      actual_file_bytes: the size of the bytes actually encoded (or written).
      evidence_file_bytes: the size of the encoded parity evidence
        (``parity.safetensors``), shipped in the artifact beside the weights.
    """

    layers: tuple[LayerSize, ...]
    normalizer_bytes: int
    header_bytes: int
    predicted_file_bytes: int
    actual_file_bytes: int
    evidence_file_bytes: int

    @property
    def matches(self) -> bool:
        return self.predicted_file_bytes == self.actual_file_bytes

    @property
    def float32_weight_bytes(self) -> int:
        return sum(layer.float32_bytes for layer in self.layers)

    @property
    def weight_bytes(self) -> int:
        return sum(layer.weight_bytes for layer in self.layers)

    @property
    def scale_bytes(self) -> int:
        return sum(layer.scale_bytes + layer.step_bytes for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": [layer.to_dict() for layer in self.layers],
            "normalizer_bytes": self.normalizer_bytes,
            "header_bytes": self.header_bytes,
            "float32_weight_bytes": self.float32_weight_bytes,
            "weight_bytes": self.weight_bytes,
            "scale_bytes": self.scale_bytes,
            "predicted_file_bytes": self.predicted_file_bytes,
            "actual_file_bytes": self.actual_file_bytes,
            "matches": self.matches,
            "evidence_file_bytes": self.evidence_file_bytes,
        }


def _layer_size(index: int, layer: LayerSpec, table: dict[str, tuple[tuple[int, ...], np.dtype, str]]) -> LayerSize:
    def nbytes(name: str) -> int:
        if name not in table:
            return 0
        shape, dtype, _ = table[name]
        return math.prod(shape) * dtype.itemsize

    count = math.prod(layer.w_shape)
    container = layer.weights.container
    bits = 32 if container == "float32" else CONTAINERS[container][0]
    return LayerSize(
        index=index,
        weight_shape=layer.w_shape,
        count=count,
        container=container,
        bits=bits,
        float32_bytes=4 * count,
        weight_bytes=nbytes(f"layers/{index}/w"),
        scale_bytes=nbytes(f"layers/{index}/w_scale"),
        bias_bytes=nbytes(f"layers/{index}/b"),
        step_bytes=nbytes(f"layers/{index}/a_step"),
    )


def size_report(model: ExportedModel, encoded: bytes, metadata: dict[str, str], evidence: bytes) -> SizeReport:
    """The :class:`SizeReport` of ``model``, with ``encoded`` the weight file's bytes and ``evidence`` the parity's.

    The prediction uses the model's formats only (its tensor table and the header
    the writer emits for it), never the encoded bytes.
    """
    table = model.tensors()
    plain = {name: (shape, dtype) for name, (shape, dtype, _) in table.items()}
    header = 8 + len(_safetensors.header(plain, metadata))
    return SizeReport(
        layers=tuple(_layer_size(i, layer, table) for i, layer in enumerate(model.layers)),
        normalizer_bytes=sum(math.prod(table[n][0]) * 4 for n in ("normalizer/mean", "normalizer/std")),
        header_bytes=header,
        predicted_file_bytes=_safetensors.file_size(plain, metadata),
        actual_file_bytes=len(encoded),
        evidence_file_bytes=len(evidence),
    )
