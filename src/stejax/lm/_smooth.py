r"""AWQ and SmoothQuant on the language model: channel scales folded into the RMSNorm before each linear.

Both methods divide input channel :math:`j` of a linear layer by :math:`s_j`
and multiply row :math:`j` of its kernel by it, which leaves the product
unchanged: :math:`(x\,\mathrm{diag}(s)^{-1})(\mathrm{diag}(s) W) = xW`. In the
transformer every quantised linear reads the output of an RMSNorm (with
``norms="subln"``; with ``"llama"`` only q, k, v and gate, up do), so
:math:`1/s` folds into that norm's scale and the smoothed model is an ordinary
float :class:`stejax.lm.Transformer`: its quantisation by rules
(:func:`stejax.ptq.quantize_ptq`), export, GGUF and decoding take it
unchanged. Linears that read one norm (q, k, v; gate, up) share one :math:`s`,
chosen on their kernels side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from stejax.lm._lowbit import _set_module, module_at

if TYPE_CHECKING:
    from flax import nnx

__all__ = ["SMOOTHING", "SmoothGroup", "smooth_lm", "smoothing_groups"]

SMOOTHING = ("awq", "smoothquant")


class SmoothGroup(NamedTuple):
    """One RMSNorm and the linears that read its output, as paths from the model (``"blocks/0/attn/q"``)."""

    norm: str
    linears: tuple[str, ...]


def smoothing_groups(model: nnx.Module) -> list[SmoothGroup]:
    """The norm and linear groups of a :class:`stejax.lm.Transformer`: every block's attention and MLP inputs, and
    with ``norms="subln"`` the inputs of its output and down projections.

    Example:
      >>> from flax import nnx
      >>> from stejax.lm import LMConfig, Transformer
      >>> model = Transformer(LMConfig(context=8, width=32, depth=1, heads=2, hidden=64), rngs=nnx.Rngs(0))
      >>> [g.linears for g in smoothing_groups(model)]  # doctest: +NORMALIZE_WHITESPACE
      [('blocks/0/attn/q', 'blocks/0/attn/k', 'blocks/0/attn/v'), ('blocks/0/attn/o',),
       ('blocks/0/mlp/gate', 'blocks/0/mlp/up'), ('blocks/0/mlp/down',)]
    """
    config = model.config  # type: ignore[attr-defined]
    subln = config.norms == "subln"
    up = ("gate", "up") if config.mlp == "swiglu" else ("up",)
    groups = []
    for i in range(config.depth):
        b = f"blocks/{i}"
        groups.append(SmoothGroup(f"{b}/attn_norm", tuple(f"{b}/attn/{n}" for n in ("q", "k", "v"))))
        if subln:
            groups.append(SmoothGroup(f"{b}/attn/o_norm", (f"{b}/attn/o",)))
        groups.append(SmoothGroup(f"{b}/mlp_norm", tuple(f"{b}/mlp/{n}" for n in up)))
        if subln:
            groups.append(SmoothGroup(f"{b}/mlp/down_norm", (f"{b}/mlp/down",)))
    return groups


def _norm_outputs(model: nnx.Module, windows: jax.Array, groups: Sequence[SmoothGroup]) -> dict[str, jax.Array]:
    """Each group's norm output ``(rows, features)`` over ``windows``, from one forward of the float model."""
    from flax import nnx

    seen: dict[str, list[jax.Array]] = {g.norm: [] for g in groups}

    class Recording(nnx.Module):
        def __init__(self, norm: nnx.Module, name: str):
            self.norm, self.name = norm, name

        def __call__(self, x: jax.Array) -> jax.Array:
            y = self.norm(x)
            seen[self.name].append(y.reshape(-1, y.shape[-1]).astype(jnp.float32))
            return y

    originals = {g.norm: module_at(model, g.norm) for g in groups}
    try:
        for name, norm in originals.items():
            _set_module(model, name, Recording(norm, name))
        model(windows)
    finally:
        for name, norm in originals.items():
            _set_module(model, name, norm)
    return {name: jnp.concatenate(rows) for name, rows in seen.items()}


