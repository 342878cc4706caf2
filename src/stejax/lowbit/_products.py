r"""Integer training products: ``dot_general`` on int8 codes forward, and both backward products on int8 too.

:func:`integer_dot_general` is the public face (re-exported by
:mod:`stejax.lowbit` and :mod:`stejax`); :func:`integer_einsum`
writes the same product with einsum subscripts. The arithmetic, once:

1. The operands are brought to a canonical form by transposes and reshapes
   (exact data movement): ``lhs`` to :math:`x` of shape ``(B, M, K)`` (batch axes,
   free axes, contracting axes) and ``rhs`` to :math:`w` of shape ``(B, K, N)``.
   With ``group_size=g`` the contraction splits into :math:`G = K/g` groups:
   :math:`x` of shape ``(B, M, G, g)``, :math:`w` of shape ``(B, G, g, N)``.
   A product with no batch axes and one group (a dense layer's) is computed in
   the plain form instead: :math:`x` keeps ``lhs``'s free axes, ``(*F, K)``, and
   :math:`w` is ``(K, N)``; the arithmetic is the canonical form's with
   :math:`B = G = 1`, operation for operation (the same values bit for bit).
2. Scales are dynamic absmax, computed in float32 (float64 for float64 inputs)
   from the current values and not differentiated:
   :math:`s = m / q_{\max}` where :math:`m` is the largest magnitude over the
   scale's slice (``s = 1`` for an all-zero slice), and the codes
   :math:`q = \operatorname{clip}(\operatorname{round}(v \cdot \mathrm{fl}(1/s)), q_{\min}, q_{\max})`,
   round half to even, stored as int8.
3. The products are ``jax.lax.dot_general(..., preferred_element_type=int32)``:
   exact integer sums, rescaled once in float32.

The backward pass follows AQT and MaxText: the forward scales that vary along
a backward product's contracting axis are folded into the cotangent *before*
it is quantised, so each backward product multiplies the stored int8 codes of
the forward operands as they are.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from stejax.estimators._core import surrogate
from stejax.estimators.uniform import _compute_dtype, check_bits, integer_range

__all__ = [
    "BACKWARDS",
    "LHS_SCALES",
    "RHS_SCALES",
    "ROUNDINGS",
    "integer_dot_general",
    "integer_einsum",
]

LHS_SCALES = ("row", "tensor")
RHS_SCALES = ("column", "tensor")
BACKWARDS = ("int8", "float")
ROUNDINGS = ("nearest", "stochastic")
GRAD_BITS = 8  # the cotangent's grid in both backward products: int8
_INT32_MAX = 2**31 - 1
_NAME = "integer_dot_general"


class _Spec(NamedTuple):
    """The static description of one product (hashable: a custom_vjp nondiff argument)."""

    bits: int
    lhs_scale: str
    rhs_scale: str
    groups: int  # G: the number of groups along the contraction (1 without group_size)
    rounding: str
    plain: bool = False  # x (*F, K) and w (K, N): no batch axes, one group, lhs's free axes kept as they are


# ----------------------------------------------------------------------------- quantisation


def _scale(v: jax.Array, axes: tuple[int, ...], qmax: int) -> jax.Array:
    """absmax / qmax over ``axes`` (kept as size-1 axes), 1 where the slice is all zero."""
    m = jnp.max(jnp.abs(v), axis=axes, keepdims=True)
    return jnp.where(m > 0, m * (1 / qmax), jnp.ones_like(m))


def _quantise(v: jax.Array, s: jax.Array, bits: int, noise: jax.Array | None = None) -> jax.Array:
    """int8 codes of ``v`` on the grid of step ``s``: nearest (half to even), or stochastic with noise u in [0, 1)."""
    qmin, qmax = integer_range(bits, signed=True)
    r = v * (1 / s)
    if noise is None:
        r = jnp.round(r)
    else:
        # Up with probability frac(r): floor(r) + [u < r - floor(r)]. Every step is exact after the product
        # (floor, the subtraction, the compare), so no fusion or reassociation of a sum r + u by the compiler
        # can move a code: XLA:CPU computed floor(r + u) with other roundings than the formula's.
        down = jnp.floor(r)
        r = down + (noise < r - down).astype(r.dtype)
    return jnp.clip(r, qmin, qmax).astype(jnp.int8)


def _operand_codes(x4: jax.Array, w4: jax.Array, spec: _Spec):
    """(qx, sx, qw, sw): codes and scales of x ``(B, M, G, g)`` and w ``(B, G, g, N)`` in the compute dtype."""
    qmax = integer_range(spec.bits, signed=True)[1]
    sx = _scale(x4, (3,) if spec.lhs_scale == "row" else (0, 1, 2, 3), qmax)  # (B, M, G, 1) or (1, 1, 1, 1)
    sw = _scale(w4, (2,) if spec.rhs_scale == "column" else (0, 1, 2, 3), qmax)  # (B, G, 1, N) or (1, 1, 1, 1)
    return _quantise(x4, sx, spec.bits), sx, _quantise(w4, sw, spec.bits), sw


def _split(x: jax.Array, w: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
    b, m, k = x.shape
    n = w.shape[2]
    cdt = _compute_dtype(x.dtype)
    return x.astype(cdt).reshape(b, m, groups, k // groups), w.astype(cdt).reshape(b, groups, k // groups, n)


def _idot(a: jax.Array, b: jax.Array, dims) -> jax.Array:
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.int32)


# ----------------------------------------------------------------------------- the three products


def _forward(x: jax.Array, w: jax.Array, spec: _Spec):
    """y ``(B, M, N)`` in x's dtype, and the residuals (int8 codes and float scales)."""
    if spec.plain:
        return _forward_plain(x, w, spec)
    x4, w4 = _split(x, w, spec.groups)
    qx, sx, qw, sw = _operand_codes(x4, w4, spec)
    # (B, M, G, g) x (B, G, g, N) -> (B, G, M, N): batch (B, G), contract g.
    acc = _idot(qx, qw, (((3,), (2,)), ((0, 2), (0, 1))))
    y = acc.astype(sx.dtype) * jnp.swapaxes(sx, 1, 2) * sw
    y = jnp.sum(y, axis=1) if spec.groups > 1 else y[:, 0]
    return y.astype(x.dtype), (qx, sx, qw, sw)


