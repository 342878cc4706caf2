"""The compared configurations, as rules over the model's linear layers.

Policy (every configuration): the linear layers inside the blocks (q, k, v, o,
gate, up, down) are quantised, weights and inputs; the embedding, the RMSNorms,
the output head, the attention products (q.k, p.v) and the softmax stay in
float32. With ``LMConfig(norms="subln")`` every linear input is preceded by an
RMSNorm (BitNet b1.58's "RMSNorm before each quantised input"); with
``norms="llama"`` the attention output and the down projection take their inputs
unnormalised, as llama does (the model's layout, :mod:`stejax.lm._model`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from stejax.lm._quantisers import activation_quantiser, weight_quantiser

__all__ = ["CONFIGS", "SITES", "LMQuant", "quantised_paths", "quantize_lm", "rules_for"]

# The linear layers that are quantised: every nnx.Linear under blocks/ (never the head).
SITES = r"blocks/\d+/(attn/(q|k|v|o)|mlp/(gate|up|down))"


@dataclasses.dataclass(frozen=True)
class LMQuant:
    """One configuration: how block linears quantise weights and inputs (None: float).

    Attributes:
      name: the configuration's name.
      weight_bits: 8, 4, 2, 1.58 or None.
      input_bits: 8, 4 or None.
      group: weights per group along the contraction axis (None: per output channel;
        per tensor for 1.58).
      ste: whether rounding has a straight-through gradient.
      description: in words, for the report.
    """

    name: str
    weight_bits: float | None
    input_bits: int | None
    group: int | None
    ste: bool
    description: str

    def quantisers(self) -> tuple[Callable[[jax.Array], jax.Array] | None, Callable[[jax.Array], jax.Array] | None]:
        """(weight quantiser, input quantiser), each None for float."""
        w = None if self.weight_bits is None else weight_quantiser(self.weight_bits, group=self.group, ste=self.ste)
        a = None if self.input_bits is None else activation_quantiser(self.input_bits, ste=self.ste)
        return w, a

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


CONFIGS: dict[str, LMQuant] = {
    c.name: c
    for c in (
        LMQuant("float", None, None, None, True, "float32 throughout"),
        LMQuant("w8a8", 8, 8, None, True, "int8 per-channel weights, int8 per-token dynamic activations"),
        LMQuant("w4a8", 4, 8, 32, True, "int4 weights per group of 32 (contraction axis), int8 per-token activations"),
        LMQuant("w4a4", 4, 4, 32, True, "int4 weights per group of 32, int4 per-token activations"),
        LMQuant("w2a8", 2, 8, 32, True, "int2 weights (codes -2..1) per group of 32, int8 per-token activations"),
        LMQuant(
            "w1.58a8",
            1.58,
            8,
            None,
            True,
            "BitNet b1.58: absmean ternary weights (per tensor), int8 per-token absmax activations",
        ),
        LMQuant("w4a8_no_ste", 4, 8, 32, False, "as w4a8 with plain rounding: zero gradient through every rounding"),
    )
}


def quantised_paths(model: nnx.Module) -> tuple[str, ...]:
    """The paths (``blocks/0/attn/q``) of the linear layers a configuration quantises."""
    names = (
        "/".join(str(p) for p in path) for path, module in nnx.iter_modules(model) if isinstance(module, nnx.Linear)
    )
    return tuple(sorted(n for n in names if re.fullmatch(SITES, n)))


def rules_for(config: LMQuant, *, weights: bool = True) -> list[Any]:
    """The :func:`stejax.flax.quantize_model` rules of a configuration (empty for float).

    ``weights=False`` leaves the weight quantiser out (for kernels that are
    already dequantised codes: re-quantising them would recompute the scale).
    """
    from stejax.flax import Rule

    w, a = config.quantisers()
    w = w if weights else None
    if w is None and a is None:
        return []
    return [Rule(SITES, kinds=("linear",), weights=w, inputs=a)]


def quantize_lm(model: nnx.Module, config: LMQuant | str, *, weights: bool = True) -> nnx.Module:
    """The model quantised as ``config`` says, by :func:`stejax.flax.quantize_model`; ``model`` is unchanged.

    One rule: path :data:`SITES`, kind ``linear``, weights and inputs as the
    configuration says; every other site (embedding, head, attention products)
    is left in float. Parameter values are kept. For ``float`` the model is
    returned as it is. ``weights=False``: inputs only (see :func:`rules_for`).

    Raises:
      KeyError: an unknown configuration name (the message lists the names).
    """
    from stejax.flax import quantize_model

    if isinstance(config, str):
        if config not in CONFIGS:
            raise KeyError(f"unknown LM configuration {config!r}; expected one of {', '.join(CONFIGS)}.")
        config = CONFIGS[config]
    rules = rules_for(config, weights=weights)
    if not rules:
        return model
    example = jax.numpy.zeros((1, 8), jax.numpy.uint8)
    return quantize_model(model, rules, example)
