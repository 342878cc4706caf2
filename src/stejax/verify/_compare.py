"""Comparisons on the host, in float64: bitwise for values, declared-exact or ulps for tangents."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from stejax.verify._tolerance import Tolerance

_SHOWN = 3


class CheckFailed(Exception):
    """A check found a violation; the message is the report's detail."""


@dataclasses.dataclass(frozen=True)
class Expected:
    """A declared value and how closely it must be met.

    Attributes:
      value: the declared value in float64 (exact, or within float64 rounding).
      magnitude: the scale of the bound: the sum of the magnitudes of the terms.
      exact: where the value is representable in the dtype, so that a correct
        rule gives it exactly.
      ulps: ulps of ``magnitude`` allowed where not exact (an array or a number).
      floor: the absolute floor of the bound (the smallest normal number times
        the number of terms).
    """

    value: np.ndarray
    magnitude: np.ndarray
    exact: np.ndarray
    ulps: Any
    floor: Any


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def representable(value: np.ndarray, dtype: np.dtype, tol: Tolerance) -> np.ndarray:
    """Where ``value`` (float64) is a normal number or zero of ``dtype``, exactly."""
    back = value.astype(dtype).astype(np.float64)
    normal = (value == 0) | (np.abs(value) >= tol.tiny)
    return (back == value) & normal & np.isfinite(value)


