r"""PTQ of any Flax NNX model by the rules of :func:`stejax.flax.quantize_model`: GPTQ per linear layer.

The rules decide, as for QAT, which sites are quantised and how;
:func:`quantize_ptq` finds them with :func:`stejax.flax.quantize_model` itself
(so the matching is the same), then, for every matched ``nnx.Linear`` (or
``nnx.LinearGeneral`` with a matrix kernel) whose rule quantises its weights,
gathers the layer's inputs over the calibration batches and rounds its kernel
with GPTQ. The inputs of each layer are gathered through the quantised model as
it stands when the layer's turn comes, with the layers listed before it by
:func:`stejax.flax.summary` already rounded: for a model whose modules are
listed in the order they run (``nnx.Sequential``, attributes assigned in call
order), the reference implementation's sequential order.

The inputs are gathered by a compiled forward pass (``jax.jit``, compiled once
per batch shape), and one pass serves a run of consecutive layers whose inputs
do not depend on one another's variables (in the language model: a block's k;
its o, q and v; its down, gate and up), so a pass per layer is not needed. The
Hessians are those of a pass per layer; they differ from an eager (uncompiled)
run of the model only by float rounding, as any compiled program may.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from stejax.ptq._gptq import gptq, round_to_nearest

if TYPE_CHECKING:
    from flax import nnx

    from stejax.flax import Quant, Rule

__all__ = ["METHODS", "quantize_ptq"]

METHODS = ("gptq", "rtn")
INPUT_CALIBRATIONS = ("absmax", "percentile", "mse")  # as stejax.flax.calibrate


def _grid_of(quant: Quant | None, where: str) -> int | None:
    """The group size of a weight quantiser PTQ can fill (None: per output channel); raises for any other."""
    if quant is None or quant.name != "fake_quant" or quant.scale_mode("weights") != "static":
        raise ValueError(
            f"{where}: PTQ sets the scales of a static fake_quant weight quantiser, e.g. "
            f"Quant('fake_quant', bits=4, axis=-1, scale='static'); got {quant!r}. A dynamic scale is recomputed from "
            "the weights on every call and would move the grid the rounding chose; other estimators have no scale "
            "to set."
        )
    params = quant.params
    if not params["signed"] or quant.init:
        raise ValueError(f"{where}: PTQ fills a signed grid with scales of its own; got {quant!r}.")
    if quant.group_size is None and params["axis"] not in (-1, 1):
        raise ValueError(
            f"{where}: PTQ needs a scale per output channel (axis=-1) or per group (group_size=...); got {quant!r}."
        )
    return quant.group_size


def quantize_ptq(
    model: nnx.Module,
    rules: Sequence[Rule],
    batches: Iterable[Any],
    *,
    method: str = "gptq",
    damp: float = 0.01,
    act_order: bool = False,
    block_size: int | None = 128,
    input_calibration: str = "absmax",
    strict: bool = True,
) -> nnx.Module:
    r"""A post-training quantised model: :func:`stejax.flax.quantize_model` with GPTQ-rounded linear kernels.

    The model is quantised by ``rules`` exactly as
    :func:`stejax.flax.quantize_model` quantises it (the first batch is the
    example input). Then, one matched linear layer at a time (in the order of
    :func:`stejax.flax.summary`), the layer's inputs are gathered over all
    ``batches`` (as the layer receives them, before its input quantiser),
    :math:`H = \tfrac2n X^\top X` is accumulated (float32, the product at
    ``Precision.HIGHEST``, summed over batches and calls in order) and the
    kernel is rounded by :func:`stejax.ptq.gptq` (``method="gptq"``) onto the
    weight quantiser's grid; ``"rtn"`` (round-to-nearest, the baseline) needs
    no inputs and runs no pass. The inputs come from a compiled pass that
    serves every layer of a run whose inputs do not depend on one another's
    variables (module docstring); the kernel
    becomes ``codes * scales`` and the quantiser's ``weight_scale`` the
    scales, so the quantised forward uses exactly the PTQ kernel. Last, the
    static input quantisers are calibrated on the same batches
    (:func:`stejax.flax.calibrate`).

    The sites PTQ rounds are ``linear`` sites with a matrix kernel ``(in, out)``
    whose rule's ``weights`` is a static, signed ``fake_quant`` with a scale per
    output channel (``axis=-1``) or per group (``group_size``), e.g.
    ``Quant("fake_quant", bits=4, axis=-1, scale="static")``. A static scale
    keeps the grid PTQ chose; QAT can continue from the returned model (the
    kernels train on that grid; the scales are :class:`stejax.flax.Calibration`
    variables, left alone by ``nnx.Optimizer(..., wrt=nnx.Param)``). Other
    matched sites are quantised as their rules say, by round-to-nearest.
    AWQ, SmoothQuant and rotations change a layer's inputs too, so they are
    applied per layer (:func:`stejax.ptq.awq`, :func:`stejax.ptq.smooth`,
    :func:`stejax.ptq.rotate_kernel`), not here; on the language model,
    :func:`stejax.lm.smooth_lm` folds AWQ's or SmoothQuant's scales into its
    norms, and the float model it returns is then rounded here.

    ``model`` is not changed. Needs the optional extra ``stejax[flax]``.

    Args:
      model: any ``nnx.Module`` with float32 linear kernels.
      rules: an ordered sequence of :class:`stejax.flax.Rule`.
      batches: the calibration batches (a list; run once per run of layers
        gathered together, plus twice); each is the model's positional
        argument, or a tuple of them.
      method: ``"gptq"`` (default) or ``"rtn"``.
      damp: GPTQ's dampening, a fraction of the mean diagonal of :math:`H`.
      act_order: GPTQ in decreasing :math:`\operatorname{diag} H`.
      block_size: GPTQ's lazy block size.
      input_calibration: the method for static input scales: ``"absmax"``,
        ``"percentile"`` or ``"mse"``.
      strict: passed to :func:`stejax.flax.quantize_model` (a rule that matches
        nothing raises).

    Returns:
      The quantised model, as :func:`stejax.flax.quantize_model` returns it.

    Raises:
      TypeError: a model that is not an ``nnx.Module`` (and as
        :func:`stejax.flax.quantize_model` raises).
      ValueError: an unknown method or input calibration, no batch, a rule whose weight quantiser
        PTQ cannot fill (the message names the rule, the site and what is
        needed), a kernel that is not float32, or a Hessian GPTQ cannot invert
        (the message names the site).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.flax import Quant, Rule
      >>> mlp = nnx.Sequential(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(16, 4, rngs=nnx.Rngs(1)))
      >>> rules = [Rule(weights=Quant("fake_quant", bits=4, axis=-1, scale="static"))]
      >>> batches = [jax.random.normal(jax.random.key(i), (32, 8)) for i in range(4)]
      >>> qmodel = quantize_ptq(mlp, rules, batches)
      >>> scale = qmodel.layers[0].stejax_quant.p0.weight_scale[...]
      >>> codes = qmodel.layers[0].kernel[...] * (1 / scale[None, :])
      >>> bool(jnp.allclose(codes, jnp.round(codes), atol=1e-5) & jnp.all(jnp.abs(codes) < 7.5))  # on the grid
      True
    """
    from flax import nnx  # the flax extra, needed here only

    from stejax.flax import calibrate, quantize_model, summary

    if method not in METHODS:
        raise ValueError(f"quantize_ptq: method must be one of {list(METHODS)}; got {method!r}.")
    if input_calibration not in INPUT_CALIBRATIONS:
        raise ValueError(
            f"quantize_ptq: input_calibration must be one of {list(INPUT_CALIBRATIONS)}; got {input_calibration!r}."
        )
    batches = [b if isinstance(b, tuple) else (b,) for b in batches]
    if not batches:
        raise ValueError("quantize_ptq: batches gave no batch.")
    if not isinstance(model, nnx.Module):
        raise TypeError(f"quantize_ptq: expected an nnx.Module; got {type(model).__name__}.")
    # Variables of their own: quantize_model's model shares the one it is given, and PTQ writes kernels.
    graphdef, state = nnx.split(model)
    own = nnx.merge(graphdef, jax.tree.map(lambda a: jnp.array(a, copy=True), state))
    qmodel = quantize_model(own, rules, *batches[0], strict=strict)
    modules: dict[str, Any] = {"/".join(str(p) for p in path): m for path, m in nnx.iter_modules(qmodel)}
    rules = tuple(rules)
    layers: list[tuple[str, str, int | None, int]] = []  # (path, where, group, bits) of each layer PTQ rounds
    for row in summary(qmodel):
        weights = None if row.rule is None else rules[row.rule].weights
        if row.kind != "linear" or weights is None:
            continue
        where = f"quantize_ptq: rule {row.rule} ({rules[cast(int, row.rule)].path!r}) at {row.path!r}"
        group = _grid_of(weights, where)
        bits = weights.params["bits"]
        kernel = modules[row.path].kernel[...]
        if kernel.ndim != 2 or kernel.dtype != jnp.float32:
            raise ValueError(f"{where}: PTQ rounds float32 (in, out) kernels; got {kernel.dtype} {kernel.shape}.")
        if bits > 8:
            raise ValueError(f"{where}: PTQ rounds to at most 8 bits; got bits={bits}.")
        layers.append((row.path, where, group, bits))

    def rounded(path: str, out: Any, group: int | None) -> None:
        module = modules[path]
        module.kernel[...] = out.kernel
        scale = module.stejax_quant.p0.weight_scale
        scale[...] = (out.scales[0] if group is None else out.scales.T).astype(scale[...].dtype)

    if method == "gptq":
        gatherer = _Gatherer(qmodel, [(path, where) for path, where, _, _ in layers], batches)
        for wave in gatherer.waves():
            hessians = gatherer.hessians(wave)
            for i in wave:
                path, _, group, bits = layers[i]
                out = gptq(
                    modules[path].kernel[...],
                    hessian_matrix=hessians[i],
                    bits=bits,
                    group=group,
                    act_order=act_order,
                    damp=damp,
                    block_size=block_size,
                    name=path,
                )
                rounded(path, out, group)
    else:
        for path, _, group, bits in layers:
            rounded(path, round_to_nearest(modules[path].kernel[...], bits=bits, group=group), group)
    calibrate(qmodel, batches, method=input_calibration)
    return qmodel


class _Gatherer:
    r"""The inputs of a model's linear layers, gathered by one compiled forward pass per batch.

    The model runs under ``jax.jit`` with its state as an argument, so the
    program is compiled once per batch shape and rerun after kernels change.
    The pass records every listed layer's product input (before its input
    quantiser); :meth:`hessians` turns the inputs of the layers asked for into
    :math:`\tfrac2n X^\top X`, the others are skipped at run time (``lax.cond``).
    """

    def __init__(self, qmodel: Any, layers: Sequence[tuple[str, str]], batches: list[tuple]):
        from flax import nnx

        self.qmodel, self.batches = qmodel, batches
        self.paths = [path for path, _ in layers]
        self.wheres = dict(layers)
        graphdef, state = nnx.split(qmodel)
        treedef = jax.tree.structure(state)
        index = {path: i for i, path in enumerate(self.paths)}

        def record(leaves: list[jax.Array], batch: tuple) -> list[list[jax.Array]]:
            # Each listed layer's inputs as rows (n, in), one entry per call, in call order.
            model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
            inputs: list[list[jax.Array]] = [[] for _ in self.paths]
            for path, node in nnx.iter_modules(model):
                module = cast(Any, node)  # a linear layer: its product is the attribute dot_general
                i = index.get("/".join(str(p) for p in path))
                if i is not None:
                    recording = _recorder(module.dot_general, inputs[i], self.wheres[self.paths[i]])
                    module.dot_general = _Recording(recording)
            model(*batch)
            return inputs

        def grams(leaves: list[jax.Array], batch: tuple, take: jax.Array) -> list[list[jax.Array]]:
            def skipped(x: jax.Array) -> jax.Array:
                return jnp.zeros((x.shape[1], x.shape[1]), x.dtype)

            return [
                [jax.lax.cond(take[i], _gram, skipped, x) for x in xs] for i, xs in enumerate(record(leaves, batch))
            ]

        self.grams = jax.jit(grams)
        # Each batch's program (read for the dependence of inputs on variables) and its recorded input shapes,
        # traced once per batch signature.
        leaves = self._leaves()
        programs: dict[Any, Any] = {}
        self.traced = []
        for batch in batches:
            key = (
                jax.tree.structure(batch),
                tuple((np.shape(a), getattr(a, "dtype", type(a))) for a in jax.tree.leaves(batch)),
            )
            if key not in programs:
                programs[key] = jax.make_jaxpr(record, return_shape=True)(leaves, batch)
            self.traced.append(programs[key])
        self.names = ["/".join(str(p) for p in path) for path, _ in nnx.to_flat_state(state)]

    def _leaves(self) -> list[jax.Array]:
        from flax import nnx

        return jax.tree.leaves(nnx.state(self.qmodel))

    def waves(self) -> Iterator[list[int]]:
        """Runs of consecutive layers (in the listed order) whose inputs do not depend on one another's variables.

        Within a run, every layer's inputs are the same whether the layers
        before it in the run are rounded or not, so one pass gathers them all,
        as a pass per layer would after rounding each layer in turn. The
        dependence is read from the traced program: an input depends on a
        variable when the variable reaches it through the program's equations
        (a nested call counts as depending on all of its arguments).
        """
        owned = [
            [i for i, name in enumerate(self.names) if name == path or name.startswith(path + "/")]
            for path in self.paths
        ]
        depends = [0] * len(self.paths)
        for closed, shapes in self.traced:
            masks = iter(_dependence(closed.jaxpr, len(self.names)))
            for i, calls in enumerate(shapes):
                for _ in calls:
                    depends[i] |= next(masks)
        start = 0
        while start < len(self.paths):
            variables, stop = 0, start
            while stop < len(self.paths) and not depends[stop] & variables:
                for leaf in owned[stop]:
                    variables |= 1 << leaf
                stop += 1
            yield list(range(start, stop))
            start = stop

    def hessians(self, wave: Sequence[int]) -> dict[int, jax.Array]:
        r""":math:`\tfrac2n X^\top X` of each layer of ``wave`` over all batches, through the model as it stands."""
        take = np.zeros(len(self.paths), bool)
        take[list(wave)] = True
        totals: dict[int, jax.Array] = {}
        counts = dict.fromkeys(wave, 0)
        for batch, (_, shapes) in zip(self.batches, self.traced, strict=True):
            grams = self.grams(self._leaves(), batch, jnp.asarray(take))
            for i in wave:
                for gram, x in zip(grams[i], shapes[i], strict=True):
                    # A running sum in call order, started from zeros, as the inputs arrive.
                    n_in = x.shape[1]
                    totals[i] = totals.get(i, jnp.zeros((n_in, n_in), jnp.float32)) + gram
                    counts[i] += x.shape[0]
        out = {}
        for i in wave:
            if counts[i] == 0:
                raise ValueError(f"{self.wheres[self.paths[i]]}: the layer was not called on the calibration batches.")
            out[i] = totals[i] * np.float32(2.0 / counts[i])
        return out


def _gram(x: jax.Array) -> jax.Array:
    return jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST)


def _recorder(product: Callable[..., jax.Array], inputs: list[jax.Array], where: str) -> Callable[..., jax.Array]:
    def recording(lhs: jax.Array, rhs: jax.Array, dims: Any, *args: Any, **kwargs: Any) -> jax.Array:
        if tuple(dims[0][0]) != (lhs.ndim - 1,) or tuple(dims[0][1]) != (0,):
            raise ValueError(f"{where}: PTQ rounds products over the input's last axis; got dimensions {dims}.")
        inputs.append(jnp.reshape(lhs, (-1, lhs.shape[-1])).astype(jnp.float32))
        return product(lhs, rhs, dims, *args, **kwargs)

    return recording


def _dependence(jaxpr: Any, n_leaves: int) -> list[int]:
    """For each output of ``jaxpr`` (flattened), the bit mask of the first ``n_leaves`` inputs it depends on."""
    masks: dict[Any, int] = {v: 1 << i for i, v in enumerate(jaxpr.invars[:n_leaves])}

    def of(v: Any) -> int:
        return 0 if isinstance(v, Literal) else masks.get(v, 0)

    for eqn in jaxpr.eqns:
        mask = 0
        for v in eqn.invars:
            mask |= of(v)
        for v in eqn.outvars:
            masks[v] = mask
    return [of(v) for v in jaxpr.outvars]


class _Recording:
    """A product function that records its inputs (an object, so that nnx keeps it as a static attribute)."""

    def __init__(self, fn: Callable[..., jax.Array]):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        return self.fn(*args, **kwargs)
