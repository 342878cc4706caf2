"""What a layer quantises with: a catalog estimator (or any callable), its settings and its learned arguments."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.estimators._entry import Entry
from stejax.estimators.calibration import absmax_scale
from stejax.estimators.catalog import CATALOG
from stejax.estimators.uniform import lsq_levels

__all__ = ["ROLES", "Calibration", "Quant", "as_quant"]

ROLES = ("weights", "activations")

# The defaults for learned arguments without data (see Quant's docstring).
PACT_ALPHA = 6.0
ACTIVATION_RANGE = 4.0


class Calibration(nnx.Variable):
    """A quantiser argument that is set, not trained: fake_quant's scale and zero point.

    Not an ``nnx.Param``, so ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` leaves it
    alone; set it from data (e.g. with :func:`stejax.absmax_scale`) or with
    ``Quant(..., init=...)``.
    """


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Quant:
    r"""One quantiser of a layer: a catalog estimator (or any callable) and its settings.

    ``Quant("lsq", bits=4)`` quantises with :func:`stejax.lsq` at 4 bits and gives
    the layer a learned step; ``Quant(stejax.sign_ste)`` is the same as
    ``Quant("sign_ste")``; ``Quant(f)`` for any other callable applies
    ``f(x)`` as it is (no learned arguments). Keyword settings are the estimator's
    own (``bits``, ``signed``, ``axis``, ``clip`` ...); settings left out take the
    estimator's defaults, so ``Quant("lsq", bits=4) == Quant("lsq", bits=4,
    signed=True)``. Latent estimators (FSQ, VQ, the rotation trick, Gumbel-softmax)
    quantise code vectors, not a layer's weights or inputs, and are refused.

    The estimator's array arguments after the first become variables of the
    layer, named ``weight_<arg>`` or ``input_<arg>``: an ``nnx.Param`` when the
    estimator gives them a surrogate gradient (LSQ's ``step``, LSQ+'s ``step``
    and ``offset``, PACT's ``alpha``), a :class:`Calibration` otherwise
    (fake_quant's ``scale`` and ``zero_point``). With ``axis`` set there is one
    value per channel along that axis (for inputs only the last axis, the
    features, is allowed). Initial values, unless ``init`` gives them:

    ==========================  =====================================  ==================================
    argument                    weights                                inputs (no data yet: standardised)
    ==========================  =====================================  ==================================
    lsq / lsq_plus ``step``     :math:`2\langle|w|\rangle/\sqrt{Q_P}`  :math:`2/\sqrt{Q_P}`
                                (Esser et al., per channel with axis)  (:math:`\langle|u|\rangle = 1`)
    lsq_plus ``offset``         0                                      0
    pact ``alpha``              6                                      6
    fake_quant ``scale``        :func:`stejax.absmax_scale` of w       :math:`4 \cdot \mathrm{fl}(1/q_{\max})`
    fake_quant ``zero_point``   0                                      0
    ==========================  =====================================  ==================================

    For inputs, LSQ's gradient scale counts one example's elements,
    :math:`g = 1/\sqrt{N Q_P}` with :math:`N` the size of ``x[0]`` (the paper's
    :math:`N`, and what :func:`stejax.model.apply` uses per example), unless
    ``grad_scale`` is given.

    Args:
      estimator: a catalog name (``stejax.CATALOG``), a catalog function, or any
        callable ``f(x) -> y`` of the same shape.
      init: initial values of learned arguments by name, e.g. ``{"alpha": 3.0}``.
      **params: the estimator's keyword settings.

    Raises:
      ValueError: an unknown name, a latent estimator, an unknown setting, a
        required setting left out (``bits``), or ``init`` for an argument the
        estimator does not have.
      TypeError: ``estimator`` is neither a string nor callable.

    Example:
      >>> from stejax.flax import Quant
      >>> Quant("lsq", bits=4)
      Quant('lsq', axis=None, bits=4, grad_scale=None, signed=True)
      >>> Quant("lsq", bits=4) == Quant("lsq", bits=4, signed=True)
      True
    """

    _estimator: str | Callable[..., Any]
    _params: tuple[tuple[str, Any], ...]
    _init: tuple[tuple[str, float], ...]

    def __init__(self, estimator: str | Callable[..., Any], /, *, init: Mapping[str, float] | None = None, **params):
        name = _catalog_name(estimator)
        if name is not None:
            entry = CATALOG[name]
            params = _complete_params(entry, params)
            known = {a.name for a in entry.args}
        else:
            if params:
                raise ValueError(
                    f"Quant: settings {sorted(params)} are only for catalog estimators; bind them into the callable "
                    "(functools.partial) instead."
                )
            known = set()
        init = dict(init or {})
        unknown = sorted(set(init) - known)
        if unknown:
            raise ValueError(
                f"Quant: init names {unknown}, which {name or 'this callable'} does not take; "
                f"its learned arguments are {sorted(known)}."
            )
        object.__setattr__(self, "_estimator", name if name is not None else estimator)
        object.__setattr__(self, "_params", tuple(sorted(params.items())))
        object.__setattr__(self, "_init", tuple(sorted((k, float(v)) for k, v in init.items())))

    @property
    def name(self) -> str:
        """The catalog name, or the callable's ``__name__``."""
        e = self._estimator
        return e if isinstance(e, str) else getattr(e, "__name__", type(e).__name__)

    @property
    def entry(self) -> Entry | None:
        """The catalog entry, or None for a plain callable."""
        return CATALOG[self._estimator] if isinstance(self._estimator, str) else None

    @property
    def params(self) -> dict[str, Any]:
        """The keyword settings, defaults filled in."""
        return dict(self._params)

    @property
    def init(self) -> dict[str, float]:
        """The initial values given for learned arguments."""
        return dict(self._init)

    @property
    def random(self) -> bool:
        """Whether the estimator draws from a key (stochastic rounding)."""
        return self.entry is not None and self.entry.random

    def __repr__(self):
        parts = [repr(self._estimator) if isinstance(self._estimator, str) else self.name]
        parts += [f"{k}={v!r}" for k, v in self._params]
        if self._init:
            parts.append(f"init={dict(self._init)!r}")
        return f"Quant({', '.join(parts)})"

    # ------------------------------------------------------------------ used by the layers

    def learned(self, role: str, *, kernel: jax.Array | None, in_features: int) -> dict[str, tuple[bool, jax.Array]]:
        """``{arg: (trainable, initial value)}`` for the estimator's array arguments after the first."""
        entry = self.entry
        if entry is None:
            return {}
        out = {}
        for position, arg in enumerate(entry.args, start=1):
            shape = self._arg_shape(role, kernel, in_features)
            value = self._initial(arg.name, role, shape, kernel)
            out[arg.name] = (position in entry.diff_argnums, value)
        return out

    def apply(self, x: jax.Array, learned: Mapping[str, jax.Array], *, role: str, key: jax.Array | None) -> jax.Array:
        """The quantised ``x``: the estimator with the layer's learned arguments (cast to ``x``'s dtype)."""
        entry = self.entry
        if entry is None:
            return self._estimator(x)
        params = self.params
        if role == "activations" and entry.name in ("lsq", "lsq_plus") and params["grad_scale"] is None:
            _, qp = lsq_levels(params["bits"], params["signed"])
            per_example = math.prod(x.shape[1:])
            params["grad_scale"] = 1.0 / math.sqrt(per_example * qp)
        if entry.random:
            params["key"] = key
        args = [jnp.asarray(learned[a.name]).astype(x.dtype) for a in entry.args]
        return entry.fn(x, *args, **params)

    def _arg_shape(self, role: str, kernel: jax.Array | None, in_features: int) -> tuple[int, ...]:
        axis = self.params.get("axis")
        if axis is None:
            return ()
        if role == "weights":
            return (kernel.shape[axis],)
        if axis != -1:
            raise ValueError(
                f"Quant: a per-channel input quantiser ({self.name}) needs axis=-1 (the features); got axis={axis}."
            )
        return (in_features,)

    def _initial(self, arg: str, role: str, shape: tuple[int, ...], kernel: jax.Array | None) -> jax.Array:
        if arg in self._init_dict():
            return jnp.full(shape, self._init_dict()[arg], jnp.float32)
        params, name = self.params, self.name
        weights = role == "weights"
        if name in ("lsq", "lsq_plus") and arg == "step":
            _, qp = lsq_levels(params["bits"], params["signed"])
            if not weights:
                return jnp.full(shape, 2.0 / math.sqrt(qp), jnp.float32)
            axes = None if params["axis"] is None else _other_axes(kernel.ndim, params["axis"])
            return (jnp.mean(jnp.abs(kernel), axis=axes) * np.float32(2.0 / math.sqrt(qp))).astype(jnp.float32)
        if arg in ("offset", "zero_point"):
            return jnp.zeros(shape, jnp.float32)
        if name == "pact" and arg == "alpha":
            return jnp.full(shape, PACT_ALPHA, jnp.float32)
        if name == "fake_quant" and arg == "scale":
            if weights:
                return absmax_scale(kernel, bits=params["bits"], signed=params["signed"], axis=params["axis"])
            q_max = 2 ** (params["bits"] - 1) - 1 if params["signed"] else 2 ** params["bits"] - 1
            return jnp.full(shape, ACTIVATION_RANGE * np.float32(1.0 / q_max), jnp.float32)
        raise ValueError(  # pragma: no cover - every catalog argument has a rule above
            f"Quant: no default initial value for {name}'s {arg!r}; give init={{{arg!r}: value}}."
        )

    def _init_dict(self) -> dict[str, float]:
        return dict(self._init)


def as_quant(spec: Quant | str | Callable[..., Any] | None, *, where: str) -> Quant | None:
    """A layer's ``weights=``/``activations=`` argument as a :class:`Quant` (None stays None)."""
    if spec is None or isinstance(spec, Quant):
        return spec
    if isinstance(spec, str) or callable(spec):
        return Quant(spec)
    raise TypeError(f"{where}: expected a Quant, a catalog name, a callable or None; got {spec!r}.")


def _catalog_name(estimator: Any) -> str | None:
    if isinstance(estimator, str):
        if estimator not in CATALOG:
            raise ValueError(f"Quant: unknown estimator {estimator!r}; the catalog has {list(CATALOG)}.")
        name = estimator
    elif callable(estimator):
        name = next((e.name for e in CATALOG.values() if e.fn is estimator), None)
        if name is None:
            return None
    else:
        raise TypeError(f"Quant: estimator must be a catalog name or a callable; got {estimator!r}.")
    entry = CATALOG[name]
    if entry.input_rank > 0:
        raise ValueError(
            f"Quant: {name} is a latent estimator: it quantises code vectors (rank >= {entry.input_rank}), not a "
            "layer's weights or inputs elementwise. Call it directly on the codes."
        )
    return name


def _complete_params(entry: Entry, given: Mapping[str, Any]) -> dict[str, Any]:
    """The estimator's keyword settings with its defaults filled in; raises on unknown or missing ones."""
    settable = {
        p.name: p.default
        for p in inspect.signature(entry.fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "key"
    }
    unknown = sorted(set(given) - set(settable))
    if unknown:
        raise ValueError(f"Quant: {entry.name} has no setting {unknown[0]!r}; its settings are {sorted(settable)}.")
    out = {k: given.get(k, default) for k, default in settable.items()}
    missing = sorted(k for k, v in out.items() if v is inspect.Parameter.empty)
    if missing:
        raise ValueError(f"Quant: {entry.name} needs {missing[0]}=...; e.g. Quant({entry.name!r}, {missing[0]}=8).")
    return out


def _other_axes(ndim: int, axis: int) -> tuple[int, ...]:
    axis = axis % ndim
    return tuple(i for i in range(ndim) if i != axis)
