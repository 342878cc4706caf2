"""Integer arithmetic of low-bit weights: training products, packed codes, resident layers and TPU kernels.

One package below the models that use it (``stejax.lm``, ``stejax.export``, ``stejax.flax``), with nothing of
a model in it:

* the training products: :func:`integer_dot_general` and :func:`integer_einsum` (int8 codes forward and in
  both backward products) and :func:`quantized_matmul` (the integer product of two fake-quantised operands);
* packing: every layout in which stejax stores or keeps integer codes, with its one packer and reader
  (:func:`pack_codes` and :func:`unpack_codes` for the integer export's two's-complement containers,
  :func:`pack` and :func:`unpack` for a language model's offset containers, :func:`pack_groups` for resident
  grouped weights);
* :mod:`stejax.lowbit.nnx`: :class:`~stejax.lowbit.nnx.LowBitLinear`, the NNX layer that keeps integer codes
  resident and multiplies by them (needs ``stejax[flax]``);
* :mod:`stejax.lowbit.kernels`: the Pallas TPU kernels of those products, each with its pure-JAX reference,
  and where the automatic choice takes them.

Importing this package imports neither Flax nor Pallas.
"""

from stejax.lowbit._matmul import quantized_matmul as quantized_matmul
from stejax.lowbit._packing import CONTAINERS as CONTAINERS
from stejax.lowbit._packing import OFFSET_CONTAINERS as OFFSET_CONTAINERS
from stejax.lowbit._packing import container_for as container_for
from stejax.lowbit._packing import offset_container_for as offset_container_for
from stejax.lowbit._packing import pack as pack
from stejax.lowbit._packing import pack_codes as pack_codes
from stejax.lowbit._packing import pack_groups as pack_groups
from stejax.lowbit._packing import packed_bytes as packed_bytes
from stejax.lowbit._packing import packed_shape as packed_shape
from stejax.lowbit._packing import unpack as unpack
from stejax.lowbit._packing import unpack_codes as unpack_codes
from stejax.lowbit._products import integer_dot_general as integer_dot_general
from stejax.lowbit._products import integer_einsum as integer_einsum