def _cotangent_codes(v: jax.Array, axis: int, noise: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    s = _scale(v, (axis,), integer_range(GRAD_BITS, signed=True)[1])
    return _quantise(v, s, GRAD_BITS, noise), s


def _noise(key: jax.Array | None, shape: tuple[int, ...], dtype: Any) -> jax.Array | None:
    return None if key is None else jax.random.uniform(key, shape, dtype)


def _backward(spec: _Spec, residuals, g: jax.Array, key: jax.Array | None, dtypes) -> tuple[jax.Array, jax.Array]:
    """The declared cotangents (x̄, w̄) of shapes (B, M, K) and (B, K, N), from int8 x int8 -> int32 products."""
    if spec.plain:
        return _backward_plain(spec, residuals, g, key, dtypes)
    qx, sx, qw, sw = residuals
    x_dtype, w_dtype = dtypes
    b, m, groups, gk = qx.shape
    n = qw.shape[3]
    g = g.astype(sx.dtype)[:, None]  # (B, 1, M, N)
    kx, kw = (None, None) if key is None else jax.random.split(key)
    # x̄ = ḡ ŵᵀ: w's scale varies along n, the contracting axis of this product; fold it into ḡ,
    # then quantise ḡ per row (over n). A per-tensor scale factors out of the sum instead.
    fold_w = spec.rhs_scale == "column"
    gx = g * sw if fold_w else jnp.broadcast_to(g, (b, 1, m, n))
    qgx, sgx = _cotangent_codes(gx, 3, _noise(kx, gx.shape, gx.dtype))  # (B, G', M, N), (B, G', M, 1)
    if gx.shape[1] == 1 and groups > 1:
        qgx, sgx = jnp.broadcast_to(qgx, (b, groups, m, n)), jnp.broadcast_to(sgx, (b, groups, m, 1))
    # (B, G, M, N) x (B, G, g, N) -> (B, G, M, g)
    dx = _idot(qgx, qw, (((3,), (3,)), ((0, 1), (0, 1)))).astype(sx.dtype) * sgx
    if not fold_w:
        dx = dx * sw
    dx = jnp.swapaxes(dx, 1, 2).reshape(b, m, groups * gk)
    # w̄ = x̂ᵀ ḡ: x's scale varies along m, the contracting axis here; fold it into ḡ, quantise per column (over m).
    fold_x = spec.lhs_scale == "row"
    gw = jnp.swapaxes(sx, 1, 2) * g if fold_x else jnp.broadcast_to(g, (b, 1, m, n))  # (B, G', M, N)
    qgw, sgw = _cotangent_codes(gw, 2, _noise(kw, gw.shape, gw.dtype))  # (B, G', M, N), (B, G', 1, N)
    if gw.shape[1] == 1 and groups > 1:
        qgw, sgw = jnp.broadcast_to(qgw, (b, groups, m, n)), jnp.broadcast_to(sgw, (b, groups, 1, n))
    # (B, M, G, g) x (B, G, M, N) -> (B, G, g, N)
    dw = _idot(qx, qgw, (((1,), (2,)), ((0, 2), (0, 1)))).astype(sx.dtype) * sgw
    if not fold_x:
        dw = dw * sx
    return dx.astype(x_dtype), dw.reshape(b, groups * gk, n).astype(w_dtype)


# ----------------------------------------------------------------------------- the plain form
#
# A product with no batch axes and one group (every dense layer: x (..., K) times w (K, N)) is computed on
# x as it comes, (*F, K), with lhs's free axes F kept, and w as (K, N). The arithmetic is the canonical
# form's with B = G = 1, operation for operation (the same maxima, codes, int32 sums and rescaling, so
# the same values and cotangents bit for bit); only the shapes differ. Flattening F into one axis of
# M = prod(F) rows is a reshape the compiler must carry through the layer around the product. In the
# LM's training step compiled for a TPU (benchmarks/tpu_aot.py) that flattening made the per-token scales
# (M,) vectors relaid out to and from the model's (batch, sequence) tiling, pushed the attention's head
# layout into the int8 products (windowed convolutions) and their codes, and added about a quarter to the
# bytes the step accesses; in the plain form the step's HLO is the shape of Qwix's.


def _plain_codes(x: jax.Array, w: jax.Array, spec: _Spec):
    """(qx, sx, qw, sw) of x ``(*F, K)`` and w ``(K, N)``: scales ``(*F, 1)`` (or all-1 shape) and ``(1, N)``."""
    cdt = _compute_dtype(x.dtype)
    x, w = x.astype(cdt), w.astype(cdt)
    qmax = integer_range(spec.bits, signed=True)[1]
    sx = _scale(x, (x.ndim - 1,) if spec.lhs_scale == "row" else tuple(range(x.ndim)), qmax)
    sw = _scale(w, (0,) if spec.rhs_scale == "column" else (0, 1), qmax)
    return _quantise(x, sx, spec.bits), sx, _quantise(w, sw, spec.bits), sw


def _lift(s: jax.Array, ndim: int) -> jax.Array:
    """w's scale ``(1, N)`` with leading size-1 axes up to ``ndim`` (broadcasting without rank promotion)."""
    return s.reshape((1,) * (ndim - s.ndim) + s.shape)


def _forward_plain(x: jax.Array, w: jax.Array, spec: _Spec):
    qx, sx, qw, sw = _plain_codes(x, w, spec)
    acc = _idot(qx, qw, (((qx.ndim - 1,), (0,)), ((), ())))  # (*F, N)
    y = acc.astype(sx.dtype) * sx * _lift(sw, acc.ndim)
    return y.astype(x.dtype), (qx, sx, qw, sw)


def _plain_noise(key: jax.Array | None, shape: tuple[int, ...], dtype: Any) -> jax.Array | None:
    # Drawn in the canonical form's shape (1, 1, M, N): the same uniforms, element for element.
    if key is None:
        return None
    return jax.random.uniform(key, (1, 1, math.prod(shape[:-1]), shape[-1]), dtype).reshape(shape)


def _backward_plain(spec: _Spec, residuals, g: jax.Array, key: jax.Array | None, dtypes):
    qx, sx, qw, sw = residuals
    x_dtype, w_dtype = dtypes
    g = g.astype(sx.dtype)  # (*F, N)
    free = tuple(range(g.ndim - 1))
    kx, kw = (None, None) if key is None else jax.random.split(key)
    fold_w = spec.rhs_scale == "column"
    gx = g * _lift(sw, g.ndim) if fold_w else g
    qgx, sgx = _cotangent_codes(gx, g.ndim - 1, _plain_noise(kx, gx.shape, gx.dtype))  # per row: (*F, 1)
    dx = _idot(qgx, qw, (((g.ndim - 1,), (1,)), ((), ()))).astype(sx.dtype) * sgx  # (*F, K)
    if not fold_w:
        dx = dx * _lift(sw, dx.ndim)
    fold_x = spec.lhs_scale == "row"
    gw = sx * g if fold_x else g
    s = _scale(gw, free, integer_range(GRAD_BITS, signed=True)[1])  # per column: (1, ..., 1, N)
    qgw = _quantise(gw, s, GRAD_BITS, _plain_noise(kw, gw.shape, gw.dtype))
    dw = _idot(qx, qgw, ((free, free), ((), ()))).astype(sx.dtype) * s.reshape(1, -1)  # (K, N)
    if not fold_x:
        dw = dw * sx.reshape(1, 1)
    return dx.astype(x_dtype), dw.astype(w_dtype)


# Why custom_vjp and not stejax's custom_jvp factory: a custom_jvp rule is linear in the tangents and
# JAX derives reverse mode by transposing it, so the backward products are always the transposes of
# the forward's linear map. Quantising the cotangent (rounding it to int8, per row or per column of
# the cotangent itself) is not linear in it and so is not the transpose of any tangent map: only a
# custom_vjp can declare it.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _int8_product(x: jax.Array, w: jax.Array, key: jax.Array | None, spec: _Spec) -> jax.Array:
    return _forward(x, w, spec)[0]


def _int8_product_fwd(x, w, key, spec):
    y, residuals = _forward(x, w, spec)
    return y, (residuals, key)  # int8 codes and scales: the float operands are not kept


def _int8_product_bwd(spec, saved, g):
    residuals, key = saved
    dx, dw = _backward(spec, residuals, g, key, (g.dtype, g.dtype))  # operands and output share one dtype
    return dx, dw, None


_int8_product.defvjp(_int8_product_fwd, _int8_product_bwd)


def _float_backward_forward(x, w, *, spec):
    return _forward(x, w, _Spec(*spec))[0]


def _float_backward_tangent(x, w, *, tangents, spec):
    # The straight-through gradient of the integer forward (the scales are constants and absmax never clips):
    # ẏ = ṫx ŵ + x̂ ṫw with the dequantised operands x̂ = q_x s_x, ŵ = q_w s_w.
    spec = _Spec(*spec)
    tx, tw = tangents
    if spec.plain:
        qx, sx, qw, sw = _plain_codes(x, w, spec)
        deq_x, deq_w = (qx.astype(sx.dtype) * sx).astype(x.dtype), (qw.astype(sw.dtype) * sw).astype(w.dtype)
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        return jax.lax.dot_general(tx.astype(x.dtype), deq_w, dims) + jax.lax.dot_general(
            deq_x, tw.astype(x.dtype), dims
        )
    x4, w4 = _split(x, w, spec.groups)
    qx, sx, qw, sw = _operand_codes(x4, w4, spec)
    deq_x = (qx.astype(sx.dtype) * sx).reshape(x.shape).astype(x.dtype)
    deq_w = (qw.astype(sw.dtype) * sw).reshape(w.shape).astype(w.dtype)
    dims = (((2,), (1,)), ((0,), (0,)))
    return jax.lax.dot_general(tx.astype(x.dtype), deq_w, dims) + jax.lax.dot_general(deq_x, tw.astype(x.dtype), dims)


_float_backward = surrogate(
    _float_backward_forward, tangent=_float_backward_tangent, name="integer_dot_general", diff_argnums=(0, 1)
)


# ----------------------------------------------------------------------------- the public functions


def _canonical(lhs_shape, rhs_shape, dims) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple]:
    """lhs and rhs permutations to (batch, free, contract) and (batch, contract, free); the output's shape."""
    (lc, rc), (lb, rb) = dims
    lf = tuple(i for i in range(len(lhs_shape)) if i not in lc and i not in lb)
    rf = tuple(i for i in range(len(rhs_shape)) if i not in rc and i not in rb)
    out = tuple(lhs_shape[i] for i in lb) + tuple(lhs_shape[i] for i in lf) + tuple(rhs_shape[i] for i in rf)
    sizes = (
        math.prod(lhs_shape[i] for i in lb),
        math.prod(lhs_shape[i] for i in lf),
        math.prod(lhs_shape[i] for i in lc),
        math.prod(rhs_shape[i] for i in rf),
    )
    return (*lb, *lf, *lc), (*rb, *rc, *rf), out, sizes


