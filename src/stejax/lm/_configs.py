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

from stejax.lm._quantisers import LLAMACPP_BLOCKS, activation_quantiser, weight_quantiser

__all__ = [
    "CONFIGS",
    "INTEGER_CONFIGS",
    "PRODUCTS",
    "PTQ_FORMS",
    "SITES",
    "LMQuant",
    "lm_quant",
    "ptq_rules",
    "quantised_paths",
    "quantize_lm",
    "rules_for",
]

# How the quantised linears multiply (stejax.flax.Rule's product): fake-quant float products (default),
# the int8 forward product with a float straight-through gradient, or int8 products forward and backward.
PRODUCTS = ("fake-quant", "int8-forward", "int8")

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
      input_block: ``None``: one input scale per token; ``32`` or ``256``: one per
        block of that many input values, as llama.cpp quantises a quantised
        product's input (Q8_0, the input of Q8_0 and Q4_0 weights; Q8_K, of TQ1_0
        and TQ2_0). 8-bit inputs only. See :meth:`with_input_block`.
      product: how the block linears multiply: ``"fake-quant"`` (float products
        of the fake-quantised operands), ``"int8-forward"`` (int8 x int8 -> int32
        forward products, float straight-through gradient) or ``"int8"`` (the
        forward and both backward products in int8, the cotangent quantised
        per row and per column: :func:`stejax.integer_dot_general`). See
        :meth:`with_product`.
    """

    name: str
    weight_bits: float | None
    input_bits: int | None
    group: int | None
    ste: bool
    description: str
    input_block: int | None = None
    product: str = "fake-quant"

    def __post_init__(self) -> None:
        if self.product not in PRODUCTS:
            raise ValueError(
                f"configuration {self.name!r}: product must be one of {list(PRODUCTS)}; got {self.product!r}."
            )
        if self.product != "fake-quant":
            integer_grid = self.weight_bits in (8, 1.58) and self.input_bits == 8 and self.group is None
            if not integer_grid or self.input_block is not None or not self.ste:
                raise ValueError(
                    f"configuration {self.name!r}: integer products take int8 per-channel or ternary weights and int8 "
                    "per-token inputs with straight-through gradients (w8a8, w1.58a8); it has "
                    f"{self.weight_bits}-bit weights (group {self.group}), {self.input_bits}-bit inputs"
                    f"{'' if self.input_block is None else f' per block of {self.input_block}'}"
                    f"{'' if self.ste else ', no STE'}."
                )
        if self.input_block is not None:
            if self.input_block not in LLAMACPP_BLOCKS:
                raise ValueError(
                    f"configuration {self.name!r}: input_block must be 32 (llama.cpp's Q8_0), 256 (Q8_K) or None "
                    f"(per token); got {self.input_block!r}."
                )
            if self.input_bits != 8:
                raise ValueError(
                    f"configuration {self.name!r}: input blocks are llama.cpp's 8-bit inputs; its inputs "
                    f"are {'float' if self.input_bits is None else f'{self.input_bits}-bit'}, expected 8-bit."
                )

    def with_input_block(self, block: int | None) -> LMQuant:
        """This configuration with its inputs quantised per block of ``block`` values (None: per token).

        Train with the block of the GGUF type the model will be exported to
        (32 for Q8_0 and Q4_0 weights, 256 for TQ1_0 and TQ2_0) and llama.cpp
        quantises every product's input to the codes and scales stejax uses.
        The name is kept; the description says the block.

        Raises:
          ValueError: a block other than 32, 256 or None, or a configuration whose inputs are not 8-bit.

        Example:
          >>> CONFIGS["w8a8"].with_input_block(32).description
          'int8 per-channel weights, int8 dynamic activations per block of 32 (llama.cpp Q8_0)'
        """
        description = self.description
        if self.input_block is not None and self.name in CONFIGS:  # start from the per-token wording
            description = CONFIGS[self.name].description
        if block is not None:
            kind = LLAMACPP_BLOCKS.get(block, "?")
            if "per-token " in description:
                description = description.replace("per-token ", "") + f" per block of {block} (llama.cpp {kind})"
            else:
                description += f"; int8 activations per block of {block} (llama.cpp {kind})"
        return dataclasses.replace(self, input_block=block, description=description)

    def with_product(self, product: str) -> LMQuant:
        """This configuration with its block linears multiplied as ``product`` says (one of :data:`PRODUCTS`).

        The integer products take w8a8's and w1.58a8's grids exactly: the
        forward product's own absmax int8 codes (one scale per token, one per
        output channel) are those of the configuration's quantisers (8-bit
        absmax), or represent them exactly (ternary weights are codes -127, 0,
        127 of one scale per channel).

        Raises:
          ValueError: an unknown product, or a configuration whose grids an int8 product cannot take.

        Example:
          >>> CONFIGS["w8a8"].with_product("int8").product
          'int8'
        """
        if product == self.product:
            return self
        description = CONFIGS[self.name].description if self.name in CONFIGS else self.description
        if product != "fake-quant":
            description += (
                "; int8 x int8 -> int32 products forward and backward"
                if product == "int8"
                else "; int8 x int8 -> int32 forward products, float straight-through gradient"
            )
        return dataclasses.replace(self, product=product, description=description)

    def quantisers(self) -> tuple[Callable[[jax.Array], jax.Array] | None, Callable[[jax.Array], jax.Array] | None]:
        """(weight quantiser, input quantiser), each None for float."""
        w = None if self.weight_bits is None else weight_quantiser(self.weight_bits, group=self.group, ste=self.ste)
        a = None
        if self.input_bits is not None:
            a = activation_quantiser(self.input_bits, block=self.input_block, ste=self.ste)
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


# Integer-product variants of the configurations whose grids an int8 product takes exactly.
INTEGER_CONFIGS: dict[str, LMQuant] = {
    f"{name}_int8": dataclasses.replace(CONFIGS[name].with_product("int8"), name=f"{name}_int8")
    for name in ("w8a8", "w1.58a8")
}


def lm_quant(name: str, *, product: str | None = None) -> LMQuant:
    """The configuration named ``name`` (:data:`CONFIGS` or :data:`INTEGER_CONFIGS`), with ``product`` if given.

    Raises:
      KeyError: an unknown name (the message lists the names).
      ValueError: a product the configuration cannot take.
    """
    config = CONFIGS.get(name) or INTEGER_CONFIGS.get(name)
    if config is None:
        raise KeyError(f"unknown LM configuration {name!r}; expected one of {', '.join([*CONFIGS, *INTEGER_CONFIGS])}.")
    return config if product is None else config.with_product(product)


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
    With integer products (``config.product``) the rule multiplies by
    :func:`stejax.integer_dot_general`, which quantises the inputs per token
    and 8-bit weights per channel itself: only a ternary weight quantiser is
    kept ahead of it.
    """
    from stejax.flax import Rule

    w, a = config.quantisers()
    w = w if weights else None
    if config.product != "fake-quant":
        # The integer product quantises each operand itself, to the same absmax int8 grid as the 8-bit
        # quantisers (one scale per token, one per output channel): they would only be computed twice.
        a = None
        w = None if config.weight_bits == 8 else w
        return [Rule(SITES, kinds=("linear",), weights=w, inputs=a, product=config.product)]
    if w is None and a is None:
        return []
    return [Rule(SITES, kinds=("linear",), weights=w, inputs=a)]


