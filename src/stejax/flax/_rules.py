r"""Quantise any Flax NNX model by rules, without changing its code.

Two mechanisms, one per kind of site (a *site* is one product, or one embedding
table):

* **Layers** (``nnx.Linear``, ``nnx.LinearGeneral``, ``nnx.Einsum``,
  ``nnx.Conv``) already take their product as an injectable function
  (``dot_general``, ``einsum_op``, ``conv_general_dilated``); the quantised
  model's layer gets a hook there that quantises the two operands (its input
  and its kernel, exactly as the layer passes them, after dtype promotion) and
  calls the layer's own function. ``nnx.ConvTranspose`` has no such argument:
  its call to ``jax.lax.conv_transpose`` is intercepted (below), and its kernel
  is quantised in the layout the product sees (``...IO``; with
  ``transpose_kernel=True`` flipped and its channel axes swapped first, exact
  data movement), so ``axis=-1`` is per output channel as for ``nnx.Conv``.
  ``nnx.Embed`` gets its table quantised in
  ``__call__`` and ``attend`` (a tied output head shares the quantised table).
* **Products written in a module's own code** (``jnp.einsum``, ``jnp.matmul``,
  ``@``, ``jnp.dot``, ``jax.lax.dot_general``), and the two products of
  ``nnx.MultiHeadAttention`` (q·k and p·v, wherever its ``attention_fn`` computes
  them), are intercepted: while a module's ``__call__`` runs, those functions
  are replaced (module attributes, restored on exit) by ones that quantise the
  operands of the n-th product of that module and call the original.

Every module of the returned model is an instance of a subclass of its own
class (``Quantized<Name>``) whose ``__call__`` marks the module as running; the
user's classes are not modified, and the user's model keeps its float layers
(the quantised model is a new graph over the same parameter arrays, not a
copy). A product is attributed to the innermost module whose ``__call__`` is
running, and identified by its position among that module's products in one
call; :func:`quantize_model` finds the sites by running the model once,
eagerly, on the example inputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.flax._quant import Calibration, Quant, as_quant, calibrated_scale

__all__ = ["KINDS", "PRODUCTS", "Rule", "SiteRow", "Summary", "calibrate", "quantize_model", "summary"]

KINDS = ("linear", "conv", "einsum", "embed", "attention", "dot")
# How a matched site multiplies: a float product of the quantised operands (fake-quant), or
# stejax.integer_dot_general with its straight-through gradient in float ("int8-forward") or its
# declared int8 backward products ("int8").
PRODUCTS = ("fake-quant", "int8-forward", "int8")
GRADIENT_ROUNDINGS = ("nearest", "stochastic")
CALIBRATION_METHODS = ("absmax", "percentile", "mse")

QuantSpec = Quant | str | Callable[..., Any] | None


# ----------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True, init=False)
class Rule:
    r"""Which sites a rule quantises, and with what.

    A site matches when ``path`` (a regular expression) matches its whole path
    (``re.fullmatch``; a layer's path is its module's, e.g. ``"blocks/0/mlp/fc1"``;
    the products of a module's own code are ``"<module>/dot0"``, ``"dot1"``...,
    those of an ``nnx.MultiHeadAttention`` ``"<module>/scores"`` and
    ``"<module>/values"``) and its kind is in ``kinds`` (None: every kind). The
    first matching rule of a list wins. ``weights=None, inputs=None`` keeps the
    matched sites in float.

    Args:
      path: a regular expression on the site's path (default ``".*"``).
      kinds: a tuple of kinds among ``"linear"``, ``"conv"``, ``"einsum"``,
        ``"embed"``, ``"attention"``, ``"dot"``, or None for all.
      weights: the weight quantiser: a :class:`Quant`, a catalog name, a
        callable, or None (float).
      inputs: the input quantiser, likewise; at attention and dot sites it
        quantises both operands (each with its own learned arguments).
      product: how the site multiplies. ``"fake-quant"`` (default): the
        layer's own float product of the quantised operands. ``"int8-forward"``:
        :func:`stejax.integer_dot_general` with ``backward="float"``, the forward
        on int8 codes (absmax scales: one per token of the input, one per
        output channel of the weights, taken after the operand quantisers,
        which it represents exactly when they are 8-bit absmax grids of that
        granularity or ternary), the straight-through gradient in float.
        ``"int8"``: the same forward and both backward products as int8 x int8
        -> int32 with the cotangent quantised (``backward="int8"``). A
        ``None`` quantiser under an integer product means the product's own
        int8 quantisation. Integer products cover products written with
        ``dot_general`` or ``einsum`` (``nnx.Linear``, ``nnx.LinearGeneral``,
        ``nnx.Einsum``, ``jnp.einsum``, ``jax.lax.dot_general``).
      gradient_rounding: the cotangent's rounding under ``product="int8"``:
        ``"nearest"`` (default) or ``"stochastic"`` (draws from the
        ``quant`` stream of ``quantize_model``'s ``rngs``).

    Example:
      >>> from stejax.flax import Quant, Rule
      >>> Rule(r".*fc\d", kinds=("linear",), weights=Quant("lsq", bits=4)).matches("mlp/fc1", "linear")
      True
    """

    path: str
    kinds: tuple[str, ...] | None
    weights: Quant | None
    inputs: Quant | None
    product: str
    gradient_rounding: str

    def __init__(
        self,
        path: str = ".*",
        *,
        kinds: Iterable[str] | None = None,
        weights: QuantSpec = None,
        inputs: QuantSpec = None,
        product: str = "fake-quant",
        gradient_rounding: str = "nearest",
    ):
        if not isinstance(path, str):
            raise TypeError(f"Rule: path must be a regular expression (str); got {path!r}.")
        try:
            re.compile(path)
        except re.error as e:
            raise ValueError(f"Rule({path!r}): the path is not a valid regular expression: {e}.") from None
        if kinds is not None:
            if isinstance(kinds, str):
                raise TypeError(f"Rule({path!r}): kinds must be a tuple of kinds, e.g. ({kinds!r},); got {kinds!r}.")
            kinds = tuple(kinds)
            unknown = [k for k in kinds if k not in KINDS]
            if unknown or not kinds:
                raise ValueError(f"Rule({path!r}): kinds must be among {list(KINDS)}; got {list(kinds)}.")
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "weights", as_quant(weights, where=f"Rule({path!r}): weights"))
        object.__setattr__(self, "inputs", as_quant(inputs, where=f"Rule({path!r}): inputs"))
        if product not in PRODUCTS:
            raise ValueError(f"Rule({path!r}): product must be one of {list(PRODUCTS)}; got {product!r}.")
        if gradient_rounding not in GRADIENT_ROUNDINGS:
            raise ValueError(
                f"Rule({path!r}): gradient_rounding must be one of {list(GRADIENT_ROUNDINGS)}; "
                f"got {gradient_rounding!r}."
            )
        if gradient_rounding != "nearest" and product != "int8":
            raise ValueError(
                f"Rule({path!r}): gradient_rounding={gradient_rounding!r} rounds the int8 cotangent of product='int8'; "
                f"got product={product!r}."
            )
        object.__setattr__(self, "product", product)
        object.__setattr__(self, "gradient_rounding", gradient_rounding)

    def matches(self, path: str, kind: str) -> bool:
        """Whether this rule covers the site at ``path`` of ``kind``."""
        return re.fullmatch(self.path, path) is not None and (self.kinds is None or kind in self.kinds)

    def __repr__(self):
        parts = [repr(self.path)]
        if self.kinds is not None:
            parts.append(f"kinds={self.kinds!r}")
        parts += [f"weights={self.weights!r}", f"inputs={self.inputs!r}"]
        if self.product != "fake-quant":
            parts.append(f"product={self.product!r}")
        if self.gradient_rounding != "nearest":
            parts.append(f"gradient_rounding={self.gradient_rounding!r}")
        return f"Rule({', '.join(parts)})"


# ----------------------------------------------------------------------------- the summary


class SiteRow(NamedTuple):
    """One row of :func:`summary`: a site, what matched it and how it is quantised."""

    path: str  # the site's path (what Rule.path matches)
    kind: str  # one of KINDS, or "float" for a module with parameters and no product the rules can see
    rule: int | None  # the index of the matching rule, None when no rule matched
    weights: str | None  # the weight quantiser (Quant repr), None for float
    inputs: str | None  # the input quantiser, None for float
    shapes: tuple[tuple[int, ...], ...]  # the operands' shapes at the example inputs
    bits: str  # e.g. "w4a8", "w32a32" for float
    note: str  # why a site is left in float, or ""


@dataclasses.dataclass(frozen=True)
class Summary:
    """The rows of :func:`summary`: a sequence of :class:`SiteRow`; ``str()`` is a table."""

    rows: tuple[SiteRow, ...]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __str__(self) -> str:
        header = ("path", "kind", "rule", "weights", "inputs", "shapes", "bits", "note")
        body = [
            (
                r.path or "(root)",
                r.kind,
                "-" if r.rule is None else str(r.rule),
                r.weights or "float",
                r.inputs or "float",
                " x ".join(str(tuple(s)) for s in r.shapes),
                r.bits,
                r.note,
            )
            for r in self
        ]
        widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(header)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
        return "\n".join(lines)


def summary(model: nnx.Module) -> Summary:
    """The sites of a model returned by :func:`quantize_model`: path, kind, rule, quantisers, shapes, bits.

    ``print(summary(qmodel))`` prints a table; the rows are :class:`SiteRow` s.

    Raises:
      TypeError: ``model`` did not come from :func:`quantize_model`.
    """
    rows = getattr(model, "stejax_summary", None)
    if not isinstance(rows, Summary):
        raise TypeError(f"summary: expected a model returned by quantize_model; got a {type(model).__name__}.")
    return rows


# ----------------------------------------------------------------------------- running modules


@dataclasses.dataclass
class _Frame:
    module: Any
    intercepts: bool  # products made by the module's own code are its sites
    count: int = 0


_FRAMES: contextvars.ContextVar[tuple[_Frame, ...]] = contextvars.ContextVar("stejax_flax_frames", default=())
_IN_HOOK: contextvars.ContextVar[bool] = contextvars.ContextVar("stejax_flax_in_hook", default=False)
# Set while quantize_model discovers sites (a list of _Record) or calibrate collects inputs (a dict).
_RECORDER: contextvars.ContextVar[list | None] = contextvars.ContextVar("stejax_flax_recorder", default=None)
_COLLECTOR: contextvars.ContextVar[dict | None] = contextvars.ContextVar("stejax_flax_collector", default=None)


def _layer_types() -> tuple[type, ...]:
    return (nnx.Linear, nnx.LinearGeneral, nnx.Einsum, nnx.Conv, nnx.Embed)


def _weighted_layer(module: Any) -> bool:
    """A layer whose one product is (input, own kernel): the layers above, and ``nnx.ConvTranspose``."""
    return isinstance(module, (*_layer_types(), nnx.ConvTranspose))


def _kind_of(module: Any) -> str:
    if isinstance(module, (nnx.Conv, nnx.ConvTranspose)):
        return "conv"
    if isinstance(module, nnx.Einsum):
        return "einsum"
    if isinstance(module, (nnx.Linear, nnx.LinearGeneral)):
        return "linear"
    if isinstance(module, nnx.Embed):
        return "embed"
    if isinstance(module, nnx.MultiHeadAttention):
        return "attention"
    return "dot"


class _Patches:
    """The product functions replaced while an intercepting module runs (reference-counted, one thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[tuple[Any, str, Any]] = []

    @staticmethod
    def _targets() -> list[tuple[Any, str, str]]:
        from jax._src.numpy import einsum as einsum_module
        from jax._src.numpy import tensor_contractions

        return [
            (jax.numpy, "einsum", "einsum"),
            (einsum_module, "einsum", "einsum"),  # what jax.nn.dot_product_attention calls
            (jax.numpy, "matmul", "matmul"),
            (tensor_contractions, "matmul", "matmul"),  # what the @ operator calls
            (jax.numpy, "dot", "dot"),
            (tensor_contractions, "dot", "dot"),
            (jax.lax, "dot_general", "dot_general"),
            (jax.lax, "conv_transpose", "conv_transpose"),  # what nnx.ConvTranspose calls
        ]

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                originals: dict[int, Any] = {}
                for owner, attr, op in self._targets():
                    original = getattr(owner, attr)
                    wrapped = originals.setdefault(id(original), _intercepted(op, original))
                    self._saved.append((owner, attr, original))
                    setattr(owner, attr, wrapped)
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for owner, attr, original in reversed(self._saved):
                    setattr(owner, attr, original)
                self._saved.clear()


_PATCHES = _Patches()


@contextlib.contextmanager
def _running(module: Any):
    frame = _Frame(module, intercepts=not isinstance(module, _layer_types()))
    token = _FRAMES.set((*_FRAMES.get(), frame))
    if frame.intercepts:
        _PATCHES.enter()
    try:
        yield frame
    finally:
        if frame.intercepts:
            _PATCHES.exit()
        _FRAMES.reset(token)


def _intercepted(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def product(*args, **kwargs):
        frames = _FRAMES.get()
        if not frames or not frames[-1].intercepts or _IN_HOOK.get():
            return original(*args, **kwargs)
        frame = frames[-1]
        if op == "conv_transpose":
            if not isinstance(frame.module, nnx.ConvTranspose):
                return original(*args, **kwargs)  # only nnx.ConvTranspose's own product is a site
            return _conv_transpose(frame, original, args, kwargs)
        if op == "einsum":
            if len(args) != 3 or not isinstance(args[0], str):
                return original(*args, **kwargs)  # an einsum of one or of three operands: not a site
            subscripts = args[0]
            axes = _einsum_contraction(subscripts, jnp.ndim(args[1]), jnp.ndim(args[2]))
            return _product(
                frame,
                args[1],
                args[2],
                axes,
                lambda a, b: original(subscripts, a, b, **kwargs),
                integer=functools.partial(_integer_einsum, subscripts),
            )
        lhs, rhs = args[0], args[1]
        if op == "dot_general":
            dims = args[2] if len(args) > 2 else kwargs["dimension_numbers"]
            rest = args[3:]
            kw = {k: v for k, v in kwargs.items() if k != "dimension_numbers"}
            axes = (tuple(dims[0][0]), tuple(dims[0][1]))
            return _product(
                frame,
                lhs,
                rhs,
                axes,
                lambda a, b: original(a, b, dims, *rest, **kw),
                integer=functools.partial(_integer_dot_general, dims),
            )
        ndim_l, ndim_r = jnp.ndim(lhs), jnp.ndim(rhs)
        axes = ((ndim_l - 1,) if ndim_l else (), ((ndim_r - 2) if ndim_r >= 2 else 0,) if ndim_r else ())
        return _product(frame, lhs, rhs, axes, lambda a, b: original(a, b, *args[2:], **kwargs))

    return product


_CONV_TRANSPOSE_DEFAULT_DIMS = {3: ("NHC", "HIO", "NHC"), 4: ("NHWC", "HWIO", "NHWC"), 5: ("NHWDC", "HWDIO", "NHWDC")}


def _conv_transpose(frame: _Frame, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    r"""``nnx.ConvTranspose``'s product as a site: the kernel quantised as the product sees it.

    With ``transpose_kernel=True``, ``jax.lax.conv_transpose`` flips the
    kernel's spatial axes and swaps its two channel axes before convolving; here
    that flip and swap (exact data movement) happen first, the quantisers see
    the kernel in the layout of the product (``...IO``: the input features are
    the contraction axis, the output channels the last axis, as for
    ``nnx.Conv``), and ``conv_transpose`` runs with ``transpose_kernel=False``.
    So ``axis=-1`` is per output channel, and ``group_size`` runs along the input
    features, whichever way the layer stores its kernel.
    """
    import inspect

    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    lhs, rhs = arguments.pop("lhs"), arguments.pop("rhs")
    given = arguments["dimension_numbers"]
    if given is None:
        given = _CONV_TRANSPOSE_DEFAULT_DIMS.get(jnp.ndim(lhs))
    dims = jax.lax.conv_dimension_numbers(jnp.shape(lhs), jnp.shape(rhs), given)
    if arguments["transpose_kernel"]:
        rhs = jnp.swapaxes(jnp.flip(rhs, dims.rhs_spec[2:]), dims.rhs_spec[0], dims.rhs_spec[1])
        arguments["transpose_kernel"] = False
    axes = ((dims.lhs_spec[1],), (dims.rhs_spec[1],))
    return _product(frame, lhs, rhs, axes, lambda a, b: original(a, b, **arguments))


def _einsum_contraction(subscripts: str, ndim_a: int, ndim_b: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The axes of each operand that a two-operand einsum sums over (letters in both inputs, not in the output)."""
    spec = subscripts.replace(" ", "")
    inputs, _, output = spec.partition("->")
    a, _, b = inputs.partition(",")
    if not _:
        return (), ()
    if "->" not in spec:  # implicit output: the letters that appear once, sorted
        letters = (a + b).replace(".", "")
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))

    def positions(term: str, ndim: int) -> dict[str, int]:
        head, dots, tail = term.partition("...")
        if not dots:
            return {c: i for i, c in enumerate(term)}
        out = {c: i for i, c in enumerate(head)}
        out.update({c: ndim - len(tail) + i for i, c in enumerate(tail)})
        return out

    pa, pb = positions(a, ndim_a), positions(b, ndim_b)
    summed = [c for c in pa if c in pb and c not in output]
    return tuple(pa[c] for c in summed), tuple(pb[c] for c in summed)


@dataclasses.dataclass(frozen=True)
class _LayerProduct:
    """The product function of a quantised layer: quantises the operands, then calls the layer's own function."""

    op: str  # "dot_general", "einsum" or "conv"
    original: Callable[..., Any]

    def __call__(self, *args, **kwargs):
        frames = _FRAMES.get()
        if not frames or _IN_HOOK.get():
            return self.original(*args, **kwargs)
        frame = frames[-1]
        if self.op == "einsum":
            subscripts, lhs, rhs, rest = args[0], args[1], args[2], args[3:]
            axes = _einsum_contraction(subscripts, lhs.ndim, rhs.ndim)
            return _product(
                frame,
                lhs,
                rhs,
                axes,
                lambda a, b: self.original(subscripts, a, b, *rest, **kwargs),
                integer=functools.partial(_integer_einsum, subscripts),
            )
        lhs, rhs, rest = args[0], args[1], args[2:]
        if self.op == "dot_general":
            dims = rest[0] if rest else kwargs["dimension_numbers"]
            axes = (tuple(dims[0][0]), tuple(dims[0][1]))
            return _product(
                frame,
                lhs,
                rhs,
                axes,
                lambda a, b: self.original(a, b, *rest, **kwargs),
                integer=functools.partial(_integer_dot_general, dims),
            )
        else:
            spec = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, kwargs.get("dimension_numbers"))
            axes = ((spec.lhs_spec[1],), (spec.rhs_spec[1],))
        return _product(frame, lhs, rhs, axes, lambda a, b: self.original(a, b, *rest, **kwargs))


class _Record(NamedTuple):
    module: Any
    position: int  # among the module's products in one call
    kind: str
    operands: tuple[Any, ...]  # concrete example values
    axes: tuple[tuple[int, ...], ...]  # the contraction axes of each operand
    weight: tuple[bool, ...]  # which operands are parameters of the module


def _integer_dot_general(dims: Any, a: Any, b: Any, **options: Any) -> Any:
    from stejax.lowbit._products import integer_dot_general

    return integer_dot_general(a, b, dims, **options)


def _integer_einsum(subscripts: str, a: Any, b: Any, **options: Any) -> Any:
    from stejax.lowbit._products import integer_einsum

    return integer_einsum(subscripts, a, b, **options)


def _product(
    frame: _Frame,
    lhs: Any,
    rhs: Any,
    axes: tuple,
    call: Callable[[Any, Any], Any],
    integer: Callable[..., Any] | None = None,
) -> Any:
    index = frame.count
    frame.count += 1
    recorder = _RECORDER.get()
    if recorder is not None:
        layer = _weighted_layer(frame.module)
        own = {id(v.get_value()) for v in vars(frame.module).values() if isinstance(v, nnx.Param)}
        weight = (False, True) if layer else (id(lhs) in own, id(rhs) in own)
        recorder.append(_Record(frame.module, index, _kind_of(frame.module), (lhs, rhs), axes, weight))
        return call(lhs, rhs)
    site = _site_of(frame.module, index)
    if site is None:
        return call(lhs, rhs)
    token = _IN_HOOK.set(True)
    try:
        a, b = site.quantise(0, lhs), site.quantise(1, rhs)
        if site.product == "fake-quant" or _COLLECTOR.get() is not None:
            return call(a, b)
        if integer is None:
            raise ValueError(
                f"stejax.flax: the site {site.row.path!r} ({site.row.kind}) has product={site.product!r}: integer "
                "products cover products written with dot_general or einsum (nnx.Linear, nnx.LinearGeneral, "
                "nnx.Einsum, jnp.einsum, jax.lax.dot_general); this one is not. Give it product='fake-quant'."
            )
        stochastic = site.gradient_rounding == "stochastic"
        return integer(
            a,
            b,
            backward="int8" if site.product == "int8" else "float",
            rounding=site.gradient_rounding,
            key=cast(Any, site.quant_rngs)() if stochastic else None,
        )
    finally:
        _IN_HOOK.reset(token)


def _site_of(module: Any, index: int) -> _Site | None:
    sites = getattr(module, "stejax_quant", None)
    if sites is None:
        return None
    site = getattr(sites, f"p{index}", None)
    if site is None and index >= sites.n_products:
        raise ValueError(
            f"stejax.flax: {type(module).__name__} made more products in one call ({index + 1}) than when "
            f"quantize_model ran it on the example inputs ({sites.n_products}); sites are identified by their order."
        )
    return site


# ----------------------------------------------------------------------------- sites


class _Operand(NamedTuple):
    prefix: str  # the variables' prefix: input, weight, lhs, rhs
    role: str  # "weights" or "activations"
    quant: Quant | None
    axis: int | None  # the one contraction axis, or None when there are several


class _Site(nnx.Module):
    """One quantised product: its two operands' quantisers and their learned (or calibrated) arguments."""

    def __init__(
        self,
        row: SiteRow,
        operands: tuple[_Operand, ...],
        examples: tuple[Any, ...],
        rngs: Any,
        product: str = "fake-quant",
        gradient_rounding: str = "nearest",
    ):
        self.row = nnx.static(row)
        self.operands = nnx.static(operands)
        self.product = nnx.static(product)
        self.gradient_rounding = nnx.static(gradient_rounding)
        for op, example in zip(operands, examples, strict=True):
            if op.quant is None:
                continue
            kernel = example if op.role == "weights" else None
            data = None if op.role == "weights" or example is None else jnp.asarray(example)
            in_features = int(np.shape(example)[-1]) if example is not None and np.ndim(example) else 1
            learned = op.quant.learned(
                op.role,
                kernel=kernel,
                in_features=in_features,
                contraction_axis=op.axis if op.axis is not None else 0,
                data=data,
            )
            for arg, (trainable, value) in learned.items():
                setattr(self, f"{op.prefix}_{arg}", (nnx.Param if trainable else Calibration)(value))
        self.quant_rngs = rngs if rngs is not None else nnx.data(None)

    def learned(self, i: int) -> dict[str, jax.Array]:
        op = self.operands[i]
        assert op.quant is not None
        entry = op.quant.entry
        if entry is None or op.quant.scale_mode(op.role) == "dynamic":
            return {}
        return {a.name: getattr(self, f"{op.prefix}_{a.name}")[...] for a in entry.args}

    def quantise(self, i: int, x: Any) -> Any:
        op = self.operands[i]
        if op.quant is None:
            return x
        collector = _COLLECTOR.get()
        if collector is not None and op.role == "activations":
            collector.setdefault((id(self), i), (self, []))[1].append(x)
            return x
        key = cast(Any, self.quant_rngs)() if op.quant.random else None
        return op.quant.apply(x, self.learned(i), role=op.role, key=key, contraction_axis=op.axis)


class _Sites(nnx.Module):
    """The sites of one module, ``p0``, ``p1``... by the order of its products (float ones absent)."""

    def __init__(self, sites: dict[int, _Site], n_products: int):
        self.n_products = nnx.static(n_products)
        for i, site in sites.items():
            setattr(self, f"p{i}", site)


# ----------------------------------------------------------------------------- Embed


def _embed_call(self, inputs, out_sharding=None):
    with _running(self) as frame:
        site = _embed_site(self, frame)
        if site is None:
            return self._stejax_base.__call__(self, inputs, out_sharding)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (embedding,) = self.promote_dtype((self.embedding[...],), dtype=self.dtype, inexact=False)
        embedding = site.quantise(1, embedding)
        if self.num_embeddings == 1:
            return jnp.broadcast_to(embedding, (*inputs.shape, self.features))
        return jnp.take(embedding, inputs, axis=0)


def _embed_attend(self, query, out_sharding=None):
    with _running(self) as frame:
        site = _embed_site(self, frame, query)
        if site is None:
            return self._stejax_base.attend(self, query, out_sharding)
        query, embedding = self.promote_dtype((query, self.embedding[...]), dtype=self.dtype)
        query, embedding = site.quantise(0, query), site.quantise(1, embedding)
        return jnp.dot(query, embedding.T, out_sharding=out_sharding)


def _embed_site(module: Any, frame: _Frame, query: Any = None) -> _Site | None:
    recorder = _RECORDER.get()
    if recorder is not None:
        table = module.embedding[...]
        axes = ((query.ndim - 1,) if query is not None else (), (1,))
        recorder.append(_Record(module, 0, "embed", (query, table), axes, (False, True)))
        return None
    return _site_of(module, 0)


# ----------------------------------------------------------------------------- the quantised classes

_QUANTIZED_CLASSES: dict[type, type] = {}  # memo: one subclass per user class, made on first use


def _quantized_class(cls: type) -> type:
    if getattr(cls, "_stejax_base", None) is not None and cls in _QUANTIZED_CLASSES.values():
        return cls
    if cls not in _QUANTIZED_CLASSES:
        namespace: dict[str, Any] = {"_stejax_base": cls}
        if issubclass(cls, nnx.Embed):
            namespace["__call__"] = _embed_call
            namespace["attend"] = _embed_attend
        else:
            call = cls.__call__

            @functools.wraps(call)
            def __call__(self, *args, **kwargs):
                with _running(self):
                    return call(self, *args, **kwargs)

            namespace["__call__"] = __call__
        new = types.new_class(f"Quantized{cls.__name__}", (cls,), {}, lambda ns: ns.update(namespace))
        new.__module__ = cls.__module__
        new.__qualname__ = f"Quantized{cls.__qualname__}"
        _QUANTIZED_CLASSES[cls] = new
    return _QUANTIZED_CLASSES[cls]


def _install_hooks(module: Any) -> None:
    """Give a layer the product hook (its own product function inside) and the running marker."""
    if isinstance(module, (nnx.Linear, nnx.LinearGeneral)):
        if getattr(module, "dot_general_cls", None) is not None:
            return
        module.dot_general = _LayerProduct("dot_general", module.dot_general or jax.lax.dot_general)
    elif isinstance(module, nnx.Einsum):
        module.einsum_op = _LayerProduct("einsum", module.einsum_op)
    elif isinstance(module, nnx.Conv):
        module.conv_general_dilated = _LayerProduct("conv", module.conv_general_dilated)


# ----------------------------------------------------------------------------- quantize_model


def quantize_model(
    model: nnx.Module,
    rules: Sequence[Rule],
    *example_inputs: Any,
    strict: bool = True,
    rngs: nnx.Rngs | None = None,
    **example_kwargs: Any,
) -> nnx.Module:
    r"""A quantised copy of ``model`` (sharing its parameter arrays), quantised where ``rules`` say.

    Runs ``model(*example_inputs, **example_kwargs)`` once, eagerly, to find its
    sites: the products of ``nnx.Linear``, ``nnx.LinearGeneral``, ``nnx.Einsum``,
    ``nnx.Conv`` and ``nnx.ConvTranspose`` (its kernel as the product sees it,
    ``...IO``, so ``axis=-1`` is per output channel); ``nnx.Embed`` tables (lookups and ``attend``); the q·k and
    p·v products of ``nnx.MultiHeadAttention``; and products written in any
    module's own ``__call__`` with ``jnp.einsum``, ``jnp.matmul``, ``@``,
    ``jnp.dot`` or ``jax.lax.dot_general``. Each site takes the first rule that
    matches it. Parameter values are kept; each quantiser's learned arguments
    (LSQ steps, PACT clips) are ``nnx.Param`` s of the site, initialised from the
    weights and, for inputs, from the example inputs (static scales are
    :class:`stejax.flax.Calibration` variables; :func:`calibrate` sets them from
    more data). ``model`` itself is not changed.

    Args:
      model: any ``nnx.Module``.
      rules: an ordered sequence of :class:`Rule`.
      *example_inputs: positional arguments of one call of ``model``.
      strict: raise when a rule matches no site (default True).
      rngs: ``nnx.Rngs`` with a ``quant`` stream, needed only for random
        estimators (stochastic rounding).
      **example_kwargs: keyword arguments of that call.

    Returns:
      The quantised model: an instance of a subclass of ``type(model)`` with
      the same parameters and paths, plus each quantised module's
      ``stejax_quant`` sites; :func:`summary` lists its sites.

    Raises:
      ValueError: a rule that matches nothing (``strict``), a group size that
        does not divide a site's contraction axis, an example input the model
        refuses, a model already quantised; the message names the rule and the
        path.
      TypeError: a model that is not an ``nnx.Module``, a rule that is not a
        :class:`Rule`, or a random estimator without ``rngs`` with a ``quant``
        stream.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax import Quant, Rule, quantize_model, summary
      >>> model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
      >>> qmodel = quantize_model(model, [Rule(weights=Quant("lsq", bits=4))], jnp.ones((1, 4)))
      >>> [(row.path, row.kind, row.bits) for row in summary(qmodel)]
      [('layers/0', 'linear', 'w4a32'), ('layers/2', 'linear', 'w4a32')]
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"quantize_model: expected an nnx.Module; got {type(model).__name__}.")
    if isinstance(rules, (Rule, str)) or not isinstance(rules, Sequence):
        raise TypeError(f"quantize_model: rules must be a list of Rule; got {rules!r}.")
    for i, rule in enumerate(rules):
        if not isinstance(rule, Rule):
            raise TypeError(f"quantize_model: rules[{i}] must be a Rule; got {rule!r}.")
    rules = tuple(rules)
    if any(getattr(type(m), "_stejax_base", None) is not None for _, m in nnx.iter_modules(model)):
        raise ValueError("quantize_model: the model is already quantised (it came from quantize_model).")
    graphdef, state = nnx.split(model)
    qmodel = nnx.merge(graphdef, state)  # new module objects over the same arrays: the user's model stays float
    paths: dict[int, str] = {}
    modules = []
    for parts, module in nnx.iter_modules(qmodel):
        paths[id(module)] = "/".join(str(p) for p in parts)
        modules.append(module)
    for module in modules:
        _install_hooks(module)
        if "__call__" in {name for klass in type(module).__mro__[:-1] for name in vars(klass)}:
            object.__setattr__(module, "__class__", _quantized_class(type(module)))
    records: list[_Record] = []
    token = _RECORDER.set(records)
    try:
        qmodel(*example_inputs, **example_kwargs)
    except Exception as e:
        shapes = [getattr(x, "shape", type(x).__name__) for x in example_inputs]
        raise ValueError(
            f"quantize_model: the model failed on the example inputs (shapes {shapes}); give inputs of one call of "
            f"the model. The error: {type(e).__name__}: {e}"
        ) from e
    finally:
        _RECORDER.reset(token)

    seen: dict[tuple[int, int], _Record] = {}
    for r in records:
        first = seen.setdefault((id(r.module), r.position), r)
        if first.operands[0] is None and r.operands[0] is not None:  # an Embed looked up, then attended
            seen[(id(r.module), r.position)] = r
    by_module: dict[int, list[_Record]] = {}
    for r in seen.values():
        by_module.setdefault(id(r.module), []).append(r)
    rows: list[SiteRow] = []
    matched = [0] * len(rules)
    for module in modules:
        mine = sorted(by_module.get(id(module), []), key=lambda r: r.position)
        path = paths[id(module)]
        if not mine:
            if any(isinstance(v, nnx.Param) for v in vars(module).values()):
                rows.append(
                    SiteRow(path, "float", None, None, None, (), "float", "parameters, no product the rules can see")
                )
            continue
        sites: dict[int, _Site] = {}
        for r in mine:
            site_path = _site_path(path, r, len(mine))
            index = next((i for i, rule in enumerate(rules) if rule.matches(site_path, r.kind)), None)
            site_rule = rules[index] if index is not None else None
            if index is not None:
                matched[index] += 1
            operands = _operands(r, site_rule, rules_index=index, path=site_path)
            operand_shapes = tuple(tuple(np.shape(x)) for x in r.operands if x is not None)
            w = next((op.quant for op in operands if op.role == "weights"), None)
            a = next((op.quant for op in operands if op.role == "activations"), None)
            product = "fake-quant" if site_rule is None else site_rule.product
            integer = product != "fake-quant"
            if integer and r.kind in ("conv", "embed"):
                raise ValueError(
                    f"quantize_model: rule {index} ({cast(Rule, site_rule).path!r}) at {site_path!r}: "
                    f"product={product!r} covers products written with dot_general or einsum; a {r.kind} site "
                    "is not one. Restrict the rule's kinds (e.g. kinds=('linear',)) or use product='fake-quant'."
                )
            row = SiteRow(
                site_path,
                r.kind,
                index,
                repr(w) if w is not None else ("int8 per channel (product)" if integer else None),
                repr(a) if a is not None else ("int8 per token (product)" if integer else None),
                operand_shapes,
                f"w{_bits(w, integer)}a{_bits(a, integer)}",
                ("" if index is not None else "no rule matched")
                + {"int8": "int8 products forward and backward", "int8-forward": "int8 forward product"}.get(
                    product, ""
                ),
            )
            rows.append(row)
            if w is None and a is None and not integer:
                continue
            random = [op.quant.name for op in operands if op.quant is not None and op.quant.random]
            if site_rule is not None and site_rule.gradient_rounding == "stochastic":
                random.append("stochastic rounding of the cotangent")
            site_rngs = None
            if random:
                if rngs is None or "quant" not in rngs:
                    raise TypeError(
                        f"quantize_model: rule {index} ({cast(Rule, site_rule).path!r}) at {site_path!r}: "
                        f"{random[0]} draws random numbers; pass rngs=nnx.Rngs(quant=...) with a 'quant' stream."
                    )
                site_rngs = rngs["quant"].fork()
            sites[r.position] = _Site(
                row,
                operands,
                r.operands,
                site_rngs,
                product,
                "nearest" if site_rule is None else site_rule.gradient_rounding,
            )
        if sites:
            if hasattr(module, "stejax_quant"):
                raise ValueError(f"quantize_model: the module at {path!r} already has an attribute stejax_quant.")
            setattr(module, "stejax_quant", _Sites(sites, len(mine)))  # noqa: B010 - an attribute of any module
    unused = [i for i, n in enumerate(matched) if n == 0]
    if strict and unused:
        i = unused[0]
        some = ", ".join(repr(r.path) for r in rows[:6] if r.kind != "float")
        raise ValueError(
            f"quantize_model: rule {i} ({rules[i]!r}) matches no site; the sites are {some}"
            f"{', ...' if len(rows) > 6 else ''}. Fix its path or kinds, or pass strict=False."
        )
    setattr(qmodel, "stejax_summary", nnx.static(Summary(tuple(rows))))  # noqa: B010
    setattr(qmodel, "stejax_rules", nnx.static(rules))  # noqa: B010
    return qmodel


def _site_path(path: str, record: _Record, n_products: int) -> str:
    if record.kind in ("linear", "conv", "einsum", "embed"):
        return path
    if record.kind == "attention" and n_products == 2:
        name = ("scores", "values")[record.position]
    else:
        name = f"dot{record.position}"
    return f"{path}/{name}" if path else name


def _operands(record: _Record, rule: Rule | None, *, rules_index: int | None, path: str) -> tuple[_Operand, ...]:
    out = []
    where = f"quantize_model: rule {rules_index} ({rule.path!r}) at {path!r}" if rule is not None else ""
    for i, (example, axes, is_weight) in enumerate(zip(record.operands, record.axes, record.weight, strict=True)):
        role = "weights" if is_weight else "activations"
        if record.kind in ("linear", "conv", "einsum", "embed"):
            prefix = "weight" if is_weight else "input"
        else:
            prefix = ("lhs", "rhs")[i]
        quant = None if rule is None else (rule.weights if is_weight else rule.inputs)
        axis = axes[0] if len(axes) == 1 else None
        if quant is not None and example is not None:
            needs_axis = quant.group_size is not None or (quant.per_token and role == "activations")
            if needs_axis and axis is None:
                raise ValueError(
                    f"{where}: group_size and per_token need "
                    f"a product over one axis; operand {i} (shape {tuple(np.shape(example))}) is summed over axes "
                    f"{axes}."
                )
            if quant.group_size is not None and np.shape(example)[axis] % quant.group_size:
                raise ValueError(
                    f"{where}: group_size {quant.group_size} "
                    f"does not divide the contraction axis of operand {i} ({role}), of length "
                    f"{np.shape(example)[axis]} (shape {tuple(np.shape(example))})."
                )
            try:
                quant._check_role(role, example if role == "weights" else None, axis if axis is not None else 0)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        ndim = np.ndim(example)
        out.append(_Operand(prefix, role, quant, None if axis is None or not ndim else int(axis) % ndim - ndim))
    return tuple(out)


def _bits(quant: Quant | None, integer: bool = False) -> str:
    if quant is None:
        return "8" if integer else "32"
    bits = quant.params.get("bits")
    if bits is not None:
        return str(bits)
    if quant.name in ("sign_ste", "approx_sign", "swish_sign", "magnitude_aware_sign", "heaviside"):
        return "1"
    if quant.name in ("ternary", "absmean_ternary"):
        return "1.58"
    return "?"


# ----------------------------------------------------------------------------- calibration


def calibrate(model: nnx.Module, batches: Iterable[Any], method: str = "absmax") -> dict[str, int]:
    r"""Set the static input scales of a quantised model from data, for PTQ (or before QAT from float).

    Runs each batch through ``model`` eagerly with its input quantisers off
    (weights quantised), gathers every quantised site's inputs over all
    batches, then sets, per site and operand:

    * fake_quant with a static scale: the scale by ``method`` on the gathered
      inputs (``"absmax"``, ``"percentile"`` (99.99th) or ``"mse"``, see
      :mod:`stejax.estimators.calibration`), per tensor or per feature as the
      Quant says;
    * LSQ and LSQ+ steps: :math:`2\langle|x|\rangle/\sqrt{Q_P}` (Esser et al.);
    * PACT clips: :math:`\alpha = q_{\max} s`, with :math:`s` the scale by
      ``method`` on the unsigned grid.

    Dynamic scales need nothing. All of one site's inputs are held in memory
    until the end.

    Args:
      model: a model returned by :func:`quantize_model`.
      batches: an iterable of batches; each is the model's positional argument,
        or a tuple of them.
      method: ``"absmax"`` (default), ``"percentile"`` or ``"mse"``.

    Returns:
      ``{site path: number of variables set}``.

    Raises:
      ValueError: an unknown method, or no batch.
      TypeError: a model that did not come from :func:`quantize_model`.
    """
    summary(model)
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"calibrate: method must be one of {list(CALIBRATION_METHODS)}; got {method!r}.")
    collected: dict = {}
    token = _COLLECTOR.set(collected)
    n = 0
    try:
        for batch in batches:
            model(*(batch if isinstance(batch, tuple) else (batch,)))
            n += 1
    finally:
        _COLLECTOR.reset(token)
    if n == 0:
        raise ValueError("calibrate: batches gave no batch.")
    out: dict[str, int] = {}
    for (_, i), (site, values) in collected.items():
        op = site.operands[i]
        quant = op.quant
        assert quant is not None  # only quantised operands are collected
        entry = quant.entry
        if entry is None or quant.scale_mode(op.role) == "dynamic":
            continue
        axis = quant.params.get("axis")
        data = jnp.concatenate([jnp.reshape(v, (-1, v.shape[-1])) for v in values]).astype(jnp.float32)
        params = quant.params
        set_ = 0
        for a in entry.args:
            var = getattr(site, f"{op.prefix}_{a.name}")
            shape = var[...].shape
            if a.name == "scale":
                calib = Quant(quant.name, calibration=method, **params)
                value = calibrated_scale(data, calib, axis=None if axis is None else -1)
            elif a.name == "step":
                from stejax.estimators.uniform import lsq_levels

                _, qp = lsq_levels(params["bits"], params["signed"])
                mean = jnp.mean(jnp.abs(data), axis=None if axis is None else 0)
                value = mean * np.float32(2.0 / np.sqrt(qp))
            elif a.name == "alpha":
                unsigned = Quant("fake_quant", bits=params["bits"], signed=False, calibration=method)
                value = calibrated_scale(data, unsigned, axis=None) * np.float32(2 ** params["bits"] - 1)
            else:
                continue
            var[...] = jnp.reshape(value, shape).astype(var[...].dtype)
            set_ += 1
        out[site.row.path] = out.get(site.row.path, 0) + set_
    return out
