"""Post-training quantisation: GPTQ, AWQ, SmoothQuant and Hadamard rotations, for one layer or by rules.

Each method takes a trained layer's weights and calibration inputs and returns
weights on stejax's symmetric absmax integer grid (or transformed weights and
inputs whose product is unchanged), with no training.
"""

from stejax.ptq._gptq import GPTQResult as GPTQResult
from stejax.ptq._gptq import gptq as gptq
from stejax.ptq._gptq import hessian as hessian
from stejax.ptq._gptq import round_to_nearest as round_to_nearest
from stejax.ptq._gptq import symmetric_grid as symmetric_grid
