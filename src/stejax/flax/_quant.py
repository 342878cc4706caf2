"""What a layer quantises with: a catalog estimator (or any callable), its settings and its learned arguments."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.estimators._entry import Entry
from stejax.estimators.calibration import absmax_scale, mse_scale, percentile_scale
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
    fake_quant ``scale``        dynamic (below); static: absmax of w   :math:`4 \cdot \mathrm{fl}(1/q_{\max})`
    fake_quant ``zero_point``   0                                      0
    ==========================  =====================================  ==================================

    **Scales: dynamic or static.** fake_quant's scale is calibrated, not learned.
    With ``scale="dynamic"`` (the default for weights) it is recomputed from the
    current values on every call, by the ``calibration`` method (``"absmax"``,
    the default; ``"percentile"``, ``"mse"``), under ``stop_gradient``, so a
    trained weight never leaves the grid's range. With ``scale="static"`` (the
    default for inputs) it is a :class:`Calibration` variable, set once (at
    initialisation for weights, by :func:`stejax.flax.calibrate` or by hand for
    inputs) and kept: the weights may then move outside it, where their gradient
    is zero. Granularity: per tensor (default); per channel with ``axis``; per
    group with ``group_size=g``, one scale or learned step per run of ``g``
    elements along the contraction axis (the kernel's input axis) for each
    output channel (LSQ's step then has shape ``(out, in // g)``); per token
    with ``per_token=True`` (dynamic inputs only: one scale per row over the
    features).

    For inputs, LSQ's gradient scale counts one example's elements,
    :math:`g = 1/\sqrt{N Q_P}` with :math:`N` the size of ``x[0]`` (the paper's
    :math:`N`, and what :func:`stejax.model.apply` uses per example), unless
    ``grad_scale`` is given.

    Args:
      estimator: a catalog name (``stejax.CATALOG``), a catalog function, or any
        callable ``f(x) -> y`` of the same shape.
      init: initial values of learned arguments by name, e.g. ``{"alpha": 3.0}``.
      scale: ``"dynamic"`` or ``"static"`` (fake_quant only); None: dynamic for
        weights, static for inputs.
      group_size: one scale (or step) per this many elements along the
        contraction axis; needs an estimator with an ``axis`` setting, left None.
      per_token: one dynamic input scale per token (needs ``scale="dynamic"``).
      calibration: how a scale is computed from values: ``"absmax"`` (default),
        ``"percentile"`` (99.99th) or ``"mse"``.
      **params: the estimator's keyword settings.

    Raises:
      ValueError: an invalid scale, granularity or calibration option; an
        unknown name, a latent estimator, an unknown setting, a
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
    _options: tuple[tuple[str, Any], ...]  # scale, group_size, per_token, calibration (non-defaults only)

    def __init__(
        self,
        estimator: str | Callable[..., Any],
        /,
        *,
        init: Mapping[str, float] | None = None,
        scale: str | None = None,
        group_size: int | None = None,
        per_token: bool = False,
        calibration: str = "absmax",
        **params: Any,
    ):
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
        options = _check_options(
            name, params, init, scale=scale, group_size=group_size, per_token=per_token, calibration=calibration
        )
        object.__setattr__(self, "_estimator", name if name is not None else estimator)
        object.__setattr__(self, "_params", tuple(sorted(params.items())))
        object.__setattr__(self, "_init", tuple(sorted((k, float(v)) for k, v in init.items())))
        object.__setattr__(self, "_options", options)

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

    @property
    def group_size(self) -> int | None:
        """One scale (or step) per run of this many elements along the contraction axis, or None."""
        return dict(self._options).get("group_size")

    @property
    def per_token(self) -> bool:
        """A dynamic input scale per token (per row over the features) instead of one per tensor."""
        return bool(dict(self._options).get("per_token", False))

    @property
    def calibration(self) -> str:
        """How a scale is computed from data: ``"absmax"`` (default), ``"percentile"`` or ``"mse"``."""
        return dict(self._options).get("calibration", "absmax")

    def scale_mode(self, role: str) -> str | None:
        """``"dynamic"`` or ``"static"`` for a calibrated scale (fake_quant) in ``role``; None for other estimators.

        Unless ``scale=`` says otherwise, weights are dynamic (the scale is
        recomputed from the current weights on every call) and inputs static (a
        :class:`Calibration` variable, set by calibration).
        """
        if self.entry is None or "scale" not in {a.name for a in self.entry.args}:
            return None
        given = dict(self._options).get("scale")
        return given if given is not None else ("dynamic" if role == "weights" else "static")

    def __repr__(self):
        parts = [repr(self._estimator) if isinstance(self._estimator, str) else self.name]
        parts += [f"{k}={v!r}" for k, v in self._params]
        parts += [f"{k}={v!r}" for k, v in self._options]
        if self._init:
            parts.append(f"init={dict(self._init)!r}")
        return f"Quant({', '.join(parts)})"

    # ------------------------------------------------------------------ used by the layers and the rules

    def learned(
        self,
        role: str,
        *,
        kernel: jax.Array | None,
        in_features: int,
        contraction_axis: int = 0,
        data: jax.Array | None = None,
    ) -> dict[str, tuple[bool, jax.Array]]:
        """``{arg: (trainable, initial value)}`` for the estimator's array arguments after the first.

        A dynamic scale is not a variable (it is recomputed on each call).
        ``contraction_axis`` is the kernel's axis that the product sums over
        (where groups run); ``data``, an example of the inputs, sets an input's
        initial step or scale from data instead of the standardised default.
        """
        entry = self.entry
        if entry is None:
            return {}
        self._check_role(role, kernel, contraction_axis)
        if self.scale_mode(role) == "dynamic":
            return {}
        out = {}
        for position, arg in enumerate(entry.args, start=1):
            shape = self._arg_shape(role, kernel, in_features, contraction_axis)
            value = self._initial(arg.name, role, shape, kernel, contraction_axis, data)
            out[arg.name] = (position in entry.diff_argnums, value)
        return out

    def apply(
        self,
        x: jax.Array,
        learned: Mapping[str, jax.Array],
        *,
        role: str,
        key: jax.Array | None,
        contraction_axis: int | None = None,
    ) -> jax.Array:
        """The quantised ``x``: the estimator with the layer's learned (or dynamic) arguments, in ``x``'s dtype.

        ``contraction_axis`` (default: 0 for weights, the last axis for inputs)
        is where groups and per-token rows run.
        """
        entry = self.entry
        if entry is None:
            return cast(Callable[..., Any], self._estimator)(x)
        c = (0 if role == "weights" else -1) if contraction_axis is None else contraction_axis
        params = self.params
        if role == "activations" and entry.name in ("lsq", "lsq_plus") and params["grad_scale"] is None:
            _, qp = lsq_levels(params["bits"], params["signed"])
            per_example = math.prod(x.shape[1:])
            params["grad_scale"] = 1.0 / math.sqrt(per_example * qp)
        if entry.random:
            params["key"] = key
        rows = x.shape[c] if self.per_token and role != "weights" else self.group_size
        if rows is not None:
            # One scale per row of the view (other axes..., n // g, g): the estimator's per-channel form, axis 0.
            view, back = _rows(x, c, rows)
            params["axis"] = 0
            if self.scale_mode(role) == "dynamic":
                args = self._dynamic_args(view, axis=0)
            else:
                args = [jnp.reshape(jnp.asarray(learned[a.name]), (-1,)).astype(x.dtype) for a in entry.args]
            return back(entry.fn(view, *args, **params))
        if self.scale_mode(role) == "dynamic":
            args = self._dynamic_args(x, axis=params.get("axis"))
        else:
            args = [jnp.asarray(learned[a.name]).astype(x.dtype) for a in entry.args]
        return entry.fn(x, *args, **params)

    def _dynamic_args(self, x: jax.Array, *, axis: int | None) -> list[jax.Array]:
        # The scale follows the current values but is not differentiated: fake_quant's scale
        # is a calibration constant (no surrogate), and a gradient through max|x| is not one.
        scale = calibrated_scale(jax.lax.stop_gradient(x), self, axis=axis)
        entry = self.entry
        assert entry is not None  # only catalog estimators have a dynamic scale
        return [scale if a.name == "scale" else jnp.zeros_like(scale) for a in entry.args]

    def _check_role(self, role: str, kernel: jax.Array | None, contraction_axis: int) -> None:
        if role == "weights":
            if self.per_token:
                raise ValueError(f"Quant: per_token is for inputs; {self.name} on weights got per_token=True.")
            g = self.group_size
            if g is not None and kernel is not None:
                n = kernel.shape[contraction_axis]
                if n % g:
                    raise ValueError(
                        f"Quant: group_size {g} does not divide the contraction axis ({contraction_axis}) of the "
                        f"weights, of length {n} (shape {tuple(kernel.shape)})."
                    )
        elif self.group_size is not None and self.scale_mode(role) != "dynamic":
            raise ValueError(
                f"Quant: a static input quantiser ({self.name}) cannot have group_size; groups of inputs need "
                "scale='dynamic' (fake_quant) or per_token=True."
            )

    def _arg_shape(
        self, role: str, kernel: jax.Array | None, in_features: int, contraction_axis: int
    ) -> tuple[int, ...]:
        if role == "weights" and self.group_size is not None:
            assert kernel is not None
            moved = jnp.moveaxis(jnp.zeros(kernel.shape, jnp.bool_), contraction_axis, -1).shape
            return (*moved[:-1], moved[-1] // self.group_size)
        axis = self.params.get("axis")
        if axis is None:
            return ()
        if role == "weights":
            assert kernel is not None
            return (kernel.shape[axis],)
        if axis != -1:
            raise ValueError(
                f"Quant: a per-channel input quantiser ({self.name}) needs axis=-1 (the features); got axis={axis}."
            )
        return (in_features,)

    def _initial(
        self,
        arg: str,
        role: str,
        shape: tuple[int, ...],
        kernel: jax.Array | None,
        contraction_axis: int,
        data: jax.Array | None,
    ) -> jax.Array:
        if arg in self._init_dict():
            return jnp.full(shape, self._init_dict()[arg], jnp.float32)
        params, name = self.params, self.name
        weights = role == "weights"
        # The values to start from, arranged so that one row is one scale's slice (None: no data).
        source, axis = (kernel, params.get("axis")) if weights else (data, params.get("axis"))
        if weights and self.group_size is not None:
            assert kernel is not None
            source, axis = _rows(kernel, contraction_axis, self.group_size)[0], 0
        if name in ("lsq", "lsq_plus") and arg == "step":
            _, qp = lsq_levels(params["bits"], params["signed"])
            if source is None:
                return jnp.full(shape, 2.0 / math.sqrt(qp), jnp.float32)
            axes = None if axis is None else _other_axes(source.ndim, axis)
            step = jnp.mean(jnp.abs(source.astype(jnp.float32)), axis=axes) * np.float32(2.0 / math.sqrt(qp))
            return jnp.reshape(step, shape).astype(jnp.float32)
        if arg in ("offset", "zero_point"):
            return jnp.zeros(shape, jnp.float32)
        if name == "pact" and arg == "alpha":
            return jnp.full(shape, PACT_ALPHA, jnp.float32)
        if name == "fake_quant" and arg == "scale":
            if source is not None:
                return jnp.reshape(calibrated_scale(source.astype(jnp.float32), self, axis=axis), shape)
            q_max = 2 ** (params["bits"] - 1) - 1 if params["signed"] else 2 ** params["bits"] - 1
            return jnp.full(shape, ACTIVATION_RANGE * np.float32(1.0 / q_max), jnp.float32)
        raise ValueError(  # pragma: no cover - every catalog argument has a rule above
            f"Quant: no default initial value for {name}'s {arg!r}; give init={{{arg!r}: value}}."
        )

    def _init_dict(self) -> dict[str, float]:
        return dict(self._init)


def calibrated_scale(x: jax.Array, quant: Quant, *, axis: int | None) -> jax.Array:
    """fake_quant's scale for ``x`` by ``quant``'s calibration method (per tensor, or per ``axis``), in x's dtype."""
    params = quant.params
    bits, signed = params["bits"], params["signed"]
    if quant.calibration == "percentile":
        return percentile_scale(x, bits=bits, signed=signed, axis=axis)
    if quant.calibration == "mse":
        return mse_scale(x, bits=bits, signed=signed, axis=axis)
    return absmax_scale(x, bits=bits, signed=signed, axis=axis)


