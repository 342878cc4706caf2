"""Pictures of estimators: the forward function and its surrogate derivative.

Needs the optional extra ``stejax[cli]`` (matplotlib); importing this module does
not import matplotlib, only calling :func:`plot_estimator` does.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stejax.estimators._entry import Entry

__all__ = ["plot_estimator"]

GRID_POINTS = 2001
DEFAULT_RANGE = (-3.0, 3.0)
# The code (channel) dimension of a rank-1 entry that gives no example_shape.
CODE_DIMENSION = 4
# Past this many kinks the dotted lines hide the curves; the caption counts them instead.
MAX_KINK_LINES = 64


def plot_estimator(
    entry: Entry,
    path: str | os.PathLike[str],
    *,
    params: Mapping[str, Any] | None = None,
) -> Path:
    r"""Draw an estimator's forward function and surrogate derivative into one PNG.

    The left panel shows :math:`y = f(x)`, the right panel the surrogate
    :math:`\partial y / \partial x`, both over a grid of 2001 float32 points on a
    range around the entry's kinks (``entry.boundaries(**params)``; ``[-3, 3]``
    when it has none). Kinks and ties are dotted vertical lines.

    The input is a batch of 2001 rows, ``x`` of shape ``(2001, *tail)``:
    ``tail`` is ``(1,)`` for elementwise estimators, the trailing axes of
    ``entry.example_shape(**params)`` (the channels or code dimension) when the
    entry gives one, and ``(4,)`` for a rank-1 entry that does not.
    Coordinate 0 of each row sweeps the grid and the other coordinates are 0.
    The panels show output coordinate 0 and the JVP of ``entry.fn`` with a
    one-hot tangent on input coordinate 0: the diagonal of the surrogate
    Jacobian, which for a ``derivative`` entry is the declared derivative.
    Extra positional arrays come from ``entry.example_args`` with
    ``np.random.default_rng(0)``; a random estimator gets
    ``key=jax.random.key(0)``, so its forward panel is one draw. The figure's
    caption says which of these apply.

    Args:
      entry: a catalog entry.
      path: where to write the PNG; parent folders are created.
      params: static hyperparameters; missing ones take ``entry.default_params()``.

    Returns:
      The path written.

    Raises:
      ValueError, TypeError: from the estimator, for invalid ``params``.
      ImportError: matplotlib is not installed (``pip install 'stejax[cli]'``).
    """
    params = {**entry.default_params(), **dict(params or {})}
    curve = _curve(entry, params)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _draw(entry, params, curve, path)
    return path


class _Curve(NamedTuple):
    """The sampled picture."""

    grid: np.ndarray  # (GRID_POINTS,) float32: the plotted coordinate of x
    forward: np.ndarray  # (GRID_POINTS,) float32: the output coordinate shown
    slope: np.ndarray  # (GRID_POINTS,) float32: its surrogate derivative (the Jacobian diagonal)
    kinks: list[float]  # finite kinks and ties, sorted
    caption: str  # how the slice was built, or ""


def _curve(entry: Entry, params: dict[str, Any]) -> _Curve:
    tail = _row_shape(entry, params)
    x_shape = (GRID_POINTS, *tail)
    args = tuple(jnp.asarray(a) for a in entry.example_args(np.random.default_rng(0), x_shape, np.float32, params))
    bind = dict(params)
    if entry.random:
        bind["key"] = jax.random.key(0)

    def fn(x):
        return entry.fn(x, *args, **bind)

    # Traced without computing first, so that the estimator validates `params` before
    # `boundaries` sees them.
    jax.eval_shape(fn, jax.ShapeDtypeStruct(x_shape, np.float32))

    kinks = sorted({float(b) for b in entry.boundaries(**params) if math.isfinite(float(b))})
    lo, hi = _plot_range(kinks)
    grid = np.linspace(lo, hi, GRID_POINTS, dtype=np.float64).astype(np.float32)
    sweep = (slice(None),) + (0,) * len(tail)
    x = np.zeros(x_shape, np.float32)
    x[sweep] = grid
    one_hot = np.zeros(x_shape, np.float32)
    one_hot[sweep] = 1.0

    y, dy = jax.jit(lambda x, t: jax.jvp(fn, (x,), (t,)))(x, one_hot)
    forward = _output_coordinate(entry, np.asarray(y, np.float32), x_shape, sweep)
    slope = _output_coordinate(entry, np.asarray(dy, np.float32), x_shape, sweep)

    notes = []
    if tail != (1,):
        at = "[:, " + ", ".join("0" * len(tail)) + "]"
        notes.append(
            f"x has shape (N, {', '.join(map(str, tail))}): x{at} sweeps the grid, the other "
            f"coordinates are 0; shown: y{at} and the Jacobian diagonal dy{at}/dx{at} "
            "(JVP with a one-hot tangent)."
        )
    if entry.tangent is not None and tail == (1,):
        notes.append("Derivative: the JVP with tangent 1 (the entry declares a tangent map).")
    if entry.args:
        names = ", ".join(a.name for a in entry.args)
        notes.append(f"Extra arrays ({names}) drawn by the entry's example_args with default_rng(0).")
    if entry.random:
        notes.append("Random: one draw per grid point, key=jax.random.key(0) (the surrogate may depend on it).")
    if len(kinks) > MAX_KINK_LINES:
        notes.append(f"{len(kinks)} kinks/ties, not drawn.")
    return _Curve(grid, forward, slope, kinks, " ".join(notes))


def _plot_range(kinks: list[float]) -> tuple[float, float]:
    if not kinks:
        return DEFAULT_RANGE
    lo, hi = kinks[0], kinks[-1]
    if lo == hi:
        return lo + DEFAULT_RANGE[0], hi + DEFAULT_RANGE[1]
    pad = max(0.25 * (hi - lo), 0.5)
    return lo - pad, hi + pad


def _row_shape(entry: Entry, params: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of one row of the batch: the trailing axes of a valid input."""
    if entry.example_shape is not None:
        base = tuple(int(n) for n in entry.example_shape(**params))
        # A leading axis beyond input_rank is a batch axis, which the grid replaces.
        tail = base[1:] if len(base) > entry.input_rank else base
    else:
        # A code dimension of 1 would be degenerate (a softmax over one class, a 1-D rotation).
        tail = (CODE_DIMENSION,) * entry.input_rank
    # At least one trailing axis, so that per-channel extra arrays are shared by the whole grid.
    return tail or (1,)


