r"""GPTQ: one linear layer's weights rounded one input feature at a time, each rounding error compensated.

For a kernel :math:`W` of shape ``(in, out)`` (``y = x W``) and calibration
inputs :math:`X` of shape ``(n, in)``, GPTQ minimises :math:`\|XW - X\hat W\|_F^2`
greedily. With the Hessian of that objective

.. math::

   H = \tfrac{2}{n} X^\top X + \lambda I, \qquad \lambda = \text{damp} \cdot \operatorname{mean}(\operatorname{diag} H),

and :math:`U` the upper Cholesky factor of :math:`H^{-1}` (:math:`H^{-1} = U^\top U`),
input feature :math:`i` (row :math:`i` of :math:`W`) is rounded to the grid and the
error is spread over the features not yet rounded:

.. math::

   \hat w_i = Q(w_i), \qquad e = (w_i - \hat w_i) / U_{ii}, \qquad
   w_j \leftarrow w_j - U_{ij}\, e \quad (j > i).

That is Algorithm 1 of Frantar et al. Rows are processed in blocks (lazy
batch updates): the rows of a block are updated at once by the rows before them
in the block, and the rows after the block once per block; the result is the
same, up to float rounding, as updating every row after each rounding.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["GPTQResult", "gptq", "hessian", "round_to_nearest", "symmetric_grid"]

_HIGHEST = jax.lax.Precision.HIGHEST
_TINY = float(np.finfo(np.float32).tiny)


class GPTQResult(NamedTuple):
    """A kernel on the grid: its integer codes and the scales that map them back."""

    codes: jax.Array  # (in, out) int8: integers in [-q_max, q_max]
    scales: jax.Array  # (in // group, out) float32; (1, out) per output channel
    kernel: jax.Array  # (in, out) float32: codes * scales, each row by its group's scale


def _check_bits(bits: int, where: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"{where}: bits must be an int in [2, 8]; got {bits!r}.")
    return bits


def _check_kernel(kernel: ArrayLike, where: str, group: int | None) -> jax.Array:
    w = jnp.asarray(kernel)
    if w.ndim != 2 or not jnp.issubdtype(w.dtype, jnp.floating):
        raise ValueError(f"{where}: the kernel must be a floating (in, out) matrix; got {w.dtype} {tuple(w.shape)}.")
    if group is not None:
        if isinstance(group, bool) or not isinstance(group, int) or group < 1 or w.shape[0] % group:
            raise ValueError(
                f"{where}: group must be a positive int that divides the kernel's input features ({w.shape[0]}); "
                f"got {group!r}."
            )
    return w.astype(jnp.float32)


def _scale(rows: jax.Array, q_max: int) -> jax.Array:
    return _scale_by(rows, np.float32(1.0 / q_max))


def _scale_by(rows: jax.Array, reciprocal: ArrayLike) -> jax.Array:
    # As stejax.absmax_scale: max|w| times fl(1/q_max), floored at the smallest normal float.
    return jnp.maximum(jnp.max(jnp.abs(rows), axis=0) * reciprocal, np.float32(_TINY))


def _round(w: jax.Array, scale: jax.Array, q_max: ArrayLike) -> jax.Array:
    # As fake_quant: a product by the reciprocal, ties to even; clipped to the symmetric range.
    q = jnp.asarray(q_max)
    return jnp.clip(jnp.round(w * (np.float32(1.0) / scale)), -q, q)


def symmetric_grid(kernel: ArrayLike, *, bits: int, group: int | None = None) -> jax.Array:
    r"""The absmax scales of a kernel ``(in, out)``: per output channel, or per group of ``group`` input features.

    :math:`s = \max|w| \cdot \operatorname{fl}(1/q_{\max})`, :math:`q_{\max} = 2^{b-1}-1`,
    over each output channel's ``in`` weights (``group=None``) or each run of
    ``group`` consecutive input features, as :func:`stejax.absmax_scale` and
    the dynamic weight quantiser of :class:`stejax.flax.Quant` compute it.

    Returns:
      float32 scales of shape ``(in // group, out)`` (``(1, out)`` per channel).

    Example:
      >>> import jax.numpy as jnp
      >>> symmetric_grid(jnp.array([[7.0, -1.0], [0.5, 0.25]]), bits=4).tolist()
      [[1.0, 0.1428571492433548]]
    """
    bits = _check_bits(bits, "symmetric_grid")
    w = _check_kernel(kernel, "symmetric_grid", group)
    g = w.shape[0] if group is None else group
    return _scale(w.reshape(w.shape[0] // g, g, w.shape[1]).transpose(1, 0, 2), 2 ** (bits - 1) - 1)


def _expand(scales: jax.Array, n_in: int) -> jax.Array:
    return jnp.repeat(scales, n_in // scales.shape[0], axis=0)


def round_to_nearest(kernel: ArrayLike, *, bits: int, group: int | None = None) -> GPTQResult:
    r"""Round-to-nearest on the grid of :func:`symmetric_grid`: the baseline GPTQ improves on.

    :math:`q = \operatorname{clip}(\operatorname{round}(w \cdot \operatorname{fl}(1/s)), -q_{\max}, q_{\max})`
    (ties to even), :math:`\hat w = q s`: the same codes as the dynamic
    absmax weight quantiser of :class:`stejax.flax.Quant` gives.

    Example:
      >>> import jax.numpy as jnp
      >>> round_to_nearest(jnp.array([[7.0, -1.0], [0.5, 0.25]]), bits=4).codes.tolist()
      [[7, -7], [0, 2]]
    """
    bits = _check_bits(bits, "round_to_nearest")
    w = _check_kernel(kernel, "round_to_nearest", group)
    q_max = 2 ** (bits - 1) - 1
    scales = symmetric_grid(w, bits=bits, group=group)
    s = _expand(scales, w.shape[0])
    codes = _round(w, s, q_max)
    return GPTQResult(codes.astype(jnp.int8), scales, codes * s)


def hessian(inputs: ArrayLike) -> jax.Array:
    r""":math:`H = \tfrac{2}{n} X^\top X` in float32 for inputs ``(..., in)``, every leading axis a sample.

    Example:
      >>> import jax.numpy as jnp
      >>> hessian(jnp.array([[1.0, 0.0], [1.0, 2.0]])).tolist()
      [[2.0, 2.0], [2.0, 4.0]]
    """
    x = jnp.asarray(inputs)
    if x.ndim < 1 or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"hessian: inputs must be a floating array (..., in); got {x.dtype} {tuple(x.shape)}.")
    x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    return _gram(x) * np.float32(2.0 / max(x.shape[0], 1))


@jax.jit
def _gram(x: jax.Array) -> jax.Array:
    return jnp.matmul(x.T, x, precision=_HIGHEST)


def gptq(
    kernel: ArrayLike,
    inputs: ArrayLike | None = None,
    *,
    bits: int,
    group: int | None = None,
    act_order: bool = False,
    damp: float = 0.01,
    block_size: int | None = 128,
    hessian_matrix: ArrayLike | None = None,
    name: str = "kernel",
) -> GPTQResult:
    r"""GPTQ for one linear layer: the kernel ``(in, out)`` on the symmetric absmax int-``bits`` grid.

    Minimises :math:`\|XW - X\hat W\|^2` on the calibration inputs greedily, one
    input feature at a time (module docstring): :math:`H = \tfrac2n X^\top X`
    in float32, ``damp * mean(diag H)`` added to its diagonal, :math:`H^{-1}`
    from its Cholesky factor, then the upper Cholesky factor of
    :math:`H^{-1}` drives the compensation.

    **The grid** is :func:`symmetric_grid`'s: one scale per output channel, or
    per group of ``group`` consecutive input features, codes in
    :math:`[-q_{\max}, q_{\max}]`, the values the dynamic absmax weight
    quantiser of :class:`stejax.flax.Quant` (``fake_quant``) represents. The code
    :math:`-q_{\max}-1` is left out: absmax scales never produce it, and a kernel
    holding it would get a larger scale when quantised again.

    **Scales.** Per channel: from the kernel as given, before any
    compensation (as the reference implementation). Per group, in input-feature
    order: computed when the group's first feature is reached, from the group's
    weights with every compensation so far applied. (The reference reads them
    from the matrix as it stood when the lazy block began; the two agree when a
    group begins a block, as with ``group = block_size = 128``; the block
    size here is rounded up to a multiple of ``group`` so that no group
    straddles a block.) With ``act_order`` and groups: the groups stay runs of
    consecutive features in the original order, and their scales are
    computed before any rounding from the kernel as given (the reference
    implementation's ``static_groups``), so the result is stored as any
    grouped kernel is.

    **Act-order**: the features are processed in decreasing :math:`\operatorname{diag} H`
    (stable order among ties); codes and scales are returned in the original order.

    Unlike the reference implementation, a feature that never occurs (a zero
    column of ``X``) is not zeroed: the dampening keeps :math:`H` positive
    definite. With ``damp=0`` such an :math:`H` is singular, and that is an error.

    Args:
      kernel: the weights, ``(in, out)``, floating.
      inputs: calibration inputs ``(..., in)``; every leading axis is a sample.
        Give this or ``hessian_matrix``.
      bits: the code width, an int in [2, 8].
      group: one scale per this many consecutive input features (dividing
        ``in``), or None for one per output channel.
      act_order: process features in decreasing ``diag(H)``.
      damp: the dampening, a fraction of the mean diagonal (default 0.01).
      block_size: rows per lazy block update (default 128); None: one block.
      hessian_matrix: :math:`\tfrac2n X^\top X` (:func:`hessian`) instead of ``inputs``.
      name: the layer's name (its path), for error messages.

    Returns:
      A :class:`GPTQResult`: int8 codes ``(in, out)``, float32 scales
      ``(in // group, out)`` (``(1, out)`` per channel), and the float32 kernel
      ``codes * scales``.

    Raises:
      ValueError: a kernel that is not a floating matrix, ``bits`` out of
        range, a ``group`` that does not divide ``in``, inputs of the wrong
        width, a negative ``damp``, or a Hessian that is not positive definite
        after dampening (the message names the layer and the dampening).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> w = jax.random.normal(jax.random.key(0), (16, 4))
      >>> x = jax.random.normal(jax.random.key(1), (64, 16))
      >>> out = gptq(w, x, bits=4)
      >>> err = lambda k: float(jnp.sum((x @ w - x @ k) ** 2))
      >>> err(out.kernel) < err(round_to_nearest(w, bits=4).kernel)
      True

    Reference:
      E. Frantar, S. Ashkboos, T. Hoefler, D. Alistarh, "GPTQ: Accurate
      Post-Training Quantization for Generative Pre-trained Transformers",
      ICLR 2023 (arXiv:2210.17323, 2022).
    """
    where = f"gptq({name!r})"
    bits = _check_bits(bits, where)
    w = _check_kernel(kernel, where, group)
    n_in = w.shape[0]
    if (inputs is None) == (hessian_matrix is None):
        raise ValueError(f"{where}: give inputs or hessian_matrix, one of them.")
    if hessian_matrix is not None:
        h = jnp.asarray(hessian_matrix, jnp.float32)
        if h.shape != (n_in, n_in):
            raise ValueError(f"{where}: hessian_matrix must be ({n_in}, {n_in}); got {tuple(h.shape)}.")
    else:
        x = jnp.asarray(inputs)
        if x.ndim < 1 or x.shape[-1] != n_in:
            raise ValueError(f"{where}: inputs must be (..., {n_in}) for a kernel {tuple(w.shape)}; got {x.shape}.")
        h = hessian(x)
    if not (isinstance(damp, (int, float)) and not isinstance(damp, bool) and damp >= 0 and math.isfinite(damp)):
        raise ValueError(f"{where}: damp must be a finite number >= 0; got {damp!r}.")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"{where}: block_size must be a positive int or None; got {block_size!r}.")
    block = n_in if block_size is None else min(block_size, n_in)
    if group is not None and not act_order:
        block = -(-block // group) * group  # a group never straddles a block
    q_max = 2 ** (bits - 1) - 1
    # q_max and fl(1/q_max) are arguments, not constants: one program serves every bit width.
    codes, scales, ok = _gptq(
        w,
        h,
        np.float32(damp),
        np.float32(q_max),
        np.float32(1.0 / q_max),
        group=group,
        act_order=bool(act_order),
        block=block,
    )
    if not bool(ok):
        raise ValueError(
            f"{where}: the Hessian 2/n X^T X is not positive definite after dampening (damp={damp} of the mean "
            "diagonal added to the diagonal); its Cholesky factorisation failed. Raise damp, or give calibration "
            "inputs that span every input feature."
        )
    kernel_q = codes * _expand(scales, n_in)
    return GPTQResult(codes.astype(jnp.int8), scales, kernel_q)


@functools.partial(jax.jit, static_argnames=("group", "act_order", "block"))
def _gptq(
    w: jax.Array,
    h: jax.Array,
    damp: jax.Array,
    q_max: jax.Array,
    reciprocal: jax.Array,
    *,
    group: int | None,
    act_order: bool,
    block: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    n_in, n_out = w.shape
    g = n_in if group is None else group
    n_groups = n_in // g
    diag = jnp.diagonal(h)
    perm = jnp.argsort(-diag, stable=True) if act_order else jnp.arange(n_in)
    # Scales fixed before any rounding: per channel always; per group with act-order (static groups).
    fixed = group is None or act_order
    scales = _scale_by(w.reshape(n_groups, g, n_out).transpose(1, 0, 2), reciprocal)
    wp = w[perm]
    hp = h[perm][:, perm]
    hp = hp + jnp.eye(n_in, dtype=jnp.float32) * (damp * jnp.mean(diag))
    lower = jnp.linalg.cholesky(hp)
    h_inv = jax.scipy.linalg.cho_solve((lower, True), jnp.eye(n_in, dtype=jnp.float32))
    u = jnp.linalg.cholesky(h_inv, upper=True)
    ok = jnp.all(jnp.isfinite(lower)) & jnp.all(jnp.isfinite(u))
    group_of = perm // g  # the group of the feature processed at each position

    codes = jnp.zeros((n_in, n_out), jnp.float32)
    for b0 in range(0, n_in, block):
        b1 = min(b0 + block, n_in)
        u1 = u[b0:b1, b0:b1]

        def step(i, state, b0=b0, u1=u1):
            w1, err1, codes, scales = state
            row = w1[i]
            k = group_of[b0 + i]
            if not fixed:  # a group's scale, when its first feature is reached, from its current weights
                start = jax.lax.dynamic_slice_in_dim(w1, i, g, axis=0)
                fresh = _scale_by(start, reciprocal)
                scales = scales.at[k].set(jnp.where((b0 + i) % g == 0, fresh, scales[k]))
            s = scales[k]
            q = _round(row, s, q_max)
            e = (row - q * s) / u1[i, i]
            w1 = w1 - u1[i][:, None] * e[None, :]
            return w1, err1.at[i].set(e), codes.at[b0 + i].set(q), scales

        w1 = wp[b0:b1]
        err1 = jnp.zeros_like(w1)
        w1, err1, codes, scales = jax.lax.fori_loop(0, b1 - b0, step, (w1, err1, codes, scales))
        if b1 < n_in:
            wp = wp.at[b1:].add(-jnp.matmul(u[b0:b1, b1:].T, err1, precision=_HIGHEST))
    inverse = jnp.argsort(perm)
    return codes[inverse], scales, ok
