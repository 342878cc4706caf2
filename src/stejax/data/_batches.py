"""Minibatches over one epoch, in an order the caller controls."""

from __future__ import annotations

import operator
from collections.abc import Iterator

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["batches"]


def batches(
    x: ArrayLike,
    y: ArrayLike,
    *,
    batch_size: int,
    order: ArrayLike | None = None,
    seed: int | None = None,
    shuffle: bool = True,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Iterate over one epoch of ``(x_batch, y_batch)`` minibatches.

    The order is explicit, never drawn from hidden global state. With
    ``shuffle=True`` (the default) give exactly one of:

    * ``order``: a permutation of ``range(N)``; batch ``k`` holds rows
      ``order[k * batch_size : (k + 1) * batch_size]``. The training loop passes
      ``jax.random.permutation(key, N)`` here, so the key it splits each epoch
      decides the order and the key flow stays visible in the training code.
    * ``seed``: a non-negative int; the order is
      ``np.random.default_rng(seed).permutation(N)``.

    With ``shuffle=False`` give neither; rows come in their stored order.

    Every example is in exactly one batch of the epoch. The last batch is shorter
    when ``batch_size`` does not divide ``N``, unless ``drop_last=True`` drops it
    (then up to ``batch_size - 1`` examples are skipped this epoch, and every batch
    has one shape, so a jitted step compiles once).

    The arguments are checked when ``batches`` is called, before the first batch.

    Args:
      x: features, shape ``(N, ...)``.
      y: labels, shape ``(N,)`` (or ``(N, ...)``).
      batch_size: a positive int.
      order: a permutation of ``range(N)`` (NumPy or JAX integer array). Default None.
      seed: a non-negative int seeding a NumPy permutation. Default None.
      shuffle: whether to shuffle (by ``order`` or ``seed``). Default True.
      drop_last: drop a final batch shorter than ``batch_size``. Default False.

    Yields:
      ``(x[rows], y[rows])``: new NumPy arrays with ``x``'s and ``y``'s dtypes.

    Raises:
      TypeError: ``batch_size`` or ``seed`` is not an int, or ``order`` is not an
        integer array.
      ValueError: ``x`` and ``y`` differ in length, ``batch_size`` is not positive,
        ``order`` is not a permutation of ``range(N)``, or ``order``, ``seed`` and
        ``shuffle`` disagree (both given, neither given while shuffling, or one
        given with ``shuffle=False``).

    Example:
      >>> import numpy as np
      >>> from stejax.data import batches
      >>> x, y = np.arange(10.0).reshape(5, 2), np.arange(5)
      >>> [yb.tolist() for _, yb in batches(x, y, batch_size=2, order=[4, 0, 3, 1, 2])]
      [[4, 0], [3, 1], [2]]
      >>> [yb.tolist() for _, yb in batches(x, y, batch_size=2, shuffle=False, drop_last=True)]
      [[0, 1], [2, 3]]
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"batches: x and y must have a leading example axis, got shapes {x.shape} and {y.shape}")
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"batches: x has {n} examples but y has {y.shape[0]}; expected one label per example")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise TypeError(f"batches: batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batches: batch_size must be positive, got {batch_size}")
    if not shuffle:
        if order is not None or seed is not None:
            raise ValueError("batches: shuffle=False takes neither order nor seed; drop them or set shuffle=True")
        rows = np.arange(n)
    elif (order is None) == (seed is None):
        given = "both were given" if order is not None else "neither was given"
        raise ValueError(
            f"batches: shuffling needs exactly one of order (a permutation, e.g. from "
            f"jax.random.permutation) or seed; {given}. Pass shuffle=False for the stored order"
        )
    elif seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise TypeError(f"batches: seed must be an int, got {type(seed).__name__}")
        if seed < 0:
            raise ValueError(f"batches: seed must be non-negative, got {seed}")
        rows = np.random.default_rng(operator.index(seed)).permutation(n)
    else:
        rows = _check_permutation(np.asarray(order), n)
    return _iterate(x, y, rows, int(batch_size), bool(drop_last))


def _check_permutation(order: np.ndarray, n: int) -> np.ndarray:
    if order.dtype.kind not in "iu":
        raise TypeError(f"batches: order must be an integer array, got dtype {order.dtype}")
    if order.shape != (n,):
        raise ValueError(f"batches: order must be a permutation of range({n}) of shape ({n},), got shape {order.shape}")
    out_of_range = (order < 0) | (order >= n)
    if out_of_range.any():
        i = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"batches: order must be a permutation of range({n}), got {order[i]} at index {i}")
    order = order.astype(np.intp)
    counts = np.bincount(order, minlength=n)
    if (counts != 1).any():
        missing = int(np.flatnonzero(counts == 0)[0])
        repeated = int(np.flatnonzero(counts > 1)[0])
        raise ValueError(
            f"batches: order must be a permutation of range({n}): row {repeated} appears "
            f"{counts[repeated]} times and row {missing} is missing"
        )
    return order


def _iterate(
    x: np.ndarray, y: np.ndarray, rows: np.ndarray, batch_size: int, drop_last: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    n = rows.shape[0]
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        take = rows[start : start + batch_size]
        yield x[take], y[take]
