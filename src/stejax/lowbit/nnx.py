r"""The NNX layer of low-bit products: a linear layer whose kernel stays in its exported integer form.

:class:`LowBitLinear` keeps integer weight codes resident (int8; grouped int4 and int2 packed two and four to a
byte; ternary as int8 or packed four to a byte) and multiplies per-token int8 (or int4) input codes by them
with int32 sums, rescaled once; :class:`SplitLinear` runs several such layers of one input as one product. The
product is chosen in Python when the layer is traced, from its fields
(``implementation``, ``method``) and static facts (the shape, the default device's generation): XLA's
``lax.dot_general`` or the Pallas kernels of :mod:`stejax.lowbit.kernels`, which give the same int32 sums.
Needs the optional extra ``stejax[flax]``.
"""

from stejax.lowbit._layer import LowBitLinear as LowBitLinear
from stejax.lowbit._layer import Resident as Resident
from stejax.lowbit._layer import SplitLinear as SplitLinear
from stejax.lowbit._layer import with_kernel_method as with_kernel_method
