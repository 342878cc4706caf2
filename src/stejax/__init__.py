"""stejax: straight-through estimators and other surrogate gradients for JAX, verified."""

from stejax.estimators._core import surrogate as surrogate
from stejax.estimators.catalog import CATALOG as CATALOG
from stejax.estimators.rounding import ceil_ste as ceil_ste
from stejax.estimators.rounding import floor_ste as floor_ste
from stejax.estimators.rounding import round_ste as round_ste
from stejax.estimators.rounding import stochastic_round as stochastic_round

__version__ = "0.1.0"
