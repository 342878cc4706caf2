r"""The language model's quantisers: integer weights and absmax activations (per token or per block), STE or not.

Each is a plain function ``f(x) -> y`` of the same shape and dtype, made from
catalog estimators (:func:`stejax.round_ste`, :func:`stejax.absmean_ternary`),
so a rule can hand it to a layer. Scales are computed from the current values
under ``stop_gradient`` (dynamic, never trained).

* weights, :math:`b` bits, symmetric: :math:`s = \max|w| / q_{\max}` per output
  channel (the kernel ``(in, out)``'s last axis) or per group of :math:`g` along
  the contraction axis; :math:`\hat w = s\,\operatorname{clip}(\operatorname{round}(w/s),
  -q_{\max}-1, q_{\max})`, :math:`q_{\max} = 2^{b-1}-1` (for 2 bits the scale is
  :math:`\max|w|/1.5` so that the four codes -2..1 cover the range).
* activations, per token (each row over its last axis), as BitNet's
  ``activation_quant``: :math:`s = q_{\max} / \max(\max|x|, 10^{-5})`,
  :math:`\hat x = \operatorname{clip}(\operatorname{round}(x s), -q_{\max}-1, q_{\max}) / s`.
* activations, per block of 32 or 256 values along the last axis, 8 bits, as
  llama.cpp quantises a quantised product's input (Q8_0 and Q8_K): with
  :math:`m` the block's :math:`\max|x|` and :math:`i = 127/m` (0 where
  :math:`m = 0`), the codes are :math:`\operatorname{round}(x\,i)` (ties to
  even) and :math:`\hat x = \operatorname{round}(x\,i)\,d`, where :math:`d` is
  :math:`m/127` rounded to float16 for blocks of 32 (Q8_0) and :math:`1/i` in
  float32 for blocks of 256 (Q8_K).

Gradients (``ste=True``): the straight-through estimator through the rounding,
nothing through the scale. Where the clip can never act, that is the identity,
:math:`\partial \hat x / \partial x = 1`, and it is declared as such (one
``stejax.surrogate`` per quantiser whose declared derivative is 1, so forward
and reverse mode both pass the tangent as it is): per-token and per-block absmax activations
(:math:`|x s| \le q_{\max}`, :math:`|x\,i| \le 127`), and
per-channel or per-group absmax weights at 8 and 4 bits
(:math:`|w/s| \le q_{\max}`, inside :math:`[-q_{\max}-1, q_{\max}]`). The
composed form (``round_ste``, then ``jnp.clip``'s mask, then the two scale
products) computes the same gradient up to the rounding of :math:`s \cdot
(1/s)`, except at a code equal to :math:`q_{\max}` (each channel's, group's or
token's largest positive value), where ``jnp.clip`` (a minimum) splits the tie
and passes half (tested); its backward pass also recomputes the rounding and
the clip's compares (116 compares against 28 in the LM's compiled w8a8 step). At 2
bits the clip acts (the code 2 is clipped to 1) and the composed form is kept,
so the gradient there is zero where the clip acts (and half on either bound).
``ste=False``: the rounding's
true derivative, zero almost everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from stejax.estimators._core import surrogate
from stejax.estimators.absmean import absmean_ternary
from stejax.estimators.rounding import round_ste

__all__ = ["LLAMACPP_BLOCKS", "activation_quantiser", "weight_codes", "weight_quantiser", "weight_scale"]

Quantiser = Callable[[jax.Array], jax.Array]


def _round(ste: bool) -> Quantiser:
    # Without an STE the rounding's true derivative (zero almost everywhere) is used.
    return round_ste if ste else jnp.round


def weight_scale(w: jax.Array, bits: int, group: int | None) -> jax.Array:
    """The per-channel (``group=None``) or per-group scale of a kernel ``(in, out)``, broadcastable to it."""
    a = jnp.abs(w)
    if group is None:
        m = jnp.max(a, axis=0, keepdims=True)
    else:
        n_in, n_out = w.shape
        if n_in % group:
            raise ValueError(f"weight_scale: group {group} does not divide the contraction axis of {w.shape}.")
        m = jnp.repeat(jnp.max(a.reshape(n_in // group, group, n_out), axis=1), group, axis=0)
    top = 1.5 if bits == 2 else 2 ** (bits - 1) - 1
    # A product by the constant 1/top, for the reason weight_codes gives.
    return jnp.maximum(m, 1e-8) * (1.0 / top)


def weight_codes(w: jax.Array, s: jax.Array, bits: int, ste: bool = True) -> jax.Array:
    """``clip(round(w * (1/s)), -2**(bits-1), 2**(bits-1) - 1)``: the integer codes, as floats.

    A product by the reciprocal, not a division: XLA rewrites ``w / broadcast(s)``
    into that product under jit but not op by op, and ties at .5 would then round
    differently in the exported codes and in the trained model.
    """
    return jnp.clip(_round(ste)(w * (1 / s)), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _straight_through(forward: Quantiser) -> Quantiser:
    """``forward`` with the identity as its declared derivative, through the factory (so jvp works too)."""
    return surrogate(forward, jnp.ones_like, name=getattr(forward, "__name__", "straight_through"))


def _int_weights(w: jax.Array, *, bits: int, group: int | None, ste: bool) -> jax.Array:
    s = jax.lax.stop_gradient(weight_scale(w, bits, group))
    return weight_codes(w, s, bits, ste) * s


def weight_quantiser(bits: float, *, group: int | None = None, ste: bool = True) -> Quantiser:
    """The weight quantiser for ``bits`` (8, 4, 2; 1.58 for BitNet's absmean ternary).

    In the example each group of two rows has its own scale per column
    (7/7 and 1/7 in the first; -3.5 is a tie and rounds to the even code -4).

    Example:
      >>> import jax.numpy as jnp
      >>> q = weight_quantiser(4, group=2)
      >>> q(jnp.array([[7.0, 1.0], [-3.5, 0.2], [1.0, 1.0], [0.5, 0.0]]))
      Array([[ 7.        ,  1.        ],
             [-4.        ,  0.14285715],
             [ 1.        ,  1.        ],
             [ 0.42857146,  0.        ]], dtype=float32)
    """
    if bits == 1.58:
        if not ste:
            raise ValueError("weight_quantiser: ternary weights without an STE are not a configuration.")
        return absmean_ternary
    if bits not in (2, 4, 8):
        raise ValueError(f"weight_quantiser: bits must be 8, 4, 2 or 1.58; got {bits!r}.")
    f: Quantiser = functools.partial(_int_weights, bits=int(bits), group=group, ste=ste)
    if ste and bits in (4, 8):  # the clip never acts: the STE is the identity (module docstring)
        f = _straight_through(functools.partial(_int_weights, bits=int(bits), group=group, ste=False))
    f.__name__ = f"int{int(bits)}_weights" + (f"_g{group}" if group else "_per_channel") + ("" if ste else "_no_ste")
    return f


def _per_token(x: jax.Array, *, bits: int, ste: bool) -> jax.Array:
    top = 2 ** (bits - 1) - 1
    s = jax.lax.stop_gradient(top / jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-5))
    return jnp.clip(_round(ste)(x * s), -top - 1, top) / s


def _per_block(x: jax.Array, *, block: int, ste: bool) -> jax.Array:
    # llama.cpp quantises float32 inputs: a narrower input is widened, the result narrowed back.
    n = x.shape[-1] if x.ndim else 0
    if n == 0 or n % block:
        raise ValueError(
            f"activation_quantiser: block {block} does not divide the last axis of an input of shape {x.shape}; "
            f"expected a multiple of {block}."
        )
    v = x.astype(jnp.float32).reshape(*x.shape[:-1], n // block, block)
    m = jax.lax.stop_gradient(jnp.max(jnp.abs(v), axis=-1, keepdims=True))
    # i = 127/m as llama.cpp computes it (a float32 quotient, 0 for an all-zero block); |v i| <= 127, so no clip.
    i = jnp.where(m > 0, 127.0 / jnp.where(m > 0, m, 1.0), 0.0)
    if block == 32:  # Q8_0: d = m/127 stored as float16
        d = (m / 127.0).astype(jnp.float16).astype(jnp.float32)
    else:  # Q8_K: d = 1/i in float32
        d = jnp.where(m > 0, 1.0 / jnp.where(m > 0, i, 1.0), 0.0)
    return (_round(ste)(v * i) * d).reshape(x.shape).astype(x.dtype)


LLAMACPP_BLOCKS: dict[int, str] = {32: "Q8_0", 256: "Q8_K"}  # block -> llama.cpp's type for a product's input


@functools.cache  # one function per setting: models quantised alike compare equal and share compiled programs
def activation_quantiser(bits: int, *, block: int | None = None, ste: bool = True) -> Quantiser:
    r"""Absmax activations at ``bits``: one scale per token, or per block of ``block`` values as llama.cpp.

    Args:
      bits: 8 or 4 per token; 8 per block.
      block: ``None``: one scale per token (each row over its last axis),
        BitNet's ``activation_quant``: :math:`s = q_{\max} / \max(\max|x|, 10^{-5})`,
        :math:`\hat x = \operatorname{clip}(\operatorname{round}(x s), -q_{\max}-1, q_{\max}) / s`.
        ``32`` or ``256``: one scale per block of that many consecutive values
        of the last axis, as llama.cpp quantises the input of a quantised
        product (Q8_0 for Q8_0 and Q4_0 weights, Q8_K for TQ1_0 and TQ2_0):
        :math:`i = 127/\max|x_{\text{block}}|` (0 for an all-zero block),
        :math:`\hat x = \operatorname{round}(x\,i)\,d` with ties to even,
        :math:`d = \operatorname{fp16}(\max|x_{\text{block}}|/127)` for 32 (Q8_0)
        and :math:`d = 1/i` in float32 for 256 (Q8_K). The last axis must be a
        multiple of ``block``.
      ste: the straight-through gradient (declared derivative 1: the codes lie in
        :math:`[-q_{\max}, q_{\max}]`, so the clip never acts); ``False``: the
        rounding's true derivative, zero almost everywhere.

    The same settings give the same function object.

    Per block, a float16 or bfloat16 input is quantised in float32 (llama.cpp's
    input type) and the result cast back to the input's dtype. The scale is
    computed under ``stop_gradient``.

    Example:
      >>> import jax.numpy as jnp
      >>> activation_quantiser(8)(jnp.array([[1.0, -0.5, 0.001]]))
      Array([[ 1.      , -0.503937,  0.      ]], dtype=float32)

      Per block of 32 each block has its own scale, rounded to float16: 1.0 is
      code 127 times float16(1/127); in the second block 0.004 is code 51 of
      0.01's 127, where one scale for the whole row would make it code 1 (0.0079):

      >>> x = jnp.zeros((1, 64)).at[0, 0].set(1.0).at[0, 32].set(0.01).at[0, 33].set(0.004)
      >>> y = activation_quantiser(8, block=32)(x)
      >>> print(y[0, 0], y[0, 32], y[0, 33])
      0.99993896 0.009999692 0.0040156245
    """
    if block is None:
        if bits not in (4, 8):
            raise ValueError(f"activation_quantiser: bits must be 8 or 4; got {bits!r}.")
        f: Quantiser = functools.partial(_per_token, bits=int(bits), ste=ste)
        if ste:  # |x s| <= top: the clip never acts, the STE is the identity (module docstring)
            f = _straight_through(functools.partial(_per_token, bits=int(bits), ste=False))
        f.__name__ = f"int{bits}_per_token" + ("" if ste else "_no_ste")
        return f
    if block not in LLAMACPP_BLOCKS:
        raise ValueError(
            f"activation_quantiser: block must be 32 (llama.cpp's Q8_0) or 256 (Q8_K), or None (per token); "
            f"got {block!r}."
        )
    if bits != 8:
        raise ValueError(
            f"activation_quantiser: blocks of {block} are llama.cpp's 8-bit inputs; bits must be 8, got {bits!r}."
        )
    q: Quantiser = functools.partial(_per_block, block=block, ste=ste)
    if ste:  # |x i| <= 127: no clip, the STE is the identity (module docstring)
        q = _straight_through(functools.partial(_per_block, block=block, ste=False))
    q.__name__ = f"int8_per_block{block}_{LLAMACPP_BLOCKS[block].lower()}" + ("" if ste else "_no_ste")
    return q
