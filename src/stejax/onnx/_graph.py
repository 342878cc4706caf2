"""A small ONNX graph builder over ``onnx.helper``: constants, nodes, QDQ pairs, the checked model, atomic saving."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OPSET", "Graph", "OnnxExportError", "save_model"]

# Opset 21: INT4 tensors, QuantizeLinear/DequantizeLinear with int16 and 4-bit types.
OPSET = 21
IR_VERSION = 10


class OnnxExportError(ValueError):
    """A model, layer or quantiser with no faithful ONNX form: the message names its path and kind."""


class Graph:
    """Nodes and initializers, named uniquely, turned into a checked ``onnx.ModelProto`` by :meth:`model`."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._used: set[str] = set()

    def fresh(self, hint: str) -> str:
        base = hint.replace("/", "_") or "t"
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def const(self, hint: str, value: Any, dtype: Any = None) -> str:
        """An initializer holding ``value`` (NumPy array or scalar) as ``dtype``; returns its name."""
        from onnx import numpy_helper

        array = np.asarray(value, dtype=dtype)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const_int4(self, hint: str, codes: np.ndarray) -> str:
        """An ONNX INT4 initializer (two codes a byte in the file) of integer codes in [-8, 7]."""
        from onnx import TensorProto, helper

        codes = np.asarray(codes, np.int64)
        if codes.size and (codes.min() < -8 or codes.max() > 7):
            raise ValueError(f"const_int4: codes must lie in [-8, 7]; got [{codes.min()}, {codes.max()}].")
        name = self.fresh(hint)
        self.initializers.append(helper.make_tensor(name, TensorProto.INT4, codes.shape, codes.reshape(-1).tolist()))
        return name

    def node(self, op: str, inputs: Sequence[str], hint: str, **attrs: Any) -> str:
        """Append ``op(inputs)``; returns the name of its one output."""
        from onnx import helper

        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.fresh(f"{hint}/{op}"), **attrs))
        return out

    def quantize(self, x: str, scale: str, zero_point: str, hint: str, *, axis: int | None = None) -> str:
        return self.node("QuantizeLinear", [x, scale, zero_point], f"{hint}/q", **_axis(axis))

    def dequantize(self, q: str, scale: str, zero_point: str | None, hint: str, *, axis: int | None = None) -> str:
        inputs = [q, scale] if zero_point is None else [q, scale, zero_point]
        return self.node("DequantizeLinear", inputs, f"{hint}/dq", **_axis(axis))

    def model(
        self,
        inputs: Sequence[tuple[str, int, Sequence[int | str]]],
        outputs: Sequence[tuple[str, int, Sequence[int | str]]],
        metadata: Mapping[str, str],
        *,
        doc: str = "",
    ) -> Any:
        """The ``ModelProto``, checked by ``onnx.checker.check_model(full_check=True)`` and with inferred shapes."""
        import onnx
        from onnx import helper

        from stejax import __version__

        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
            [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in outputs],
            self.initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="stejax",
            producer_version=__version__,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        helper.set_model_props(model, dict(metadata))
        onnx.checker.check_model(model, full_check=True)
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)


def _axis(axis: int | None) -> dict[str, int]:
    return {} if axis is None else {"axis": axis}


def save_model(model: Any, out: str | os.PathLike) -> Path:
    """Write ``model`` to ``out`` atomically: a hidden file beside it, fsynced, then linked into place.

    Raises:
      FileExistsError: ``out`` exists (an ONNX file is never overwritten).
    """
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists; an exported ONNX file is never overwritten.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.onnx-partial-{secrets.token_hex(6)}"
    try:
        with open(tmp, "xb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, out)  # fails rather than replaces when out appeared meanwhile
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return out
