"""The quantisers the model applies to weights and layer inputs, and their saturation statistics.

Each returns the quantised array and the fraction of its inputs in the estimator's
zero-gradient region (a float32 scalar computed on stopped-gradient values, so it
never changes a gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from stejax.estimators.binary import magnitude_aware_sign, sign_ste
from stejax.estimators.uniform import lsq, lsq_levels, pact
from stejax.model._config import Quantizer

__all__ = ["pact_step", "quantize_input", "quantize_weights"]


def _along_last(step: jax.Array, ndim: int) -> jax.Array:
    """A per-channel step reshaped to broadcast against the last axis (explicitly, for rank promotion)."""
    return step if step.ndim == 0 else jnp.reshape(step, (1,) * (ndim - 1) + (-1,))


def _outside_fraction(x: jax.Array, step: jax.Array, qn: int, qp: int) -> jax.Array:
    """The fraction of v = x / step outside [-Q_N, Q_P], where LSQ's input gradient is 0 (NaN counts)."""
    x, step = jax.lax.stop_gradient(x), jax.lax.stop_gradient(_along_last(step, x.ndim))
    v = x * (1 / step)
    inside = (v >= -qn) & (v <= qp)
    return jnp.mean((~inside).astype(jnp.float32))


def _outside_unit_fraction(x: jax.Array) -> jax.Array:
    """The fraction of |x| > 1 (or NaN), where the clipped sign STE's gradient is 0."""
    return jnp.mean((~(jnp.abs(jax.lax.stop_gradient(x)) <= 1)).astype(jnp.float32))


def round_no_ste(x: jax.Array, step: jax.Array, *, bits: int, signed: bool) -> jax.Array:
    r"""LSQ's forward with plain ``jnp.round`` and ``jnp.clip``: zero gradient with respect to ``x``.

    The same float32 operations as :func:`stejax.estimators.uniform.lsq`
    (``v = x * (1 / s)``, clip, round half to even, times ``s``), so the values agree
    with LSQ's; ``jnp.round`` has a zero derivative, so nothing reaches ``x``, while
    ``s`` gets plain autodiff's :math:`\operatorname{round}(\operatorname{clip}(v))`.
    """
    qn, qp = lsq_levels(bits, signed)
    s = _along_last(step, x.ndim)
    return jnp.round(jnp.clip(x * (1 / s), -qn, qp)) * s


def quantize_weights(w: jax.Array, step: jax.Array | None, q: Quantizer | None) -> tuple[jax.Array, jax.Array | None]:
    """The layer's weights as the forward pass uses them, and the zero-gradient fraction (None if float)."""
    if q is None:
        return w, None
    if q.method == "sign":
        # XNOR-Net / larq: alpha * sign(w), alpha = mean |w| per output channel (or
        # per tensor), the scale held constant for differentiation.
        if q.granularity == "channel":
            wq = magnitude_aware_sign(w, axis=-1)
        else:
            wq = jnp.reshape(magnitude_aware_sign(jnp.reshape(w, (-1,))), w.shape)
        return wq, _outside_unit_fraction(w)
    step = _required_step(step, q, "weights")
    qn, qp = lsq_levels(q.bits, True)
    if q.method == "lsq":
        axis = None if q.granularity == "tensor" else w.ndim - 1
        return lsq(w, step, bits=q.bits, signed=True, axis=axis), _outside_fraction(w, step, qn, qp)
    # round_no_ste: every input is in the zero-gradient region.
    return round_no_ste(w, step, bits=q.bits, signed=True), jnp.ones((), jnp.float32)


def pact_step(alpha: jax.Array, bits: int) -> jax.Array:
    r"""PACT's grid step :math:`s = \alpha \cdot \operatorname{fl}(1/(2^b - 1))`, as :func:`stejax.pact` computes it.

    The same float32 product as the estimator's forward, so ``round(clip(u, 0, alpha) * (1/s))`` and the
    integer path's ``round(clip(u * (1/s), 0, 2^b - 1))`` give the same codes.
    """
    return jnp.asarray(alpha, jnp.float32) * (1 / (2**bits - 1))


def _outside_clip_fraction(u: jax.Array, alpha: jax.Array) -> jax.Array:
    """The fraction of u outside [0, alpha), where PACT's input gradient is 0 (NaN counts)."""
    u, alpha = jax.lax.stop_gradient(u), jax.lax.stop_gradient(alpha)
    return jnp.mean((~((u >= 0) & (u < alpha))).astype(jnp.float32))


def quantize_input(
    u: jax.Array,
    step: jax.Array | None,
    q: Quantizer | None,
    *,
    signed: bool,
    alpha: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """A layer's input as the layer sees it, and the zero-gradient fraction (None if float).

    ``signed`` selects LSQ's grid: signed for the first layer's standardised
    features, unsigned after a ReLU. ``alpha`` is PACT's clipping level (pact only).
    """
    if q is None:
        return u, None
    if q.method == "sign":
        return sign_ste(u), _outside_unit_fraction(u)
    if q.method == "pact":
        if alpha is None:
            raise ValueError("pact inputs need their clipping level; got None (the parameters lack a_alpha).")
        return pact(u, alpha, bits=q.bits), _outside_clip_fraction(u, alpha)
    step = _required_step(step, q, "inputs")
    qn, qp = lsq_levels(q.bits, signed)
    if q.method == "lsq":
        return lsq(u, step, bits=q.bits, signed=signed), _outside_fraction(u, step, qn, qp)
    return round_no_ste(u, step, bits=q.bits, signed=signed), jnp.ones((), jnp.float32)


def _required_step(step: jax.Array | None, q: Quantizer, where: str) -> jax.Array:
    if step is None:
        raise ValueError(f"{q.method} {where} need their LSQ step; got None (the parameters lack the step).")
    return step
