"""A vector-quantisation codebook: nearest-code lookup with a chosen estimator, and the updates that keep it alive.

Pure functions on plain data, in the style of optax: a frozen :class:`Codebook`
holds the configuration, its methods take and return PyTrees (``params``, trained
by gradients; :class:`CodebookState`, updated by the methods), and nothing is
mutated, so a whole training run can be jitted and mapped over seeds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike

from stejax import keys
from stejax.estimators.latent import vq_quantize, vq_ste

__all__ = [
    "CODE_INITS",
    "Codebook",
    "CodebookOutput",
    "CodebookState",
    "kmeans",
    "kmeans_plus_plus",
    "l2_normalize",
    "nearest_code_matmul",
]

_DISTANCES = ("euclidean", "cosine")
_UPDATES = ("gradient", "ema")
_SEEDINGS = ("random", "kmeans++")
_LOOKUPS = ("exact", "matmul")
# How the codes were initialised, as recorded in CodebookState.code_init (an int32 index into this tuple).
CODE_INITS = ("normal", "uniform", "kaiming_uniform", "kmeans")


class CodebookState(NamedTuple):
    """The running statistics of a codebook (never trained by gradients).

    ``cluster_size`` drives dead-code replacement for both updates; with EMA
    updates ``embed_sum / smoothed(cluster_size)`` are the codes.
    """

    cluster_size: jax.Array  # (K,) float32: EMA of how many vectors chose each code per step
    embed_sum: jax.Array  # (K, codebook_dim) float32: EMA of the sum of the vectors that chose each code
    # () int32: how the codes were initialised, an index into CODE_INITS; None in a state saved before it was
    # recorded (such a state loads and trains unchanged).
    code_init: jax.Array | None = None

    @property
    def initialisation(self) -> str | None:
        """How the codes were initialised: one of ``CODE_INITS`` (``"kaiming_uniform"``...), None if not recorded.

        Example:
          >>> import jax
          >>> from stejax.vq import Codebook
          >>> _, state = Codebook(codebook_size=8, dim=4).init(key=jax.random.key(0))
          >>> state.initialisation
          'kaiming_uniform'
        """
        if self.code_init is None:
            return None
        return CODE_INITS[int(self.code_init)]


class CodebookOutput(NamedTuple):
    """What :meth:`Codebook.quantize` returns. ``H`` heads, codes of dimension ``d``."""

    quantized: jax.Array  # (..., dim): the codes, projected out, with the estimator's gradient
    indices: jax.Array  # (..., H) int32: the nearest code of each head
    vectors: jax.Array  # (..., H, d): the projected (and, for cosine, normalised) inputs
    codes: jax.Array  # (..., H, d): the chosen codes, before the projection out
    commitment_loss: jax.Array  # (): mean((vectors - sg(codes))^2), gradient to the encoder only
    codebook_loss: jax.Array  # (): mean((sg(vectors) - codes)^2), gradient to the codes only (0 with EMA)


def l2_normalize(x: ArrayLike, eps: float = 1e-12) -> jax.Array:
    r"""``x / max(||x||, eps)`` over the last axis; a zero vector stays zero.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import l2_normalize
      >>> l2_normalize(jnp.array([3.0, 4.0]))
      Array([0.6, 0.8], dtype=float32)
    """
    x = jnp.asarray(x)
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, eps)


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Codebook: `{name}` must be a positive int; got {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class Codebook:
    r"""A codebook of ``codebook_size`` codes that quantises ``dim``-wide vectors.

    Forward, per input vector :math:`x \in \mathbb{R}^{\text{dim}}`:

    1. Projection in (only when ``heads * codebook_dim != dim``): :math:`v = W_\text{in} x + b_\text{in}`,
       reshaped to ``heads`` vectors :math:`v_h \in \mathbb{R}^{d}`, ``d = codebook_dim``.
    2. Cosine distance: :math:`v_h` and the codes are divided by their norms
       (:func:`l2_normalize`); then the nearest code by squared euclidean distance is
       the code of largest cosine similarity.
    3. :math:`k_h = \arg\min_k \lVert v_h - c_k\rVert^2`, **ties to the lowest index**
       (exactly :func:`stejax.vq_ste`'s rule: distances in float32 in the difference
       form), and :math:`q_h = \text{estimator}(v_h, C) = c_{k_h}` exactly.
    4. Projection out (when there is one in): :math:`y = W_\text{out}\,\text{concat}_h q_h + b_\text{out}`.

    All heads share one codebook. The gradient past the quantiser is the
    ``estimator``'s: :func:`stejax.vq_quantize` (straight-through, the identity),
    :func:`stejax.rotation_trick`, or any ``estimator(z, codebook) -> q`` whose
    forward is the nearest code (check yours with :func:`stejax.verify.check_surrogate`).
    The estimator treats the codebook as a constant; the codes learn from
    :attr:`CodebookOutput.codebook_loss` (``update="gradient"``) or from
    :meth:`update` (``update="ema"``, the codes then get no gradient at all).

    EMA update (van den Oord et al. 2017, appendix; the conventions of
    vector-quantize-pytorch): with :math:`n_k` the number of vectors that chose
    code :math:`k` in the batch and :math:`s_k` their sum, decay :math:`\gamma`,

    .. math::
       N_k \leftarrow \gamma N_k + (1-\gamma) n_k,\qquad
       m_k \leftarrow \gamma m_k + (1-\gamma) s_k,\qquad
       \tilde N_k = \frac{N_k + \epsilon}{\sum_j N_j + K\epsilon}\sum_j N_j,\qquad
       c_k = m_k / \tilde N_k

    (Laplace smoothing keeps an unused code finite; cosine codebooks renormalise
    :math:`c_k`). :math:`N` is tracked for both updates and drives dead-code
    replacement: :meth:`replace_dead` replaces every code with
    :math:`N_k <` ``dead_code_threshold`` by a distinct vector of the batch.

    Defaults, and why. The initial codes are small, Kaiming-uniform
    :math:`c_{kd} \sim U(\pm\sqrt{6/(K d)})` (``code_init="kaiming_uniform"``), and
    EMA statistics decay by :math:`\gamma = 0.8`: the set-up of the rotation trick's
    authors and of vector-quantize-pytorch. Codes near the origin sit among an
    encoder's first outputs, so most of them are the nearest code of some vector
    from the first steps; codes drawn from :math:`\mathcal{N}(0, 1)` in many
    dimensions sit at norm about :math:`\sqrt d`, away from the data, where most
    are never chosen and never move (``stejax vq compare``'s ``wide-init`` set-up
    measures that collapse, and shows it is worst with the rotation trick, whose
    gradient pulls the encoder's vectors towards the origin). A decay of 0.8 lets
    EMA codes follow a moving encoder within a few steps; 0.99 leaves them behind.
    For a data-dependent start call :meth:`kmeans_init` on the first batch. The
    state returned by :meth:`init` and :meth:`kmeans_init` records which start was
    used (:attr:`CodebookState.initialisation`).

    Attributes:
      codebook_size: ``K``, the number of codes.
      dim: the width of the input's last axis.
      codebook_dim: ``d``, the width of one code (default ``dim // heads``).
      heads: how many vectors each input is split into (each gets its own index).
      distance: ``"euclidean"`` or ``"cosine"``.
      estimator: the function that carries the gradient past the quantiser.
      update: ``"gradient"`` or ``"ema"``.
      decay: :math:`\gamma` of the EMA statistics (default 0.8).
      eps: :math:`\epsilon` of the Laplace smoothing (default 1e-5).
      dead_code_threshold: replace codes whose :math:`N_k` falls below it (0: never).
      code_init: the initial codes: ``"kaiming_uniform"`` (default,
        :math:`U(\pm\sqrt{6/(K d)})`), ``"uniform"`` (:math:`U(\pm s)`, ``s`` =
        ``init_scale``, default :math:`1/K` as taming-transformers) or ``"normal"``
        (:math:`\mathcal{N}(0, s^2)`, ``s`` = ``init_scale``, default 1).
      init_scale: the scale ``s`` of ``"uniform"`` or ``"normal"`` codes (None: their
        default); Kaiming-uniform codes have the fixed bound and take none.
      lookup: ``"exact"`` (default: the nearest code by :func:`stejax.vq_ste`'s
        difference form, the estimator called with the whole codebook) or
        ``"matmul"`` (:func:`nearest_code_matmul`, one search per call, the
        estimator called per vector with its chosen code alone; for large ``K``;
        estimators whose gradient depends on the other codes need ``"exact"``).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.vq import Codebook
      >>> cb = Codebook(codebook_size=4, dim=2)
      >>> params, state = cb.init(key=jax.random.key(0))
      >>> params = {"codes": jnp.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0], [0.0, 2.0]])}
      >>> out = cb.quantize(params, jnp.array([[0.9, 1.2], [1.8, 0.1]]))
      >>> out.indices[:, 0]
      Array([1, 2], dtype=int32)
      >>> out.quantized
      Array([[1., 1.],
             [2., 0.]], dtype=float32)

    Reference:
      A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural Discrete Representation
      Learning", NeurIPS 2017; P. Wang, vector-quantize-pytorch (EMA, k-means
      initialisation, dead-code replacement).
    """

    codebook_size: int
    dim: int
    codebook_dim: int | None = None
    heads: int = 1
    distance: str = "euclidean"
    estimator: Callable[..., jax.Array] = vq_quantize
    update: str = "gradient"
    decay: float = 0.8
    eps: float = 1e-5
    dead_code_threshold: float = 0.0
    init_scale: float | None = None
    lookup: str = "exact"
    code_init: str = "kaiming_uniform"

    def __post_init__(self):
        _check_positive_int("codebook_size", self.codebook_size)
        _check_positive_int("dim", self.dim)
        _check_positive_int("heads", self.heads)
        if self.codebook_dim is None:
            if self.dim % self.heads:
                raise ValueError(
                    f"Codebook: `dim` ({self.dim}) must be divisible by `heads` ({self.heads}) "
                    f"when no `codebook_dim` is given."
                )
            object.__setattr__(self, "codebook_dim", self.dim // self.heads)
        _check_positive_int("codebook_dim", self.codebook_dim)
        if self.distance not in _DISTANCES:
            raise ValueError(f"Codebook: `distance` must be one of {_DISTANCES}; got {self.distance!r}.")
        if self.lookup not in _LOOKUPS:
            raise ValueError(f"Codebook: `lookup` must be one of {_LOOKUPS}; got {self.lookup!r}.")
        if self.update not in _UPDATES:
            raise ValueError(f"Codebook: `update` must be one of {_UPDATES}; got {self.update!r}.")
        if not callable(self.estimator):
            raise TypeError(
                f"Codebook: `estimator` must be callable as estimator(z, codebook); got {self.estimator!r}."
            )
        if not (isinstance(self.decay, int | float) and 0 <= self.decay < 1):
            raise ValueError(f"Codebook: `decay` must be a float in [0, 1); got {self.decay!r}.")
        if self.code_init not in CODE_INITS[:3]:
            raise ValueError(f"Codebook: `code_init` must be one of {CODE_INITS[:3]}; got {self.code_init!r}.")
        if self.init_scale is not None:
            if isinstance(self.init_scale, bool) or not (
                isinstance(self.init_scale, int | float) and self.init_scale > 0
            ):
                raise ValueError(f"Codebook: `init_scale` must be a positive float or None; got {self.init_scale!r}.")
            if self.code_init == "kaiming_uniform":
                raise ValueError(
                    f"Codebook: `init_scale` ({self.init_scale!r}) sets the scale of code_init='normal' or "
                    f"'uniform'; the default code_init='kaiming_uniform' has the fixed bound sqrt(6 / (K d)). "
                    f"For N(0, init_scale^2) codes pass code_init='normal'."
                )
        if not (isinstance(self.eps, int | float) and self.eps > 0):
            raise ValueError(f"Codebook: `eps` must be a positive float; got {self.eps!r}.")
        if not (isinstance(self.dead_code_threshold, int | float) and self.dead_code_threshold >= 0):
            raise ValueError(
                f"Codebook: `dead_code_threshold` must be a float >= 0 (0 turns replacement off); "
                f"got {self.dead_code_threshold!r}."
            )

    @property
    def _code_dim(self) -> int:
        """``codebook_dim`` as an int: ``__post_init__`` fills in the default ``dim // heads``."""
        if self.codebook_dim is None:  # only when __post_init__ was bypassed
            raise ValueError("Codebook: `codebook_dim` is None; construct the Codebook through its __init__.")
        return self.codebook_dim

    @property
    def has_projection(self) -> bool:
        """Whether inputs are projected in and out (``heads * codebook_dim != dim``)."""
        return self.heads * self._code_dim != self.dim

    @property
    def bits(self) -> float:
        """Bits per input vector: ``heads * log2(codebook_size)``."""
        return self.heads * math.log2(self.codebook_size)

    # ----------------------------------------------------------------------------------------
    # Initialisation
    # ----------------------------------------------------------------------------------------

    def init(self, *, key: jax.Array, dtype: DTypeLike = jnp.float32) -> tuple[dict[str, Any], CodebookState]:
        r"""Fresh parameters and statistics.

        Codes as ``code_init`` says (see the class docstring; unit vectors for cosine);
        projections (when there are) :math:`W \sim \mathcal{N}(0, 1/\text{fan\_in})`, zero
        bias. Statistics as vector-quantize-pytorch starts them: :math:`N_k = 1`,
        :math:`m_k = c_k`; ``state.code_init`` records ``code_init``.

        Returns:
          ``(params, state)``: ``params`` has ``"codes"`` ``(K, d)`` and, with a
          projection, ``"project_in"`` and ``"project_out"`` (each ``{"w", "b"}``).
        """
        k_codes, k_in, k_out = keys.split(key, 3, where="Codebook.init: codes, project_in, project_out")
        shape = (self.codebook_size, self._code_dim)
        k_codes = keys.consume(k_codes, where="Codebook.init codes")
        if self.code_init == "normal":
            scale = 1.0 if self.init_scale is None else self.init_scale
            codes = jax.random.normal(k_codes, shape, dtype) * scale
        else:
            if self.code_init == "uniform":
                bound = 1.0 / self.codebook_size if self.init_scale is None else self.init_scale
            else:  # kaiming_uniform: torch.nn.init.kaiming_uniform_ of a (K, d) table, fan_in = K d
                bound = math.sqrt(6.0 / (self.codebook_size * self._code_dim))
            codes = jax.random.uniform(k_codes, shape, dtype, minval=-bound, maxval=bound)
        if self.distance == "cosine":
            codes = l2_normalize(codes)
        params: dict[str, Any] = {"codes": codes}
        if self.has_projection:
            wide = self.heads * self._code_dim
            params["project_in"] = _dense_init(k_in, self.dim, wide, dtype)
            params["project_out"] = _dense_init(k_out, wide, self.dim, dtype)
        state = CodebookState(
            cluster_size=jnp.ones((self.codebook_size,), jnp.float32),
            embed_sum=codes.astype(jnp.float32),
            code_init=jnp.int32(CODE_INITS.index(self.code_init)),
        )
        return params, state

    # ----------------------------------------------------------------------------------------
    # The forward pass
    # ----------------------------------------------------------------------------------------

    def codes(self, params: dict[str, Any]) -> jax.Array:
        """The codebook as the quantiser sees it: ``(K, d)``, normalised for cosine, no gradient with EMA."""
        codes = params["codes"]
        if self.distance == "cosine":
            codes = l2_normalize(codes)
        if self.update == "ema":
            codes = jax.lax.stop_gradient(codes)
        return codes

    def project(self, params: dict[str, Any], z: ArrayLike) -> jax.Array:
        """The vectors that are quantised: ``(..., dim) -> (..., heads, d)``, projected in and normalised for cosine."""
        z = jnp.asarray(z)
        if z.ndim < 1 or z.shape[-1] != self.dim:
            raise ValueError(f"Codebook: the input must have shape (..., dim={self.dim}); got shape {z.shape}.")
        if self.has_projection:
            z = _affine(params["project_in"], z)
        v = z.reshape((*z.shape[:-1], self.heads, self._code_dim))
        return l2_normalize(v) if self.distance == "cosine" else v

    def quantize(self, params: dict[str, Any], z: ArrayLike) -> CodebookOutput:
        """Quantise ``z`` of shape ``(..., dim)``; see the class docstring for the forward and the gradient."""
        v = self.project(params, z)
        codes = self.codes(params)
        if self.lookup == "matmul":
            return self._quantize_matmul(params, v, codes)
        # vq_ste gives the indices (ties to the lowest index) and both losses; the estimator gives q.
        vq = vq_ste(v, codes.astype(v.dtype))
        q = self.estimator(v, codes.astype(v.dtype))
        flat = q.reshape((*q.shape[:-2], self.heads * self._code_dim))
        if self.has_projection:
            flat = _affine(params["project_out"], flat)
        chosen = jnp.take(codes, vq.indices, axis=0)
        return CodebookOutput(
            quantized=flat,
            indices=vq.indices.astype(jnp.int32),
            vectors=v,
            codes=chosen,
            commitment_loss=vq.commitment_loss,
            codebook_loss=vq.codebook_loss if self.update == "gradient" else jnp.zeros((), vq.codebook_loss.dtype),
        )

    def _quantize_matmul(self, params: dict[str, Any], v: jax.Array, codes: jax.Array) -> CodebookOutput:
        codes = codes.astype(v.dtype)
        indices = nearest_code_matmul(v, codes)
        chosen = jnp.take(codes, indices, axis=0)  # differentiable w.r.t. the codes
        # The estimator sees each vector with its own code as a one-code codebook: the forward is that code,
        # the gradient what the estimator gives for (z, q), and no second search over all K codes.
        flat_v = v.reshape(-1, self._code_dim)
        one_code = jax.lax.stop_gradient(chosen).reshape(-1, 1, self._code_dim)
        q = jax.vmap(self.estimator)(flat_v, one_code).reshape(v.shape)
        flat = q.reshape((*q.shape[:-2], self.heads * self._code_dim))
        if self.has_projection:
            flat = _affine(params["project_out"], flat)
        commitment = jnp.mean(jnp.square(v - jax.lax.stop_gradient(chosen)))
        codebook = jnp.mean(jnp.square(jax.lax.stop_gradient(v) - chosen))
        return CodebookOutput(
            quantized=flat,
            indices=indices.astype(jnp.int32),
            vectors=v,
            codes=chosen,
            commitment_loss=commitment,
            codebook_loss=codebook if self.update == "gradient" else jnp.zeros((), codebook.dtype),
        )

    def loss(self, out: CodebookOutput, *, commitment_weight: float = 0.25, codebook_weight: float = 1.0) -> jax.Array:
        r"""The auxiliary loss :math:`w_\text{cb}\,\mathcal{L}_\text{codebook} + \beta\,\mathcal{L}_\text{commit}`.

        :math:`\mathcal{L}_\text{codebook}` is 0 with EMA updates (the codes are not
        trained by gradients); :math:`\beta` is ``commitment_weight`` (0.25 in the paper).
        """
        return codebook_weight * out.codebook_loss + commitment_weight * out.commitment_loss

    def indices_to_codes(self, params: dict[str, Any], indices: ArrayLike) -> jax.Array:
        """The codes of ``indices`` (any shape): ``indices.shape + (d,)``, as :attr:`CodebookOutput.codes`."""
        return jnp.take(self.codes(params), jnp.asarray(indices), axis=0)

    def codes_to_indices(self, params: dict[str, Any], codes: ArrayLike) -> jax.Array:
        """The index of the nearest code to each vector of ``codes`` ``(..., d)``; exact for the codebook's own codes
        (the lowest index among equal codes)."""
        codes = jnp.asarray(codes)
        return vq_ste(codes, self.codes(params).astype(codes.dtype)).indices.astype(jnp.int32)

    def decode(self, params: dict[str, Any], indices: ArrayLike) -> jax.Array:
        """The output ``(..., dim)`` that :meth:`quantize` gives for ``indices`` ``(..., heads)``."""
        q = self.indices_to_codes(params, indices)
        flat = q.reshape((*q.shape[:-2], self.heads * self._code_dim))
        if self.has_projection:
            flat = _affine(params["project_out"], flat)
        return flat

    # ----------------------------------------------------------------------------------------
    # Updates of the statistics and the codes
    # ----------------------------------------------------------------------------------------

    def update_state(
        self, params: dict[str, Any], state: CodebookState, out: CodebookOutput
    ) -> tuple[dict[str, Any], CodebookState]:
        r"""One EMA step of :math:`N` and :math:`m` from a batch; with ``update="ema"`` also the codes.

        Uses ``out.vectors`` and ``out.indices`` (no gradient flows through it).
        See the class docstring for the formulas.
        """
        v = jax.lax.stop_gradient(out.vectors).reshape(-1, self._code_dim).astype(jnp.float32)
        idx = out.indices.reshape(-1)
        # Scatter-adds, not a (n, K) one-hot product: O(n d) whatever K.
        counts = jnp.zeros((self.codebook_size,), jnp.float32).at[idx].add(1.0)
        sums = jnp.zeros((self.codebook_size, self._code_dim), jnp.float32).at[idx].add(v)
        g = self.decay
        cluster_size = g * state.cluster_size + (1 - g) * counts
        embed_sum = g * state.embed_sum + (1 - g) * sums
        new_state = state._replace(cluster_size=cluster_size, embed_sum=embed_sum)
        if self.update == "ema":
            params = {**params, "codes": self.ema_codes(new_state).astype(params["codes"].dtype)}
        return params, new_state

    def ema_codes(self, state: CodebookState) -> jax.Array:
        r"""The codes :math:`m_k / \tilde N_k` with Laplace-smoothed :math:`\tilde N` (normalised for cosine)."""
        total = jnp.sum(state.cluster_size)
        smoothed = (state.cluster_size + self.eps) / (total + self.codebook_size * self.eps) * total
        codes = state.embed_sum / smoothed[:, None]
        return l2_normalize(codes) if self.distance == "cosine" else codes

    def replace_dead(
        self, params: dict[str, Any], state: CodebookState, vectors: ArrayLike, *, key: jax.Array
    ) -> tuple[dict[str, Any], CodebookState, jax.Array]:
        r"""Replace every code with :math:`N_k <` ``dead_code_threshold`` by a vector of the batch.

        ``vectors`` ``(..., d)`` are flattened to ``n`` rows; a random permutation of
        the rows (drawn from ``key``) gives code :math:`k` the row ``perm[k mod n]``,
        so the replacements are distinct rows when ``n >= K``. A replaced code
        restarts with :math:`N_k` = the threshold and :math:`m_k = N_k c_k` (as
        vector-quantize-pytorch). Codes at or above the threshold are untouched,
        bit for bit.

        Returns:
          ``(params, state, replaced)`` with ``replaced`` a bool ``(K,)`` mask.
        """
        v = jax.lax.stop_gradient(jnp.asarray(vectors)).reshape(-1, self._code_dim)
        n = v.shape[0]
        dead = state.cluster_size < self.dead_code_threshold
        perm = jax.random.permutation(keys.consume(key, where="Codebook.replace_dead"), n)
        picked = v[perm[jnp.arange(self.codebook_size) % n]]
        if self.distance == "cosine":
            picked = l2_normalize(picked)
        codes = jnp.where(dead[:, None], picked.astype(params["codes"].dtype), params["codes"])
        threshold = jnp.float32(self.dead_code_threshold)
        cluster_size = jnp.where(dead, threshold, state.cluster_size)
        embed_sum = jnp.where(dead[:, None], picked.astype(jnp.float32) * threshold, state.embed_sum)
        return {**params, "codes": codes}, state._replace(cluster_size=cluster_size, embed_sum=embed_sum), dead

    def kmeans_init(
        self,
        params: dict[str, Any],
        state: CodebookState,
        vectors: ArrayLike,
        *,
        key: jax.Array,
        iters: int = 10,
        seeding: str = "random",
    ) -> tuple[dict[str, Any], CodebookState]:
        r"""Initialise the codes by k-means (Lloyd's algorithm) on ``vectors`` ``(..., d)``.

        The means start at ``K`` rows of the data: drawn by a permutation from ``key``
        (``seeding="random"``, with repetition when there are fewer rows than codes,
        as vector-quantize-pytorch) or by k-means++ (``seeding="kmeans++"``, see
        :func:`kmeans_plus_plus`); each of ``iters`` iterations assigns every row to
        its nearest mean (ties to the lowest index) and moves each mean to the
        average of its rows; a mean with no rows stays where it is. Cosine codebooks
        renormalise the means. The statistics restart at :math:`N_k` = the rows of
        the last assignment, :math:`m_k = N_k c_k`, and record ``"kmeans"`` as the
        initialisation. Deterministic for a key.
        """
        v = jax.lax.stop_gradient(jnp.asarray(vectors)).reshape(-1, self._code_dim).astype(jnp.float32)
        means, counts = kmeans(
            v, self.codebook_size, key=key, iters=iters, cosine=self.distance == "cosine", seeding=seeding
        )
        params = {**params, "codes": means.astype(params["codes"].dtype)}
        return params, CodebookState(
            cluster_size=counts, embed_sum=means * counts[:, None], code_init=jnp.int32(CODE_INITS.index("kmeans"))
        )