def _rows(x: jax.Array, axis: int, size: int) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """``x`` as rows of ``size`` consecutive elements along ``axis``, and the map back to ``x``'s layout.

    The rows are ordered as ``moveaxis(x, axis, -1)``'s leading axes, then the
    groups: ``(other axes..., n // size)`` flattened.
    """
    moved = jnp.moveaxis(x, axis, -1)
    view = jnp.reshape(moved, (-1, size))

    def back(y: jax.Array) -> jax.Array:
        return jnp.moveaxis(jnp.reshape(y, moved.shape), -1, axis)

    return view, back


def as_quant(spec: Quant | str | Callable[..., Any] | None, *, where: str) -> Quant | None:
    """A layer's ``weights=``/``activations=`` argument as a :class:`Quant` (None stays None)."""
    if spec is None or isinstance(spec, Quant):
        return spec
    if isinstance(spec, str) or callable(spec):
        return Quant(spec)
    raise TypeError(f"{where}: expected a Quant, a catalog name, a callable or None; got {spec!r}.")


def _catalog_name(estimator: Any) -> str | None:
    name: str | None
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


SCALE_MODES = ("dynamic", "static")
CALIBRATIONS = ("absmax", "percentile", "mse")


def _check_options(
    name: str | None,
    params: Mapping[str, Any],
    init: Mapping[str, float],
    *,
    scale: Any,
    group_size: Any,
    per_token: Any,
    calibration: Any,
) -> tuple[tuple[str, Any], ...]:
    """The granularity and scale options, checked; only non-default ones are kept (equal Quants compare equal)."""
    what = name or "this callable"
    entry = CATALOG[name] if name is not None else None
    args = {a.name for a in entry.args} if entry is not None else set()
    if scale is not None:
        if scale not in SCALE_MODES:
            raise ValueError(f"Quant: scale must be one of {list(SCALE_MODES)} or None; got {scale!r}.")
        if "scale" not in args:
            raise ValueError(
                f"Quant: scale={scale!r} is for estimators with a calibrated scale (fake_quant); {what} has none"
                + (f" ({', '.join(sorted(args))} {'is' if len(args) == 1 else 'are'} its own)." if args else ".")
            )
        if scale == "dynamic" and set(init) & {"scale", "zero_point"}:
            raise ValueError(f"Quant: init={dict(init)!r} with scale='dynamic': a dynamic scale has no initial value.")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"Quant: calibration must be one of {list(CALIBRATIONS)}; got {calibration!r}.")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"Quant: group_size must be None or a positive int; got {group_size!r}.")
        if entry is None or "axis" not in params:
            raise ValueError(
                f"Quant: group_size needs an estimator with a per-channel form (an axis setting); {what} has none."
            )
        if params["axis"] is not None:
            raise ValueError(
                f"Quant: give axis (per channel) or group_size (per group), not both; got axis={params['axis']!r}, "
                f"group_size={group_size}."
            )
    if not isinstance(per_token, bool):
        raise TypeError(f"Quant: per_token must be a bool; got {per_token!r}.")
    if per_token:
        if scale != "dynamic":
            raise ValueError(
                f"Quant: per_token=True needs scale='dynamic' (a scale per token is computed per call); "
                f"got scale={scale!r}."
            )
        if group_size is not None or params.get("axis") is not None:
            raise ValueError("Quant: per_token=True is its own granularity; leave axis and group_size unset.")
    given = {"scale": scale, "group_size": group_size, "per_token": per_token, "calibration": calibration}
    defaults = {"scale": None, "group_size": None, "per_token": False, "calibration": "absmax"}
    return tuple(sorted((k, v) for k, v in given.items() if v != defaults[k]))


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
