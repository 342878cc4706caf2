"""absmean_ternary (BitNet b1.58's weight quantiser): the verifier, and BitNet's reference formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from stejax.estimators.catalog import CATALOG
from stejax.verify import check_estimator


def bitnet_weight_quant(w: np.ndarray) -> np.ndarray:
    """BitNet's ``WeightQuant.forward`` (transformers 4.57.1, integrations/bitnet.py), in NumPy.

    ``scale = 1.0 / weight.abs().mean().clamp_(min=1e-5)``;
    ``(weight * scale).round().clamp(-1, 1) / scale`` in float32, cast back.
    """
    w32 = w.astype(np.float32)
    scale = np.float32(1.0) / np.maximum(np.float32(np.abs(w32.astype(np.float64)).mean()), np.float32(1e-5))
    return (np.clip(np.round(w32 * scale), -1, 1) / scale).astype(w.dtype)


def test_passes_the_verifier():
    report = check_estimator("absmean_ternary")
    assert report.ok, [(c.name, c.detail) for c in report.checks if not c.passed]
    assert len(report.checks) > 20


@pytest.mark.parametrize("shape", [(7,), (64, 48), (3, 32, 16)])
@pytest.mark.parametrize("spread", [0.02, 1.0, 300.0])
def test_equals_bitnet_reference_formula(shape, spread):
    rng = np.random.default_rng(hash((shape, spread)) % 2**32)
    w = (rng.standard_normal(shape) * spread).astype(np.float32)
    got = np.asarray(stejax.absmean_ternary(jnp.asarray(w)))
    want = bitnet_weight_quant(w)
    # stejax sums |w| in float32 (XLA's tree order), the reference here in float64:
    # the scales differ by at most a float32 sum's error, (4 + log2 n) ulps. The
    # codes are identical.
    gamma = np.abs(w.astype(np.float64)).mean()
    np.testing.assert_array_equal(np.sign(got), np.sign(want))
    rtol = (4 + np.ceil(np.log2(w.size))) * np.finfo(np.float32).eps
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)
    assert set(np.unique(np.round(got / gamma)).tolist()) <= {-1.0, 0.0, 1.0}


def test_gradient_is_the_identity_and_nothing_flows_through_the_scale():
    w = jnp.array([[-3.0, 0.01], [0.2, 40.0]])
    g = jax.grad(lambda v: (stejax.absmean_ternary(v) * jnp.arange(4.0).reshape(2, 2)).sum())(w)
    np.testing.assert_array_equal(np.asarray(g), np.arange(4.0).reshape(2, 2))


def test_all_zero_tensor_and_nan():
    assert not np.any(np.asarray(stejax.absmean_ternary(jnp.zeros((3, 3)))))
    y = np.asarray(stejax.absmean_ternary(jnp.array([1.0, jnp.nan, -2.0])))
    assert np.isnan(y).all()


def test_dtypes_follow_the_input():
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        w = jnp.linspace(-1, 1, 11, dtype=dtype)
        assert stejax.absmean_ternary(w).dtype == dtype


def test_bad_eps_is_refused():
    with pytest.raises(ValueError, match=r"absmean_ternary: `eps` must be a number > 0; got 0.0"):
        stejax.absmean_ternary(jnp.ones(3), eps=0.0)
    with pytest.raises(TypeError, match="`eps` must be a real number"):
        stejax.absmean_ternary(jnp.ones(3), eps="small")


def test_in_the_catalog_beside_twn_ternary():
    entry = CATALOG["absmean_ternary"]
    assert entry.fn is stejax.absmean_ternary and entry.family == "binary"
    w = jnp.array([-1.0, -0.45, 0.3, 0.6, 1.0])  # mean|w| = 0.67: the rules disagree at -0.45
    assert np.asarray(stejax.ternary(w)).tolist() == [-1.0, 0.0, 0.0, 1.0, 1.0]
    assert np.sign(np.asarray(stejax.absmean_ternary(w))).tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]
