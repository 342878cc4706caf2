r"""GGUF export: a stejax language model as a llama.cpp ``llama`` or ``bitnet`` model, its integer codes kept exactly.

Two llama.cpp architectures compute what a stejax model computes, chosen by its
norm placement (:func:`gguf_architecture`):

* ``norms="llama"`` (:data:`stejax.lm.LLAMA`) is llama.cpp's ``llama``: an
  RMSNorm before attention and before the MLP, rotary positions, a SwiGLU MLP
  and an untied head (``output``).
* ``norms="subln"`` (BitNet's SubLN placement, with RMSNorms also before the
  attention output and the down projection) with a tied head is llama.cpp's
  ``bitnet`` (``src/models/bitnet.cpp``): ``blk.N.attn_sub_norm`` (width) is
  stejax's :math:`\mathrm{N}_o`, applied to the heads' concatenated output before
  ``attn_output``; ``blk.N.ffn_sub_norm`` (hidden width) is :math:`\mathrm{N}_d`,
  applied to :math:`\mathrm{silu}(W_{gate} x) \odot W_{up} x` before
  ``ffn_down``. Its logits are the final norm's output times ``token_embd``,
  so the head is the embedding (``tied=True``); it reads no ``output`` tensor.
  It rotates the pairs :math:`(i, i + d/2)` of a head (llama.cpp's NEOX rope
  type) where stejax rotates :math:`(2i, 2i + 1)`, so ``attn_q`` and ``attn_k``
  hold stejax's output channels reordered within each head, the even ones
  then the odd ones: the attention scores are the same sums, and each row
  keeps its codes and scale.

A file written by :func:`export_gguf` has no vocabulary
(``tokenizer.ggml.model = "none"``, ``<arch>.vocab_size = 256``): token ids are
the bytes 0-255 and the logits are over those 256 values. Tensors carry
llama.cpp's names (``token_embd``, ``blk.N.attn_q``, ..., ``output_norm``, and
``output`` for a llama), each weight ``(out, in)`` with the contraction axis
along the row, as ggml stores it.

Each quantised kernel is written in the GGUF type that holds its codes exactly,
so that the only change is each block's scale rounded to float16:

=====================  =========================================  ===================================
stejax weights         GGUF type                                  a block of 32 (256) weights holds
=====================  =========================================  ===================================
int8, per channel      Q8_0 (8.5 bits a weight)                   the 32 codes and the channel's scale
int4, groups of 32     Q4_0 (4.5)                                 the 32 codes + 8 and the group's scale
int2, groups of 32     Q4_0 (4.5)                                 the 32 codes + 8 and the group's scale
ternary (absmean)      TQ2_0 (2.0625), TQ1_0 (1.6875) or Q4_0     256 (32) trits and the tensor's
                       where a row is a multiple of 256, else     :math:`\gamma` (the inverse of
                       Q4_0                                       stejax's stored scale)
float                  F32 (or F16)                               the values
=====================  =========================================  ===================================

The embedding, the norms and the output head stay F32 (stejax keeps them in
float32). The dequantised GGUF weight is ``d * code`` with ``d`` the float16
scale; stejax's is ``code * scale`` (``code / scale`` for ternary), so the two
agree to float16's rounding of the scale (a relative :math:`2^{-11}` at most;
a scale outside float16's normal range is refused rather than flushed). The
bitnet graph's optional per-tensor ``.scale`` tensors are not written: the
block scales already hold :math:`\gamma`.

How llama.cpp quantises a quantised product's input (not a property of the
file): to int8 per block of 32 values with a float16 scale (Q8_0) for Q8_0 and
Q4_0 weights, per block of 256 with a float32 scale (Q8_K) for TQ1_0 and TQ2_0,
in both architectures. A configuration trained with that block
(``LMQuant.with_input_block(32)``, or 256 for a model whose ternary tensors are
all TQ1_0/TQ2_0) computes what the file computes, but for float16's rounding
of each weight scale and the order of float32 sums. One trained per token (one
int8 scale per row, the presets' default) or with the other block still
exports: llama.cpp's products then approximate the model's, and
:attr:`GGUFExport.input_differences` says which tensors differ and how.

A model that neither architecture computes is refused, by name: learned
positions, a GELU MLP, a tied head with llama's norms, an untied head with
SubLN norms (llama.cpp's bitnet takes its head from the embedding), biases,
and 4-bit activations (``w4a4``: llama.cpp quantises inputs to 8 bits).

The file is written atomically: a hidden temporary file beside ``out``, fsynced,
then linked into place (never overwriting); a failed export leaves nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BITS_PER_WEIGHT",
    "INPUT_TYPES",
    "TERNARY_TYPES",
    "GGUFError",
    "GGUFExport",
    "bitnet_differences",
    "check_input_block",
    "export_gguf",
    "gguf_architecture",
    "gguf_differences",
    "gguf_name",
    "gguf_types",
    "input_differences",
    "llama_differences",
    "llamacpp_input_blocks",
    "neox_rows",
    "read_gguf",
]

# Bits a weight takes in each type written here (block bytes * 8 / block weights).
BITS_PER_WEIGHT: dict[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "Q8_0": 8.5,
    "Q4_0": 4.5,
    "TQ2_0": 2.0625,
    "TQ1_0": 1.6875,
}
# (weights per block, bytes per block) of the quantised types.
_BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "TQ2_0": (256, 66), "TQ1_0": (256, 54)}
# The types ternary kernels whose rows are multiples of 256 may take.
TERNARY_TYPES = ("TQ2_0", "TQ1_0", "Q4_0")
# How llama.cpp's CPU backend quantises the input of a product with each weight type (its vec_dot type):
# (input type, values per block, the block scale's type).
INPUT_TYPES: dict[str, tuple[str, int, str]] = {
    "Q8_0": ("Q8_0", 32, "float16"),
    "Q4_0": ("Q8_0", 32, "float16"),
    "TQ2_0": ("Q8_K", 256, "float32"),
    "TQ1_0": ("Q8_K", 256, "float32"),
}
ROPE_BASE = 10000.0  # stejax.lm.rotary's theta base
_FP16_NORMAL = (2.0**-14, 65504.0)


class GGUFError(ValueError):
    """A model, configuration or tensor that no GGUF file of llama.cpp's can hold as stejax computes it."""


