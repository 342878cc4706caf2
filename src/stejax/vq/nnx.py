"""An NNX face for :class:`stejax.vq.Codebook`: the codes and statistics as variables, updated in place.

Needs the optional extra ``stejax[flax]``; ``import stejax.vq`` does not import
flax, ``import stejax.vq.nnx`` does. The module holds no logic of its own: every
computation is the pure :class:`~stejax.vq.Codebook` method.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.typing import ArrayLike

from stejax.vq._codebook import Codebook, CodebookOutput, CodebookState

__all__ = ["CodebookStat", "VectorQuantizer"]


class CodebookStat(nnx.Variable):
    """Codebook statistics (and EMA-updated codes): updated by the module, never by an optimiser."""


class VectorQuantizer(nnx.Module):
    """A :class:`~stejax.vq.Codebook` as an NNX module.

    Gradient-trained codes and the projections are ``nnx.Param``; the EMA
    statistics, and the codes of an EMA codebook, are :class:`CodebookStat`, so
    ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` trains exactly what gradients
    should train.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from stejax.vq import Codebook
      >>> from stejax.vq.nnx import VectorQuantizer
      >>> vq = VectorQuantizer(Codebook(codebook_size=8, dim=4, update="ema", decay=0.9), rngs=nnx.Rngs(0))
      >>> out = vq(jnp.ones((3, 4)), update=True)   # quantise, then one EMA step in place
      >>> out.quantized.shape, vq.cluster_size[...].shape
      ((3, 4), (8,))
    """

    def __init__(self, codebook: Codebook, *, rngs: nnx.Rngs):
        self.config = codebook
        params, state = codebook.init(key=rngs.params())
        kind = nnx.Param if codebook.update == "gradient" else CodebookStat
        self.codes = kind(params["codes"])
        if codebook.has_projection:
            self.project_in = nnx.data({k: nnx.Param(v) for k, v in params["project_in"].items()})
            self.project_out = nnx.data({k: nnx.Param(v) for k, v in params["project_out"].items()})
        self.cluster_size = CodebookStat(state.cluster_size)
        self.embed_sum = CodebookStat(state.embed_sum)
        self.code_init = CodebookStat(state.code_init)  # how the codes were initialised (CodebookState.code_init)

    def params(self) -> dict[str, Any]:
        """The parameter PyTree the pure :class:`~stejax.vq.Codebook` methods take."""
        params: dict[str, Any] = {"codes": self.codes[...]}
        if self.config.has_projection:
            params["project_in"] = {k: v[...] for k, v in self.project_in.items()}
            params["project_out"] = {k: v[...] for k, v in self.project_out.items()}
        return params

    def state(self) -> CodebookState:
        """The statistics as a :class:`~stejax.vq.CodebookState`."""
        return CodebookState(self.cluster_size[...], self.embed_sum[...], self.code_init[...])

    def _store(self, params: dict[str, Any], state: CodebookState) -> None:
        self.codes[...] = jax.lax.stop_gradient(params["codes"])
        self.cluster_size[...] = state.cluster_size
        self.embed_sum[...] = state.embed_sum
        if state.code_init is not None:
            self.code_init[...] = state.code_init

    def __call__(self, z: ArrayLike, *, update: bool = False, key: jax.Array | None = None) -> CodebookOutput:
        """:meth:`Codebook.quantize`; with ``update=True`` then :meth:`Codebook.update_state` in place, and with a
        ``key`` and a ``dead_code_threshold`` also :meth:`Codebook.replace_dead`."""
        params = self.params()
        out = self.config.quantize(params, z)
        if update:
            params, state = self.config.update_state(params, self.state(), out)
            if key is not None and self.config.dead_code_threshold > 0:
                params, state, _ = self.config.replace_dead(params, state, out.vectors, key=key)
            self._store(params, state)
        return out

    def kmeans_init(self, z: ArrayLike, *, key: jax.Array, iters: int = 10) -> None:
        """:meth:`Codebook.kmeans_init` on the projected ``z`` ``(..., dim)``, in place."""
        params = self.params()
        vectors = self.config.project(params, z)
        params, state = self.config.kmeans_init(params, self.state(), vectors, key=key, iters=iters)
        self._store(params, state)
