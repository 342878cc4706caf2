"""Leaf-by-leaf comparison of two PyTrees at stated tolerances, for the transformation stages."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["TOLERANCES", "compare_trees", "first_nonfinite", "leaf_path", "tolerance"]

# |got - eager| <= atol + rtol * |eager|, elementwise, per dtype of the eager leaf.
# float32 uses the numbers the training tests state for jit against eager
# (stejax.train's NUMERICAL_TOLERANCES); the 16-bit types allow a few of their ulps.
# Integer, boolean and key leaves must be equal.
TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-12, "atol": 1e-12},
    "float32": {"rtol": 1e-5, "atol": 1e-5},
    "float16": {"rtol": 4e-3, "atol": 4e-3},
    "bfloat16": {"rtol": 3.2e-2, "atol": 3.2e-2},
}


def tolerance(dtype: Any) -> dict[str, float] | None:
    """The stated ``{"rtol", "atol"}`` for a floating dtype; None for exact comparison."""
    return TOLERANCES.get(np.dtype(dtype).name)


def leaf_path(path: tuple[Any, ...]) -> str:
    """A PyTree path as ``jax.tree_util.keystr`` writes it, or ``"(root)"`` for a bare array."""
    return jax.tree_util.keystr(path) or "(root)"


def _as_numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def compare_trees(got: Any, want: Any, *, what: str) -> str | None:
    """Why ``got`` differs from ``want`` (tree structure, then each leaf's shape, dtype, values); None if equal.

    Values are compared at :data:`TOLERANCES` for the dtype of ``want``'s leaf,
    with NaN equal to NaN in the same place (the eager stages have already
    refused non-finite values, so a NaN here is one the transformation made).
    """
    # Annotated: the return type jax declares for structure() names an extension type
    # without a stub, which mypy cannot resolve and then refuses to compare.
    got_def: jax.tree_util.PyTreeDef = jax.tree.structure(got)
    want_def: jax.tree_util.PyTreeDef = jax.tree.structure(want)
    if got_def != want_def:
        return f"{what}: the tree structure differs from the eager result: got {got_def}, expected {want_def}."
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    for (path, g), w in zip(got_leaves, jax.tree.leaves(want), strict=True):
        name = f"{what}{jax.tree_util.keystr(path)}"
        g, w = _as_numpy(g), _as_numpy(w)
        if g.shape != w.shape:
            return f"{name}: shape {g.shape} differs from the eager shape {w.shape}."
        if g.dtype != w.dtype:
            return f"{name}: dtype {g.dtype} differs from the eager dtype {w.dtype}."
        tol = tolerance(w.dtype)
        if tol is None:
            if not np.array_equal(g, w):
                i = tuple(int(v) for v in np.argwhere(g != w)[0])
                return f"{name}: differs from the eager value at index {i}: {g[i]} != {w[i]} (exact comparison)."
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        close = np.isclose(g64, w64, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True)
        if not close.all():
            bad = np.argwhere(~close)
            i = tuple(int(v) for v in bad[0])
            diff = np.abs(g64 - w64)
            return (
                f"{name}: {len(bad)} of {g.size} values differ from the eager result beyond "
                f"atol {tol['atol']:g} + rtol {tol['rtol']:g} * |eager| ({w.dtype}); the first at index {i}: "
                f"{g64[i]!r} against {w64[i]!r}; the largest difference {np.nanmax(diff):.3g}."
            )
    return None


def first_nonfinite(tree: Any, *, what: str) -> str | None:
    """A sentence naming the first leaf of ``tree`` with a NaN or infinity, and where; None if all finite."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.asarray(leaf)
        if not np.issubdtype(a.dtype, np.inexact):
            continue
        bad = ~np.isfinite(a.astype(np.float64))
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            at = f" at index {i}" if a.ndim else ""
            return (
                f"{what}{jax.tree_util.keystr(path)} is {a[i]!r}{at} "
                f"({int(np.isnan(a.astype(np.float64)).sum())} NaN, "
                f"{int(np.isinf(a.astype(np.float64)).sum())} inf of {a.size} values)"
            )
    return None
