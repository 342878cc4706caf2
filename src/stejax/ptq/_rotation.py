r"""Hadamard rotations: spread outlier channels over all channels before quantising (QuaRot-style).

With :math:`R` orthonormal (:math:`RR^\top = I`), :math:`y = xW = (xR)(R^\top W)`.
A normalised Hadamard matrix mixes every input channel into every rotated one
with equal weight :math:`\pm 1/\sqrt{n}`, so one large channel becomes many
moderate ones: the rotated activations and weights have a smaller largest value
for their root mean square, and quantise with less error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["hadamard", "rotate_inputs", "rotate_kernel"]

_HIGHEST = jax.lax.Precision.HIGHEST


def hadamard(n: int, *, block: int | None = None) -> jax.Array:
    r"""The orthonormal Hadamard matrix of size ``n`` (Sylvester), or a block diagonal of them.

    Sylvester's construction :math:`H_{2m} = \begin{pmatrix} H_m & H_m \\ H_m & -H_m \end{pmatrix}`,
    :math:`H_1 = (1)`, scaled by :math:`1/\sqrt{n}`: symmetric and orthonormal.
    Sizes that are powers of two are supported; for other sizes give ``block``,
    a power of two that divides ``n``, for ``n / block`` copies of the
    block's matrix on the diagonal (each rotates its own run of channels).
    Hadamard matrices of other orders (12, 20, ...) are not built here.

    Returns:
      float32 ``(n, n)``.

    Raises:
      ValueError: ``n`` not a power of two without ``block``, or a ``block``
        that is not a power of two dividing ``n``.

    Example:
      >>> import jax.numpy as jnp
      >>> jnp.sign(hadamard(2)).tolist()
      [[1.0, 1.0], [1.0, -1.0]]
    """

    def power_of_two(k: object) -> bool:
        return isinstance(k, int) and not isinstance(k, bool) and k >= 1 and k & (k - 1) == 0

    if block is None:
        if not power_of_two(n):
            raise ValueError(
                f"hadamard: n must be a power of two; got {n!r}. For other sizes give block=, a power of two that "
                "divides n (a block-diagonal rotation)."
            )
        block = n
    if not power_of_two(block) or not isinstance(n, int) or n < 1 or n % block:
        raise ValueError(f"hadamard: block must be a power of two that divides n={n!r}; got {block!r}.")
    h = np.ones((1, 1))
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    h = h / np.sqrt(block)
    return jnp.asarray(np.kron(np.eye(n // block), h), jnp.float32)


def rotate_inputs(inputs: ArrayLike, rotation: ArrayLike) -> jax.Array:
    """``inputs @ rotation`` over the last axis (float32 products at full precision), in the inputs' dtype."""
    x = jnp.asarray(inputs)
    r = jnp.asarray(rotation, jnp.float32)
    return jnp.matmul(x.astype(jnp.float32), r, precision=_HIGHEST).astype(x.dtype)


def rotate_kernel(kernel: ArrayLike, rotation: ArrayLike) -> jax.Array:
    r"""``rotation.T @ kernel`` for a kernel ``(in, out)``: with :func:`rotate_inputs`, :math:`(xR)(R^\top W) = xW`.

    Example:
      >>> import jax.numpy as jnp
      >>> r = hadamard(4)
      >>> x, w = jnp.arange(8.0).reshape(2, 4), jnp.ones((4, 3))
      >>> bool(jnp.allclose(rotate_inputs(x, r) @ rotate_kernel(w, r), x @ w))
      True

    Reference:
      S. Ashkboos et al., "QuaRot: Outlier-Free 4-Bit Inference in Rotated
      LLMs", NeurIPS 2024 (arXiv:2404.00456).
    """
    w = jnp.asarray(kernel)
    r = jnp.asarray(rotation, jnp.float32)
    return jnp.matmul(r.T, w.astype(jnp.float32), precision=_HIGHEST).astype(w.dtype)
