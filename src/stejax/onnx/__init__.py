"""Deploy stejax-quantised networks with ONNX Runtime: QDQ graphs that its CPU integer kernels run.

:func:`export_onnx` writes a digits model (a verified artifact, or a run
exported to one) as an ONNX file in QDQ form, after checking its logits in ONNX
Runtime against stejax's integer forward (:class:`OnnxParity`, within
:data:`LOGIT_TOLERANCE` for the default ``QLinearConv`` graph, bit for bit for
``conv="integer"``); :func:`export_nnx` writes a Flax
NNX model quantised by rules (:func:`stejax.flax.quantize_model`). Both refuse,
with :class:`OnnxExportError` naming the path and kind, anything that has no
faithful ONNX form. :func:`open_runtime` opens a file on the CPU execution provider;
:func:`optimized_ops` lists the kernels ONNX Runtime runs after its fusions.
Needs the optional extra ``stejax[onnx]``.
"""

from stejax.onnx._export import LOGIT_TOLERANCE as LOGIT_TOLERANCE
from stejax.onnx._export import OnnxExport as OnnxExport
from stejax.onnx._export import OnnxParity as OnnxParity
from stejax.onnx._export import OnnxSpeed as OnnxSpeed
from stejax.onnx._export import export_onnx as export_onnx
from stejax.onnx._export import load_source as load_source
from stejax.onnx._graph import OnnxExportError as OnnxExportError
from stejax.onnx._nnx import export_nnx as export_nnx
from stejax.onnx._runtime import INTEGER_OPS as INTEGER_OPS
from stejax.onnx._runtime import integer_op_count as integer_op_count
from stejax.onnx._runtime import open_runtime as open_runtime
from stejax.onnx._runtime import optimized_ops as optimized_ops
