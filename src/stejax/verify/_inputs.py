"""The inputs the verifier feeds a function: values, their layout, tangents.

Values for the first argument come in two sets per dtype, laid out alike:

* the *pool*: the special values (+-0, +-inf, NaN, +-largest finite, +-smallest
  normal and subnormal), a boundary triplet (the float below, the point, the
  float above) for every boundary, magnitudes from the smallest subnormal to the
  largest finite value, and ordinary values around the boundaries;
* the *smooth* set: the finite triplets and ordinary values, for identities
  that sum over elements (one inf or NaN would turn a whole sum into NaN) and
  for the compositions.

A layout turns values into positional arguments: the first argument gets shape
``(rows,) + item_shape`` and the other arguments are made for that shape. Both
sets fill the same number of rows (256 elements, or the next multiple of 256),
so that every estimator runs on the same few shapes and JAX compiles each
primitive once per dtype for the whole catalog.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

MakeRest = Callable[[tuple[int, ...], np.dtype, np.random.Generator], tuple[Any, ...]]

# Enough magnitudes to visit every binade of float16 and a spread of float32's.
_MAGNITUDE_EXPONENTS = 40
_ORDINARY = 96
_SMOOTH_ORDINARY = 160
_MAX_BOUNDARIES = 256
# Every case holds a multiple of this many elements of the first argument.
_CASE_ELEMENTS = 256


def finfo(dtype: Any) -> Any:
    return ml_dtypes.finfo(np.dtype(dtype))


def rng_for(seed: int, *labels: str) -> np.random.Generator:
    """A generator seeded by ``seed`` and stable labels (a dtype name, a purpose)."""
    return np.random.default_rng([seed, *(zlib.crc32(label.encode()) for label in labels)])


def _uint(dtype: np.dtype) -> type[np.unsignedinteger[Any]]:
    by_size: dict[int, type[np.unsignedinteger[Any]]] = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    return by_size[dtype.itemsize]


def next_float(values: np.ndarray, direction: int) -> np.ndarray:
    """The neighbouring float of each finite value towards +inf (``direction=1``) or -inf (-1).

    Steps the bit pattern, so it works for bfloat16 (which ``np.nextafter`` lacks)
    as for the IEEE types: +-0 steps to the smallest subnormal of that direction.
    """
    dtype = values.dtype
    uint = _uint(dtype)
    bits = values.view(uint)
    sign_bit = uint(1) << uint(8 * dtype.itemsize - 1)
    negative = (bits & sign_bit) != 0
    zero = (bits & (sign_bit - uint(1))) == 0
    # Away from zero is +1 on the magnitude's bits, towards zero is -1 (never below zero here).
    away = (direction > 0) != negative
    one = uint(1)
    out = np.where(away, bits + one, np.where(zero, bits, bits - one))
    out = np.where(zero, one if direction > 0 else sign_bit | one, out).astype(uint)
    return out.view(dtype)


def boundary_triplets(points: Sequence[float] | np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The float below, the point itself and the float above, for each finite point."""
    at = np.asarray(points, np.float64).astype(dtype)
    at = at[np.isfinite(at.astype(np.float64))]
    if at.size == 0:
        return np.zeros((0,), dtype)
    return np.stack([next_float(at, -1), at, next_float(at, 1)], axis=-1).reshape(-1)


def special_values(dtype: np.dtype) -> np.ndarray:
    info = finfo(dtype)
    sub = float(info.smallest_subnormal)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny, sub, -sub]
    return np.array(vals, np.float64).astype(dtype)


