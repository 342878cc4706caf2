r"""The integer product's declared backward, checked against a NumPy reference of the same arithmetic.

:func:`check_integer_product` runs :func:`stejax.integer_dot_general` (forward
and ``jax.vjp``, jitted) and a NumPy reference that computes the same thing
step by step: the absmax scales and int8 codes in float32 (``v * fl(1/s)``,
rounded half to even, clipped), the integer sums in int64 (exact, like the
int32 accumulator while it cannot overflow), the conversions and scale
products in the same order. IEEE float32 products, quotients and
round-to-nearest conversions are the same in NumPy and XLA, so forward values
and both declared cotangents must agree **bit for bit**. A forward with
groups sums them in an order XLA chooses (it may fuse the last scale product
and the sum into a dot with fused multiply-adds): it is held to the bound of a
float32 sum of :math:`G` terms, :math:`(G + 1)\,\epsilon \sum_\gamma |t_\gamma|`. Stochastic rounding
draws its noise from the same keys, split the same way.

Beside the contract, the check measures what the declaration trades: the
relative error :math:`\lVert \bar v_{int8} - \bar v_{STE}\rVert_2 / \lVert \bar
v_{STE}\rVert_2` of each declared cotangent against the exact straight-through
gradient of the same integer forward (``backward="float"``, float products of
the dequantised operands). :func:`gradient_error` measures the same ratio for
any pair of loss functions, e.g. a model's whole gradient on a training batch
with ``product="int8"`` against ``product="int8-forward"``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.typing import ArrayLike

__all__ = ["ProductCheck", "check_integer_product", "gradient_error"]


@dataclasses.dataclass(frozen=True)
class ProductCheck:
    """What :func:`check_integer_product` found.

    Attributes:
      forward_exact: the forward equals the reference bit for bit (with
        groups: within the group sum's rounding bound).
      lhs_grad_exact, rhs_grad_exact: each declared cotangent equals the
        reference bit for bit.
      lhs_grad_error, rhs_grad_error: relative L2 error of each declared
        cotangent to the exact straight-through gradient.
      mismatches: ``{"forward" | "lhs_grad" | "rhs_grad": count}`` of elements
        that differ from the reference (empty when all agree).
      options: the product's options as checked.
    """

    forward_exact: bool
    lhs_grad_exact: bool
    rhs_grad_exact: bool
    lhs_grad_error: float
    rhs_grad_error: float
    mismatches: dict[str, int]
    options: dict[str, Any]

    @property
    def ok(self) -> bool:
        """The forward and both declared cotangents agree with the reference."""
        return self.forward_exact and self.lhs_grad_exact and self.rhs_grad_exact

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``ok`` included."""
        return {**dataclasses.asdict(self), "ok": self.ok}


# ----------------------------------------------------------------------------- the NumPy reference


def _scale(v: np.ndarray, axes: tuple[int, ...], qmax: int) -> np.ndarray:
    m = np.max(np.abs(v), axis=axes, keepdims=True)
    return np.where(m > 0, m * np.float32(1 / qmax), np.float32(1)).astype(np.float32)


def _codes(v: np.ndarray, s: np.ndarray, bits: int, noise: np.ndarray | None = None) -> np.ndarray:
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    r = v * (np.float32(1) / s)
    if noise is None:
        r = np.rint(r)
    else:
        down = np.floor(r)
        r = down + (noise < r - down).astype(np.float32)
    return np.clip(r, qmin, qmax).astype(np.int64)


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def reference_product(
    x: np.ndarray,
    w: np.ndarray,
    g: np.ndarray,
    *,
    bits: int,
    lhs_scale: str,
    rhs_scale: str,
    groups: int,
    noise: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(y, x̄, w̄, Σ|terms|) of the canonical product x ``(B, M, K)``, w ``(B, K, N)`` for cotangent g, float32.

    The last is the sum of the group terms' magnitudes (``|y|`` without groups), for the group sum's bound.
    """
    b, m, k = x.shape
    n = w.shape[2]
    gk = k // groups
    qmax = 2 ** (bits - 1) - 1
    x4, w4 = x.reshape(b, m, groups, gk), w.reshape(b, groups, gk, n)
    sx = _scale(x4, (3,) if lhs_scale == "row" else (0, 1, 2, 3), qmax)
    sw = _scale(w4, (2,) if rhs_scale == "column" else (0, 1, 2, 3), qmax)
    qx, qw = _codes(x4, sx, bits), _codes(w4, sw, bits)
    acc = np.einsum("bmgk,bgkn->bgmn", qx, qw)
    terms = _f32(acc) * np.swapaxes(sx, 1, 2) * sw
    y = np.asarray(terms[:, 0] if groups == 1 else np.sum(terms, axis=1, dtype=np.float32))
    magnitude = np.sum(np.abs(terms.astype(np.float64)), axis=1)
    g4 = g.astype(np.float32)[:, None]
    fold_w = rhs_scale == "column"
    gx = g4 * sw if fold_w else np.broadcast_to(g4, (b, 1, m, n))
    sgx = _scale(gx, (3,), 127)
    qgx = _codes(gx, sgx, 8, None if noise is None else noise[0])
    dx = _f32(np.einsum("bgmn,bgkn->bgmk", np.broadcast_to(qgx, (b, groups, m, n)), qw)) * sgx
    if not fold_w:
        dx = dx * sw
    dx = np.swapaxes(dx, 1, 2).reshape(b, m, k)
    fold_x = lhs_scale == "row"
    gw = np.swapaxes(sx, 1, 2) * g4 if fold_x else np.broadcast_to(g4, (b, 1, m, n))
    sgw = _scale(gw, (2,), 127)
    qgw = _codes(gw, sgw, 8, None if noise is None else noise[1])
    dw = _f32(np.einsum("bmgk,bgmn->bgkn", qx, np.broadcast_to(qgw, (b, groups, m, n)))) * sgw
    if not fold_x:
        dw = dw * sx
    return y, dx, dw.reshape(b, k, n), magnitude


# ----------------------------------------------------------------------------- the check


def _canonical(a: np.ndarray, perm: tuple[int, ...], shape: tuple[int, int, int]) -> np.ndarray:
    return np.transpose(a, perm).reshape(shape)


def _relative(a: jax.Array | np.ndarray, b: jax.Array | np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denominator = float(np.linalg.norm(b64))
    return float(np.linalg.norm(a64 - b64)) / denominator if denominator else float(np.linalg.norm(a64))


def check_integer_product(
    lhs: ArrayLike,
    rhs: ArrayLike,
    dimension_numbers: Any,
    *,
    cotangent: ArrayLike | None = None,
    seed: int = 0,
    **options: Any,
) -> ProductCheck:
    r"""Check :func:`stejax.integer_dot_general`'s forward and declared backward against a NumPy reference.

    Runs the product jitted (forward, then ``jax.vjp`` with ``cotangent``, or
    a seeded standard normal one) with ``options`` (``bits``, ``lhs_scale``,
    ``rhs_scale``, ``group_size``, ``rounding``, ``key``; ``backward`` is
    ``"int8"``), and the reference of the same arithmetic on the canonical form
    (module docstring). Also measures each declared cotangent's relative L2
    error to the exact straight-through gradient (``backward="float"``).

    float32 operands only: the reference is float32 arithmetic.

    Example:
      >>> import numpy as np
      >>> from stejax.verify import check_integer_product
      >>> x = np.random.default_rng(0).standard_normal((8, 32), np.float32)
      >>> w = np.random.default_rng(1).standard_normal((32, 16), np.float32)
      >>> result = check_integer_product(x, w, (((1,), (0,)), ((), ())))
      >>> result.ok, result.lhs_grad_error < 0.02, result.rhs_grad_error < 0.02
      (True, True, True)

    Raises:
      TypeError: operands that are not float32.
      ValueError: ``backward`` other than ``"int8"``, or what
        :func:`stejax.integer_dot_general` refuses.
    """
    from stejax.lowbit._products import _canonical as canonical_dims
    from stejax.lowbit._products import _check_dims, integer_dot_general

    x_in, w_in = np.asarray(lhs), np.asarray(rhs)
    if x_in.dtype != np.float32 or w_in.dtype != np.float32:
        raise TypeError(
            f"check_integer_product: the reference is float32 arithmetic; got {x_in.dtype} and {w_in.dtype} operands."
        )
    if options.get("backward", "int8") != "int8":
        raise ValueError(
            f"check_integer_product: checks the declared int8 backward; got backward={options['backward']!r}."
        )
    options = {k: v for k, v in options.items() if k != "backward"}
    dims = _check_dims(x_in.shape, w_in.shape, dimension_numbers)
    lperm, rperm, out_shape, (b, m, k, n) = canonical_dims(x_in.shape, w_in.shape, dims)

    def product(a, c):
        return integer_dot_general(a, c, dims, **options)

    def product_ste(a, c, forward_options):
        # The exact straight-through gradient of the same integer forward: float backward products.
        return integer_dot_general(a, c, dims, **forward_options, backward="float")

    y, vjp = jax.vjp(jax.jit(product), x_in, w_in)
    if cotangent is None:
        cotangent = np.random.default_rng(seed).standard_normal(out_shape).astype(np.float32)
    g = np.asarray(cotangent, np.float32)
    dx, dw = jax.jit(vjp)(g)
    forward_options = {k: v for k, v in options.items() if k not in ("rounding", "key")}
    _, vjp_ste = jax.vjp(jax.jit(lambda a, c: product_ste(a, c, forward_options)), x_in, w_in)
    dx_ste, dw_ste = jax.jit(vjp_ste)(g)

    groups = 1 if options.get("group_size") is None else k // int(options["group_size"])
    noise = None
    if options.get("rounding") == "stochastic":
        kx, kw = jax.random.split(options["key"])
        shape_x = (b, groups if options.get("rhs_scale", "column") == "column" else 1, m, n)
        shape_w = (b, groups if options.get("lhs_scale", "row") == "row" else 1, m, n)
        noise = (np.asarray(jax.random.uniform(kx, shape_x)), np.asarray(jax.random.uniform(kw, shape_w)))
    ry, rdx, rdw, magnitude = reference_product(
        _canonical(x_in, lperm, (b, m, k)),
        _canonical(w_in, rperm, (b, k, n)),
        g.reshape(b, m, n),
        bits=options.get("bits", 8),
        lhs_scale=options.get("lhs_scale", "row"),
        rhs_scale=options.get("rhs_scale", "column"),
        groups=groups,
        noise=noise,
    )
    # Back from the canonical form to the operands' layouts (exact data movement).
    ry = ry.reshape(out_shape)
    rdx = np.transpose(rdx.reshape(tuple(x_in.shape[i] for i in lperm)), np.argsort(lperm))
    rdw = np.transpose(rdw.reshape(tuple(w_in.shape[i] for i in rperm)), np.argsort(rperm))
    got = {"forward": np.asarray(y), "lhs_grad": np.asarray(dx), "rhs_grad": np.asarray(dw)}
    want = {"forward": ry, "lhs_grad": rdx, "rhs_grad": rdw}
    mismatches = {}
    for name in got:
        a, r = got[name], want[name]
        if name == "forward" and groups > 1:
            # The group sum's order (and fusion) is XLA's: the bound of a float32 sum of `groups` terms.
            bound = (groups + 1) * float(np.finfo(np.float32).eps) * magnitude.reshape(out_shape)
            bad = int(np.sum(~(np.abs(a.astype(np.float64) - r) <= bound + float(np.finfo(np.float32).tiny))))
        else:
            bad = int(np.sum(a.view(np.uint32) != r.astype(np.float32).view(np.uint32)))
        if bad:
            mismatches[name] = bad
    return ProductCheck(
        forward_exact="forward" not in mismatches,
        lhs_grad_exact="lhs_grad" not in mismatches,
        rhs_grad_exact="rhs_grad" not in mismatches,
        lhs_grad_error=_relative(dx, dx_ste),
        rhs_grad_error=_relative(dw, dw_ste),
        mismatches=mismatches,
        options={k: v for k, v in options.items() if k != "key"},
    )


def gradient_error(loss: Callable[..., jax.Array], reference: Callable[..., jax.Array], *args: Any) -> dict[str, float]:
    r"""Relative L2 error of ``grad(loss)`` to ``grad(reference)`` over the first argument's leaves.

    Returns ``{"total": ||Δ|| / ||ref||}`` over all leaves together, and
    ``"worst_leaf"``, the largest per-leaf ratio (leaves whose reference
    gradient is zero are left out of it). Both gradients are jitted.

    Example:
      >>> import jax.numpy as jnp
      >>> gradient_error(lambda p: jnp.sum(p["w"] ** 2), lambda p: jnp.sum(p["w"] ** 2), {"w": jnp.ones(3)})
      {'total': 0.0, 'worst_leaf': 0.0}
    """
    got = jax.jit(jax.grad(loss))(*args)
    want = jax.jit(jax.grad(reference))(*args)
    pairs = list(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))
    num = math.sqrt(sum(float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)) for a, b in pairs))
    den = math.sqrt(sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for _, b in pairs))
    per_leaf = [_relative(a, b) for a, b in pairs if np.any(np.asarray(b) != 0)]
    return {"total": num / den if den else num, "worst_leaf": max(per_leaf, default=0.0)}
