"""ONNX Runtime on the CPU execution provider: an InferenceSession, and which kernels its optimised graph runs."""

from __future__ import annotations

import collections
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["INTEGER_OPS", "integer_op_count", "open_runtime", "optimized_ops"]

# The integer kernels ORT's CPU execution provider fuses QDQ products into: the standard ones and
# MatMulIntegerToFloat (com.microsoft: int8/uint8 x int8 -> int32, then x (scale_a * scale_b), float out).
INTEGER_OPS = ("QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger", "MatMulNBits", "MatMulIntegerToFloat")


def open_runtime(
    model: str | os.PathLike | bytes,
    *,
    threads: int = 2,
    optimized_path: str | None = None,
    allow_spinning: bool = True,
) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU execution provider with ``threads`` intra-op threads.

    ``optimized_path``: where ORT writes the graph it runs (after its fusions).
    One inter-op thread and sequential execution, so that ``threads`` is the
    whole budget. ``allow_spinning=False``: the intra-op threads sleep after a call
    instead of spinning for the next (ORT's ``allow_spinning`` option off), for timing
    several runtimes in one process, where a pool still spinning takes the cores the
    next one runs on.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # the NCHWc notice about serialising an optimised graph is expected
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def optimized_ops(model: str | os.PathLike | bytes, *, threads: int = 2) -> collections.Counter[str]:
    """The op types of the graph ORT runs for ``model`` (read back from ``optimized_model_filepath``), counted."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="stejax-onnx-") as tmp:
        path = Path(tmp) / "optimized.onnx"
        open_runtime(model, threads=threads, optimized_path=str(path))
        graph = onnx.load(str(path)).graph
        return collections.Counter(node.op_type for node in graph.node)


def integer_op_count(ops: collections.Counter[str]) -> int:
    """How many nodes of ``ops`` are integer products (:data:`INTEGER_OPS`)."""
    return sum(ops[name] for name in INTEGER_OPS)