@dataclasses.dataclass(frozen=True)
class GGUFExport:
    """What :func:`export_gguf` wrote.

    Attributes:
      path: the GGUF file.
      bytes: its size.
      config: the stejax configuration's name (``w1.58a8``).
      types: GGUF type per tensor name (``{"blk.0.attn_q.weight": "TQ2_0", ...}``).
      bits_per_weight: the quantised block weights' bits per weight, over all of them
        (every weight of the blocks' linear layers; the float configuration's F32/F16).
      input_differences: how llama.cpp's quantisation of the quantised products'
        inputs differs from the configuration's, one sentence per difference
        (empty: llama.cpp quantises every input as the model does).
      input_block: the configuration's input block (None: one scale per token, or float inputs).
      architecture: llama.cpp's architecture of the file (``"llama"`` or ``"bitnet"``, :func:`gguf_architecture`).
    """

    path: Path
    bytes: int
    config: str
    types: Mapping[str, str]
    bits_per_weight: float
    input_differences: tuple[str, ...] = ()
    input_block: int | None = None
    architecture: str = "llama"


# ----------------------------------------------------------------------------------------------- names and checks

_BLOCK_NAMES = {
    "attn_norm/scale": "attn_norm.weight",
    "attn/q/kernel": "attn_q.weight",
    "attn/k/kernel": "attn_k.weight",
    "attn/v/kernel": "attn_v.weight",
    "attn/o_norm/scale": "attn_sub_norm.weight",  # SubLN's N_o: bitnet only
    "attn/o/kernel": "attn_output.weight",
    "mlp_norm/scale": "ffn_norm.weight",
    "mlp/gate/kernel": "ffn_gate.weight",
    "mlp/up/kernel": "ffn_up.weight",
    "mlp/down_norm/scale": "ffn_sub_norm.weight",  # SubLN's N_d: bitnet only
    "mlp/down/kernel": "ffn_down.weight",
}
_TOP_NAMES = {
    "embed/embedding": "token_embd.weight",
    "final_norm/scale": "output_norm.weight",
    "head/kernel": "output.weight",
}


def gguf_name(name: str) -> str:
    """llama.cpp's GGUF tensor name of a stejax parameter (``blocks/0/attn/q/kernel`` -> ``blk.0.attn_q.weight``).

    The SubLN norms ``attn/o_norm`` and ``mlp/down_norm`` are bitnet's
    ``attn_sub_norm`` and ``ffn_sub_norm``; ``head/kernel`` is llama's ``output``.

    Raises:
      GGUFError: a parameter llama.cpp has no tensor for (the message names it).

    Example:
      >>> gguf_name("blocks/3/mlp/down/kernel")
      'blk.3.ffn_down.weight'
      >>> gguf_name("blocks/0/attn/o_norm/scale")
      'blk.0.attn_sub_norm.weight'
    """
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split("/", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"blk.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    raise GGUFError(
        f"{name!r}: llama.cpp's llama and bitnet have no tensor for this parameter; their computations do not "
        "include it."
    )


def gguf_architecture(model: Any) -> str:
    """llama.cpp's architecture that a GGUF export of an :class:`~stejax.lm.LMConfig` takes.

    ``"llama"`` for ``norms="llama"``; ``"bitnet"`` for ``norms="subln"``
    (llama.cpp's BitNet b1.58 graph, whose blocks carry the two extra norms).
    :func:`gguf_differences` says whether the model is that architecture's computation.

    Example:
      >>> from stejax.lm import LLAMA
      >>> gguf_architecture(LLAMA), gguf_architecture(LLAMA.replace(norms="subln", tied=True))
      ('llama', 'bitnet')
    """
    return "llama" if getattr(model, "norms", "subln") == "llama" else "bitnet"


def gguf_differences(model: Any, config: Any = None) -> list[str]:
    """How a model and a configuration differ from the computation of their llama.cpp architecture.

    :func:`llama_differences` for ``norms="llama"``, :func:`bitnet_differences`
    for ``norms="subln"`` (:func:`gguf_architecture`). Empty: the model exports
    exactly.

    Example:
      >>> from stejax.lm import LLAMA
      >>> gguf_differences(LLAMA.replace(norms="subln", tied=True), "w1.58a8")
      []
      >>> gguf_differences(LLAMA.replace(norms="subln"))[0].split(":")[0]
      'an untied head (tied=False)'
    """
    if gguf_architecture(model) == "llama":
        return llama_differences(model, config)
    return bitnet_differences(model, config)


