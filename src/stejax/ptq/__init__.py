"""Post-training quantisation: GPTQ, AWQ, SmoothQuant and Hadamard rotations, for one layer or by rules.

Each method takes a trained linear layer's kernel ``(in, out)`` and calibration
inputs and, with no training, returns the kernel on stejax's symmetric absmax
integer grid (:func:`gptq`, :func:`awq`, :func:`round_to_nearest`) or a kernel
and an input transform whose product is unchanged (:func:`smooth`,
:func:`rotate_kernel` with :func:`rotate_inputs`). :func:`quantize_ptq` applies
GPTQ to every linear layer that the rules of :func:`stejax.flax.quantize_model`
quantise in a Flax NNX model; it needs the optional extra ``stejax[flax]``, the
per-layer functions only JAX.
"""

from stejax.ptq._awq import AWQResult as AWQResult
from stejax.ptq._awq import awq as awq
from stejax.ptq._awq import awq_scales as awq_scales
from stejax.ptq._gptq import GPTQResult as GPTQResult
from stejax.ptq._gptq import gptq as gptq
from stejax.ptq._gptq import hessian as hessian
from stejax.ptq._gptq import round_to_nearest as round_to_nearest
from stejax.ptq._gptq import symmetric_grid as symmetric_grid
from stejax.ptq._model import quantize_ptq as quantize_ptq
from stejax.ptq._rotation import hadamard as hadamard
from stejax.ptq._rotation import rotate_inputs as rotate_inputs
from stejax.ptq._rotation import rotate_kernel as rotate_kernel
from stejax.ptq._smoothquant import Smoothed as Smoothed
from stejax.ptq._smoothquant import smooth as smooth
from stejax.ptq._smoothquant import smoothquant_scales as smoothquant_scales
