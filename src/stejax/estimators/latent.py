"""Latent quantizers: FSQ, vector quantization, the rotation trick, straight-through Gumbel-softmax.

Shared conventions of this family:

* Intermediate arithmetic runs in float32 for float16, bfloat16 and float32
  inputs (float64 for float64 inputs); only the result is rounded to the input
  dtype. Low-precision transcendental functions and norms are thereby computed
  once, in one place, instead of depending on how XLA fuses low-precision ops.
* Elementwise formulas are written without a multiply feeding an add and
  without a division by a compile-time constant: XLA on CPU contracts
  ``a * b + c`` into a fused multiply-add under ``jit`` (not op by op) and
  rewrites ``x / c`` as ``x * (1 / c)``. Written this way they give the same
  bits eagerly and under ``jit``.
* Computations with a reduction over the vector axis (distances, norms, dot
  products, the softmax) are each compiled as one unit (``jax.jit``): XLA on CPU
  picks a reduction's summation order, and whether to fuse a multiply into it,
  by shape and by what it is fused with, so ``jnp.sum(v * v, -1)`` op by op and
  inside a larger ``jit`` can differ in the last bit. Compiled as a unit they
  give the same bits either way (checked by the tests; XLA promises no more).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from stejax.estimators._core import surrogate
from stejax.estimators._entry import ArgSpec, Entry, ParamSpec

__all__ = [
    "ENTRIES",
    "VQResult",
    "fsq",
    "fsq_codes_to_indices",
    "fsq_indices_to_codes",
    "gumbel_softmax_st",
    "rotation_trick",
    "vq_quantize",
    "vq_ste",
]

_INT32_MAX = int(np.iinfo(np.int32).max)


def _compute_dtype(dtype) -> jnp.dtype:
    """float64 for float64 inputs, float32 for every other floating dtype."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def _check_rank(name: str, x: jax.Array, what: str = "input") -> None:
    if x.ndim < 1:
        raise ValueError(
            f"{name}: the {what} must have at least one axis (the vector axis is the last); got shape {x.shape}."
        )


# --------------------------------------------------------------------------------------------
# Finite Scalar Quantization
# --------------------------------------------------------------------------------------------


class _FSQConstants(NamedTuple):
    """Per-channel constants of FSQ, in float64 (shape ``(len(levels),)``)."""

    levels: np.ndarray  # int64, L per channel
    shift: np.ndarray  # arctanh(offset / half_l); 0 for odd L
    tanh_shift: np.ndarray  # offset / half_l = tanh(shift); 0 for odd L
    half_l: np.ndarray  # (L - 1) (1 + eps) / 2
    half_width: np.ndarray  # int64, L // 2
    inv_half_width: np.ndarray  # 1 / (L // 2)
    slope: np.ndarray  # half_l / half_width
    basis: np.ndarray  # int64, mixed-radix place values (first channel least significant)


def _check_levels(name: str, levels: Any) -> tuple[int, ...]:
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
        raise TypeError(
            f"{name}: `levels` must be a tuple of ints (one per channel), e.g. (8, 5, 5, 5); "
            f"got {levels!r} of type {type(levels).__name__}."
        )
    levels = tuple(levels)
    if not levels:
        raise ValueError(f"{name}: `levels` must name at least one channel; got {levels!r}.")
    for level in levels:
        if isinstance(level, (bool, np.bool_)) or not isinstance(level, (int, np.integer)):
            raise TypeError(
                f"{name}: every entry of `levels` must be an int >= 2; got {level!r} "
                f"of type {type(level).__name__} in levels={levels!r}."
            )
        if level < 2:
            raise ValueError(f"{name}: every entry of `levels` must be >= 2; got {level} in levels={levels!r}.")
    return tuple(int(level) for level in levels)


@functools.lru_cache(maxsize=64)
def _fsq_constants(levels: tuple[int, ...]) -> _FSQConstants:
    eps = 1e-3
    lv = np.asarray(levels, np.int64)
    even = lv % 2 == 0
    half_l = (lv - 1) * (1 + eps) / 2
    offset = np.where(even, 0.5, 0.0)
    half_width = lv // 2
    basis = np.concatenate(([1], np.cumprod(lv[:-1]))).astype(np.int64)
    consts = _FSQConstants(
        levels=lv,
        shift=np.arctanh(offset / half_l),
        tanh_shift=offset / half_l,
        half_l=half_l,
        half_width=half_width,
        inv_half_width=1.0 / half_width,
        slope=half_l / half_width,
        basis=basis,
    )
    for a in consts:
        a.setflags(write=False)
    return consts


def _fsq_setup(name: str, z: jax.Array, levels: Any) -> _FSQConstants:
    levels = _check_levels(name, levels)
    _check_rank(name, z)
    if z.shape[-1] != len(levels):
        raise ValueError(
            f"{name}: the last axis of the input must have one channel per level, "
            f"len(levels) = {len(levels)} for levels={levels!r}; got input shape {z.shape} "
            f"(last axis {z.shape[-1]})."
        )
    return _fsq_constants(levels)


