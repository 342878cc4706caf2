r"""A decoder-only byte-level transformer written with standard Flax NNX layers.

Every product with a weight is an ``nnx.Linear`` (no bias), so that the model is
quantised by rules (:func:`stejax.flax.quantize_model`) and not by a
hand-quantised copy. Layout of one block (pre-norm), with ``norms="subln"``
(an RMSNorm before *every* linear input, BitNet's "SubLN" placement):

.. math::
    h &= x + W_o\,\mathrm{N}_o(\mathrm{attn}(W_q \mathrm{N}(x), W_k \mathrm{N}(x), W_v \mathrm{N}(x))) \\
    y &= h + W_{down}\,\mathrm{N}_d(\mathrm{silu}(W_{gate} \mathrm{N}'(h)) \odot W_{up} \mathrm{N}'(h))

and with ``norms="llama"`` (llama's computation: no :math:`\mathrm{N}_o`, no
:math:`\mathrm{N}_d`):

.. math::
    h &= x + W_o\,\mathrm{attn}(W_q \mathrm{N}(x), W_k \mathrm{N}(x), W_v \mathrm{N}(x)) \\
    y &= h + W_{down}(\mathrm{silu}(W_{gate} \mathrm{N}'(h)) \odot W_{up} \mathrm{N}'(h))

with causal softmax attention over rotary (or learned) positions, computed with
``jnp.einsum``. The output head is its own ``nnx.Linear`` (``tied=False``) or
the embedding table (``tied=True``, through ``nnx.Embed.attend``). Every
RMSNorm has :data:`RMS_EPS` as its epsilon.

:data:`LLAMA` is the llama-compatible configuration (``norms="llama"``,
rotary, SwiGLU, untied head): ``stejax lm train`` builds it, and it is the one
that exports to GGUF and runs in llama.cpp (:func:`stejax.lm.export_gguf`).
``LMConfig()``'s own default stays ``norms="subln"``, so that every saved
configuration without the field loads as the architecture it was trained with.

Generation keeps a key-value cache (:class:`LayerCache` per block):
:meth:`Transformer.extend` appends new tokens' keys and values and attends over
the cache, so the prefix is never recomputed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "LLAMA",
    "RMS_EPS",
    "SIZES",
    "LMConfig",
    "LayerCache",
    "Transformer",
    "init_cache",
    "lm_size",
    "parameter_count",
    "rotary",
]

VOCAB = 256
# Every RMSNorm's epsilon (nnx.RMSNorm's default); a GGUF file states it as llama.attention.layer_norm_rms_epsilon.
RMS_EPS = 1e-6
NORMS = ("subln", "llama")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The architecture.

    Attributes:
      context: the longest sequence (tokens), for learned positions and the cache.
      width: the model width :math:`d`.
      depth: the number of blocks.
      heads: attention heads; ``width`` must be a multiple.
      hidden: the MLP's hidden width (a multiple of 32, for int4 groups).
      mlp: ``"swiglu"`` or ``"gelu"``.
      positions: ``"rotary"`` or ``"learned"``.
      tied: the output head shares the embedding table.
      norms: ``"subln"``, an RMSNorm before every linear input (BitNet's
        placement, with RMSNorms before the attention output and the MLP's down
        projection), or ``"llama"``, only the two pre-norms of each block
        (llama's computation). The field's default is ``"subln"`` so that
        configurations saved without it load unchanged; new runs use
        :data:`LLAMA`.
    """

    context: int = 128
    width: int = 128
    depth: int = 4
    heads: int = 4
    hidden: int = 352
    mlp: str = "swiglu"
    positions: str = "rotary"
    tied: bool = False
    norms: str = "subln"

    def __post_init__(self) -> None:
        for name in ("context", "width", "depth", "heads", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LMConfig: `{name}` must be an int >= 1; got {value!r}.")
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise ValueError(
                f"LMConfig: `width` ({self.width}) must be a multiple of `heads` ({self.heads}) with an even head "
                "width (rotary positions rotate pairs)."
            )
        if self.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"LMConfig: `mlp` must be 'swiglu' or 'gelu'; got {self.mlp!r}.")
        if self.positions not in ("rotary", "learned"):
            raise ValueError(f"LMConfig: `positions` must be 'rotary' or 'learned'; got {self.positions!r}.")
        if self.norms not in NORMS:
            raise ValueError(f"LMConfig: `norms` must be 'subln' or 'llama'; got {self.norms!r}.")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> LMConfig:
        """A copy with fields changed (checked again)."""
        return dataclasses.replace(self, **changes)