def llama_differences(model: Any, config: Any = None) -> list[str]:
    """How a model architecture (an :class:`~stejax.lm.LMConfig`) and a configuration differ from llama's computation.

    An empty list: the model exports exactly. ``config`` (an :class:`~stejax.lm.LMQuant`
    or its name) adds the configuration's own differences.
    """
    out = []
    if model.positions != "rotary":
        out.append(
            f"learned positions (positions={model.positions!r}): llama adds no position embedding; "
            "it rotates queries and keys (positions='rotary')"
        )
    if model.mlp != "swiglu":
        out.append(f"a {model.mlp.upper()} MLP (mlp={model.mlp!r}): llama's MLP is SwiGLU (mlp='swiglu')")
    if model.tied:
        out.append("a tied head (tied=True): llama's output head here is its own tensor (tied=False)")
    if getattr(model, "norms", "subln") != "llama":
        out.append(
            "SubLN norm placement (norms='subln'): RMSNorms before the attention output and the down "
            "projection, which llama lacks (norms='llama')"
        )
    return out + _config_differences(config)


def bitnet_differences(model: Any, config: Any = None) -> list[str]:
    """How a model architecture and a configuration differ from llama.cpp's ``bitnet`` computation.

    llama.cpp's bitnet (``src/models/bitnet.cpp``) is BitNet b1.58's SubLN
    block: RMSNorms before q/k/v, before the attention output (``attn_sub_norm``),
    before gate/up and before the down projection (``ffn_sub_norm``), a SwiGLU
    MLP, rotary positions, no biases, and logits computed with the token
    embedding (a tied head). Empty: the model exports exactly. ``config`` (an
    :class:`~stejax.lm.LMQuant` or its name) adds the configuration's own
    differences, as for :func:`llama_differences`.
    """
    out = []
    if getattr(model, "norms", "subln") != "subln":
        out.append(
            f"llama's norm placement (norms={model.norms!r}): llama.cpp's bitnet normalises the attention output "
            "and the down projection's input as well (norms='subln')"
        )
    if model.positions != "rotary":
        out.append(
            f"learned positions (positions={model.positions!r}): llama.cpp's bitnet adds no position embedding; "
            "it rotates queries and keys (positions='rotary')"
        )
    if model.mlp != "swiglu":
        out.append(
            f"a {model.mlp.upper()} MLP (mlp={model.mlp!r}): llama.cpp's bitnet MLP is SwiGLU, "
            "silu(gate) * up (mlp='swiglu')"
        )
    if not model.tied:
        out.append(
            "an untied head (tied=False): llama.cpp's bitnet computes the logits with the token embedding "
            "(token_embd) and reads no output tensor, so a SubLN model needs a tied head (tied=True); "
            "with an untied head, train llama's norm placement (norms='llama')"
        )
    return out + _config_differences(config)


def _config_differences(config: Any) -> list[str]:
    """How a configuration's quantisation differs from what a GGUF file and llama.cpp compute (either architecture)."""
    from stejax.lm._configs import CONFIGS

    out: list[str] = []
    if config is not None:
        config = CONFIGS[config] if isinstance(config, str) else config
        if config.input_bits not in (None, 8):
            out.append(
                f"{config.input_bits}-bit activations (configuration {config.name!r}): llama.cpp quantises a "
                "product's input to 8 bits"
            )
        if config.weight_bits not in (None, 8, 4, 2, 1.58):
            out.append(f"{config.weight_bits}-bit weights (configuration {config.name!r}): no GGUF type holds them")
        if config.weight_bits in (8, 4, 2) and config.group is not None and config.group % 32:
            out.append(
                f"scale groups of {config.group} (configuration {config.name!r}): GGUF blocks hold 32 weights "
                "with one scale; groups must be a multiple of 32"
            )
    return out


def _multiple_message(name: str, gguf: str, shape: tuple[int, ...], kind: str, multiple: int) -> str:
    n = shape[0]
    lower, upper = n // multiple * multiple, -(-n // multiple) * multiple
    fits = f"{lower} or {upper}" if lower else f"{upper}"
    return (
        f"{name} ({gguf}): kernel of shape {shape} has {n} inputs per output row; {kind} stores rows in blocks of "
        f"{multiple}, so the input width must be a multiple of {multiple} ({n} is not; {fits} would fit)."
    )


def _type_for(name: str, gguf: str, shape: tuple[int, ...], config: Any, ternary: str, float_type: str) -> str:
    """The GGUF type of one block kernel ``(in, out)`` under ``config``."""
    n_in = shape[0]
    bits = config.weight_bits
    if bits is None:
        return float_type
    if bits == 1.58:
        if n_in % _BLOCKS[ternary][0] == 0:
            return ternary
        if n_in % 32 == 0:
            return "Q4_0"
        kind = "Q4_0" if ternary == "Q4_0" else f"ternary needs {ternary} (blocks of 256) or Q4_0, which"
        raise GGUFError(_multiple_message(name, gguf, shape, kind, 32))
    kind = "Q8_0" if bits == 8 else "Q4_0"
    if n_in % 32:
        raise GGUFError(_multiple_message(name, gguf, shape, kind, 32))
    return kind