def _channel_const(values: np.ndarray, ndim: int, dtype) -> jax.Array:
    """A per-channel constant shaped to broadcast against a rank-``ndim`` array, rounded once."""
    return jnp.asarray(np.asarray(values).reshape((1,) * (ndim - 1) + (-1,)), dtype)


def _fsq_tanh(z: jax.Array, c: _FSQConstants) -> jax.Array:
    """tanh(z + shift) in the compute dtype (the shift is 0 on odd channels)."""
    u = z.astype(_compute_dtype(z.dtype))
    return jnp.tanh(u + _channel_const(c.shift, z.ndim, u.dtype))


def _fsq_forward(z, *, levels):
    c = _fsq_setup("fsq", z, levels)
    th = _fsq_tanh(z, c)
    # tanh(z + shift) * half_l - offset, evaluated as (tanh(z + shift) - tanh(shift)) * half_l:
    # the same number, without a multiply feeding an add that XLA would contract into an FMA
    # under jit only.
    bounded = (th - _channel_const(c.tanh_shift, z.ndim, th.dtype)) * _channel_const(c.half_l, z.ndim, th.dtype)
    quantized = jnp.round(bounded)
    # A zero code is +0.0: the sign of a rounded-to-zero b follows the last bit of tanh (and
    # XLA may fold z + 0), and fsq_indices_to_codes gives +0.0.
    quantized = jnp.where(quantized == 0, 0, quantized)
    return (quantized * _channel_const(c.inv_half_width, z.ndim, th.dtype)).astype(z.dtype)


def _fsq_derivative(z, *, levels):
    c = _fsq_setup("fsq", z, levels)
    th = _fsq_tanh(z, c)
    # 1 - tanh^2 as (1 - tanh)(1 + tanh): no cancellation as |tanh| -> 1, and no FMA contraction.
    return ((1 - th) * (1 + th) * _channel_const(c.slope, z.ndim, th.dtype)).astype(z.dtype)


_fsq = surrogate(_fsq_forward, _fsq_derivative, name="fsq")


def fsq(z: ArrayLike, *, levels: Sequence[int]) -> jax.Array:
    r"""Finite Scalar Quantization with a straight-through rounding and the true bound's derivative.

    Forward: each channel :math:`i` of the last axis is bounded to :math:`L_i`
    integer levels and rescaled to :math:`[-1, 1]`. With :math:`\epsilon = 10^{-3}`,

    .. math::
       h_i = \tfrac{(L_i - 1)(1 + \epsilon)}{2},\quad
       o_i = \begin{cases} 1/2 & L_i \text{ even} \\ 0 & L_i \text{ odd}\end{cases},\quad
       s_i = \operatorname{artanh}(o_i / h_i),\quad
       w_i = \lfloor L_i / 2 \rfloor,

    .. math::
       b_i = \tanh(z_i + s_i)\, h_i - o_i,\qquad
       y_i = \operatorname{round}(b_i) / w_i .

    :math:`\operatorname{round}(b_i)` takes exactly :math:`L_i` integer values
    (:math:`-w_i, \dots, L_i - 1 - w_i`), so :math:`y_i` lies on a grid of
    :math:`L_i` points in :math:`[-1, 1]` and :math:`z = 0` maps to 0.

    Evaluation, exactly: in float32 (float64 for float64 inputs),
    :math:`b_i = (\tanh(z_i + s_i) - o_i/h_i)\, h_i` (the same number as above;
    written so XLA cannot contract a multiply-add differently under ``jit``),
    then :math:`y_i = \operatorname{round}(b_i) \cdot (1/w_i)` with
    :math:`s_i, o_i/h_i, h_i, 1/w_i` each computed in float64 and rounded once to
    the compute dtype; the result is rounded once to ``z``'s dtype. A zero code is
    always ``+0.0`` (as :func:`fsq_indices_to_codes` gives it), whatever the sign
    of ``z`` or of the rounded :math:`b_i`.

    Surrogate: straight-through the rounding, the true derivative of the bound,

    .. math::
       \frac{\partial y_i}{\partial z_i} = \frac{h_i\,(1 - \tanh^2(z_i + s_i))}{w_i}
       \quad\text{(elementwise; evaluated as } (1-\tanh)(1+\tanh)\,(h_i/w_i)\text{)}.

    Kinks and ties: :math:`y` jumps where :math:`b_i` crosses :math:`k + 1/2`,
    i.e. at :math:`z_i = \operatorname{artanh}((k + 1/2 + o_i)/h_i) - s_i`;
    exact ties round to even. The derivative is smooth there. It decays to 0 as
    :math:`|z_i| \to \infty` (0 at ``±inf``); NaN propagates.

    Args:
      z: floating-point array of shape ``(..., len(levels))``.
      levels: the number of levels :math:`L_i \ge 2` of each channel (required
        keyword, static), e.g. ``(8, 5, 5, 5)`` for a 1000-code implicit codebook.

    Returns:
      An array of ``z``'s shape and dtype with values :math:`k / w_i`.

    Raises:
      ValueError: ``z.shape[-1] != len(levels)``, ``z`` is a scalar, or a level
        is < 2 (or ``levels`` is empty).
      TypeError: ``levels`` is not a sequence of ints, or ``z`` is not floating.

    Dtypes: float16 and bfloat16 inputs are computed in float32 and rounded once;
    the derivative is rounded to ``z``'s dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.latent import fsq
      >>> fsq(jnp.array([0.4, -3.0, 0.7]), levels=(8, 5, 3))
      Array([ 0.25, -1.  ,  1.  ], dtype=float32)
      >>> jax.grad(lambda z: fsq(z, levels=(8, 5, 3)).sum())(jnp.zeros(3))
      Array([0.8580357, 1.001    , 1.001    ], dtype=float32)

    Reference:
      F. Mentzer, D. Minnen, E. Agustsson, M. Tschannen, "Finite Scalar
      Quantization: VQ-VAE Made Simple", ICLR 2024 (arXiv:2309.15505). The bound
      uses :math:`(1 + \epsilon)` and :math:`\operatorname{artanh}`, which centre
      :math:`z = 0` exactly (the paper's listing has :math:`(1 - \epsilon)` and
      :math:`\tan`; the level sets are the same).
    """
    return _fsq(z, levels=levels)