@functools.partial(jax.jit, static_argnames=("n_clusters",))  # one compilation per shape, eager or not
def kmeans_plus_plus(vectors: ArrayLike, n_clusters: int, *, key: jax.Array) -> jax.Array:
    r"""k-means++ seeding: ``n_clusters`` rows of ``vectors`` ``(n, d)``, drawn with probability :math:`\propto D^2`.

    The first row is drawn uniformly; each next one with probability
    :math:`D(x)^2 / \sum_y D(y)^2`, :math:`D(x)` the distance from row :math:`x` to
    the nearest row drawn so far (uniformly again when every :math:`D` is 0, as
    when there are fewer distinct rows than clusters). Every returned mean is a
    row of the data. Deterministic for a key; one ``lax.fori_loop`` of
    ``n_clusters`` steps, each :math:`O(n d)`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.vq import kmeans_plus_plus
      >>> x = jnp.array([[0.0], [0.1], [10.0], [10.1]])
      >>> means = kmeans_plus_plus(x, 2, key=jax.random.key(0))
      >>> sorted(v > 5 for v in means[:, 0].tolist())  # one seed in each cluster
      [False, True]

    Reference:
      D. Arthur, S. Vassilvitskii, "k-means++: The Advantages of Careful Seeding", SODA 2007.
    """
    v = jnp.asarray(vectors, jnp.float32)
    if v.ndim != 2 or v.shape[0] < 1:
        raise ValueError(f"kmeans_plus_plus: `vectors` must have shape (n >= 1, d); got shape {v.shape}.")
    n = v.shape[0]
    k_first, k_rest = keys.split(key, where="kmeans_plus_plus: first, rest")
    first = jax.random.randint(keys.consume(k_first, where="kmeans_plus_plus: first"), (), 0, n)
    draws = keys.split(k_rest, max(n_clusters - 1, 1), where="kmeans_plus_plus: one key per draw")
    means = jnp.zeros((n_clusters, v.shape[1]), jnp.float32).at[0].set(v[first])
    d2 = jnp.sum(jnp.square(v - v[first][None, :]), axis=-1)

    def draw(i, carry):
        means, d2 = carry
        total = jnp.sum(d2)
        # D^2 sampling by inverse CDF; uniform over the rows when every distance is 0.
        weights = jnp.where(total > 0, d2, jnp.ones_like(d2))
        cdf = jnp.cumsum(weights)
        u = jax.random.uniform(draws[i - 1], (), jnp.float32) * cdf[-1]
        pick = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), n - 1)
        row = v[pick]
        return means.at[i].set(row), jnp.minimum(d2, jnp.sum(jnp.square(v - row[None, :]), axis=-1))

    means, _ = jax.lax.fori_loop(1, n_clusters, draw, (means, d2))
    return means


