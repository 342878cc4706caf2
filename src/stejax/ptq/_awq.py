r"""AWQ: activation-aware scaling of each input channel before the weights are rounded.

A product :math:`y = xW` is unchanged when input channel :math:`j` is divided by
:math:`s_j` and row :math:`j` of the kernel multiplied by it:
:math:`y = (x\,\mathrm{diag}(s)^{-1})(\mathrm{diag}(s) W)`. Rounding the scaled
kernel instead of :math:`W` rounds the rows of salient channels (large mean
:math:`|x_j|`) more finely relative to their size. AWQ takes
:math:`s = \bar{a}^{\alpha}` with :math:`\bar a_j = \operatorname{mean}|x_j|` and
searches :math:`\alpha` on a grid for the smallest output error on calibration inputs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.ptq._gptq import _check_bits, _check_kernel, _expand, _round, _scale

__all__ = ["AWQResult", "awq", "awq_scales"]

_HIGHEST = jax.lax.Precision.HIGHEST
_MIN_SCALE = 1e-4


class AWQResult(NamedTuple):
    """The searched exponent, the channel scales it gives and the scaled kernel on the grid."""

    alpha: float  # the exponent on the grid with the smallest error
    input_scales: jax.Array  # (in,) float32: divide input channel j by s_j, multiply kernel row j by it
    codes: jax.Array  # (in, out) int8: the codes of diag(s) W, in [-q_max, q_max]
    scales: jax.Array  # (in // group, out) float32: the grid's scales for diag(s) W
    kernel: jax.Array  # (in, out) float32: codes * scales, the quantised diag(s) W
    losses: jax.Array  # (n_grid,) float32: the error at each alpha


def awq_scales(mean_abs: ArrayLike, alpha: float) -> jax.Array:
    r"""The channel scales for one exponent: :math:`s = \max(\hat a^{\alpha}, 10^{-4}) / \sqrt{\max s \cdot \min s}`.

    :math:`\hat a = \max(\bar a / (\max \bar a + 10^{-8}), 10^{-4})` is the mean
    :math:`|x_j|` normalised to the largest; the last division centres the scales
    around 1 (as the reference implementation; a common factor of all scales
    cancels in the absmax grid).

    Example:
      >>> import jax.numpy as jnp
      >>> awq_scales(jnp.array([1.0, 4.0]), 0.0).tolist()
      [1.0, 1.0]
      >>> [round(v, 4) for v in awq_scales(jnp.array([1.0, 4.0]), 1.0).tolist()]
      [0.5, 2.0]
    """
    a = jnp.asarray(mean_abs, jnp.float32)
    return _awq_scales(a, jnp.float32(alpha))


def _awq_scales(a: jax.Array, alpha: jax.Array) -> jax.Array:
    a = jnp.maximum(a / (jnp.max(a) + np.float32(1e-8)), np.float32(_MIN_SCALE))
    s = jnp.maximum(jnp.power(a, alpha), np.float32(_MIN_SCALE))
    return s / jnp.sqrt(jnp.max(s) * jnp.min(s))


def awq(
    kernel: ArrayLike,
    inputs: ArrayLike,
    *,
    bits: int,
    group: int | None = None,
    n_grid: int = 20,
    mean_abs: ArrayLike | None = None,
    name: str = "kernel",
) -> AWQResult:
    r"""AWQ for one linear layer: the exponent :math:`\alpha`, its channel scales and the scaled kernel on the grid.

    For each :math:`\alpha` in ``linspace(0, 1, n_grid)`` (20 points by default,
    both ends included; the reference implementation uses :math:`i/20`,
    :math:`i < 20`), with :math:`s` = :func:`awq_scales` of the mean
    :math:`|x_j|` over the calibration inputs, the error is

    .. math::

       L(\alpha) = \operatorname{mean}_x \big\| xW - (x\,\mathrm{diag}(s)^{-1})\, Q(\mathrm{diag}(s) W) \big\|^2,

    with :math:`Q` the symmetric absmax grid of
    :func:`stejax.ptq.symmetric_grid` (per output channel or per group) and
    round-to-nearest. The smallest :math:`L` wins (the first on ties);
    :math:`\alpha = 0` is plain round-to-nearest. Using the result needs the
    inputs divided by ``input_scales`` (folded into whatever produces them: a
    norm's scale, the previous layer's output channels).

    Args:
      kernel: ``(in, out)``, floating.
      inputs: calibration inputs ``(..., in)``; every leading axis is a sample.
      bits: the code width, an int in [2, 8].
      group: one grid scale per this many input features, or None (per channel).
      n_grid: the number of exponents tried (>= 1).
      mean_abs: ``(in,)``, the :math:`\bar a_j` to scale by, or None (default)
        for the mean :math:`|x_j|` of ``inputs``. Features whose scale must be
        shared (the rows of a convolution kernel that read one input channel,
        whose :math:`1/s` is folded into the one channel that produces them)
        are given equal values; the scales are then equal too.
      name: the layer's name, for error messages.

    Returns:
      An :class:`AWQResult`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> w = jax.random.normal(jax.random.key(0), (16, 4))
      >>> x = jax.random.normal(jax.random.key(1), (64, 16)) * jnp.linspace(0.1, 10.0, 16)[None, :]
      >>> out = awq(w, x, bits=4)
      >>> out.input_scales.shape, out.codes.dtype
      ((16,), dtype('int8'))
      >>> bool(jnp.min(out.losses) <= out.losses[0])  # alpha = 0 is round-to-nearest
      True

    Reference:
      J. Lin et al., "AWQ: Activation-aware Weight Quantization for LLM
      Compression and Acceleration", MLSys 2024 (arXiv:2306.00978, 2023).
    """
    where = f"awq({name!r})"
    bits = _check_bits(bits, where)
    w = _check_kernel(kernel, where, group)
    x = jnp.asarray(inputs)
    if x.ndim < 1 or x.shape[-1] != w.shape[0] or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(
            f"{where}: inputs must be floating (..., {w.shape[0]}) for a kernel {tuple(w.shape)}; "
            f"got {x.dtype} {tuple(x.shape)}."
        )
    if isinstance(n_grid, bool) or not isinstance(n_grid, int) or n_grid < 1:
        raise ValueError(f"{where}: n_grid must be a positive int; got {n_grid!r}.")
    x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    if mean_abs is None:
        a = jnp.mean(jnp.abs(x), axis=0)
    else:
        a = jnp.asarray(mean_abs, jnp.float32)
        if a.shape != (w.shape[0],):
            raise ValueError(f"{where}: mean_abs must be ({w.shape[0]},); got {tuple(a.shape)}.")
    alphas = jnp.linspace(0.0, 1.0, n_grid, dtype=jnp.float32)
    losses = _losses(w, x, a, alphas, bits=bits, group=group)
    best = int(jnp.argmin(losses))
    s = _awq_scales(a, alphas[best])
    codes, scales = _quantise(w * s[:, None], bits=bits, group=group)
    return AWQResult(
        float(alphas[best]), s, codes.astype(jnp.int8), scales, codes * _expand(scales, w.shape[0]), losses
    )


def _quantise(w: jax.Array, *, bits: int, group: int | None) -> tuple[jax.Array, jax.Array]:
    q_max = 2 ** (bits - 1) - 1
    n_in, n_out = w.shape
    g = n_in if group is None else group
    scales = _scale(w.reshape(n_in // g, g, n_out).transpose(1, 0, 2), q_max)
    return _round(w, _expand(scales, n_in), q_max), scales


@functools.partial(jax.jit, static_argnames=("bits", "group"))
def _losses(
    w: jax.Array, x: jax.Array, mean_abs: jax.Array, alphas: jax.Array, *, bits: int, group: int | None
) -> jax.Array:
    y = jnp.matmul(x, w, precision=_HIGHEST)

    def loss(alpha):
        s = _awq_scales(mean_abs, alpha)
        codes, scales = _quantise(w * s[:, None], bits=bits, group=group)
        w_hat = codes * _expand(scales, w.shape[0])
        d = y - jnp.matmul(x / s[None, :], w_hat, precision=_HIGHEST)
        return jnp.mean(jnp.sum(d * d, axis=-1))

    return jax.lax.map(loss, alphas)