# The llama-compatible architecture that new runs (``stejax lm train``) use: rotary, SwiGLU, no biases, an
# untied head and llama's norm placement; at these widths (multiples of 32) every quantised configuration exports.
LLAMA = LMConfig(context=64, width=64, depth=2, heads=2, hidden=160, norms="llama")


# The named sizes users train on an accelerator: BitNet's SubLN layout (an RMSNorm before every quantised
# linear's input) with the head tied to the embedding, which llama.cpp runs as its bitnet architecture; SwiGLU
# at about 2.5x the width, 64-wide heads (128 at 350M), 256 bytes of context. Widths and hidden widths are
# multiples of 256, so that every quantised linear's rows fill llama.cpp's 256-value TQ2_0 and Q8_K blocks.
SIZES: dict[str, LMConfig] = {
    "25M": LMConfig(context=256, width=512, depth=8, heads=8, hidden=1280, norms="subln", tied=True),
    "100M": LMConfig(context=256, width=1024, depth=8, heads=16, hidden=2816, norms="subln", tied=True),
    "350M": LMConfig(context=256, width=1536, depth=12, heads=12, hidden=4096, norms="subln", tied=True),
}


def lm_size(name: str) -> LMConfig:
    """The architecture of a named size (:data:`SIZES`).

    ======  =====  =====  =====  ======  ============
    size    width  depth  heads  hidden  parameters
    ======  =====  =====  =====  ======  ============
    25M     512    8      8      1280    24.3M
    100M    1024   8      16     2816    103.1M
    350M    1536   12     12     4096    340.2M
    ======  =====  =====  =====  ======  ============

    All three: 256 bytes of context, SubLN norms, SwiGLU, rotary positions,
    the output head tied to the embedding (so that they export to llama.cpp's
    bitnet architecture).

    Raises:
      KeyError: an unknown name (the message lists the sizes).

    Example:
      >>> lm_size("25M").width
      512
    """
    if name not in SIZES:
        raise KeyError(f"unknown LM size {name!r}; expected one of {', '.join(SIZES)}.")
    return SIZES[name]


def parameter_count(config: LMConfig) -> int:
    """The number of parameters of :class:`Transformer` with this architecture, counted without building it.

    Example:
      >>> parameter_count(lm_size("100M"))
      103070720
    """
    d, h = config.width, config.hidden
    attention = 4 * d * d + (d if config.norms == "subln" else 0)
    mlp = (3 if config.mlp == "swiglu" else 2) * d * h + (h if config.norms == "subln" else 0)
    block = attention + mlp + 2 * d
    embeddings = VOCAB * d + (config.context * d if config.positions == "learned" else 0)
    head = 0 if config.tied else d * VOCAB
    return config.depth * block + embeddings + head + d


class LayerCache(NamedTuple):
    """One block's key-value cache."""

    keys: jax.Array  # float32 (batch, context, heads, head_width)
    values: jax.Array  # float32 (batch, context, heads, head_width)