@functools.partial(jax.jit, static_argnames=("n_clusters", "iters", "cosine", "seeding"))
def kmeans(
    vectors: ArrayLike,
    n_clusters: int,
    *,
    key: jax.Array,
    iters: int = 10,
    cosine: bool = False,
    seeding: str = "random",
) -> tuple[jax.Array, jax.Array]:
    """Lloyd's k-means on ``vectors`` ``(n, d)``: ``(means (K, d), counts (K,))``; see :meth:`Codebook.kmeans_init`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.vq import kmeans
      >>> x = jnp.array([[0.0], [0.2], [10.0], [10.2]])
      >>> means, counts = kmeans(x, 2, key=jax.random.key(0))
      >>> sorted(round(m, 3) for m in means[:, 0].tolist()), counts.tolist()
      ([0.1, 10.1], [2.0, 2.0])
    """
    v = jnp.asarray(vectors, jnp.float32)
    if v.ndim != 2 or v.shape[0] < 1:
        raise ValueError(f"kmeans: `vectors` must have shape (n >= 1, d); got shape {v.shape}.")
    if seeding not in _SEEDINGS:
        raise ValueError(f"kmeans: `seeding` must be one of {_SEEDINGS}; got {seeding!r}.")
    n = v.shape[0]
    if seeding == "kmeans++":
        means = kmeans_plus_plus(v, n_clusters, key=key)
    else:
        perm = jax.random.permutation(keys.consume(key, where="kmeans: initial means"), n)
        means = v[perm[jnp.arange(n_clusters) % n]]

    def assign(m):
        idx = nearest_code_matmul(v, m)
        counts = jnp.zeros((n_clusters,), jnp.float32).at[idx].add(1.0)
        return counts, jnp.zeros((n_clusters, v.shape[1]), jnp.float32).at[idx].add(v)

    def step(_, m):
        counts, sums = assign(m)
        new = sums / jnp.maximum(counts, 1)[:, None]
        if cosine:
            new = l2_normalize(new)
        return jnp.where((counts > 0)[:, None], new, m)

    means = jax.lax.fori_loop(0, iters, step, means)
    counts, _ = assign(means)
    return means, counts