def _fsq_index_constants(name: str, levels: Any) -> _FSQConstants:
    levels = _check_levels(name, levels)
    size = math.prod(levels)
    if size > _INT32_MAX:
        raise ValueError(
            f"{name}: the implicit codebook has prod(levels) = {size} codes, more than int32 "
            f"indices hold ({_INT32_MAX}); got levels={levels!r}."
        )
    return _fsq_constants(levels)


def fsq_codes_to_indices(codes: ArrayLike, *, levels: Sequence[int]) -> jax.Array:
    r"""The index of each FSQ code in the implicit codebook of ``prod(levels)`` codes.

    A code :math:`y` (an output of :func:`fsq`) has integer digits
    :math:`d_i = \operatorname{round}(y_i w_i) + w_i \in \{0, \dots, L_i - 1\}`
    and index :math:`\sum_i d_i \prod_{j < i} L_j` (mixed radix, the first
    channel least significant, as in the paper's reference code). Pure, no
    gradient.

    Args:
      codes: floating array of shape ``(..., len(levels))`` holding FSQ codes.
        Values off the grid are rounded to the nearest level (not clipped).
      levels: as for :func:`fsq` (required keyword).

    Returns:
      An int32 array of shape ``codes.shape[:-1]``.

    Raises:
      ValueError: shape mismatch, bad levels, or ``prod(levels)`` > 2**31 - 1.
      TypeError: ``codes`` is not floating, or ``levels`` is not ints.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.estimators.latent import fsq_codes_to_indices
      >>> fsq_codes_to_indices(jnp.array([[-1.0, -1.0], [-0.75, -1.0], [0.75, 1.0]]), levels=(8, 5))
      Array([ 0,  1, 39], dtype=int32)
    """
    name = "fsq_codes_to_indices"
    c = _fsq_index_constants(name, levels)
    codes = jnp.asarray(codes)
    if not jnp.issubdtype(codes.dtype, jnp.floating):
        raise TypeError(f"{name}: `codes` must be a floating-point array of FSQ codes; got dtype {codes.dtype}.")
    _fsq_setup(name, codes, levels)
    cdt = _compute_dtype(codes.dtype)
    # round(y * w) + w rather than round(y * w + w): no multiply-add to contract.
    scaled = jnp.round(codes.astype(cdt) * _channel_const(c.half_width, codes.ndim, cdt))
    digits = scaled.astype(jnp.int32) + _channel_const(c.half_width, codes.ndim, jnp.int32)
    return jnp.sum(digits * _channel_const(c.basis, codes.ndim, jnp.int32), axis=-1, dtype=jnp.int32)


