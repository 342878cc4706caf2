"""The optional entropy (diversity) term of a codebook's loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

__all__ = ["entropy_loss"]


def entropy_loss(logits: ArrayLike, *, diversity_weight: float = 1.0) -> jax.Array:
    r"""Per-sample entropy minus the weighted entropy of the batch-average distribution.

    With :math:`p = \operatorname{softmax}(\ell)` over the last axis (codes) and
    :math:`\bar p` the mean of :math:`p` over all other axes,

    .. math::
       \mathcal{L} = \operatorname{mean}_n H(p_n) - \lambda\, H(\bar p),\qquad H(p) = -\sum_k p_k \log p_k .

    Low when each vector is confident and the batch spreads over the codes
    (:math:`\lambda` = ``diversity_weight``). For a codebook use
    ``logits = -distances / temperature``.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import entropy_loss
      >>> confident_and_diverse = jnp.array([[20.0, 0.0], [0.0, 20.0]])
      >>> collapsed = jnp.array([[20.0, 0.0], [20.0, 0.0]])
      >>> bool(entropy_loss(confident_and_diverse) < entropy_loss(collapsed))
      True
    """
    logits = jnp.asarray(logits)
    if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(
            f"entropy_loss: `logits` must be a floating array (..., K); got dtype {logits.dtype}, shape {logits.shape}."
        )
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    sample_entropy = jnp.mean(-jnp.sum(p * logp, axis=-1))
    mean_p = jnp.mean(p.reshape(-1, p.shape[-1]), axis=0)
    batch_entropy = -jnp.sum(jnp.where(mean_p > 0, mean_p * jnp.log(jnp.where(mean_p > 0, mean_p, 1)), 0))
    return sample_entropy - diversity_weight * batch_entropy
