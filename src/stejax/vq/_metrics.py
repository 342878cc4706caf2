"""Codebook metrics as plain functions of indices and vectors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

__all__ = [
    "batch_usage",
    "bits_per_sample",
    "code_histogram",
    "dead_codes",
    "perplexity",
    "quantization_error",
    "usage",
]


def _check_size(name: str, codebook_size) -> int:
    if isinstance(codebook_size, bool) or not isinstance(codebook_size, int) or codebook_size < 1:
        raise ValueError(f"{name}: `codebook_size` must be a positive int; got {codebook_size!r}.")
    return codebook_size


def code_histogram(indices: ArrayLike, codebook_size: int) -> jax.Array:
    """How many times each code occurs in ``indices`` (any shape): int32 ``(codebook_size,)``.

    Indices outside ``[0, codebook_size)`` are not counted.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import code_histogram
      >>> code_histogram(jnp.array([[0, 2], [2, 2]]), 4)
      Array([1, 0, 3, 0], dtype=int32)
    """
    k = _check_size("code_histogram", codebook_size)
    idx = jnp.asarray(indices).reshape(-1)
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise TypeError(f"code_histogram: `indices` must be integers; got dtype {idx.dtype}.")
    return jnp.bincount(idx, length=k).astype(jnp.int32)


def usage(indices: ArrayLike, codebook_size: int) -> jax.Array:
    r"""The share of the codes used at least once in ``indices``: :math:`|\{k : n_k > 0\}| / K`, float32.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import usage
      >>> usage(jnp.array([0, 2, 2, 2]), 4)
      Array(0.5, dtype=float32)
    """
    counts = code_histogram(indices, codebook_size)
    return jnp.mean((counts > 0).astype(jnp.float32))


def batch_usage(indices: ArrayLike, codebook_size: int) -> jax.Array:
    r"""The share of the codes used within each batch, averaged over batches: float32.

    ``indices`` ``(n_batches, ...)``: :math:`\frac{1}{n}\sum_b |\{k : n_{b,k} > 0\}| / K`.
    At most ``min(batch, K) / K``: a batch of ``B`` vectors cannot use more than ``B`` codes.
    The per-batch reading of codebook usage, beside :func:`usage` over a whole epoch.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import batch_usage
      >>> batch_usage(jnp.array([[0, 0, 1, 1], [0, 1, 2, 3]]), 8)  # 2 of 8, then 4 of 8
      Array(0.375, dtype=float32)
    """
    k = _check_size("batch_usage", codebook_size)
    idx = jnp.asarray(indices)
    if idx.ndim < 1 or not jnp.issubdtype(idx.dtype, jnp.integer):
        raise TypeError(
            f"batch_usage: `indices` must be integers of shape (n_batches, ...); got {idx.dtype} {idx.shape}."
        )
    flat = idx.reshape(idx.shape[0], -1)
    used = jax.vmap(lambda row: jnp.sum((jnp.bincount(row, length=k) > 0).astype(jnp.float32)))(flat)
    return jnp.mean(used) / k


def perplexity(indices: ArrayLike, codebook_size: int) -> jax.Array:
    r"""The exponential of the code histogram's entropy: :math:`\exp(-\sum_k p_k \log p_k)`, :math:`p_k = n_k/n`.

    1 when one code is used, ``K`` when all are used equally; :math:`0 \log 0 = 0`.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import perplexity
      >>> perplexity(jnp.array([0, 1, 2, 3]), 8)
      Array(4., dtype=float32)
    """
    counts = code_histogram(indices, codebook_size).astype(jnp.float32)
    p = counts / jnp.maximum(jnp.sum(counts), 1)
    plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1)), 0)
    return jnp.exp(-jnp.sum(plogp))


def dead_codes(indices: ArrayLike, codebook_size: int) -> jax.Array:
    """The number of codes never used in ``indices`` (one epoch's, say): int32.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import dead_codes
      >>> dead_codes(jnp.array([0, 2, 2]), 4)
      Array(2, dtype=int32)
    """
    return jnp.sum(code_histogram(indices, codebook_size) == 0).astype(jnp.int32)


def quantization_error(z: ArrayLike, q: ArrayLike) -> jax.Array:
    r"""The mean over vectors of :math:`\lVert z - q\rVert^2` (sum over the last axis, mean over the rest).

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import quantization_error
      >>> quantization_error(jnp.array([[1.0, 1.0], [0.0, 0.0]]), jnp.array([[1.0, 0.0], [0.0, 0.0]]))
      Array(0.5, dtype=float32)
    """
    z, q = jnp.asarray(z), jnp.asarray(q)
    if z.shape != q.shape or z.ndim < 1:
        raise ValueError(f"quantization_error: z and q must have one shape (..., d); got {z.shape} and {q.shape}.")
    d = (z - q).astype(jnp.float32)
    return jnp.mean(jnp.sum(d * d, axis=-1))


def bits_per_sample(codebook_size: int, tokens: int = 1) -> float:
    r""":math:`\text{tokens} \cdot \log_2 K`: the bits one sample's indices carry.

    Example:
      >>> from stejax.vq import bits_per_sample
      >>> bits_per_sample(64, tokens=4)
      24.0
    """
    _check_size("bits_per_sample", codebook_size)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"bits_per_sample: `tokens` must be a positive int; got {tokens!r}.")
    return tokens * math.log2(codebook_size)
