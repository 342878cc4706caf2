"""stejax: straight-through estimators and other surrogate gradients for JAX, verified.

Every estimator returns exactly its forward operation and carries a declared
surrogate derivative, built by the one factory :func:`surrogate`. The catalog
(:data:`CATALOG`) holds the same facts as data.
"""

from stejax.estimators._core import surrogate as surrogate
from stejax.estimators.absmean import absmean_ternary as absmean_ternary
from stejax.estimators.binary import approx_sign as approx_sign
from stejax.estimators.binary import magnitude_aware_sign as magnitude_aware_sign
from stejax.estimators.binary import sign_ste as sign_ste
from stejax.estimators.binary import swish_sign as swish_sign
from stejax.estimators.binary import ternary as ternary
from stejax.estimators.calibration import absmax_scale as absmax_scale
from stejax.estimators.calibration import minmax_scale as minmax_scale
from stejax.estimators.calibration import mse_scale as mse_scale
from stejax.estimators.calibration import percentile_scale as percentile_scale
from stejax.estimators.catalog import CATALOG as CATALOG
from stejax.estimators.latent import VQResult as VQResult
from stejax.estimators.latent import fsq as fsq
from stejax.estimators.latent import fsq_codes_to_indices as fsq_codes_to_indices
from stejax.estimators.latent import fsq_indices_to_codes as fsq_indices_to_codes
from stejax.estimators.latent import gumbel_softmax_st as gumbel_softmax_st
from stejax.estimators.latent import rotation_trick as rotation_trick
from stejax.estimators.latent import vq_quantize as vq_quantize
from stejax.estimators.latent import vq_ste as vq_ste
from stejax.estimators.rounding import ceil_ste as ceil_ste
from stejax.estimators.rounding import floor_ste as floor_ste
from stejax.estimators.rounding import round_ste as round_ste
from stejax.estimators.rounding import stochastic_round as stochastic_round
from stejax.estimators.spiking import heaviside as heaviside
from stejax.estimators.spiking import heaviside_atan as heaviside_atan
from stejax.estimators.spiking import heaviside_boxcar as heaviside_boxcar
from stejax.estimators.spiking import heaviside_fast_sigmoid as heaviside_fast_sigmoid
from stejax.estimators.spiking import heaviside_sigmoid as heaviside_sigmoid
from stejax.estimators.spiking import heaviside_superspike as heaviside_superspike
from stejax.estimators.spiking import heaviside_triangular as heaviside_triangular
from stejax.estimators.uniform import dorefa_activations as dorefa_activations
from stejax.estimators.uniform import dorefa_weights as dorefa_weights
from stejax.estimators.uniform import fake_quant as fake_quant
from stejax.estimators.uniform import lsq as lsq
from stejax.estimators.uniform import lsq_plus as lsq_plus
from stejax.estimators.uniform import pact as pact
from stejax.lowbit._matmul import quantized_matmul as quantized_matmul
from stejax.lowbit._products import integer_dot_general as integer_dot_general
from stejax.lowbit._products import integer_einsum as integer_einsum

__version__ = "0.1.0"
