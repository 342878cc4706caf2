"""Flax NNX layers that quantise with stejax estimators, for quantisation-aware training.

:class:`QuantLinear` and :class:`QuantConv` fake-quantise their weights and
their inputs with any elementwise catalog estimator (:class:`Quant`, by name or
function) or any callable; LSQ steps and PACT clip levels are ``nnx.Param`` s
trained with the weights. :func:`quantize` wraps an existing ``nnx.Linear`` or
``nnx.Conv``; :func:`functional_params` turns trained layers into the
functional model's parameters (:func:`stejax.model.apply`), so an NNX model
goes through the same export path. :mod:`stejax.flax.example` trains a digits
CNN with ``nnx.Optimizer``.

Needs the optional extra ``stejax[flax]``; ``import stejax`` does not import Flax.
"""

from stejax.flax._convert import functional_params as functional_params
from stejax.flax._convert import quant_of as quant_of
from stejax.flax._layers import QuantConv as QuantConv
from stejax.flax._layers import QuantLinear as QuantLinear
from stejax.flax._layers import quantize as quantize
from stejax.flax._quant import Calibration as Calibration
from stejax.flax._quant import Quant as Quant
from stejax.flax._rules import Rule as Rule
from stejax.flax._rules import SiteRow as SiteRow
from stejax.flax._rules import Summary as Summary
from stejax.flax._rules import calibrate as calibrate
from stejax.flax._rules import quantize_model as quantize_model
from stejax.flax._rules import summary as summary
from stejax.flax._saving import load_quantized as load_quantized
from stejax.flax._saving import save_quantized as save_quantized