def init_cache(config: LMConfig, batch: int, length: int | None = None) -> tuple[LayerCache, ...]:
    """An empty cache (zeros) for ``batch`` sequences of up to ``length`` tokens (default: ``config.context``).

    Raises:
      ValueError: ``length`` outside ``[1, config.context]``.
    """
    length = config.context if length is None else length
    if not 1 <= length <= config.context:
        raise ValueError(f"init_cache: length must be in [1, {config.context}] (the context); got {length}.")
    shape = (batch, length, config.heads, config.width // config.heads)
    return tuple(LayerCache(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)) for _ in range(config.depth))


def rotary(x: jax.Array, positions: jax.Array) -> jax.Array:
    r"""Rotary position embedding (Su et al. 2021, RoFormer) on ``x`` of shape ``(batch, time, heads, d)``.

    Pairs :math:`(x_{2i}, x_{2i+1})` are rotated by :math:`p\,\theta_i`,
    :math:`\theta_i = 10000^{-2i/d}`, at position :math:`p`.
    """
    d = x.shape[-1]
    theta = 10000.0 ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angle = positions.astype(jnp.float32)[:, None] * theta[None, :]  # (time, d/2)
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    even, odd = x[..., 0::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
    # Rotated in float32, returned in x's dtype (a bfloat16 model's q and k stay bfloat16).
    return jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1).reshape(x.shape).astype(x.dtype)


def _linear(n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)


