"""Shared test setup: strict JAX numerics and helpers for exact comparisons."""

import jax
import ml_dtypes
import numpy as np
import pytest

# As equinox does: no silent dtype or rank promotion anywhere in the suite.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

FLOAT_DTYPES = (np.float16, ml_dtypes.bfloat16, np.float32)


@pytest.fixture(params=FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    """float16, bfloat16 and float32, one test each."""
    return np.dtype(request.param)
