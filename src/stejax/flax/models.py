"""Small float NNX models written as users write them, for tests, docs and benchmarks of quantize_model.

None of them imports stejax: each is plain Flax NNX, so quantising it by rules
shows what rules do to code that knows nothing about quantisation.

* :class:`DigitsCNN`: two ``nnx.Conv`` and one ``nnx.Linear`` on 8x8 digits.
* :class:`AttentionBlock`: a pre-norm transformer block with ``nnx.MultiHeadAttention``.
* :class:`EinsumAttentionBlock`: the same block with the attention written by hand with ``jnp.einsum``.
* :class:`TiedLM`: an ``nnx.Embed``, one block and a tied output head (``embed.attend``).
* :class:`ConvDecoder`: an ``nnx.Conv`` down and an ``nnx.ConvTranspose`` back up, 8x8 images to 8x8 images.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["AttentionBlock", "ConvDecoder", "DigitsCNN", "EinsumAttentionBlock", "TiedLM"]


class DigitsCNN(nnx.Module):
    """3x3 convolutions (16, then 32 channels at stride 2), ReLU, one dense layer: flat 8x8 images to 10 logits.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> DigitsCNN(rngs=nnx.Rngs(0))(jnp.zeros((2, 64))).shape
      (2, 10)
    """

    def __init__(self, channels: tuple[int, int] = (16, 32), *, dtype: Any = None, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=dtype or jnp.float32, rngs=rngs)
        self.conv1 = nnx.Conv(1, channels[0], (3, 3), padding="SAME", **kw)
        self.conv2 = nnx.Conv(channels[0], channels[1], (3, 3), strides=2, padding="SAME", **kw)
        self.head = nnx.Linear(4 * 4 * channels[1], 10, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = jnp.reshape(x, (x.shape[0], 8, 8, 1))
        z = jax.nn.relu(self.conv1(z))
        z = jax.nn.relu(self.conv2(z))
        return self.head(jnp.reshape(z, (z.shape[0], -1)))


class _MLP(nnx.Module):
    def __init__(self, d: int, hidden: int, *, dtype: Any, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=dtype or jnp.float32, rngs=rngs)
        self.fc1 = nnx.Linear(d, hidden, **kw)
        self.fc2 = nnx.Linear(hidden, d, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x)))


class AttentionBlock(nnx.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``, with ``nnx.MultiHeadAttention`` (no mask, no dropout)."""

    def __init__(self, d: int = 32, heads: int = 4, hidden: int = 64, *, dtype: Any = None, rngs: nnx.Rngs):
        pd = dtype or jnp.float32
        self.norm1 = nnx.LayerNorm(d, dtype=dtype, param_dtype=pd, rngs=rngs)
        self.attn: nnx.Module = nnx.MultiHeadAttention(
            num_heads=heads, in_features=d, decode=False, dtype=dtype, param_dtype=pd, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(d, dtype=dtype, param_dtype=pd, rngs=rngs)
        self.mlp = _MLP(d, hidden, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _EinsumAttention(nnx.Module):
    def __init__(self, d: int, heads: int, *, dtype: Any, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=dtype or jnp.float32, rngs=rngs)
        self.heads = heads
        self.qkv = nnx.Linear(d, 3 * d, **kw)
        self.out = nnx.Linear(d, d, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = jnp.split(jnp.reshape(self.qkv(x), (b, t, 3, self.heads, d // self.heads)), 3, axis=2)
        q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]
        q = q / jnp.asarray(math.sqrt(d // self.heads), q.dtype)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        p = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v)
        return self.out(jnp.reshape(o, (b, t, d)))


class EinsumAttentionBlock(AttentionBlock):
    """:class:`AttentionBlock` with the attention written by hand: two ``jnp.einsum`` s in the module's own code."""

    def __init__(self, d: int = 32, heads: int = 4, hidden: int = 64, *, dtype: Any = None, rngs: nnx.Rngs):
        super().__init__(d, heads, hidden, dtype=dtype, rngs=rngs)
        self.attn = _EinsumAttention(d, heads, dtype=dtype, rngs=rngs)


class TiedLM(nnx.Module):
    """Tokens to logits: ``nnx.Embed``, an :class:`EinsumAttentionBlock`, a norm, and the embedding as the head."""

    def __init__(self, vocab: int = 50, d: int = 32, *, dtype: Any = None, rngs: nnx.Rngs):
        pd = dtype or jnp.float32
        self.embed = nnx.Embed(vocab, d, dtype=dtype, param_dtype=pd, rngs=rngs)
        self.block = EinsumAttentionBlock(d, dtype=dtype, rngs=rngs)
        self.norm = nnx.LayerNorm(d, dtype=dtype, param_dtype=pd, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.embed.attend(self.norm(self.block(self.embed(tokens))))


class ConvDecoder(nnx.Module):
    """A 3x3 ``nnx.Conv`` at stride 2 (8x8 to 4x4), ReLU, a 3x3 ``nnx.ConvTranspose`` at stride 2 back to 8x8.

    ``transpose_kernel=True`` (the default here) stores the transposed kernel as
    ``(3, 3, out, in)``, the layout of the convolution it is the gradient of.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> ConvDecoder(rngs=nnx.Rngs(0))(jnp.zeros((2, 8, 8, 1))).shape
      (2, 8, 8, 1)
    """

    def __init__(self, channels: int = 8, *, transpose_kernel: bool = True, dtype: Any = None, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=dtype or jnp.float32, rngs=rngs)
        self.down = nnx.Conv(1, channels, (3, 3), strides=2, padding="SAME", **kw)
        self.up = nnx.ConvTranspose(
            channels, 1, (3, 3), strides=2, padding="SAME", transpose_kernel=transpose_kernel, **kw
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.up(jax.nn.relu(self.down(x)))