def quantize_lm(model: nnx.Module, config: LMQuant | str, *, weights: bool = True) -> nnx.Module:
    """The model quantised as ``config`` says, by :func:`stejax.flax.quantize_model`; ``model`` is unchanged.

    One rule: path :data:`SITES`, kind ``linear``, weights and inputs as the
    configuration says; every other site (embedding, head, attention products)
    is left in float. Parameter values are kept. For ``float`` the model is
    returned as it is. ``weights=False``: inputs only (see :func:`rules_for`).
    ``config`` is a configuration or a name from :data:`CONFIGS` or
    :data:`INTEGER_CONFIGS`; with integer products the rule's ``product`` is
    the configuration's (:meth:`LMQuant.with_product`).

    Raises:
      KeyError: an unknown configuration name (the message lists the names).
    """
    from stejax.flax import quantize_model

    if isinstance(config, str):
        config = lm_quant(config)
    rules = rules_for(config, weights=weights)
    if not rules:
        return model
    example = jax.numpy.zeros((1, 8), jax.numpy.uint8)
    return quantize_model(model, rules, example)


# The forms post-training quantisation rounds the block linears to (stejax.ptq.quantize_ptq): form ->
# (weight bits, group along the contraction axis or None for one scale per output channel, input bits or None).
# Weight scales are static (the grid the rounding chose); 8-bit inputs are quantised per token, dynamically, as
# the QAT configuration of the same name quantises them. 2 bits is the ternary grid {-1, 0, 1} x one absmax
# scale per output channel (stejax.ptq.symmetric_grid), the form QAT continues as w1.58a8.
PTQ_FORMS: dict[str, tuple[int, int | None, int | None]] = {
    "w4-g32": (4, 32, None),
    "w4-channel": (4, None, None),
    "w4a8": (4, 32, 8),
    "w8a8": (8, None, 8),
    "w1.58a8": (2, None, 8),
}


def ptq_rules(form: str) -> list[Any]:
    """The :func:`stejax.ptq.quantize_ptq` rules of a PTQ form of :data:`PTQ_FORMS`, over the sites of :data:`SITES`.

    Raises:
      KeyError: an unknown form (the message lists the forms).

    Example:
      >>> ptq_rules("w4a8")[0].weights.group_size, ptq_rules("w1.58a8")[0].weights.params["bits"]
      (32, 2)
    """
    from stejax.flax import Quant, Rule

    if form not in PTQ_FORMS:
        raise KeyError(f"unknown PTQ form {form!r}; expected one of {', '.join(PTQ_FORMS)}.")
    bits, group, input_bits = PTQ_FORMS[form]
    if group is None:
        weights = Quant("fake_quant", bits=bits, axis=-1, scale="static")
    else:
        weights = Quant("fake_quant", bits=bits, group_size=group, scale="static")
    inputs = None if input_bits is None else activation_quantiser(input_bits, ste=True)
    return [Rule(SITES, kinds=("linear",), weights=weights, inputs=inputs)]