def _check_dims(lhs_shape, rhs_shape, dimension_numbers) -> tuple:
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        lc, rc, lb, rb = (tuple(int(i) for i in a) for a in (lc, rc, lb, rb))
    except (TypeError, ValueError):
        raise ValueError(
            f"{_NAME}: dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), "
            f"tuples of axes; got {dimension_numbers!r}."
        ) from None
    for side, shape, axes in (("lhs", lhs_shape, lc + lb), ("rhs", rhs_shape, rc + rb)):
        if len(set(axes)) != len(axes) or any(not 0 <= a < len(shape) for a in axes):
            raise ValueError(
                f"{_NAME}: {side}'s contracting and batch axes must be distinct axes of its shape {shape}; got {axes}."
            )
    if not lc or len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(
            f"{_NAME}: expected as many lhs as rhs contracting axes (at least one) and as many batch axes; "
            f"got contracting {lc} and {rc}, batch {lb} and {rb}."
        )
    for kind, la, ra in (("contracting", lc, rc), ("batch", lb, rb)):
        ls, rs = tuple(lhs_shape[i] for i in la), tuple(rhs_shape[i] for i in ra)
        if ls != rs:
            raise ValueError(
                f"{_NAME}: the {kind} axes must have equal sizes; got lhs {ls} (axes {la} of {lhs_shape}) and "
                f"rhs {rs} (axes {ra} of {rhs_shape})."
            )
    return ((lc, rc), (lb, rb))