def fsq_indices_to_codes(indices: ArrayLike, *, levels: Sequence[int], dtype: DTypeLike = jnp.float32) -> jax.Array:
    r"""The FSQ code of each index of the implicit codebook; inverse of :func:`fsq_codes_to_indices`.

    Digits :math:`d_i = \lfloor n / \prod_{j<i} L_j \rfloor \bmod L_i`, code
    :math:`y_i = (d_i - w_i) \cdot (1/w_i)` evaluated as :func:`fsq` does (in
    float32, or float64 for ``dtype=float64``, then rounded once to ``dtype``),
    so a round trip reproduces :func:`fsq`'s output bit for bit. Pure, no gradient.

    Args:
      indices: integer array of any shape. Indices are taken modulo
        ``prod(levels)``.
      levels: as for :func:`fsq` (required keyword).
      dtype: the floating dtype of the codes (default float32).

    Returns:
      An array of shape ``indices.shape + (len(levels),)`` and dtype ``dtype``.

    Raises:
      ValueError: bad levels, or ``prod(levels)`` > 2**31 - 1.
      TypeError: ``indices`` is not an integer array, or ``dtype`` is not floating.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.estimators.latent import fsq_indices_to_codes
      >>> fsq_indices_to_codes(jnp.array([0, 1, 39]), levels=(8, 5))
      Array([[-1.  , -1.  ],
             [-0.75, -1.  ],
             [ 0.75,  1.  ]], dtype=float32)
    """
    name = "fsq_indices_to_codes"
    c = _fsq_index_constants(name, levels)
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{name}: `indices` must be an integer array; got dtype {indices.dtype}.")
    try:
        out_dtype = jnp.dtype(dtype)
    except TypeError:
        out_dtype = None
    if out_dtype is None or not jnp.issubdtype(out_dtype, jnp.floating):
        raise TypeError(f"{name}: `dtype` must be a floating dtype (e.g. jnp.float32); got {dtype!r}.")
    ndim = indices.ndim + 1
    n = indices.astype(jnp.int32)[..., None]
    digits = (n // _channel_const(c.basis, ndim, jnp.int32)) % _channel_const(c.levels, ndim, jnp.int32)
    cdt = _compute_dtype(out_dtype)
    centred = (digits - _channel_const(c.half_width, ndim, jnp.int32)).astype(cdt)
    return (centred * _channel_const(c.inv_half_width, ndim, cdt)).astype(out_dtype)


def _fsq_boundaries(*, levels, **_) -> tuple[float, ...]:
    """The z at which some channel's bounded value crosses a rounding tie k + 1/2."""
    points = set()
    for level in sorted(set(_check_levels("fsq", levels))):
        c = _fsq_constants((level,))
        half_l, offset = float(c.half_l[0]), float(c.tanh_shift[0] * c.half_l[0])
        for k in range(-level, level):
            tie = k + 0.5
            if abs(tie + offset) < half_l:
                points.add(float(np.arctanh((tie + offset) / half_l) - c.shift[0]))
    return tuple(sorted(points))


def _fsq_example_shape(*, levels, **_) -> tuple[int, ...]:
    return (3, len(_check_levels("fsq", levels)))


# --------------------------------------------------------------------------------------------
# Vector quantization: nearest code, straight-through; the rotation trick
# --------------------------------------------------------------------------------------------


def _check_codebook(name: str, z: jax.Array, codebook: jax.Array) -> None:
    _check_rank(name, z, "input z")
    if codebook.ndim != 2 or codebook.shape[0] < 1 or codebook.shape[1] != z.shape[-1]:
        raise ValueError(
            f"{name}: the codebook must have shape (K, D) with K >= 1 and D = z.shape[-1]; "
            f"got z of shape {z.shape} and codebook of shape {codebook.shape}."
        )


def _squared_distances(z: jax.Array, codebook: jax.Array) -> jax.Array:
    """sum_d (z_d - c_kd)^2 for every code k, shape ``z.shape[:-1] + (K,)``, in the compute dtype.

    The difference form, not ||z||^2 - 2 z.c + ||c||^2, which cancels for nearby
    vectors and can pick the wrong code.
    """
    cdt = _compute_dtype(z.dtype)
    codes = codebook.astype(cdt).reshape((1,) * (z.ndim - 1) + codebook.shape)
    diff = z.astype(cdt)[..., None, :] - codes
    return jnp.sum(diff * diff, axis=-1)


@jax.jit  # one unit, so eager and jitted callers pick the same code (see the module docstring)
def _nearest_indices(z: jax.Array, codebook: jax.Array) -> jax.Array:
    # argmin: equal distances go to the lowest index; a NaN distance counts as the minimum.
    return jnp.argmin(_squared_distances(z, codebook), axis=-1)


def _vq_forward(z, codebook):
    _check_codebook("vq_quantize", z, codebook)
    return jnp.take(codebook, _nearest_indices(z, codebook), axis=0)


def _vq_derivative(z, codebook):
    return jnp.ones_like(z)


_vq = surrogate(_vq_forward, _vq_derivative, name="vq_quantize", diff_argnums=(0,))


class VQResult(NamedTuple):
    """The outputs of :func:`vq_ste`. ``z`` has shape ``(..., D)``, the codebook ``(K, D)``."""

    quantized: jax.Array  # (..., D), z's dtype: the nearest codes, straight-through to z
    indices: jax.Array  # (...,), int32 (int64 under x64): the nearest code's index
    commitment_loss: jax.Array  # (), z's dtype: mean((z - sg(q))^2), gradient to z only
    codebook_loss: jax.Array  # (), z's dtype: mean((sg(z) - q)^2), gradient to the codebook only


def _check_vq_args(name: str, z: ArrayLike, codebook: ArrayLike) -> tuple[jax.Array, jax.Array]:
    z, codebook = jnp.asarray(z), jnp.asarray(codebook)
    for role, a in (("input z", z), ("codebook", codebook)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"{name}: the {role} must be a floating-point array; got dtype {a.dtype}.")
    if z.dtype != codebook.dtype:
        raise TypeError(
            f"{name}: z and the codebook must share one floating dtype; got {z.dtype} and "
            f"{codebook.dtype}. Cast explicitly."
        )
    _check_codebook(name, z, codebook)
    return z, codebook


def vq_quantize(z: ArrayLike, codebook: ArrayLike) -> jax.Array:
    r"""The nearest codebook vector, with a straight-through gradient to ``z``.

    The single-output form of :func:`vq_ste` (its ``quantized`` field): the
    catalog's ``vq_quantize`` entry. Use :func:`vq_ste` to also get the indices
    and the VQ-VAE losses that train the codebook.

    Forward: :math:`k^{*} = \arg\min_k \sum_d (z_d - c_{kd})^2` over the last axis
    and :math:`y = c_{k^{*}}`, exactly ``codebook[k*]``. Distances are evaluated in
    float32 (float64 for float64 inputs) in this difference form (not
    :math:`\lVert z\rVert^2 - 2 z \cdot c + \lVert c\rVert^2`, which cancels), so
    codes equidistant to within that rounding are ordered by the rounded values.

    Surrogate: :math:`\partial y_d / \partial z_d = 1` (elementwise identity, the
    straight-through estimator); the codebook is a constant of this path (its
    tangent is ignored).

    Kinks and ties: :math:`y` jumps on the Voronoi boundaries between codes.
    Equal distances go to the lowest index (``argmin``). A vector with a NaN (or,
    with an infinite codebook entry, an undefined) distance takes the first such
    code; a vector with an infinite entry is infinitely far from every finite
    code and takes code 0.

    Args:
      z: floating array of shape ``(..., D)``.
      codebook: array of shape ``(K, D)`` with ``z``'s dtype.

    Returns:
      An array of ``z``'s shape and dtype.

    Raises:
      ValueError: the codebook is not ``(K, D)`` with ``D = z.shape[-1]``, or ``z`` is a scalar.
      TypeError: non-floating arrays or different dtypes.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.latent import vq_quantize
      >>> codebook = jnp.array([[0.0, 0.0], [1.0, 1.0]])
      >>> vq_quantize(jnp.array([0.8, 0.4]), codebook)
      Array([1., 1.], dtype=float32)
      >>> jax.grad(lambda z: vq_quantize(z, codebook).sum())(jnp.array([0.8, 0.4]))
      Array([1., 1.], dtype=float32)

    Reference:
      A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural Discrete
      Representation Learning", NeurIPS 2017.
    """
    return _vq(z, codebook)


def vq_ste(z: ArrayLike, codebook: ArrayLike) -> VQResult:
    r"""Vector quantization with the straight-through estimator and the VQ-VAE losses.

    ``quantized`` is :func:`vq_quantize`: :math:`q = c_{k^{*}}` with
    :math:`k^{*} = \arg\min_k \lVert z - c_k \rVert^2` (ties to the lowest index)
    and :math:`\partial q / \partial z = I`. With :math:`\operatorname{sg}` the
    stop-gradient and means over all elements,

    .. math::
       \mathcal{L}_\text{commit} = \operatorname{mean}\big((z - \operatorname{sg}(q))^2\big),\qquad
       \mathcal{L}_\text{codebook} = \operatorname{mean}\big((\operatorname{sg}(z) - q)^2\big).

    The commitment loss trains only the encoder (gradient :math:`2(z - q)/N` to
    ``z``, none to the codebook); the codebook loss trains only the selected
    codes. The paper's objective is
    :math:`\mathcal{L}_\text{codebook} + \beta\, \mathcal{L}_\text{commit}`
    (:math:`\beta = 0.25`); weighting is left to the caller.

    Args:
      z: floating array of shape ``(..., D)``.
      codebook: array of shape ``(K, D)`` with ``z``'s dtype.

    Returns:
      A :class:`VQResult` ``(quantized, indices, commitment_loss, codebook_loss)``:
      ``quantized`` of ``z``'s shape and dtype, ``indices`` int32 (int64 under x64)
      of shape ``z.shape[:-1]``, both losses scalars of ``z``'s dtype (the mean
      accumulates in float32 for low-precision dtypes, as ``jnp.mean`` does).

    Raises:
      ValueError: the codebook is not ``(K, D)`` with ``D = z.shape[-1]``, or ``z`` is a scalar.
      TypeError: non-floating arrays or different dtypes.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.estimators.latent import vq_ste
      >>> out = vq_ste(jnp.array([[0.8, 0.4], [0.1, 0.0]]), jnp.array([[0.0, 0.0], [1.0, 1.0]]))
      >>> out.indices
      Array([1, 0], dtype=int32)
      >>> round(float(out.commitment_loss), 4)
      0.1025

    Reference:
      A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural Discrete
      Representation Learning", NeurIPS 2017.
    """
    z, codebook = _check_vq_args("vq_ste", z, codebook)
    quantized = _vq(z, codebook)
    indices = _nearest_indices(z, codebook)
    codes = jnp.take(codebook, indices, axis=0)  # differentiable w.r.t. the codebook
    commitment_loss = jnp.mean(jnp.square(z - jax.lax.stop_gradient(codes)))
    codebook_loss = jnp.mean(jnp.square(jax.lax.stop_gradient(z) - codes))
    return VQResult(quantized, indices, commitment_loss, codebook_loss)


def _direction(v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(v / ||v||, ||v||) over the last axis, scaled by max|v| so squares neither overflow nor
    underflow; the direction of a zero vector is 0."""
    m = jnp.max(jnp.abs(v), axis=-1, keepdims=True)
    nonzero = m > 0
    scaled = v / jnp.where(nonzero, m, 1)
    scaled_norm = jnp.sqrt(jnp.sum(scaled * scaled, axis=-1, keepdims=True))
    unit = jnp.where(nonzero, scaled / jnp.where(nonzero, scaled_norm, 1), 0)
    return unit, m * scaled_norm


def _rotation_forward(z, codebook):
    _check_codebook("rotation_trick", z, codebook)
    return jnp.take(codebook, _nearest_indices(z, codebook), axis=0)


def _rotation_tangent(z, codebook, *, tangents):
    _check_codebook("rotation_trick", z, codebook)
    (t,) = tangents
    return _rotation_tangent_map(z, codebook, t)


@jax.jit  # one unit, so eager and jitted callers get the same bits (see the module docstring)
def _rotation_tangent_map(z, codebook, t):
    cdt = _compute_dtype(z.dtype)
    q = jnp.take(codebook, _nearest_indices(z, codebook), axis=0).astype(cdt)
    e, z_norm = _direction(z.astype(cdt))
    f, q_norm = _direction(q)
    # r = 0 when e = -f: R is then the reflection I - 2 e e^T, which still maps e to f.
    r, _ = _direction(e + f)
    scale = q_norm / jnp.where(z_norm == 0, 1, z_norm)
    # The surrogate Jacobian lambda R is a constant of the backward pass (the paper's sg).
    e, f, r, scale = (jax.lax.stop_gradient(a) for a in (e, f, r, scale))
    tc = t.astype(cdt)
    along_r = jnp.sum(r * tc, axis=-1, keepdims=True)
    along_e = jnp.sum(e * tc, axis=-1, keepdims=True)
    rotated = tc - 2 * r * along_r + 2 * f * along_e
    # z = 0: lambda and e are undefined; fall back to the straight-through identity.
    return jnp.where(z_norm == 0, tc, scale * rotated).astype(z.dtype)


_rotation = surrogate(_rotation_forward, tangent=_rotation_tangent, name="rotation_trick", diff_argnums=(0,))


def rotation_trick(z: ArrayLike, codebook: ArrayLike) -> jax.Array:
    r"""Vector quantization whose gradient is rotated and rescaled from ``q`` back to ``z``.

    Forward: the nearest code, exactly as :func:`vq_quantize`:
    :math:`q = c_{k^{*}}`, :math:`k^{*} = \arg\min_k \lVert z - c_k\rVert^2`, ties to
    the lowest index.

    Surrogate: per vector (last axis), the Jacobian is the constant
    (stop-gradient) :math:`\lambda R`, which maps :math:`z` onto :math:`q`:

    .. math::
       e = \frac{z}{\lVert z\rVert},\quad f = \frac{q}{\lVert q\rVert},\quad
       r = \frac{e + f}{\lVert e + f\rVert},\quad
       R = I - 2 r r^\top + 2 f e^\top,\quad \lambda = \frac{\lVert q\rVert}{\lVert z\rVert},

    .. math::
       \dot q = \lambda R\, \dot z
       = \lambda\big(\dot z - 2 r (r^\top \dot z) + 2 f (e^\top \dot z)\big).

    :math:`R` is orthogonal and :math:`R e = f`, so :math:`\lambda R z = q`. The
    Jacobian is not diagonal; it couples the entries of each vector, never
    different vectors.

    Degenerate cases: :math:`z = 0` (:math:`\lambda` and :math:`e` undefined) falls
    back to the straight-through identity :math:`\dot q = \dot z`.
    :math:`q = 0 \ne z` gives :math:`\lambda = 0`, a zero Jacobian.
    :math:`e = -f` (:math:`r` undefined) takes :math:`r = 0`, so
    :math:`R = I - 2 e e^\top`, the reflection that maps :math:`e` to
    :math:`f = -e` (orthogonal, determinant -1), as the reference code does.
    Near :math:`e = -f` the computed :math:`r` loses accuracy. Non-finite ``z``
    gives a NaN tangent.

    Kinks and ties: as :func:`vq_quantize` (Voronoi boundaries; equal distances
    go to the lowest index).

    Args:
      z: floating array of shape ``(..., D)``.
      codebook: array of shape ``(K, D)`` with ``z``'s dtype; a constant for
        differentiation (train it with ``vq_ste(z, codebook).codebook_loss``).

    Returns:
      An array of ``z``'s shape and dtype.

    Raises:
      ValueError: the codebook is not ``(K, D)`` with ``D = z.shape[-1]``, or ``z`` is a scalar.
      TypeError: non-floating arrays or different dtypes.

    Dtypes: norms and the tangent are computed in float32 for float16/bfloat16
    (norms with a max-abs scaling, so they do not overflow) and rounded once.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.latent import rotation_trick
      >>> codebook = jnp.array([[0.0, 2.0]])
      >>> rotation_trick(jnp.array([1.0, 0.0]), codebook)
      Array([0., 2.], dtype=float32)
      >>> jax.jacfwd(rotation_trick)(jnp.array([1.0, 0.0]), codebook).round(4)  # 2 x (rotation by 90°)
      Array([[ 0., -2.],
             [ 2.,  0.]], dtype=float32)

    Reference:
      C. Fifty, R. G. Junkins, D. Duan, A. Iger, J. W. Liu, E. Amid, S. Thrun,
      C. Ré, "Restructuring Vector Quantization with the Rotation Trick",
      arXiv:2410.06424, 2024 (ICLR 2025).
    """
    return _rotation(z, codebook)


def _make_codebook(rng: np.random.Generator, x_shape, dtype, params) -> np.ndarray:
    """Six codes of the input's dimension D = x_shape[-1]."""
    return rng.standard_normal((6, x_shape[-1])).astype(dtype)


def _no_boundaries(**_) -> tuple[float, ...]:
    # Data-dependent: the Voronoi boundaries and argmax ties depend on the codebook or the noise.
    return ()


# --------------------------------------------------------------------------------------------
# Straight-through Gumbel-softmax
# --------------------------------------------------------------------------------------------


def _check_tau(tau: Any) -> float:
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"gumbel_softmax_st: `tau` must be a positive finite number (a static float); "
            f"got {tau!r} of type {type(tau).__name__}."
        )
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"gumbel_softmax_st: `tau` must be a positive finite number; got {tau!r}.")
    return float(tau)