def nearest_code_matmul(vectors: ArrayLike, codes: ArrayLike, *, block: int = 64) -> jax.Array:
    r"""The index of the nearest code by :math:`\lVert c_k\rVert^2 - 2\,v\cdot c_k`, for large codebooks.

    One matrix product instead of the ``(..., K, d)`` differences of
    :func:`stejax.vq_ste`, and the argmin in two levels (the minimum over blocks of
    ``block`` codes, then the argmin within the first block that holds it), which
    XLA on CPU runs many times faster than one argmin over ``K``. Equal values go to
    the lowest index, as ``argmin``; two codes whose distances agree to within the
    float32 rounding of the expanded form may be ordered differently from the
    difference form. Float32 arithmetic.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.vq import nearest_code_matmul
      >>> nearest_code_matmul(jnp.array([[0.9, 1.2], [1.8, 0.1]]), jnp.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]))
      Array([1, 2], dtype=int32)
    """
    v = jnp.asarray(vectors, jnp.float32)
    c = jnp.asarray(codes, jnp.float32)
    k = c.shape[0]
    products = v @ c.T  # (..., K)
    # ||v||^2 is the same for every code, so it is left out.
    scores = jnp.sum(c * c, axis=-1).reshape((1,) * (products.ndim - 1) + (k,)) - 2.0 * products
    if k <= block or k % block:
        return jnp.argmin(scores, axis=-1).astype(jnp.int32)
    blocks = scores.reshape((*scores.shape[:-1], k // block, block))
    first = jnp.argmin(jnp.min(blocks, axis=-1), axis=-1)
    inner = jnp.take_along_axis(blocks, first[..., None, None], axis=-2)[..., 0, :]
    return (first * block + jnp.argmin(inner, axis=-1)).astype(jnp.int32)


def _affine(layer: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """``x @ w + b`` with the bias broadcast explicitly (no rank promotion)."""
    y = x @ layer["w"]
    return y + layer["b"].reshape((1,) * (y.ndim - 1) + (-1,))


def _dense_init(key: jax.Array, fan_in: int, fan_out: int, dtype: DTypeLike) -> dict[str, jax.Array]:
    w = jax.random.normal(keys.consume(key, where="Codebook.init projection"), (fan_in, fan_out), dtype)
    return {"w": w / jnp.sqrt(jnp.asarray(fan_in, dtype)), "b": jnp.zeros((fan_out,), dtype)}
