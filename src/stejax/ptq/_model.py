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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np

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
    :math:`H = \tfrac2n X^\top X` is accumulated and the kernel is rounded by
    :func:`stejax.ptq.gptq` (``method="gptq"``) or by round-to-nearest
    (``"rtn"``, the baseline) onto the weight quantiser's grid; the kernel
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
    :func:`stejax.ptq.rotate_kernel`), not here.

    ``model`` is not changed. Needs the optional extra ``stejax[flax]``.

    Args:
      model: any ``nnx.Module`` with float32 linear kernels.
      rules: an ordered sequence of :class:`stejax.flax.Rule`.
      batches: the calibration batches (iterated once per rounded layer, plus
        twice); each is the model's positional argument, or a tuple of them.
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
    for row in summary(qmodel):
        weights = None if row.rule is None else rules[row.rule].weights
        if row.kind != "linear" or weights is None:
            continue
        where = f"quantize_ptq: rule {row.rule} ({rules[cast(int, row.rule)].path!r}) at {row.path!r}"
        group = _grid_of(weights, where)
        bits = weights.params["bits"]
        module = modules[row.path]
        kernel = module.kernel[...]
        if kernel.ndim != 2 or kernel.dtype != jnp.float32:
            raise ValueError(f"{where}: PTQ rounds float32 (in, out) kernels; got {kernel.dtype} {kernel.shape}.")
        if bits > 8:
            raise ValueError(f"{where}: PTQ rounds to at most 8 bits; got bits={bits}.")
        if method == "gptq":
            h = _layer_hessian(qmodel, module, batches, where)
            out = gptq(
                kernel,
                hessian_matrix=h,
                bits=bits,
                group=group,
                act_order=act_order,
                damp=damp,
                block_size=block_size,
                name=row.path,
            )
        else:
            out = round_to_nearest(kernel, bits=bits, group=group)
        module.kernel[...] = out.kernel
        scale = module.stejax_quant.p0.weight_scale
        scale[...] = (out.scales[0] if group is None else out.scales.T).astype(scale[...].dtype)
    calibrate(qmodel, batches, method=input_calibration)
    return qmodel


class _Gram:
    """The running sum of x^T x over a layer's inputs, and their count."""

    def __init__(self, n_in: int):
        self.total = jnp.zeros((n_in, n_in), jnp.float32)
        self.count = 0

    def add(self, x: jax.Array) -> None:
        x = jnp.reshape(x, (-1, x.shape[-1])).astype(jnp.float32)
        self.total = self.total + jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST)
        self.count += x.shape[0]


def _layer_hessian(qmodel: nnx.Module, module: Any, batches: list[tuple], where: str) -> jax.Array:
    r""":math:`\tfrac2n X^\top X` over the inputs ``module`` receives when ``qmodel`` runs on ``batches``."""
    gram = _Gram(module.kernel[...].shape[0])
    product = module.dot_general

    def recording(lhs: jax.Array, rhs: jax.Array, dims: Any, *args: Any, **kwargs: Any) -> jax.Array:
        if tuple(dims[0][0]) != (lhs.ndim - 1,) or tuple(dims[0][1]) != (0,):
            raise ValueError(f"{where}: PTQ rounds products over the input's last axis; got dimensions {dims}.")
        gram.add(lhs)
        return product(lhs, rhs, dims, *args, **kwargs)

    module.dot_general = _Recording(recording)
    try:
        for batch in batches:
            qmodel(*batch)
    finally:
        module.dot_general = product
    if gram.count == 0:
        raise ValueError(f"{where}: the layer was not called on the calibration batches.")
    return gram.total * np.float32(2.0 / gram.count)


class _Recording:
    """A product function that records its inputs (an object, so that nnx keeps it as a static attribute)."""

    def __init__(self, fn: Callable[..., jax.Array]):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        return self.fn(*args, **kwargs)
