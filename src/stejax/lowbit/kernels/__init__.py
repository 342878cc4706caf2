"""Pallas TPU kernels for low-bit products: each in a module of its own with its pure-JAX reference beside it.

Every kernel multiplies int8 input codes by integer weight codes kept packed in HBM (int8, grouped int4 and
int2, 2-bit ternary) with exact int32 sums; the fused kernels do a whole layer (input quantisation, product,
rescale) in one call. The references are the tests' oracle and run wherever a kernel cannot. :func:`supports`
and :data:`VERIFIED_ON` say where the automatic choice takes a kernel. Every wrapper takes ``interpret``
(Pallas interpret mode, any backend).
"""

from stejax.lowbit.kernels._fused import fused_grouped_linear as fused_grouped_linear
from stejax.lowbit.kernels._fused import fused_grouped_reference as fused_grouped_reference
from stejax.lowbit.kernels._fused import fused_linear as fused_linear
from stejax.lowbit.kernels._fused import fused_linear_reference as fused_linear_reference
from stejax.lowbit.kernels._grouped import grouped_sum as grouped_sum
from stejax.lowbit.kernels._grouped import grouped_sum_reference as grouped_sum_reference
from stejax.lowbit.kernels._int8 import int8_accumulate as int8_accumulate
from stejax.lowbit.kernels._int8 import int8_accumulate_reference as int8_accumulate_reference
from stejax.lowbit.kernels._skeleton import IMPLEMENTATIONS as IMPLEMENTATIONS
from stejax.lowbit.kernels._skeleton import VERIFIED_ON as VERIFIED_ON
from stejax.lowbit.kernels._skeleton import Blocks as Blocks
from stejax.lowbit.kernels._supports import FORMS as FORMS
from stejax.lowbit.kernels._supports import supports as supports
from stejax.lowbit.kernels._ternary import ternary_accumulate as ternary_accumulate
from stejax.lowbit.kernels._ternary import ternary_accumulate_reference as ternary_accumulate_reference
from stejax.lowbit.kernels._vpu import METHODS as METHODS