class Attention(nnx.Module):
    """Causal multi-head self-attention: q, k, v and output projections (``subln``: an RMSNorm before the last)."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        d = config.width
        self.heads = config.heads
        self.subln = config.norms == "subln"
        self.rotary = config.positions == "rotary"
        self.q = _linear(d, d, rngs)
        self.k = _linear(d, d, rngs)
        self.v = _linear(d, d, rngs)
        if config.norms == "subln":
            self.o_norm = nnx.RMSNorm(d, epsilon=RMS_EPS, rngs=rngs)
        self.o = _linear(d, d, rngs)

    def projections(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The queries, keys and values ``(batch, time, width)`` of ``x``: three products, or one where a loader
        has put the three kernels side by side in one layer ``qkv`` (:func:`stejax.lm.load_lowbit`)."""
        if hasattr(self, "qkv"):
            return self.qkv(x)
        return self.q(x), self.k(x), self.v(x)

    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: LayerCache | None, start: Any
    ) -> tuple[jax.Array, LayerCache | None]:
        b, t, d = x.shape
        split = (b, t, self.heads, d // self.heads)
        q, k, v = (p.reshape(split) for p in self.projections(x))
        if self.rotary:
            q, k = rotary(q, positions), rotary(k, positions)
        if cache is None:
            keys, values, key_positions = k, v, positions
        else:
            # A bfloat16 model may keep its cache in bfloat16 (rotary angles are float32: cast back).
            keys = jax.lax.dynamic_update_slice(cache.keys, k.astype(cache.keys.dtype), (0, start, 0, 0))
            values = jax.lax.dynamic_update_slice(cache.values, v.astype(cache.values.dtype), (0, start, 0, 0))
            key_positions = jnp.arange(keys.shape[1])
            cache = LayerCache(keys, values)
        # Scores and softmax in float32 whatever the model's dtype (a bfloat16 model's products accumulate there).
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, keys.astype(q.dtype), preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(d // self.heads)
        # Causal: a query sees keys at its own position and before (empty cache slots lie after).
        visible = key_positions[None, :] <= positions[:, None]
        scores = jnp.where(visible[None, None], scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(values.dtype), values).reshape(b, t, d).astype(x.dtype)
        return self.o(self.o_norm(out) if self.subln else out), cache


class MLP(nnx.Module):
    """SwiGLU (gate, up, down) or GELU (up, down) (``subln``: an RMSNorm before the down projection)."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        d, h = config.width, config.hidden
        self.swiglu = config.mlp == "swiglu"
        self.subln = config.norms == "subln"
        if self.swiglu:
            self.gate = _linear(d, h, rngs)
        self.up = _linear(d, h, rngs)
        if self.subln:
            self.down_norm = nnx.RMSNorm(h, epsilon=RMS_EPS, rngs=rngs)
        self.down = _linear(h, d, rngs)

    def gate_and_up(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """SwiGLU's gate and up projections of ``x``: two products, or one where a loader has put the two
        kernels side by side in one layer ``gate_up`` (:func:`stejax.lm.load_lowbit`)."""
        if hasattr(self, "gate_up"):
            return self.gate_up(x)
        return self.gate(x), self.up(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.swiglu:
            gate, up = self.gate_and_up(x)
            u = jax.nn.silu(gate) * up
        else:
            u = jax.nn.gelu(self.up(x))
        return self.down(self.down_norm(u) if self.subln else u)


class Block(nnx.Module):
    """One pre-norm transformer block."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(config.width, epsilon=RMS_EPS, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(config.width, epsilon=RMS_EPS, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: LayerCache | None, start: Any
    ) -> tuple[jax.Array, LayerCache | None]:
        a, cache = self.attn(self.attn_norm(x), positions, cache, start)
        h = x + a
        return h + self.mlp(self.mlp_norm(h)), cache


class Transformer(nnx.Module):
    """The byte-level language model: embedding, blocks, final RMSNorm, output head.

    Args:
      config: the architecture.
      rngs: ``nnx.Rngs`` with a ``params`` stream (a key from
        :func:`stejax.keys.split`).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.lm import LMConfig, Transformer
      >>> model = Transformer(LMConfig(context=16, width=32, depth=1, heads=2, hidden=64), rngs=nnx.Rngs(0))
      >>> model(jnp.zeros((2, 16), jnp.uint8)).shape
      (2, 16, 256)
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(VOCAB, config.width, rngs=rngs)
        if config.positions == "learned":
            self.position = nnx.Embed(config.context, config.width, rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.depth)])
        self.final_norm = nnx.RMSNorm(config.width, epsilon=RMS_EPS, rngs=rngs)
        if not config.tied:
            self.head = _linear(config.width, VOCAB, rngs)

    def _run(
        self, tokens: jax.Array, start: Any, cache: tuple[LayerCache, ...] | None
    ) -> tuple[jax.Array, tuple[LayerCache, ...] | None]:
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"Transformer: tokens must be an integer array (batch, time); got {tokens.dtype} {tokens.shape}."
            )
        if tokens.shape[1] > self.config.context:
            raise ValueError(
                f"Transformer: {tokens.shape[1]} tokens exceed the context of {self.config.context}; "
                "expected at most that many."
            )
        positions = start + jnp.arange(tokens.shape[1])
        # In the table's dtype (nnx.Embed returns float32 from a bfloat16 table): a bfloat16 model runs in bfloat16.
        x = self.embed(tokens.astype(jnp.int32)).astype(self.embed.embedding[...].dtype)
        if self.config.positions == "learned":
            x = x + self.position(positions)
        new_cache: list[LayerCache] = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, positions, None if cache is None else cache[i], start)
            if layer_cache is not None:
                new_cache.append(layer_cache)
        x = self.final_norm(x)
        logits = self.embed.attend(x) if self.config.tied else self.head(x)
        return logits.astype(jnp.float32), (None if cache is None else tuple(new_cache))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``(batch, time, 256)`` (float32) for byte tokens ``(batch, time)``, positions from 0."""
        return self._run(tokens, 0, None)[0]

    def extend(
        self, tokens: jax.Array, cache: tuple[LayerCache, ...], start: Any
    ) -> tuple[jax.Array, tuple[LayerCache, ...]]:
        """Logits for ``tokens`` at positions ``start, start+1, ...`` given the cache of the earlier ones.

        Returns the logits and the cache with these tokens' keys and values
        written at their positions. ``start + time`` must not exceed the context.
        """
        logits, new_cache = self._run(tokens, start, cache)
        assert new_cache is not None
        return logits, new_cache