def _choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{_NAME}: {name} must be one of {list(choices)}; got {value!r}.")
    return value


def integer_dot_general(
    lhs: ArrayLike,
    rhs: ArrayLike,
    dimension_numbers: Any,
    *,
    bits: int = 8,
    lhs_scale: str = "row",
    rhs_scale: str = "column",
    group_size: int | None = None,
    backward: str = "int8",
    rounding: str = "nearest",
    key: jax.Array | None = None,
) -> jax.Array:
    r"""``jax.lax.dot_general`` on int8 codes forward, with a declared int8 x int8 backward (AQT's "QT" product).

    Forward, in the canonical form :math:`x` ``(B, M, K)``, :math:`w` ``(B, K, N)``
    (batch axes, then ``lhs``'s free axes, then the contracting axes; any
    ``dimension_numbers`` are brought to it by transposes and reshapes), with
    groups :math:`\gamma` of ``group_size`` along :math:`K` (one group without it):

    .. math::

       y_{bmn} = \sum_\gamma \Big(\sum_{k \in \gamma} q_{x,bmk}\, q_{w,bkn}\Big)\, s_{x,bm\gamma}\, s_{w,b\gamma n},

    with :math:`q = \operatorname{clip}(\operatorname{round}(v \cdot \mathrm{fl}(1/s)), q_{\min}, q_{\max})`
    (round half to even, :math:`(q_{\min}, q_{\max}) = (-2^{b-1}, 2^{b-1}-1)`) and dynamic absmax
    scales :math:`s = \max|v| / q_{\max}` over the scale's slice, computed from
    the current values in float32 (float64 for float64 inputs; 1 for an all-zero
    slice): ``lhs_scale="row"`` gives one per row and group (per token),
    ``"tensor"`` one for all of ``lhs``; ``rhs_scale="column"`` one per output
    column and group (per channel), ``"tensor"`` one for all of ``rhs``. The inner
    sums are ``int8 x int8 -> int32`` dots (exact); each is converted to
    float32 once, multiplied by the two scales, summed over groups, and rounded
    to ``lhs``'s dtype. Since :math:`|v/s| \le q_{\max}` the clip never acts.

    Backward (``backward="int8"``, a declared gradient, not the transpose of a
    tangent map): with :math:`\bar y` the cotangent and :math:`Q_r`, :math:`Q_c`
    int8 quantisation of a matrix with one absmax scale per row or per column
    (:math:`Q(v) = s_v\, q_v`, round to nearest, or stochastic rounding
    :math:`\lfloor r \rfloor + \mathbb{1}[u < r - \lfloor r \rfloor]` with :math:`r = v \cdot \mathrm{fl}(1/s)`,
    :math:`u \sim U[0, 1)` from ``key``: up with probability :math:`r - \lfloor r\rfloor`),

    .. math::

       \bar x_{bmk} = \Big[Q_r\big(\bar y_{b} \odot s_{w,b\gamma}\big)\; q_{w,b\gamma}^\top\Big]_{mk},
       \qquad
       \bar w_{bkn} = \Big[q_{x,b\gamma}^\top\; Q_c\big(s_{x,b\gamma} \odot \bar y_{b}\big)\Big]_{kn},
       \qquad k \in \gamma,

    each bracket an ``int8 x int8 -> int32`` product of the cotangent's codes
    and the forward's stored codes, rescaled by the cotangent's scales. The
    forward scales that vary along a backward product's contracting axis
    (:math:`s_w` along :math:`n` for :math:`\bar x`, :math:`s_x` along
    :math:`m` for :math:`\bar w`) are folded into :math:`\bar y` before it is
    quantised; a per-tensor scale is multiplied after the product instead.
    Without the quantisation :math:`Q` this is exactly the straight-through
    gradient of the integer forward (the fake-quant composition's):
    :math:`\bar x = \bar y\, \hat w^\top`, :math:`\bar w = \hat x^\top \bar y`,
    :math:`\hat x = q_x s_x`, :math:`\hat w = q_w s_w`; the difference is the
    int8 rounding of the (scaled) cotangent, with relative error about
    :math:`2^{-8}` per element (:func:`stejax.verify.check_integer_product`
    measures it). The scales get no gradient. The residuals kept for the
    backward pass are the int8 codes and the scales, not the float operands.

    ``backward="float"``: the same forward with the straight-through gradient
    above computed in float (float products of the dequantised operands), as a
    ``custom_jvp``: forward mode works and gives that tangent.

    Forward mode with ``backward="int8"``: refused with a TypeError that names
    ``backward="float"`` and :func:`stejax.fake_quant` (a quantised cotangent is
    a reverse-mode object; there is no tangent whose transpose it is).

    Special values: a slice holding inf or NaN has a non-finite scale, so the
    outputs that use it are not finite (NaN or inf).

    Args:
      lhs, rhs: floating-point arrays of one dtype (float16, bfloat16, float32;
        float64 under x64).
      dimension_numbers: as ``jax.lax.dot_general``: ``((lhs_contracting,
        rhs_contracting), (lhs_batch, rhs_batch))``.
      bits: the forward operands' signed grid, an int in [2, 8] (codes are int8).
        The cotangent is always on the int8 grid.
      lhs_scale: ``"row"`` (default, per token) or ``"tensor"``.
      rhs_scale: ``"column"`` (default, per output channel) or ``"tensor"``.
      group_size: one scale per run of this many elements along the contraction
        (which must be a single axis and a multiple of it), for the ``"row"``
        and ``"column"`` sides; None: one group.
      backward: ``"int8"`` (default) or ``"float"``.
      rounding: the cotangent's rounding, ``"nearest"`` or ``"stochastic"``
        (needs ``key``; ``backward="int8"`` only).
      key: a PRNG key for stochastic rounding (split once per call into one
        key per backward product); None otherwise.

    Returns:
      ``dot_general``'s output shape (batch axes, ``lhs``'s free axes, ``rhs``'s
      free axes), in ``lhs``'s dtype.

    Raises:
      TypeError: non-floating or mixed dtypes; ``bits`` not an int; a key given
        with round-to-nearest; forward mode with ``backward="int8"``.
      ValueError: an invalid option, dimension numbers or group size; a
        contraction long enough to overflow the int32 sum; stochastic rounding
        without a key.

    Example:
      The float product is ``[[1.0, 0.875], [-1.875, 0.75]]``; on int8 codes
      (-0.5 of a row whose largest magnitude is 1 is code -63.5, rounded to -64):

      >>> import jax, jax.numpy as jnp, numpy as np, stejax
      >>> x = jnp.array([[1.0, -0.5], [0.25, 2.0]])
      >>> w = jnp.array([[0.5, 1.0], [-1.0, 0.25]])
      >>> dims = (((1,), (0,)), ((), ()))
      >>> np.asarray(stejax.integer_dot_general(x, w, dims), float).round(3).tolist()
      [[1.008, 0.873], [-1.873, 0.756]]
      >>> np.asarray(jax.grad(lambda x: stejax.integer_dot_general(x, w, dims).sum())(x), float).round(3).tolist()
      [[1.504, -0.748], [1.504, -0.748]]

    Reference:
      C. Sakr et al. / Google, "AQT: Accurate Quantized Training" (2023, the
      ``dot_general`` with int8 backward products); M. Courbariaux et al.,
      "Training deep neural networks with low precision multiplications", 2014.
    """
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    for side, a in (("lhs", lhs), ("rhs", rhs)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"{_NAME}: {side} must be a floating-point array; got {a.dtype}.")
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"{_NAME}: lhs and rhs must share one floating dtype; got {lhs.dtype} and {rhs.dtype}.")
    bits = check_bits(_NAME, bits, signed=True)
    if bits > 8:
        raise ValueError(f"{_NAME}: bits must be an int in [2, 8] (the codes are int8); got {bits}.")
    _choice("lhs_scale", lhs_scale, LHS_SCALES)
    _choice("rhs_scale", rhs_scale, RHS_SCALES)
    _choice("backward", backward, BACKWARDS)
    _choice("rounding", rounding, ROUNDINGS)
    if rounding == "stochastic":
        if backward != "int8":
            raise ValueError(f"{_NAME}: rounding='stochastic' rounds the int8 cotangent; it needs backward='int8'.")
        if key is None:
            raise ValueError(f"{_NAME}: rounding='stochastic' needs a PRNG key, e.g. key=jax.random.key(0).")
    elif key is not None:
        raise TypeError(f"{_NAME}: a key is only for rounding='stochastic'; round-to-nearest takes none.")
    dims = _check_dims(lhs.shape, rhs.shape, dimension_numbers)
    lperm, rperm, out_shape, (b, m, k, n) = _canonical(lhs.shape, rhs.shape, dims)
    groups = 1
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"{_NAME}: group_size must be None or a positive int; got {group_size!r}.")
        if len(dims[0][0]) != 1 or k % group_size:
            raise ValueError(
                f"{_NAME}: group_size {group_size} must divide a single contracting axis; got contracting axes "
                f"{dims[0][0]} of lhs shape {lhs.shape} (K = {k})."
            )
        groups = k // int(group_size)
    qmin = integer_range(max(bits, GRAD_BITS), signed=True)[0]
    if max(k, m, n) * qmin * qmin > _INT32_MAX:
        raise ValueError(
            f"{_NAME}: a sum of {max(k, m, n)} terms of up to {qmin * qmin} each (K = {k}, and M = {m}, N = {n} "
            f"for the backward products) could overflow int32; each must be at most {_INT32_MAX // (qmin * qmin)}."
        )
    plain = not dims[1][0] and groups == 1
    spec = _Spec(bits, lhs_scale, rhs_scale, groups, rounding, plain)
    x = jnp.transpose(lhs, lperm)
    # The plain form keeps lhs's free axes (see _forward_plain); the canonical one flattens them to M.
    x = x.reshape(*x.shape[: lhs.ndim - len(dims[0][0])], k) if plain else x.reshape(b, m, k)
    w = jnp.transpose(rhs, rperm).reshape(b, k, n)
    w = w[0] if plain else w
    if backward == "float":
        y = _float_backward(x, w, spec=tuple(spec))
    else:
        try:
            y = _int8_product(x, w, key, spec)
        except TypeError as error:
            if "forward-mode" not in str(error):
                raise
            raise TypeError(
                f"{_NAME}: backward='int8' declares a quantised reverse-mode gradient and has no forward mode "
                "(jax.jvp, jacfwd, hessian). For forward mode use backward='float' (the same integer forward "
                "with the float straight-through tangent), or stejax.fake_quant on each operand and a float product."
            ) from None
    return y.reshape(out_shape)