@jax.jit  # one unit, so eager and jitted callers draw the same sample (see the module docstring)
def _gumbel_perturbed(logits: jax.Array, key: jax.Array) -> jax.Array:
    cdt = _compute_dtype(logits.dtype)
    return logits.astype(cdt) + jax.random.gumbel(key, logits.shape, cdt)


def _gumbel_forward(logits, *, key, tau=1.0):
    _check_tau(tau)
    _check_rank("gumbel_softmax_st", logits, "logits")
    # argmax: equal perturbed logits go to the lowest index; NaN counts as the maximum.
    index = jnp.argmax(_gumbel_perturbed(logits, key), axis=-1)
    return jax.nn.one_hot(index, logits.shape[-1], dtype=logits.dtype)


def _gumbel_tangent(logits, *, tangents, key, tau=1.0):
    tau = _check_tau(tau)
    _check_rank("gumbel_softmax_st", logits, "logits")
    (t,) = tangents
    return _gumbel_tangent_map(logits, t, key, tau=tau)


@functools.partial(jax.jit, static_argnames="tau")  # one unit (see the module docstring)
def _gumbel_tangent_map(logits, t, key, *, tau):
    soft = jax.nn.softmax(_gumbel_perturbed(logits, key) / tau, axis=-1)
    tc = t.astype(soft.dtype)
    centred = tc - jnp.sum(soft * tc, axis=-1, keepdims=True)
    return (soft * centred / tau).astype(logits.dtype)