def gguf_types(
    model: Any, config: Any, *, ternary: str = "TQ2_0", float_type: str = "F32"
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name -> (type, ggml shape) for an architecture and a configuration, before writing.

    The ggml shape is ``(in, out)`` for a matrix (``(width, 256)`` for the
    embedding and the head) and ``(width,)`` for a norm (``(hidden,)`` for
    bitnet's ``ffn_sub_norm``). The tensors are those of the model's llama.cpp
    architecture (:func:`gguf_architecture`), in the order written: a bitnet
    has the two sub-norms of each block and no ``output`` (its head is
    ``token_embd``).

    Args:
      model: the :class:`~stejax.lm.LMConfig`.
      config: the :class:`~stejax.lm.LMQuant` or its name.
      ternary: ``"TQ2_0"``, ``"TQ1_0"`` or ``"Q4_0"`` for ternary kernels whose rows are multiples of 256.
      float_type: ``"F32"`` or ``"F16"`` for the float configuration's block kernels.

    Raises:
      GGUFError: the model or configuration differs from the computation of
        its llama.cpp architecture (every difference named), or a kernel's shape
        fits no type.
    """
    from stejax.lm._configs import CONFIGS

    config = CONFIGS[config] if isinstance(config, str) else config
    if ternary not in TERNARY_TYPES:
        raise GGUFError(f"ternary must be one of {', '.join(map(repr, TERNARY_TYPES))}; got {ternary!r}.")
    if float_type not in ("F32", "F16"):
        raise GGUFError(f"float_type must be 'F32' or 'F16'; got {float_type!r}.")
    architecture = gguf_architecture(model)
    differences = gguf_differences(model, config)
    if differences:
        raise GGUFError(
            f"this model is not {_COMPUTATIONS[architecture]}, so no GGUF file would compute what it computes: "
            + "; ".join(differences)
            + "."
        )
    d, h = model.width, model.hidden
    bitnet = architecture == "bitnet"
    out: dict[str, tuple[str, tuple[int, ...]]] = {"token_embd.weight": ("F32", (d, 256))}
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "gate": (d, h), "up": (d, h), "down": (h, d)}
    for i in range(model.depth):
        out[f"blk.{i}.attn_norm.weight"] = ("F32", (d,))
        for site, shape in shapes.items():
            if bitnet and site == "o":
                out[f"blk.{i}.attn_sub_norm.weight"] = ("F32", (d,))
            if bitnet and site == "gate":
                out[f"blk.{i}.ffn_norm.weight"] = ("F32", (d,))
            if bitnet and site == "down":
                out[f"blk.{i}.ffn_sub_norm.weight"] = ("F32", (h,))
            part = "attn" if site in ("q", "k", "v", "o") else "mlp"
            name = f"blocks/{i}/{part}/{site}"
            gguf = gguf_name(f"{name}/kernel")
            out[gguf] = (_type_for(name, gguf, shape, config, ternary, float_type), shape)
        if not bitnet:
            out[f"blk.{i}.ffn_norm.weight"] = ("F32", (d,))
    out["output_norm.weight"] = ("F32", (d,))
    if not bitnet:
        out["output.weight"] = ("F32", (d, 256))
    return out


_COMPUTATIONS = {
    "llama": "llama's computation",
    "bitnet": "the computation of llama.cpp's bitnet, the architecture that runs SubLN models (norms='subln')",
}


def input_differences(types: Mapping[str, str], config: Any) -> list[str]:
    """How llama.cpp quantises the inputs of a file's quantised products, where that differs from ``config``.

    llama.cpp quantises the input of a product with Q8_0 or Q4_0 weights to
    int8 per block of 32 values with a float16 scale (Q8_0), and of one with
    TQ1_0 or TQ2_0 weights per block of 256 with a float32 scale (Q8_K)
    (:data:`INPUT_TYPES`). A configuration whose ``input_block`` is that block
    quantises the same values to the same codes and scales.

    Args:
      types: GGUF type per tensor name (:attr:`GGUFExport.types`, or the types of :func:`gguf_types`).
      config: the :class:`~stejax.lm.LMQuant` or its name.

    Returns:
      one sentence per kind of input that differs, naming the tensors, both
      schemes and what would match; empty where every input matches (and for
      a file without quantised products).

    Example:
      >>> types = {"blk.0.attn_q.weight": "Q8_0", "blk.0.ffn_down.weight": "Q8_0"}
      >>> input_differences(types, "w8a8")[0][:90]
      'the inputs of 2 Q8_0 tensors: llama.cpp quantises them to int8 per block of 32 values with'
      >>> from stejax.lm import CONFIGS
      >>> input_differences(types, CONFIGS["w8a8"].with_input_block(32))
      []
    """
    from stejax.lm._configs import CONFIGS
    from stejax.lm._quantisers import LLAMACPP_BLOCKS

    config = CONFIGS[config] if isinstance(config, str) else config
    counts: dict[tuple[str, int, str], dict[str, int]] = {}
    for kind in types.values():
        if kind in INPUT_TYPES:
            tally = counts.setdefault(INPUT_TYPES[kind], {})
            tally[kind] = tally.get(kind, 0) + 1
    if config.input_bits is None:
        ours = "float inputs"
    elif config.input_block is None:
        ours = f"one int{config.input_bits} scale per token"
    else:
        ours = f"one int8 scale per block of {config.input_block} ({LLAMACPP_BLOCKS[config.input_block]})"
    out = []
    for (kind, block, scale), tally in sorted(counts.items()):
        if config.input_block == block:
            continue
        if config.input_block == 32:  # only ternary kernels take TQ1_0/TQ2_0
            match = "write them as Q4_0 (ternary='Q4_0'), whose inputs are Q8_0 blocks of 32"
        else:
            match = f"train with input blocks of {block} (LMQuant.with_input_block({block}))"
        tensors = ", ".join(f"{n} {k}" for k, n in sorted(tally.items()))
        out.append(
            f"the inputs of {tensors} tensors: llama.cpp quantises them to int8 per block of {block} values with a "
            f"{scale} scale ({kind}), where configuration {config.name!r} uses {ours}, so llama.cpp's products "
            f"approximate the model's; to compute what it computes, {match}"
        )
    return out


def llamacpp_input_blocks(model: Any, config: Any, *, ternary: str = "TQ2_0") -> tuple[int, ...]:
    """The blocks per which llama.cpp quantises the quantised products' inputs of a GGUF export, smallest first.

    From the types :func:`gguf_types` gives the architecture and configuration
    (Q8_0 and Q4_0 weights: inputs per block of 32; TQ1_0 and TQ2_0: per 256).
    One block: a configuration trained with it (:meth:`~stejax.lm.LMQuant.with_input_block`)
    quantises every product's input as llama.cpp does. Two: ternary tensors of
    both kinds (rows of 256 and rows of 32), which no single block matches;
    with ``ternary="Q4_0"`` every one takes 32. Empty: no quantised product.

    Raises:
      GGUFError: the model or configuration has no GGUF form (as :func:`gguf_types`).

    Example:
      >>> from stejax.lm import LMConfig
      >>> llamacpp_input_blocks(LMConfig(width=64, heads=2, hidden=160, norms="llama"), "w1.58a8")
      (32,)
      >>> llamacpp_input_blocks(LMConfig(width=256, heads=2, hidden=512, norms="llama"), "w1.58a8")
      (256,)
    """
    types = gguf_types(model, config, ternary=ternary)
    return tuple(sorted({INPUT_TYPES[kind][1] for kind, _ in types.values() if kind in INPUT_TYPES}))


def check_input_block(model: Any, block: int | None) -> None:
    """Refuse an input block that does not divide every quantised linear's input width.

    The block linears take inputs of ``model.width`` values (q, k, v, o, gate,
    up) and ``model.hidden`` values (down); a block of inputs must divide both.

    Raises:
      ValueError: the block, both widths and the blocks that would fit.

    Example:
      >>> from stejax.lm import LMConfig
      >>> try:
      ...     check_input_block(LMConfig(width=64, heads=2, hidden=160), 256)
      ... except ValueError as error:
      ...     print(str(error).split("; ")[-1])
      32 would fit (256 needs a width and hidden width that are multiples of 256).
    """
    from stejax.lm._quantisers import LLAMACPP_BLOCKS

    if block is None:
        return
    widths = (model.width, model.hidden)
    if all(n % block == 0 for n in widths):
        return
    fits = [b for b in LLAMACPP_BLOCKS if all(n % b == 0 for n in widths)]
    if fits:
        hint = f"{' or '.join(map(str, fits))} would fit"
    else:
        hint = f"no llama.cpp block ({' or '.join(map(str, LLAMACPP_BLOCKS))}) fits, only one scale per token"
    big = max(LLAMACPP_BLOCKS)
    if big not in fits:
        hint += f" ({big} needs a width and hidden width that are multiples of {big})"
    raise ValueError(
        f"input blocks of {block} do not fit this model: its quantised linears take inputs of {model.width} values "
        f"(width: q, k, v, o, gate, up) and {model.hidden} (hidden: down), and a block must divide both; {hint}."
    )


# ----------------------------------------------------------------------------------------------- block encoders


def _fp16_scales(name: str, gguf: str, d: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """``d`` as float16 bytes' values, refusing a scale of a block with nonzero codes outside float16's normal range."""
    d = np.asarray(d, np.float32)
    bad = nonzero & ~((np.abs(d) >= _FP16_NORMAL[0]) & (np.abs(d) <= _FP16_NORMAL[1]))
    if bad.any():
        value = float(d[bad].reshape(-1)[0])
        raise GGUFError(
            f"{name} ({gguf}): a block scale of {value:.3g} lies outside float16's normal range "
            f"[{_FP16_NORMAL[0]:.3g}, {_FP16_NORMAL[1]:.0f}], so a GGUF block could not hold it to float16's "
            "precision; expected weights whose scale fits (rescale the tensor)."
        )
    return d.astype(np.float16)


def _q8_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q8_0 rows: per block of 32, the float16 scale then 32 int8 codes (``codes`` (rows, n), ``d`` (rows, n/32))."""
    rows, n = codes.shape
    qs = codes.astype(np.int8).reshape(rows, n // 32, 32).view(np.uint8)
    scale = d.astype(np.float16).reshape(rows, n // 32, 1).view(np.uint8)
    return np.concatenate([scale, qs], axis=-1).reshape(rows, -1)


def _q4_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q4_0 rows: the float16 scale, then 16 bytes holding codes + 8 (weight j low nibble, weight j + 16 high)."""
    rows, n = codes.shape
    nib = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, n // 32, 2, 16)
    qs = nib[:, :, 0] | (nib[:, :, 1] << np.uint8(4))
    scale = d.astype(np.float16).reshape(rows, n // 32, 1).view(np.uint8)
    return np.concatenate([scale, qs], axis=-1).reshape(rows, -1)


def _tq2_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """TQ2_0 rows: per 256 weights, 64 bytes of 2-bit trits (code + 1; four 32-weight runs per byte), then the scale."""
    rows, n = codes.shape
    trits = (codes.astype(np.int16) + 1).astype(np.uint8).reshape(rows, n // 256, 2, 4, 32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    qs = np.bitwise_or.reduce(trits << shifts, axis=3).reshape(rows, n // 256, 64)
    scale = d.astype(np.float16).reshape(rows, n // 256, 1).view(np.uint8)
    return np.concatenate([qs, scale], axis=-1).reshape(rows, -1)


def _tq1_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """TQ1_0 rows through gguf-py's own packing of the codes (scale 1), with each block's scale set to ``d``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rows, n = codes.shape
    packed = np.asarray(quantize(codes.astype(np.float32), GGMLQuantizationType.TQ1_0)).reshape(rows, n // 256, 54)
    packed = packed.copy()
    packed[..., 52:54] = d.astype(np.float16).reshape(rows, n // 256, 1).view(np.uint8)
    return packed.reshape(rows, -1)


_ENCODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "TQ2_0": _tq2_0, "TQ1_0": _tq1_0}


def _encode(name: str, gguf: str, kind: str, codes: np.ndarray, scale: np.ndarray, config: Any) -> np.ndarray:
    """Block bytes ``(out, bytes per row)`` of a kernel's codes ``(in, out)`` and stejax's compact scale."""
    rows = np.ascontiguousarray(codes.T)  # (out, in): the contraction axis along the row
    n_out, n_in = rows.shape
    block = _BLOCKS[kind][0]
    nb = n_in // block
    if config.weight_bits == 1.58:
        gamma = np.float32(1.0) / np.float32(scale.reshape(()))  # stejax dequantises code / scale
        d = np.full((n_out, nb), gamma, np.float32)
    elif config.group is None:
        d = np.repeat(np.asarray(scale, np.float32).reshape(1, n_out).T, nb, axis=1)
    else:
        starts = np.arange(nb) * block  # each 32-block lies inside one group (group % 32 == 0)
        d = np.asarray(scale, np.float32)[starts // config.group].T
    nonzero = np.asarray(rows.reshape(n_out, nb, block).any(axis=-1))
    d16 = _fp16_scales(name, gguf, d, nonzero)
    return _ENCODERS[kind](rows, d16.astype(np.float32))


# ----------------------------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class _Weights:
    model: Any  # LMConfig
    config: Any  # LMQuant
    floats: dict[str, np.ndarray]  # stejax name -> float32 (every parameter that is not a quantised kernel)
    codes: dict[str, tuple[np.ndarray, np.ndarray]]  # site -> (int8 codes (in, out), compact float32 scale)
    source: str


def _from_model(model: Any, config: Any, source: str) -> _Weights:
    from stejax.lm._configs import CONFIGS, quantised_paths
    from stejax.lm._export import _codes_and_scale, _flat_params

    config = CONFIGS[config] if isinstance(config, str) else config
    params = _flat_params(model)
    sites = set(quantised_paths(model)) if config.weight_bits is not None else set()
    floats, codes = {}, {}
    for name, value in params.items():
        site = name.rsplit("/", 1)[0]
        if site in sites and name.endswith("/kernel"):
            codes[site] = _codes_and_scale(value, config)
        else:
            floats[name] = np.asarray(value, np.float32)
    return _Weights(model.config, config, floats, codes, source)


def _from_artifact(root: Path) -> _Weights:
    """An LM artifact's tensors, after the manifest check (integrity, every file's size and sha256)."""
    from stejax.artifacts import ArtifactError
    from stejax.lm._configs import LMQuant
    from stejax.lm._export import WEIGHTS, read_lm_tensors
    from stejax.lm._model import LMConfig
    from stejax.lowbit._packing import unpack

    manifest, tensors = read_lm_tensors(root)
    config = LMQuant(**manifest["config"])
    model = LMConfig(**manifest["model"])
    floats, codes = {}, {}
    for site, entry in manifest["quantised"].items():
        context = f"export_gguf: {root / WEIGHTS}: tensor {site + '/codes'!r}"
        try:
            flat = unpack(tensors[f"{site}/codes"], entry["container"], math.prod(entry["shape"]), context=context)
        except ValueError as e:
            raise ArtifactError(str(e)) from None
        codes[site] = (flat.reshape(entry["shape"]), np.asarray(tensors[f"{site}/scale"], np.float32))
    for name, value in tensors.items():
        if name.rsplit("/", 1)[0] not in manifest["quantised"]:
            floats[name] = np.asarray(value, np.float32)
    return _Weights(model, config, floats, codes, str(root))


def _from_run(root: Path) -> _Weights:
    import json

    from flax import nnx

    from stejax.lm._configs import CONFIGS
    from stejax.lm._model import LMConfig, Transformer
    from stejax.lm._train import load_checkpoint

    run = json.loads((root / "config.json").read_text())
    model = load_checkpoint(Transformer(LMConfig(**run["model"]), rngs=nnx.Rngs(0)), root / "params.safetensors")
    config = CONFIGS[run["config"]].with_input_block(run.get("input_block"))
    return _from_model(model, config, str(root))


def _load_source(source: Any, config: Any) -> _Weights:
    if isinstance(source, (str, os.PathLike)):
        if config is not None:
            raise GGUFError("config is read from the run or artifact directory; pass it only with a model.")
        root = Path(source)
        if (root / "manifest.json").exists():
            return _from_artifact(root)
        if (root / "config.json").exists() and (root / "params.safetensors").exists():
            return _from_run(root)
        from stejax.artifacts import ArtifactError

        raise ArtifactError(
            f"{root}: neither an LM artifact (manifest.json, from stejax lm export) nor a run "
            "(config.json and params.safetensors, from stejax lm train)."
        )
    if config is None:
        raise GGUFError("export_gguf(model, ...): pass the model's configuration (config='w1.58a8', ...).")
    return _from_model(source, config, type(source).__name__)


# ----------------------------------------------------------------------------------------------- writing


def neox_rows(width: int, heads: int) -> np.ndarray:
    r"""The order of q's and k's output channels in a bitnet file: within each head, the even ones, then the odd.

    stejax rotates the pairs :math:`(2i, 2i + 1)` of a head of width :math:`d`
    by :math:`p\,\theta_i` (:func:`stejax.lm.rotary`); llama.cpp's bitnet
    rotates :math:`(i, i + d/2)` by the same angle (its NEOX rope type). Row
    ``j`` of a bitnet ``attn_q`` or ``attn_k`` is stejax's output channel
    ``neox_rows(width, heads)[j]``: the rotation then pairs the same values, and
    a query-key product sums the same terms in another order.

    Example:
      >>> neox_rows(8, 2).tolist()
      [0, 2, 1, 3, 4, 6, 5, 7]
    """
    head = width // heads
    within = np.concatenate([np.arange(0, head, 2), np.arange(1, head, 2)])
    return (np.arange(heads)[:, None] * head + within[None, :]).reshape(-1)


def _plan(weights: _Weights, ternary: str, float_type: str) -> dict[str, tuple[str, np.ndarray, Any]]:
    """GGUF name -> (type, numpy array to write, raw ggml type or None), in the architecture's tensor order."""
    from gguf import GGMLQuantizationType

    model = weights.model
    architecture = gguf_architecture(model)
    types = gguf_types(model, weights.config, ternary=ternary, float_type=float_type)
    by_gguf: dict[str, tuple[str, np.ndarray, Any]] = {}
    stray = [n for n in weights.floats if n.endswith("/bias")]
    if stray:
        raise GGUFError(f"biases ({', '.join(stray)}): llama.cpp's products here have none.")
    # bitnet rotates (i, i + d/2): q's and k's output channels go in that order (neox_rows).
    rotated = {f"blocks/{i}/attn/{s}" for i in range(model.depth) for s in "qk"} if architecture == "bitnet" else set()
    order = neox_rows(model.width, model.heads)
    for name, value in weights.floats.items():
        gguf = gguf_name(name)
        kind, _ = types[gguf]
        if name.endswith("/kernel"):
            if name.rsplit("/", 1)[0] in rotated:
                value = value[:, order]
            value = value.T  # (in, out) -> ggml's (out, in)
        array = np.ascontiguousarray(value, np.float16 if kind == "F16" else np.float32)
        by_gguf[gguf] = (kind, array, None)
    for site, (codes, scale) in weights.codes.items():
        gguf = gguf_name(f"{site}/kernel")
        kind, shape = types[gguf]
        if tuple(codes.shape) != shape:
            raise GGUFError(f"{site} ({gguf}): codes of shape {codes.shape}; the model needs {shape}.")
        if site in rotated:  # a channel's codes and its scale (per channel or per group) move together
            codes = codes[:, order]
            scale = scale[..., order] if np.ndim(scale) else scale
        by_gguf[gguf] = (kind, _encode(site, gguf, kind, codes, scale, weights.config), GGMLQuantizationType[kind])
    missing = [g for g in types if g not in by_gguf]
    if missing:
        raise GGUFError(f"{weights.source}: lacks {', '.join(missing)}, tensors of the {architecture} model.")
    return {g: by_gguf[g] for g in types}


def _file_type(kinds: list[str]) -> int:
    from gguf import LlamaFileType

    quantised = [k for k in kinds if k in _BLOCKS]
    if not quantised:
        return int(LlamaFileType.MOSTLY_F16 if "F16" in kinds else LlamaFileType.ALL_F32)
    smallest = min(quantised, key=lambda k: BITS_PER_WEIGHT[k])
    return int(LlamaFileType[f"MOSTLY_{smallest}"])


def export_gguf(
    source: Any,
    out: str | os.PathLike,
    *,
    config: Any = None,
    ternary: str = "TQ2_0",
    float_type: str = "F32",
) -> GGUFExport:
    """Write a stejax LM as a GGUF file that llama.cpp runs: a ``llama``, or a ``bitnet`` for SubLN norms.

    The architecture follows the model's norms (:func:`gguf_architecture`):
    ``norms="llama"`` with an untied head is written as llama.cpp's ``llama``;
    ``norms="subln"`` with a tied head as its ``bitnet``, whose blocks hold the
    SubLN norms (``attn_sub_norm``, ``ffn_sub_norm``) and whose head is the
    embedding. Both take the same GGUF types and the same input blocks.

    Args:
      source: a run directory (``stejax lm train``'s: config.json,
        params.safetensors), an artifact directory (``stejax lm export``'s; its
        manifest is checked and its packed codes written as they are), or a model
        (:class:`~stejax.lm.Transformer`, float or quantised) with ``config``.
      out: the ``.gguf`` file to create; must not exist.
      config: the model's configuration (an :class:`~stejax.lm.LMQuant` or its
        name), only with a model.
      ternary: the type of ternary kernels whose rows are multiples of 256:
        ``"TQ2_0"`` (2.0625 bits a weight, llama.cpp's faster one), ``"TQ1_0"``
        (1.6875), or ``"Q4_0"`` (4.5; its inputs are quantised per block of 32,
        as a configuration trained with input blocks of 32 quantises them).
      float_type: ``"F32"`` or ``"F16"`` for the float configuration's block kernels.

    Returns:
      a :class:`GGUFExport`; its ``input_differences`` say where llama.cpp
      quantises a product's input otherwise than the configuration (a
      configuration trained per token, or with the other block), in which case
      llama.cpp's logits approximate the model's rather than repeat them.

    Raises:
      GGUFError: a model that differs from the computation of its llama.cpp
        architecture (each difference named: :func:`gguf_differences`), a
        configuration no GGUF type holds, or a kernel whose shape does not fit
        its type (the tensor, its shape, the multiple and what would fit).
      stejax.artifacts.ArtifactError: a missing, changed or unlisted artifact file, or an edited manifest.
      FileExistsError: ``out`` exists.
    """
    from gguf import GGUFValueType, GGUFWriter

    target = Path(out)
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"{target} exists; a GGUF export never overwrites a file.")
    weights = _load_source(source, config)
    plan = _plan(weights, ternary, float_type)
    model, cfg = weights.model, weights.config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.gguf-partial-{secrets.token_hex(6)}"
    architecture = gguf_architecture(model)
    writer = GGUFWriter(tmp, architecture)  # general.architecture; every model key below is under its name
    try:
        writer.add_name(f"stejax byte LM ({cfg.name})")
        writer.add_file_type(_file_type([k for k, _, _ in plan.values()]))
        writer.add_quantization_version(2)
        writer.add_context_length(model.context)
        writer.add_embedding_length(model.width)
        writer.add_block_count(model.depth)
        writer.add_feed_forward_length(model.hidden)
        writer.add_head_count(model.heads)
        writer.add_head_count_kv(model.heads)
        writer.add_layer_norm_rms_eps(_rms_eps())
        writer.add_rope_dimension_count(model.width // model.heads)
        writer.add_rope_freq_base(ROPE_BASE)
        writer.add_vocab_size(256)
        writer.add_tokenizer_model("none")
        writer.add_key_value("stejax.configuration", cfg.name, GGUFValueType.STRING)
        writer.add_key_value("stejax.description", cfg.description, GGUFValueType.STRING)
        if cfg.input_block is not None:
            writer.add_key_value("stejax.input_block", cfg.input_block, GGUFValueType.UINT32)
        for gguf, (_, array, raw) in plan.items():
            writer.add_tensor(gguf, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.link(tmp, target)  # fails if target appeared meanwhile: never overwrite
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    kinds = {g: k for g, (k, _, _) in plan.items()}
    block = [g for g in kinds if g.startswith("blk.") and not g.endswith("norm.weight")]
    sizes = gguf_types(model, cfg, ternary=ternary, float_type=float_type)
    n = sum(math.prod(sizes[g][1]) for g in block)
    bits = sum(BITS_PER_WEIGHT[kinds[g]] * math.prod(sizes[g][1]) for g in block) / n
    notes = tuple(input_differences(kinds, cfg))
    return GGUFExport(target, target.stat().st_size, cfg.name, kinds, bits, notes, cfg.input_block, architecture)


def _rms_eps() -> float:
    from stejax.lm._model import RMS_EPS

    return RMS_EPS


def read_gguf(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file dequantised by gguf-py's reader: name -> float32 array in ggml's ``(out, in)``.

    The round trip of :func:`export_gguf`: each block kernel equals stejax's
    dequantised kernel (transposed) up to float16's rounding of the scale; in a
    bitnet file, ``attn_q`` and ``attn_k`` hold its rows in :func:`neox_rows` order.
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    out = {}
    for tensor in reader.tensors:
        shape = tuple(int(s) for s in reversed(tensor.shape))
        values = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        out[tensor.name] = np.asarray(values, np.float32).reshape(shape)
    return out