def integer_einsum(subscripts: str, lhs: ArrayLike, rhs: ArrayLike, **options: Any) -> jax.Array:
    """:func:`integer_dot_general` written as a two-operand einsum, e.g. ``"btd,df->btf"`` or ``"bqhd,bkhd->bhqk"``.

    Letters in both operands and the output are batch axes; in both operands
    and not the output, contracting axes; the rest are free. Explicit output
    (``->``) and no ellipsis or repeated letter within an operand. ``options``
    are :func:`integer_dot_general`'s keywords.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> x, w = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
      >>> stejax.integer_einsum("btd,df->btf", x, w).shape
      (2, 3, 5)

    Raises:
      ValueError: subscripts outside that form (the message shows them).
    """
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    a, comma, c = inputs.partition(",")
    letters = a + c + output
    if (
        not arrow
        or not comma
        or "." in letters
        or "," in c
        or not all(ch.isalpha() for ch in letters)
        or len(set(a)) != len(a)
        or len(set(c)) != len(c)
        or len(set(output)) != len(output)
        or set(output) - set(a) - set(c)
    ):
        raise ValueError(
            "integer_einsum: subscripts must be two operands and an explicit output, letters only, no ellipsis "
            f"and no letter repeated within one operand (e.g. 'btd,df->btf'); got {subscripts!r}."
        )
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    if lhs.ndim != len(a) or rhs.ndim != len(c):
        raise ValueError(
            f"integer_einsum: {subscripts!r} names {len(a)} and {len(c)} axes; got operands of shapes "
            f"{lhs.shape} and {rhs.shape}."
        )
    batch = [ch for ch in a if ch in c and ch in output]
    contract = [ch for ch in a if ch in c and ch not in output]
    summed_alone = [ch for ch in a + c if ch not in output and not (ch in a and ch in c)]
    if summed_alone:
        raise ValueError(f"integer_einsum: {subscripts!r} sums {summed_alone} over one operand only; not a product.")
    dims = (
        (tuple(a.index(ch) for ch in contract), tuple(c.index(ch) for ch in contract)),
        (tuple(a.index(ch) for ch in batch), tuple(c.index(ch) for ch in batch)),
    )
    y = integer_dot_general(lhs, rhs, dims, **options)
    produced = batch + [ch for ch in a if ch not in c] + [ch for ch in c if ch not in a]
    return jnp.transpose(y, tuple(produced.index(ch) for ch in output))
