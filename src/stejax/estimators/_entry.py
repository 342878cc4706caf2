"""The catalog's record of one estimator: its facts as data.

The verifier, the command line and the docs read these records; the public
function's docstring states the same facts for a reader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["ArgSpec", "Entry", "ParamSpec"]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """A static hyperparameter (keyword argument) of an estimator.

    Attributes:
      name: the keyword.
      default: the default value, or ``None`` when the keyword is required.
      values: representative values that tests and the verifier try.
      doc: what it means and its valid range.
    """

    name: str
    default: Any
    values: tuple[Any, ...]
    doc: str


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """A positional array argument after the first (a step size, a codebook).

    Attributes:
      name: the argument's name in the public signature.
      make: ``make(rng, x_shape, dtype, params) -> np.ndarray`` builds a valid
        example value for an input of shape ``x_shape``.
      differentiable: whether it carries a surrogate gradient.
      doc: its meaning and shape.
    """

    name: str
    make: Callable[[np.random.Generator, tuple[int, ...], Any, Mapping[str, Any]], np.ndarray]
    differentiable: bool
    doc: str


@dataclasses.dataclass(frozen=True)
class Entry:
    """One catalog member.

    ``fn``, ``forward`` and ``derivative`` (or ``tangent``) share one calling
    convention: ``fn(x, *args, **params)``, with ``key=`` added for random
    estimators. ``derivative`` returns the elementwise partial of the output
    with respect to each differentiable positional argument (a tuple when there
    are several); ``tangent(x, *args, tangents=..., **params)`` is the linear
    tangent map of estimators whose surrogate Jacobian is not diagonal.

    Attributes:
      name: the public name, ``stejax.<name>``.
      family: one of ``rounding``, ``binary``, ``uniform``, ``latent``, ``spiking``.
      fn: the public estimator.
      forward: the exact forward function.
      derivative: the declared elementwise surrogate partials, or ``None``.
      tangent: the declared linear tangent map, or ``None``.
      diff_argnums: positional arguments that carry a surrogate gradient.
      boundaries: ``boundaries(**params) -> tuple[float, ...]``, the kink and tie
        points of the first argument for representative inputs.
      params: the static hyperparameters.
      args: the positional arrays after the first.
      random: whether ``key=`` is required.
      input_rank: the least rank of the first argument (1 for codebook lookups).
      example_shape: ``example_shape(**params) -> tuple[int, ...]``, a valid shape
        for the first argument under those params (FSQ needs its last axis to
        match ``levels``), or ``None`` when any shape of rank ``input_rank`` works.
      forward_math: the forward function, in LaTeX.
      derivative_math: the surrogate derivative, in LaTeX.
      kinks: behaviour at kinks and ties, in words.
      integral: what the surrogate derivative integrates to (spiking), or "".
      reference: the paper.
    """

    name: str
    family: str
    fn: Callable[..., Any]
    forward: Callable[..., Any]
    derivative: Callable[..., Any] | None
    tangent: Callable[..., Any] | None
    diff_argnums: tuple[int, ...]
    boundaries: Callable[..., tuple[float, ...]]
    params: tuple[ParamSpec, ...] = ()
    args: tuple[ArgSpec, ...] = ()
    random: bool = False
    input_rank: int = 0
    example_shape: Callable[..., tuple[int, ...]] | None = None
    forward_math: str = ""
    derivative_math: str = ""
    kinks: str = ""
    integral: str = ""
    reference: str = ""

    def default_params(self) -> dict[str, Any]:
        """The keyword arguments at their defaults (the first listed value if required)."""
        return {p.name: (p.values[0] if p.default is None else p.default) for p in self.params}

    def param_grid(self) -> list[dict[str, Any]]:
        """The defaults, then each parameter moved alone through its listed values."""
        base = self.default_params()
        grid = [base]
        for p in self.params:
            for v in p.values:
                if v != base[p.name]:
                    grid.append({**base, p.name: v})
        return grid

    def example_args(
        self, rng: np.random.Generator, x_shape: tuple[int, ...], dtype: Any, params: Mapping[str, Any]
    ) -> tuple[np.ndarray, ...]:
        """Valid example values for the positional arrays after the first."""
        return tuple(a.make(rng, x_shape, dtype, params) for a in self.args)