_gumbel = surrogate(_gumbel_forward, tangent=_gumbel_tangent, name="gumbel_softmax_st", random=True)


def gumbel_softmax_st(logits: ArrayLike, *, key: jax.Array, tau: float = 1.0) -> jax.Array:
    r"""A one-hot sample of a categorical distribution, with the Gumbel-softmax gradient.

    Forward: with :math:`g_i \sim \text{Gumbel}(0, 1)` drawn from ``key``
    (``jax.random.gumbel(key, logits.shape, float32)``; float64 for float64
    logits), :math:`y = \operatorname{one\_hot}(\arg\max_i (\ell_i + g_i))` over the
    last axis, in ``logits``' dtype. The sum :math:`\ell + g` is taken in float32,
    so :math:`P(y_i = 1) = \operatorname{softmax}(\ell)_i` (the Gumbel-max trick);
    ``tau`` does not change the sample.

    Surrogate: the Jacobian of the relaxed sample
    :math:`s = \operatorname{softmax}((\ell + g)/\tau)` (same noise), per vector:

    .. math::
       \dot y = \frac{1}{\tau}\, s \odot \big(\dot\ell - \langle s, \dot\ell\rangle\big),
       \qquad \frac{\partial y_i}{\partial \ell_j} = \frac{s_i(\delta_{ij} - s_j)}{\tau}.

    Not diagonal: each entry's tangent depends on the whole vector.

    Kinks and ties: equal perturbed logits go to the lowest index (``argmax``),
    an event of probability zero for finite logits. ``-inf`` logits are never
    drawn unless every logit of the vector is ``-inf`` (then index 0); a NaN or
    ``+inf`` logit is always drawn (the first one).

    Args:
      logits: floating array of shape ``(..., n)``, unnormalised log-probabilities.
      key: a PRNG key (required keyword). The same key gives the same sample.
        The noise has ``logits.shape``; under ``vmap`` an unbatched key gives
        every example the same noise, so map over split keys for independent draws.
      tau: the temperature of the surrogate, a static positive float (default 1.0).

    Returns:
      A one-hot array of ``logits``' shape and dtype.

    Raises:
      ValueError: ``tau`` is not positive and finite, or ``logits`` is a scalar.
      TypeError: ``tau`` is not a number, ``key`` is missing, or ``logits`` is not floating.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.estimators.latent import gumbel_softmax_st
      >>> y = gumbel_softmax_st(jnp.array([0.0, 50.0, 0.0]), key=jax.random.key(0))
      >>> y
      Array([0., 1., 0.], dtype=float32)

    Reference:
      E. Jang, S. Gu, B. Poole, "Categorical Reparameterization with
      Gumbel-Softmax", ICLR 2017.
    """
    return _gumbel(logits, key=key, tau=_check_tau(tau))