def _two_product_error(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rounding error of ``a * b`` in float64 (Dekker's TwoProduct)."""
    split = 134217729.0  # 2**27 + 1

    def halves(v):
        c = split * v
        hi = c - (c - v)
        return hi, v - hi

    p = a * b
    ah, al = halves(a)
    bh, bl = halves(b)
    return ((ah * bh - p) + ah * bl + al * bh) + al * bl


def product(d: np.ndarray, t: np.ndarray, dtype: np.dtype, tol: Tolerance) -> Expected:
    """The declared ``d * t`` for dtype-valued ``d`` and ``t`` of one shape."""
    d64, t64 = f64(d), f64(t)
    p = d64 * t64
    exact = representable(p, dtype, tol)
    if dtype == np.float64:
        # The float64 product itself may be rounded; only error-free products are exact.
        exact &= _two_product_error(d64, t64) == 0
    return Expected(value=p, magnitude=np.abs(p), exact=exact, ulps=tol.tangent_ulps, floor=tol.tiny)


def total(parts: Sequence[Expected], dtype: np.dtype, tol: Tolerance) -> Expected:
    """The sum of several declared terms of one shape (a tangent on several arguments)."""
    if len(parts) == 1:
        return parts[0]
    # The start is a float64 zero (as the int 0 it replaces, it turns a -0.0 sum into 0.0)
    # so that the sum is an array for the type checker too.
    value = sum((p.value for p in parts), np.zeros(()))
    nonzero = sum((p.value != 0).astype(int) for p in parts)
    exact = np.logical_and.reduce([p.exact for p in parts]) & representable(value, dtype, tol)
    if dtype == np.float64:
        exact &= nonzero <= 1
    return Expected(
        value=value,
        magnitude=sum((p.magnitude for p in parts), np.zeros(())),
        exact=exact,
        ulps=tol.tangent_ulps + 1,
        floor=tol.tiny * len(parts),
    )


def reduced(term: Expected, aligned: tuple[int, ...], target: tuple[int, ...], tol: Tolerance) -> Expected:
    """A term summed over the axes a broadcast argument was broadcast along (its cotangent).

    ``aligned`` is the argument's shape with ones inserted so that it has the
    term's rank; ``target`` the argument's shape.
    """
    shape = term.value.shape
    axes = tuple(i for i, (a, s) in enumerate(zip(aligned, shape, strict=True)) if a == 1 and s != 1)
    n = math.prod(shape[i] for i in axes) if axes else 1
    if n == 1:
        return Expected(
            value=term.value.reshape(target),
            magnitude=term.magnitude.reshape(target),
            exact=term.exact.reshape(target),
            ulps=term.ulps,
            floor=term.floor,
        )
    value = term.value.sum(axis=axes, keepdims=True).reshape(target)
    nonzero = (term.value != 0).sum(axis=axes, keepdims=True).reshape(target)
    all_exact = term.exact.all(axis=axes, keepdims=True).reshape(target)
    return Expected(
        value=value,
        magnitude=term.magnitude.sum(axis=axes, keepdims=True).reshape(target),
        # A sum of rounded partial sums is exact only when a single term is nonzero.
        exact=all_exact & (nonzero <= 1),
        ulps=max(tol.sum_bound_ulps(n), tol.tangent_ulps),
        floor=tol.tiny * n,
    )


def mapped(value: Any, tol: Tolerance) -> Expected:
    """A tangent map's declared value: within ulps of the largest finite magnitude in the array."""
    v = f64(value)
    finite = np.abs(v[np.isfinite(v)])
    scale = float(finite.max()) if finite.size else 0.0
    return Expected(
        value=v,
        magnitude=np.abs(v) + scale,
        exact=np.zeros(v.shape, bool),
        ulps=tol.tangent_ulps,
        floor=tol.tiny,
    )


def mismatches(got: Any, expected: Expected, dtype: np.dtype, tol: Tolerance) -> np.ndarray:
    """Where ``got`` misses the declared value: off it where exact, beyond the bound elsewhere."""
    g = f64(got)
    v = expected.value
    rounded = v.astype(dtype).astype(np.float64)
    equal = (g == rounded) | (np.isnan(g) & np.isnan(v))
    finite = np.isfinite(g) & np.isfinite(v)
    bound = (expected.ulps + tol.platform_ulps) * tol.eps * expected.magnitude + expected.floor
    close = ~expected.exact & finite & (np.abs(g - v) <= bound)
    if tol.platform_ulps:
        # The platform evaluates the declared derivative with other roundings than the rule (its contract).
        close |= expected.exact & finite & (np.abs(g - v) <= tol.platform_ulps * tol.eps * np.abs(v) + tol.tiny)
    return ~(equal | close)


def unequal(a: Any, b: Any, tol: Tolerance) -> np.ndarray:
    """Where ``a`` and ``b`` differ: exactly on CPU, beyond the platform contract's ulps elsewhere (NaN equals NaN)."""
    a, b = f64(a), f64(b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if tol.platform_ulps:
        bound = tol.platform_ulps * tol.eps * np.maximum(np.abs(a), np.abs(b)) + tol.tiny
        same |= np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= bound)
    return ~same


def bitwise_mismatches(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Where two arrays of one dtype and shape differ bit for bit (any NaN equals any NaN)."""
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    g_nan, e_nan = np.isnan(f64(got)), np.isnan(f64(expected))
    same = got.view(uint) == expected.view(uint)
    return ~((same & ~g_nan & ~e_nan) | (g_nan & e_nan))


def describe_array(x: Any) -> str:
    """``float32[4,3]``, ``tuple of 2``, or the type's name."""
    if isinstance(x, tuple | list):
        return f"a {type(x).__name__} of {len(x)}"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{np.dtype(x.dtype).name}[{','.join(str(n) for n in x.shape)}]"
    return type(x).__name__


def single_array(x: Any, what: str) -> np.ndarray:
    """``x`` as a NumPy array, or CheckFailed if it is not one array."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, tuple | list):
        raise CheckFailed(f"{what} is {describe_array(x)}, not one array.")
    return np.asarray(x)


def same_kind_problem(got: np.ndarray, expected: np.ndarray, what: str, against: str) -> str | None:
    if got.dtype != expected.dtype:
        return f"{what} has dtype {got.dtype.name}; {against} has {expected.dtype.name}."
    if got.shape != expected.shape:
        return f"{what} has shape {got.shape}; {against} has {expected.shape}."
    return None


def fmt(v: Any) -> str:
    """A float as Python writes it: exact for every dtype's value, -0.0, inf and nan included."""
    return repr(float(v))


def where(x: np.ndarray | None, index: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """The input at an output position, or the position when the input has another shape."""
    if x is not None and x.shape == shape:
        return f"x={fmt(x[index])}"
    return f"index {index}"


def examples(
    bad: np.ndarray,
    got: np.ndarray,
    expected: np.ndarray,
    x: np.ndarray | None,
    *,
    extra: Sequence[tuple[str, np.ndarray]] = (),
) -> str:
    """The first few bad positions: the input, what came and what was declared."""
    rows = []
    for index in (tuple(int(i) for i in row) for row in np.argwhere(bad)[:_SHOWN]):
        parts = [f"{where(x, index, bad.shape)}: got {fmt(got[index])}, expected {fmt(expected[index])}"]
        parts += [f"{label} {fmt(values[index])}" for label, values in extra]
        rows.append(", ".join(parts))
    more = int(bad.sum()) - len(rows)
    return "; ".join(rows) + (f"; and {more} more" if more > 0 else "")


def bitwise_problem(got: Any, expected: Any, what: str, against: str, x: np.ndarray | None) -> str | None:
    """None if ``got`` equals ``expected`` bit for bit, else a readable account."""
    g = single_array(got, what)
    e = single_array(expected, against)
    problem = same_kind_problem(g, e, what, against)
    if problem:
        return problem
    bad = bitwise_mismatches(g, e)
    if not bad.any():
        return None
    return (
        f"{int(bad.sum())} of {bad.size} values of {what} differ bitwise from {against}; "
        + examples(bad, g, e, x)
        + "."
    )


def declared_problem(
    got: Any,
    expected: Expected,
    dtype: np.dtype,
    tol: Tolerance,
    what: str,
    x: np.ndarray | None,
    *,
    skip: np.ndarray | None = None,
    extra: Sequence[tuple[str, np.ndarray]] = (),
) -> tuple[str | None, str]:
    """Compare a tangent or cotangent with its declared value.

    Returns:
      ``(problem, note)``: the problem (or None) and a note on how it was
      compared (exact and toleranced counts, skipped points).
    """
    g = single_array(got, what)
    if g.shape != expected.value.shape:
        return f"{what} has shape {g.shape}; the declared value has {expected.value.shape}.", ""
    if g.dtype != dtype:
        return f"{what} has dtype {g.dtype.name}, not {dtype.name}.", ""
    bad = mismatches(g, expected, dtype, tol)
    considered = np.ones(g.shape, bool) if skip is None else ~skip
    bad &= considered
    n_exact = int((expected.exact & considered).sum())
    note = f"{n_exact} of {int(considered.sum())} compared exactly, the rest within the bound"
    if skip is not None and skip.any():
        note += f"; skipped {int(skip.sum())} point(s) where the declared derivative is not finite"
    if not bad.any():
        return None, note
    v = expected.value.astype(dtype).astype(np.float64)
    nonfinite = bad & ~np.isfinite(f64(g)) & np.isfinite(v)
    lead = (
        f"{what} is not finite where the declared value is finite at {int(nonfinite.sum())} point(s); "
        if nonfinite.any()
        else ""
    )
    return (
        lead
        + f"{int(bad.sum())} of {int(considered.sum())} values of {what} differ from the declared value; "
        # The non-finite points first: they are the likelier bug.
        + examples(nonfinite if nonfinite.any() else bad, g, v, x, extra=extra)
        + ".",
        note,
    )
