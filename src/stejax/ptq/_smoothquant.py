r"""SmoothQuant: move the range of outlier input channels from the activations into the weights.

For :math:`y = xW` with kernel :math:`W` ``(in, out)``, channel :math:`j`'s scale

.. math::

   s_j = \frac{\max|x_j|^{\alpha}}{\max|W_{j,:}|^{1-\alpha}}

divides input channel :math:`j` and multiplies row :math:`j` of the kernel:
:math:`y = (x\,\mathrm{diag}(s)^{-1})(\mathrm{diag}(s) W)`, the same product in
exact arithmetic, with activations that have smaller outliers, so that both
operands quantise to 8 bits (w8a8) with less error.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.ptq._gptq import _check_kernel

__all__ = ["Smoothed", "smooth", "smoothquant_scales"]

_FLOOR = 1e-5  # the reference implementation's clamp, on max|W_j| and on s


class Smoothed(NamedTuple):
    """A smoothed layer: the channel scales, and the kernel with its rows multiplied by them."""

    scales: jax.Array  # (in,) float32: divide input channel j by s_j
    kernel: jax.Array  # (in, out): diag(s) W, in the kernel's dtype


def smoothquant_scales(input_absmax: ArrayLike, kernel: ArrayLike, *, alpha: float = 0.5) -> jax.Array:
    r"""SmoothQuant's channel scales :math:`s_j = \max|x_j|^{\alpha} / \max|W_{j,:}|^{1-\alpha}`, at least 1e-5.

    Args:
      input_absmax: ``(in,)``, the largest :math:`|x_j|` per input channel over
        the calibration inputs.
      kernel: ``(in, out)``.
      alpha: the migration strength in [0, 1] (default 0.5: both operands end
        with the same per-channel range).

    Returns:
      float32 scales ``(in,)``. :math:`\max|W_{j,:}|` is floored at :math:`10^{-5}`
      first, as in the reference implementation.

    Example:
      >>> import jax.numpy as jnp
      >>> smoothquant_scales(jnp.array([16.0, 1.0]), jnp.array([[1.0], [4.0]])).tolist()
      [4.0, 0.5]
    """
    w = _check_kernel(kernel, "smoothquant_scales", None)
    a = jnp.asarray(input_absmax, jnp.float32)
    if a.shape != (w.shape[0],):
        raise ValueError(f"smoothquant_scales: input_absmax must be ({w.shape[0]},); got {tuple(a.shape)}.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothquant_scales: alpha must be in [0, 1]; got {alpha!r}.")
    w_max = jnp.maximum(jnp.max(jnp.abs(w), axis=1), np.float32(_FLOOR))
    s = jnp.power(a, np.float32(alpha)) / jnp.power(w_max, np.float32(1.0 - alpha))
    return jnp.maximum(s, np.float32(_FLOOR))


def smooth(kernel: ArrayLike, inputs: ArrayLike, *, alpha: float = 0.5) -> Smoothed:
    r"""SmoothQuant for one linear layer: the scales from calibration inputs, and the kernel ``diag(s) W``.

    The layer's inputs are then to be divided by ``scales`` (folded into the
    norm or layer that produces them); :math:`(x / s)(\mathrm{diag}(s) W) = xW`
    up to float rounding.

    Args:
      kernel: ``(in, out)``, floating.
      inputs: calibration inputs ``(..., in)``; every leading axis is a sample.
      alpha: the migration strength (default 0.5).

    Example:
      >>> import jax.numpy as jnp
      >>> out = smooth(jnp.array([[1.0], [4.0]]), jnp.array([[16.0, -1.0]]))
      >>> out.scales.tolist(), out.kernel.tolist()
      ([4.0, 0.5], [[4.0], [2.0]])

    Reference:
      G. Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training
      Quantization for Large Language Models", ICML 2023 (arXiv:2211.10438, 2022).
    """
    w = jnp.asarray(kernel)
    x = jnp.asarray(inputs)
    if x.ndim < 1 or x.shape[-1] != np.shape(w)[0]:
        raise ValueError(f"smooth: inputs must be (..., {np.shape(w)[0]}) for a kernel {np.shape(w)}; got {x.shape}.")
    absmax = jnp.max(jnp.abs(x.reshape(-1, x.shape[-1]).astype(jnp.float32)), axis=0)
    s = smoothquant_scales(absmax, w, alpha=alpha)
    return Smoothed(s, (w.astype(jnp.float32) * s[:, None]).astype(w.dtype))