# --------------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------------

_CODEBOOK = ArgSpec(
    name="codebook",
    make=_make_codebook,
    differentiable=False,
    doc="(K, D) codes with D = z.shape[-1]; a constant of the straight-through path.",
)

_REFERENCE_VQ = "van den Oord, Vinyals, Kavukcuoglu, NeurIPS 2017"

ENTRIES = (
    Entry(
        name="fsq",
        family="latent",
        fn=fsq,
        forward=_fsq_forward,
        derivative=_fsq_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_fsq_boundaries,
        params=(
            ParamSpec(
                name="levels",
                default=None,
                values=((8, 5, 5, 5), (2, 3, 4)),
                doc="Levels L_i >= 2 per channel (required); the input's last axis must be len(levels).",
            ),
        ),
        input_rank=1,
        # The first argument's last axis must equal len(levels).
        example_shape=_fsq_example_shape,
        forward_math=(
            r"y_i = \operatorname{round}\big(\tanh(z_i + s_i)\,h_i - o_i\big)/w_i,\ "
            r"h_i = \tfrac{(L_i-1)(1+10^{-3})}{2},\ o_i = \tfrac12[L_i\ \text{even}],\ "
            r"s_i = \operatorname{artanh}(o_i/h_i),\ w_i = \lfloor L_i/2\rfloor"
        ),
        derivative_math=r"\partial y_i/\partial z_i = h_i\,(1 - \tanh^2(z_i + s_i))/w_i",
        kinks=(
            "Jumps where tanh(z_i + s_i) h_i - o_i crosses k + 1/2 (ties round to even); zero "
            "codes are +0.0; the derivative is smooth there and tends to 0 as |z| grows."
        ),
        reference="Mentzer, Minnen, Agustsson, Tschannen, ICLR 2024",
    ),
    Entry(
        name="vq_quantize",
        family="latent",
        fn=vq_quantize,
        forward=_vq_forward,
        derivative=_vq_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=_no_boundaries,
        args=(_CODEBOOK,),
        input_rank=1,
        forward_math=r"y = c_{k^*},\ k^* = \arg\min_k \lVert z - c_k\rVert^2",
        derivative_math=r"\partial y_d/\partial z_d = 1",
        kinks=(
            "Jumps on the Voronoi boundaries of the codebook (data-dependent, so no fixed "
            "boundary points); equal distances go to the lowest index."
        ),
        reference=_REFERENCE_VQ,
    ),
    Entry(
        name="rotation_trick",
        family="latent",
        fn=rotation_trick,
        forward=_rotation_forward,
        derivative=None,
        tangent=_rotation_tangent,
        diff_argnums=(0,),
        boundaries=_no_boundaries,
        args=(_CODEBOOK,),
        input_rank=1,
        forward_math=r"y = q = c_{k^*},\ k^* = \arg\min_k \lVert z - c_k\rVert^2",
        derivative_math=(
            r"\dot q = \operatorname{sg}(\lambda R)\,\dot z,\ \lambda = \lVert q\rVert/\lVert z\rVert,\ "
            r"R = I - 2 r r^\top + 2 f e^\top,\ e = \hat z,\ f = \hat q,\ r = \widehat{e + f}"
        ),
        kinks=("As vq_quantize. z = 0: identity tangent; e = -f: r = 0, R = I - 2 e e^T; q = 0: zero tangent."),
        reference="Fifty et al., arXiv:2410.06424 (2024)",
    ),
    Entry(
        name="gumbel_softmax_st",
        family="latent",
        fn=gumbel_softmax_st,
        forward=_gumbel_forward,
        derivative=None,
        tangent=_gumbel_tangent,
        diff_argnums=(0,),
        boundaries=_no_boundaries,
        params=(
            ParamSpec(
                name="tau",
                default=1.0,
                values=(1.0, 0.5, 2.0),
                doc="Temperature of the surrogate softmax, > 0; does not change the sample.",
            ),
        ),
        random=True,
        input_rank=1,
        forward_math=r"y = \operatorname{one\_hot}(\arg\max_i(\ell_i + g_i)),\ g_i \sim \text{Gumbel}(0,1)",
        derivative_math=(
            r"\dot y = s \odot (\dot\ell - \langle s, \dot\ell\rangle)/\tau,\ "
            r"s = \operatorname{softmax}((\ell + g)/\tau)"
        ),
        kinks="Argmax ties (probability zero) go to the lowest index.",
        reference="Jang, Gu, Poole, ICLR 2017",
    ),
)