def magnitude_values(dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Values of both signs from the smallest subnormal to the largest finite value."""
    info = finfo(dtype)
    low = math.log2(float(info.smallest_subnormal))
    high = float(info.maxexp) - 1
    exponents = np.round(np.linspace(low, high, _MAGNITUDE_EXPONENTS))
    # Three-bit mantissas stay representable (and below the largest finite value) in every dtype.
    mantissa = 1 + rng.integers(0, 8, exponents.size) / 8
    sign = rng.choice([-1.0, 1.0], exponents.size)
    mags = sign * mantissa * np.exp2(exponents)
    return np.concatenate([mags, -mags]).astype(dtype)


def value_range(boundaries: Sequence[float]) -> tuple[float, float]:
    """The interval the ordinary values are drawn from: the boundaries and a margin."""
    finite = [float(b) for b in boundaries if math.isfinite(float(b))]
    if not finite:
        return -4.0, 4.0
    lo, hi = min(finite), max(finite)
    margin = max(1.0, 0.25 * (hi - lo))
    return lo - margin, hi + margin


def ordinary_values(dtype: np.dtype, rng: np.random.Generator, count: int, span: tuple[float, float]):
    return rng.uniform(span[0], span[1], count).astype(dtype)


def chosen_boundaries(boundaries: Sequence[float], dtype: np.dtype) -> tuple[np.ndarray, int]:
    """The distinct finite boundaries in ``dtype`` (at most 256, evenly chosen) and how many there were."""
    pts = np.unique(np.asarray([float(b) for b in boundaries], np.float64).astype(dtype).astype(np.float64))
    pts = pts[np.isfinite(pts)]
    total = pts.size
    if total > _MAX_BOUNDARIES:
        pts = pts[np.round(np.linspace(0, total - 1, _MAX_BOUNDARIES)).astype(int)]
    return pts, total


@dataclasses.dataclass(frozen=True)
class Values:
    """The two value sets for one dtype (see the module docstring)."""

    pool: np.ndarray
    smooth: np.ndarray
    boundaries_used: int
    boundaries_total: int


def make_values(dtype: np.dtype, boundaries: Sequence[float], seed: int, extra: np.ndarray | None) -> Values:
    rng = rng_for(seed, dtype.name, "values")
    points, total = chosen_boundaries(boundaries, dtype)
    triplets = boundary_triplets(points, dtype)
    span = value_range(points.tolist())
    parts = [special_values(dtype), triplets]
    if extra is not None:
        parts.append(np.asarray(extra).astype(dtype).reshape(-1))
    parts += [magnitude_values(dtype, rng), ordinary_values(dtype, rng, _ORDINARY, span)]
    finite_triplets = triplets[np.isfinite(triplets.astype(np.float64))]
    smooth = rng.permutation(np.concatenate([finite_triplets, ordinary_values(dtype, rng, _SMOOTH_ORDINARY, span)]))
    return Values(
        pool=np.concatenate(parts),
        smooth=smooth,
        boundaries_used=int(points.size),
        boundaries_total=int(total),
    )


@dataclasses.dataclass(frozen=True)
class Layout:
    """How values become positional arguments.

    Attributes:
      item_shape: the first argument has shape ``(rows,) + item_shape``; its
        leading axis is a batch axis (the compositions vmap and scan over it).
      make_rest: ``make_rest(x_shape, dtype, rng)``, the other positional
        arguments for a first argument of shape ``x_shape``.
    """

    item_shape: tuple[int, ...]
    make_rest: MakeRest

    @property
    def item_size(self) -> int:
        return math.prod(self.item_shape)

    def rows_for(self, count: int) -> int:
        """Rows for ``count`` values: 256 elements or the next multiple, and at least two rows."""
        elements = _CASE_ELEMENTS * max(1, -(-count // _CASE_ELEMENTS))
        return max(2, -(-elements // self.item_size))

    def arguments(self, values: np.ndarray, dtype: np.dtype, rng: np.random.Generator, rows: int):
        """The positional arguments holding ``values`` (repeated to fill ``rows`` rows)."""
        x = np.resize(values, rows * self.item_size).reshape((rows, *self.item_shape)).astype(dtype)
        rest = tuple(self.make_rest(x.shape, dtype, rng))
        return (x, *rest)


def generated_layout() -> Layout:
    """One array argument: the values laid out in one axis."""
    return Layout(item_shape=(), make_rest=lambda shape, dtype, rng: ())


def user_layout(args: Sequence[Any]) -> Layout:
    """The layout for user-given example arguments.

    The first argument keeps its trailing axes; its leading axis is filled with
    generated values. The other arguments keep their values, cast to the dtype
    when floating; one whose leading axis matches the first argument's (a
    per-row or per-element array) is tiled along that axis with the rows.
    """
    x0 = np.asarray(args[0])
    rest = [np.asarray(a) for a in args[1:]]
    item_shape = tuple(x0.shape[1:])

    def make_rest(x_shape, dtype, rng):
        out = []
        for a in rest:
            if a.ndim == x0.ndim and a.ndim >= 1 and a.shape[0] == x0.shape[0] and x0.shape[0] > 1:
                a = np.take(a, np.arange(x_shape[0]) % a.shape[0], axis=0)
            out.append(cast_floating(a, dtype))
        return tuple(out)

    return Layout(item_shape=item_shape, make_rest=make_rest)


def cast_floating(a: Any, dtype: np.dtype) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(dtype) if is_floating_dtype(a.dtype) else a


def is_floating_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a floating dtype, bfloat16 included (NumPy says no for it)."""
    return bool(jnp.issubdtype(np.dtype(dtype), jnp.floating))


def few_bit_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Nonzero multiples of 1/8 in [-2, 2]: five significant bits, exact in every dtype.

    With so few bits, many products ``derivative * tangent`` are exact, and
    ``2 t1 - t2 / 2`` (the linearity check) is exact even in bfloat16.
    """
    k = rng.integers(1, 17, shape) * rng.choice([-1, 1], shape)
    return (k / 8).astype(dtype)
