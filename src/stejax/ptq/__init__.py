"""Post-training quantisation: GPTQ, AWQ, SmoothQuant and Hadamard rotations, for one layer or by rules.

Each method takes a trained linear layer's kernel ``(in, out)`` and calibration
inputs and, with no training, returns the kernel on stejax's symmetric absmax
integer grid (:func:`gptq`, :func:`awq`, :func:`round_to_nearest`) or a kernel
and an input transform whose product is unchanged (:func:`smooth`,
:func:`rotate_kernel` with :func:`rotate_inputs`). :func:`quantize_ptq` applies
GPTQ to every linear layer that the rules of :func:`stejax.flax.quantize_model`
quantise in a Flax NNX model; it needs the optional extra ``stejax[flax]``, the
per-layer functions only JAX. :func:`quantize_params` quantises the reference
models of :mod:`stejax.model` to a form (``"w4a8"``, ``"w8a8"``...) by
round-to-nearest, GPTQ, AWQ or SmoothQuant, and :func:`quantize_run` does it to
a float run directory, writing a run directory that ``stejax export`` takes
(``stejax ptq`` on the command line; needs ``stejax[train]``).
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
from stejax.ptq._reference import PTQ_METHODS as PTQ_METHODS
from stejax.ptq._reference import PTQParams as PTQParams
from stejax.ptq._reference import fold_channel_scales as fold_channel_scales
from stejax.ptq._reference import form_config as form_config
from stejax.ptq._reference import layer_rows as layer_rows
from stejax.ptq._reference import quantize_params as quantize_params
from stejax.ptq._rotation import hadamard as hadamard
from stejax.ptq._rotation import rotate_inputs as rotate_inputs
from stejax.ptq._rotation import rotate_kernel as rotate_kernel
from stejax.ptq._run import PTQ_FILE as PTQ_FILE
from stejax.ptq._run import PTQRun as PTQRun
from stejax.ptq._run import quantize_run as quantize_run
from stejax.ptq._run import read_ptq_record as read_ptq_record
from stejax.ptq._smoothquant import Smoothed as Smoothed
from stejax.ptq._smoothquant import smooth as smooth
from stejax.ptq._smoothquant import smoothquant_scales as smoothquant_scales
