"""Finite Scalar Quantization as a module: the paper's level presets and the index conversions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from stejax.estimators.latent import fsq, fsq_codes_to_indices, fsq_indices_to_codes

__all__ = ["FSQ", "FSQ_LEVELS"]

# Table 1 of the FSQ paper: the recommended levels for a target codebook size 2^n.
FSQ_LEVELS: dict[int, tuple[int, ...]] = {
    2**8: (8, 6, 5),
    2**10: (8, 5, 5, 5),
    2**12: (7, 5, 5, 5, 5),
    2**14: (8, 8, 8, 6, 5),
    2**16: (8, 8, 8, 5, 5, 5),
}


@dataclasses.dataclass(frozen=True)
class FSQ:
    r"""Finite Scalar Quantization of the last axis with :math:`\prod_i L_i` implicit codes.

    Calling it is :func:`stejax.fsq` (bound each channel with :math:`\tanh`, round to
    :math:`L_i` levels in :math:`[-1, 1]`, straight-through the rounding): no
    codebook to learn, no auxiliary loss. :meth:`codes_to_indices` and
    :meth:`indices_to_codes` convert between codes and indices in
    :math:`[0, \prod_i L_i)` (mixed radix, the first channel least significant),
    exact inverses of each other on codes.

    Attributes:
      levels: :math:`L_i \ge 2` per channel.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import FSQ
      >>> q = FSQ.from_codebook_size(2**10)
      >>> q.levels, q.codebook_size
      ((8, 5, 5, 5), 1000)
      >>> codes = q(jnp.array([[0.3, -2.0, 0.0, 5.0]]))
      >>> codes
      Array([[ 0.25, -1.  ,  0.  ,  1.  ]], dtype=float32)
      >>> q.indices_to_codes(q.codes_to_indices(codes))
      Array([[ 0.25, -1.  ,  0.  ,  1.  ]], dtype=float32)

    Reference:
      F. Mentzer, D. Minnen, E. Agustsson, M. Tschannen, "Finite Scalar
      Quantization: VQ-VAE Made Simple", ICLR 2024 (Table 1 for the presets).
    """

    levels: tuple[int, ...]

    def __post_init__(self):
        levels = self.levels
        if isinstance(levels, str | bytes) or not isinstance(levels, Sequence) or not levels:
            raise TypeError(f"FSQ: `levels` must be a non-empty tuple of ints >= 2; got {levels!r}.")
        if any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 2 for v in levels):
            raise ValueError(f"FSQ: every level must be an int >= 2; got levels={tuple(levels)!r}.")
        object.__setattr__(self, "levels", tuple(int(v) for v in levels))

    @classmethod
    def from_codebook_size(cls, codebook_size: int) -> FSQ:
        """The paper's preset for a codebook of about ``codebook_size`` codes (2^8, 2^10, ..., 2^16)."""
        if codebook_size not in FSQ_LEVELS:
            sizes = ", ".join(f"2^{int(math.log2(s))}" for s in FSQ_LEVELS)
            raise ValueError(f"FSQ.from_codebook_size: the presets are for {sizes}; got {codebook_size!r}.")
        return cls(FSQ_LEVELS[codebook_size])

    @property
    def dim(self) -> int:
        """The number of channels, ``len(levels)``."""
        return len(self.levels)

    @property
    def codebook_size(self) -> int:
        r""":math:`\prod_i L_i`."""
        return math.prod(self.levels)

    @property
    def bits(self) -> float:
        """Bits per code, ``log2(codebook_size)``."""
        return math.log2(self.codebook_size)

    def __call__(self, z: ArrayLike) -> jax.Array:
        """The codes of ``z`` ``(..., len(levels))``, with FSQ's gradient (see :func:`stejax.fsq`)."""
        return fsq(z, levels=self.levels)

    def bounded(self, z: ArrayLike) -> jax.Array:
        r"""The value before rounding, on the codes' scale: :math:`(\tanh(z_i + s_i) h_i - o_i) / w_i`.

        :math:`\lVert \text{bounded}(z) - \text{FSQ}(z)\rVert^2` is FSQ's quantisation
        error; each entry differs from the code by at most :math:`1/(2 w_i)`.
        """
        z = jnp.asarray(z)
        lv = np.asarray(self.levels, np.float64)
        half_l = (lv - 1) * (1 + 1e-3) / 2
        offset = np.where(lv % 2 == 0, 0.5, 0.0)
        shift = np.arctanh(offset / half_l)
        width = np.floor(lv / 2)
        shape = (1,) * (z.ndim - 1) + (-1,)

        def const(a):
            return jnp.asarray(a.reshape(shape), z.dtype)

        b = jnp.tanh(z + const(shift)) * const(half_l) - const(offset)
        return b / const(width)

    def codes_to_indices(self, codes: ArrayLike) -> jax.Array:
        """Indices ``(...)`` int32 of codes ``(..., len(levels))`` (:func:`stejax.fsq_codes_to_indices`)."""
        return fsq_codes_to_indices(codes, levels=self.levels)

    def indices_to_codes(self, indices: ArrayLike, dtype: DTypeLike = jnp.float32) -> jax.Array:
        """Codes ``(..., len(levels))`` of indices (:func:`stejax.fsq_indices_to_codes`)."""
        return fsq_indices_to_codes(indices, levels=self.levels, dtype=dtype)