def _output_coordinate(entry: Entry, y: np.ndarray, x_shape, sweep) -> np.ndarray:
    if y.shape == x_shape:
        return y[sweep]
    if y.ndim >= 1 and y.shape[0] == x_shape[0]:
        return y.reshape(x_shape[0], -1)[:, 0]
    raise ValueError(
        f"plot_estimator: {entry.name} maps an input of shape {x_shape} to shape {y.shape}; "
        f"expected the leading (batch) axis of length {x_shape[0]} to be kept."
    )


def _draw(entry: Entry, params: dict[str, Any], curve: _Curve, path: Path) -> None:
    # The object-oriented API with the Agg canvas: no pyplot, no global figure state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)

    left.plot(curve.grid, curve.grid, color="0.75", linestyle="--", linewidth=1, label="y = x")
    if entry.random:
        # Neighbouring draws are independent: dots, not a line through them.
        left.plot(curve.grid, curve.forward, "o", color="C0", markersize=1.2, label="forward (one draw)")
    else:
        left.plot(curve.grid, curve.forward, color="C0", linewidth=1.6, label="forward")
    left.set_title(_panel_title("forward", entry.forward_math))
    left.set_ylabel("y")
    left.legend(loc="upper left", fontsize="small")

    if entry.random:
        right.plot(curve.grid, curve.slope, "o", color="C3", markersize=1.2)
    else:
        right.plot(curve.grid, curve.slope, color="C3", linewidth=1.6)
    if entry.derivative is not None:
        right.set_title(_panel_title("surrogate derivative", entry.derivative_math))
    else:
        right.set_title(_panel_title("diagonal of the surrogate Jacobian, from", entry.derivative_math))
    right.set_ylabel("dy/dx")
    right.set_ylim(*_slope_limits(curve.slope))

    for ax in (left, right):
        ax.set_xlabel("x")
        ax.grid(True, color="0.92")
        ax.set_xlim(float(curve.grid[0]), float(curve.grid[-1]))
        if len(curve.kinks) <= MAX_KINK_LINES:
            for k in curve.kinks:
                ax.axvline(k, color="0.45", linestyle=":", linewidth=0.9)

    fig.suptitle(_title(entry, params), fontsize="large")
    if curve.caption:
        fig.supxlabel(_wrap(curve.caption, 150), fontsize="small", color="0.3")
    _shrink_titles_to_fit(fig, (left, right))
    fig.savefig(path, dpi=100, metadata={"Software": None})


def _shrink_titles_to_fit(fig, axes) -> None:
    """One smaller size for the panel titles when one (long math) is wider than its panel."""
    renderer = fig.canvas.get_renderer()
    # Text width grows in proportion to the font size, so one measurement gives the size.
    overflow = max(
        ax.title.get_window_extent(renderer).width / (1.1 * ax.get_window_extent(renderer).width) for ax in axes
    )
    if overflow > 1:
        size = max(6.0, min(ax.title.get_fontsize() for ax in axes) / overflow)
        for ax in axes:
            ax.title.set_fontsize(size)


def _slope_limits(slope: np.ndarray) -> tuple[float, float]:
    """Limits that include 0, so that a constant derivative reads as its value and not as noise."""
    finite = slope[np.isfinite(slope)]
    lo = min(0.0, float(finite.min())) if finite.size else 0.0
    hi = max(0.0, float(finite.max())) if finite.size else 1.0
    pad = 0.1 * (hi - lo) if hi > lo else 1.0
    return lo - pad, hi + pad


def _title(entry: Entry, params: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    key = "key=jax.random.key(0): one draw" if entry.random else ""
    inside = ", ".join(s for s in (shown, key) if s)
    return f"{entry.name}({inside})  [{entry.family}]"


def _panel_title(label: str, latex: str) -> str:
    math_text = _mathtext(latex)
    return f"{label}\n{math_text}" if math_text else label


# LaTeX spellings that mathtext lacks, and its own for the same symbol.
_MATHTEXT_SPELLINGS = (
    (r"\\le(?![a-zA-Z])", r"\\leq"),
    (r"\\ge(?![a-zA-Z])", r"\\geq"),
    (r"\\[td]frac(?![a-zA-Z])", r"\\frac"),
    (r"\\frac(\d)(\d)", r"\\frac{\1}{\2}"),
    (r"\\[lr]Vert(?![a-zA-Z])", r"\\Vert"),
    (r"\\[lr]vert(?![a-zA-Z])", r"|"),
    (r"\\[bB]igg?[lr]?(?![a-zA-Z])", ""),
)


def _mathtext(latex: str) -> str | None:
    """``$latex$`` if matplotlib's mathtext can typeset it (a subset of LaTeX), else None."""
    if not latex:
        return None
    from matplotlib.mathtext import MathTextParser

    text = latex
    for pattern, replacement in _MATHTEXT_SPELLINGS:
        text = re.sub(pattern, replacement, text)
    text = f"${text}$"
    try:
        MathTextParser("path").parse(text)
    except ValueError:
        return None
    return text


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))