def smooth_lm(
    model: nnx.Module,
    windows: Any,
    *,
    method: str,
    bits: int | None = None,
    group_size: int | None = None,
    alpha: float = 0.5,
    n_grid: int = 20,
) -> tuple[nnx.Module, dict[str, float]]:
    r"""A copy of a float LM with AWQ's or SmoothQuant's channel scales folded into its norms and kernels.

    For each group of :func:`smoothing_groups`, the norm's outputs over the
    calibration ``windows`` are the linears' inputs :math:`X`, and their
    kernels side by side are :math:`W`:

    - ``"awq"``: :func:`stejax.ptq.awq` on :math:`(W, X)` with ``bits`` and
      ``group_size`` (the grid the weights will be rounded to): the exponent on
      ``linspace(0, 1, n_grid)`` with the smallest output error after
      round-to-nearest, and its scales.
    - ``"smoothquant"``: :func:`stejax.ptq.smooth` with ``alpha`` (for 8-bit inputs).

    The copy's kernels are :math:`\mathrm{diag}(s) W` and each norm's scale is
    divided by :math:`s`, in float32; its logits equal the original's up to
    float32 rounding. The original is not changed. The copy is still float:
    round it with :func:`stejax.ptq.quantize_ptq` (``"rtn"`` gives AWQ as
    published; ``"gptq"`` rounds the scaled kernels by GPTQ).

    Args:
      model: a float :class:`stejax.lm.Transformer` (not quantised by rules).
      windows: calibration byte windows ``(batch, time)``, e.g. from the training split.
      method: ``"awq"`` or ``"smoothquant"``.
      bits: AWQ's code width in [2, 8]; required for ``"awq"``.
      group_size: AWQ's grid: one scale per this many input features, or None per output channel.
      alpha: SmoothQuant's migration strength.
      n_grid: AWQ's number of exponents.

    Returns:
      The smoothed copy and, per group's norm path, the exponent AWQ chose (SmoothQuant: ``alpha``).

    Raises:
      ValueError: an unknown method, AWQ without ``bits``, or a kernel that is not a float matrix (a model already
        quantised by rules or loaded in low bits).
    """
    from flax import nnx

    from stejax.ptq import awq, smooth

    if method not in SMOOTHING:
        raise ValueError(f"smooth_lm: method must be one of {SMOOTHING}; got {method!r}.")
    if method == "awq" and bits is None:
        raise ValueError("smooth_lm: AWQ searches its scales for a grid; give bits (and group_size).")
    out = nnx.clone(model)
    groups = smoothing_groups(out)
    for group in groups:
        for path in group.linears:
            layer = module_at(out, path)
            if type(layer) is not nnx.Linear:
                raise ValueError(
                    f"smooth_lm: {path} is a {type(layer).__name__}; expected the float model's nnx.Linear "
                    "(smooth before quantising)."
                )
    inputs = _norm_outputs(out, jnp.asarray(windows), groups)
    chosen: dict[str, float] = {}
    for group in groups:
        kernels = [module_at(out, p).kernel[...].astype(jnp.float32) for p in group.linears]
        w = jnp.concatenate(kernels, axis=1)
        x = inputs.pop(group.norm)
        if method == "awq":
            result = awq(w, x, bits=int(bits), group=group_size, n_grid=n_grid, name=group.norm)  # type: ignore[arg-type]
            s, chosen[group.norm] = result.input_scales, float(result.alpha)
        else:
            s, chosen[group.norm] = smooth(w, x, alpha=alpha).scales, float(alpha)
        for path, kernel in zip(group.linears, kernels, strict=True):
            layer = module_at(out, path)
            layer.kernel[...] = (kernel * s[:, None]).astype(layer.kernel[...].dtype)
        norm = module_at(out, group.norm)
        norm.scale[...] = (norm.scale[...].astype(jnp.float32) / s).astype(norm.scale[...].dtype)
    return out, chosen
