"""The pure training functions: batched forward, loss, one optimiser update, evaluation."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from stejax import keys
from stejax.model import ModelConfig, QATConfig, apply, input_contract
from stejax.train._products import IntegerProducts, integer_logits

__all__ = [
    "Batch",
    "NonFiniteError",
    "StepMetrics",
    "TrainStep",
    "compiled_evaluate",
    "compiled_statistics",
    "compiled_train_step",
    "compiled_update",
    "evaluate",
    "forward",
    "logged_update",
    "loss",
    "needs_key",
    "raise_if_nonfinite",
    "step_statistics",
    "update",
]


class Batch(NamedTuple):
    """One minibatch, as :func:`stejax.data.batches` yields it."""

    x: jax.Array  # float32 (B, in_features), standardised features
    y: jax.Array  # int32 (B,), labels in [0, n_classes)


class StepMetrics(NamedTuple):
    """What :func:`update` reports about one step (all computed inside the step)."""

    loss: jax.Array  # float32 (): the mean cross-entropy before the update
    zero_grad: dict[str, dict[str, jax.Array]]  # float32 () leaves: apply's stats, batch mean
    finite: jax.Array  # bool (): the input parameters, the loss and the gradient all finite


class NonFiniteError(FloatingPointError):
    """A training step met a NaN or infinity; raised instead of training on.

    Attributes:
      step: the 1-based global step at which it happened.
      part: ``"parameter"``, ``"loss"`` or ``"gradient"``: what was non-finite first,
        checked in that order (a non-finite parameter makes everything after it
        non-finite, so it is the most precise culprit).
      path: the PyTree path of the first non-finite leaf, as
        ``jax.tree_util.keystr`` writes it (``"['layers'][1]['w']"``), or ``""``
        for the loss.
    """

    def __init__(self, message: str, *, step: int, part: str, path: str):
        super().__init__(message)
        self.step = step
        self.part = part
        self.path = path


def needs_key(model_config: ModelConfig, *, train: bool) -> bool:
    """Whether a forward pass draws randomness: in training, with a positive dropout rate.

    (No QAT preset uses a stochastic estimator; dropout is the model's only random
    operation.)
    """
    return bool(train and model_config.dropout > 0)


def forward(
    params: Any,
    x: ArrayLike,
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
    key: jax.Array | None = None,
    train: bool = False,
    return_stats: bool = False,
) -> jax.Array | tuple[jax.Array, dict[str, dict[str, jax.Array]]]:
    r"""The logits of a batch: :func:`stejax.model.apply` mapped over the examples.

    .. math::

       \text{logits}_{n} = f_\theta(x_n), \qquad n = 1, \dots, N,

    with :math:`f_\theta` the fake-quantised model of ``model_config`` and
    ``qat_config``; for an :class:`stejax.train.IntegerProducts` configuration
    (``TrainConfig(product=...)``), the same model with integer products in its
    quantised layers, computed on the whole batch at once (each product one
    ``dot_general`` over the batch, inputs scaled per example). A concrete ``x``
    (not a tracer) is first checked against the model's
    :class:`stejax.model.InputContract`: dtype float32, ``in_features``
    features, every value finite; under ``jit`` only the shape and dtype can be
    checked (by ``apply``).

    With dropout in training, ``key`` is split into one key per example
    (``stejax.keys.split``), and each is consumed by that example's dropout masks.

    Args:
      params: the parameter PyTree (:func:`stejax.model.param_spec`).
      x: float32 features of shape ``(N, in_features)``.
      model_config: an :class:`stejax.model.MLPConfig` or :class:`stejax.model.ConvConfig`.
      qat_config: a :class:`stejax.model.QATConfig`.
      key: a typed PRNG key; required when :func:`needs_key` (training with
        dropout), ignored otherwise.
      train: training mode (dropout on).
      return_stats: also return apply's zero-gradient fractions, averaged over
        the batch.

    Returns:
      float32 logits ``(N, n_classes)``; with ``return_stats`` the pair
      ``(logits, stats)`` with float32 scalar leaves ``stats["layer_i"][part]``.

    Raises:
      TypeError: ``x`` is not float32, or a key is needed and missing.
      ValueError: ``x`` is not ``(N, in_features)`` or holds NaN or inf.

    Example:
      >>> import functools, jax, numpy as np
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> from stejax.train import forward
      >>> mc, qc = MLPConfig(hidden=(8,)), preset("w4a4")
      >>> params = init_params(jax.random.key(0), mc, qc)
      >>> logits_of = jax.jit(functools.partial(forward, model_config=mc, qat_config=qc))
      >>> logits_of(params, np.zeros((3, 64), np.float32)).shape
      (3, 10)
    """
    if not isinstance(x, jax.core.Tracer):
        contract = input_contract(model_config)
        contract.check(x)
        if np.ndim(x) != 2:
            raise ValueError(
                f"forward: x must be a batch of shape (N, {contract.shape[0]}); got shape {np.shape(x)}. "
                "Add a leading axis for one example."
            )
    x = jnp.asarray(x)
    example_keys = None
    if needs_key(model_config, train=train):
        if key is None:
            raise TypeError(f"forward: training with dropout {model_config.dropout} needs a PRNG key as `key`.")
        keys.check_key(key, what="forward: key")
        example_keys = keys.split(key, x.shape[0], where="forward: one key per example")
        # apply splits each example's key once more, into its dropout masks.
        keys.consume(example_keys, where="forward: each example's dropout")
    if isinstance(qat_config, IntegerProducts):
        # One product over the whole batch (per-example scales), not one per example under vmap.
        logits, stats = integer_logits(
            params, x, model_config=model_config, qat_config=qat_config, example_keys=example_keys
        )
        return (logits, stats) if return_stats else logits
    one = functools.partial(apply, model_config=model_config, qat_config=qat_config, train=train, return_stats=True)
    logits, stats = jax.vmap(one, in_axes=(None, 0))(params, x, key=example_keys)
    if not return_stats:
        return logits
    return logits, jax.tree.map(jnp.mean, stats)


def loss(
    params: Any,
    batch: Batch | tuple[ArrayLike, ArrayLike],
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
    key: jax.Array | None = None,
    train: bool = False,
    return_stats: bool = False,
) -> jax.Array | tuple[jax.Array, dict[str, dict[str, jax.Array]]]:
    r"""The mean softmax cross-entropy of a batch with integer labels.

    .. math::

       L(\theta) = \frac{1}{N} \sum_{n=1}^{N}
         \Bigl(\log \sum_{k} e^{z_{nk}} - z_{n y_n}\Bigr),
       \qquad z_n = f_\theta(x_n),

    computed by ``optax.softmax_cross_entropy_with_integer_labels`` (a stable
    log-sum-exp) in float32.

    Args:
      params: the parameter PyTree.
      batch: ``(x, y)``: float32 features ``(N, in_features)`` and int32 labels ``(N,)``.
      model_config, qat_config, key, train: as for :func:`forward`.
      return_stats: also return :func:`forward`'s batch-mean zero-gradient fractions.

    Returns:
      The float32 scalar loss, or ``(loss, stats)``.

    Raises:
      TypeError: labels that are not int32 (and :func:`forward`'s errors).
      ValueError: labels not of shape ``(N,)``, or (when concrete) out of range.

    Example:
      >>> import jax, numpy as np
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> from stejax.train import loss
      >>> mc, qc = MLPConfig(hidden=(8,)), preset("float")
      >>> params = init_params(jax.random.key(0), mc, qc)
      >>> zero = jax.tree.map(lambda p: p * 0, params)  # uniform logits: loss = log(10)
      >>> batch = (np.ones((4, 64), np.float32), np.arange(4, dtype=np.int32))
      >>> round(float(loss(zero, batch, model_config=mc, qat_config=qc)), 6)
      2.302585
    """
    x, y = batch
    logits, stats = forward(
        params, x, model_config=model_config, qat_config=qat_config, key=key, train=train, return_stats=True
    )
    _check_labels(y, logits.shape[0], model_config.n_classes)
    value = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(y)))
    return (value, stats) if return_stats else value


def update(
    params: Any,
    opt_state: optax.OptState,
    batch: Batch | tuple[ArrayLike, ArrayLike],
    key: jax.Array | None,
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
    statistics: bool = True,
) -> tuple[Any, optax.OptState, StepMetrics]:
    r"""One optimiser step on one batch: pure, ready for ``jax.jit``.

    .. math::

       g = \nabla_\theta L(\theta; x, y), \qquad
       (u, s') = \operatorname{opt.update}(g, s, \theta), \qquad \theta' = \theta + u,

    with :math:`L` the training-mode :func:`loss` (dropout on) and the gradient
    through the quantisers given by their surrogate derivatives. Nothing is
    checked for finiteness here (a jitted function cannot raise on values); the
    metrics carry the flags and :func:`raise_if_nonfinite` turns them into an error.

    Args:
      params: the parameter PyTree.
      opt_state: ``optimizer.init(params)`` or the previous step's state.
      batch: ``(x, y)`` as for :func:`loss`.
      key: the step's own typed PRNG key, split into the per-example dropout keys;
        None for a model without dropout (see :func:`needs_key`).
      model_config, qat_config: the model.
      optimizer: an optax ``GradientTransformation``.
      statistics: compute the zero-gradient fractions (default True). False
        leaves ``zero_grad`` empty: the step :func:`stejax.train.train` takes on
        every batch but the last of an epoch (``stejax bench --suite train``
        times both). The finite flag is computed either way.

    Returns:
      ``(new_params, new_opt_state, metrics)``, the metrics a :class:`StepMetrics`.

    Example:
      >>> import functools, jax, numpy as np, optax
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> from stejax.train import update
      >>> mc, qc, opt = MLPConfig(hidden=(8,)), preset("w4a4"), optax.sgd(0.1)
      >>> params = init_params(jax.random.key(0), mc, qc)
      >>> batch = (np.ones((4, 64), np.float32), np.arange(4, dtype=np.int32))
      >>> step = jax.jit(functools.partial(update, model_config=mc, qat_config=qc, optimizer=opt))
      >>> new, _, m = step(params, opt.init(params), batch, None)
      >>> bool(m.finite), float(m.loss) > 0
      (True, True)
    """
    grad_fn = jax.value_and_grad(loss, has_aux=True)
    (value, stats), grads = grad_fn(
        params, batch, model_config=model_config, qat_config=qat_config, key=key, train=True, return_stats=True
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    finite = all_finite(value, params, grads)
    return new_params, opt_state, StepMetrics(loss=value, zero_grad=stats if statistics else {}, finite=finite)


def all_finite(*trees: Any) -> jax.Array:
    """One bool scalar: every element of every leaf of ``trees`` is finite (neither NaN nor infinite).

    One fused reduction per leaf, combined with ``&``: no copy of the leaves (a
    ``ravel_pytree`` first would concatenate them, which measured costlier than the
    reductions themselves on a CPU step). Without ``statistics`` the zero-gradient
    fractions are dead code under ``jit`` and never computed; this flag stays.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.train._step import all_finite
      >>> bool(all_finite(jnp.ones(3), {"w": jnp.zeros((2, 2))})), bool(all_finite(jnp.array([1.0, jnp.inf])))
      (True, False)
    """
    flags = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(trees)]
    return functools.reduce(jnp.logical_and, flags, jnp.bool_(True))


def logged_update(
    params: Any,
    opt_state: optax.OptState,
    batch: Batch | tuple[ArrayLike, ArrayLike],
    key: jax.Array | None,
    log: ArrayLike,
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
) -> tuple[Any, optax.OptState, StepMetrics]:
    r"""One :func:`update` whose zero-gradient fractions are computed only when ``log`` is True.

    The update itself, the loss and the finite flag are those of ``update(...,
    statistics=False)``: the same arithmetic on every step. When the bool scalar
    ``log`` is True, the fractions are computed by a second pass of the
    training-mode forward (the same ``params``, ``batch`` and ``key``, so the same
    dropout masks and quantiser inputs as the step's own forward pass) inside a
    ``jax.lax.cond``; when it is False that branch does not run and the fractions
    are zeros. One program serves every step, for a caller that needs a single
    program (:func:`stejax.train.train_seeds` vmaps it over runs); the untaken
    branch still costs the other steps a few percent on a CPU, so
    :func:`stejax.train.train` takes a :class:`TrainStep` instead (two programs,
    nothing for the statistics on a step that does not log).

    The second pass reuses the step's key on purpose (same key, same masks); it
    reads a ``jax.random.clone`` of it, so JAX's key-reuse checker accepts it.

    Args:
      params, opt_state, batch, key, model_config, qat_config, optimizer: as for :func:`update`.
      log: a bool scalar (an array under ``jit``): compute the fractions.

    Returns:
      ``(new_params, new_opt_state, metrics)``; ``metrics.zero_grad`` has
      :func:`update`'s structure, zeros when ``log`` is False.

    Example:
      >>> import functools, jax, numpy as np, optax
      >>> from stejax.model import MLPConfig, init_params, preset
      >>> from stejax.train import logged_update, update
      >>> mc, qc, opt = MLPConfig(hidden=(8,)), preset("w4a4"), optax.sgd(0.1)
      >>> params = init_params(jax.random.key(0), mc, qc)
      >>> batch = (np.ones((4, 64), np.float32), np.arange(4, dtype=np.int32))
      >>> kw = dict(model_config=mc, qat_config=qc, optimizer=opt)
      >>> step = jax.jit(functools.partial(logged_update, **kw))  # as train compiles it
      >>> _, _, m = step(params, opt.init(params), batch, None, True)
      >>> _, _, want = jax.jit(functools.partial(update, **kw))(params, opt.init(params), batch, None)
      >>> m.zero_grad == want.zero_grad, float(m.loss) == float(want.loss)
      (True, True)
    """
    new_params, opt_state, metrics = update(
        params,
        opt_state,
        batch,
        key,
        model_config=model_config,
        qat_config=qat_config,
        optimizer=optimizer,
        statistics=False,
    )
    x = batch[0]
    stats_key = None if key is None else jax.random.clone(key)

    def fractions() -> dict[str, dict[str, jax.Array]]:
        out = forward(
            params, x, model_config=model_config, qat_config=qat_config, key=stats_key, train=True, return_stats=True
        )
        if not isinstance(out, tuple):  # pragma: no cover - return_stats=True returns a pair
            raise TypeError(f"logged_update: forward(..., return_stats=True) returned {type(out).__name__}.")
        return out[1]

    shapes = jax.eval_shape(fractions)
    zero_grad = jax.lax.cond(
        jnp.asarray(log, jnp.bool_),
        fractions,
        lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes),
    )
    return new_params, opt_state, metrics._replace(zero_grad=zero_grad)


def raise_if_nonfinite(
    metrics: StepMetrics,
    *,
    step: int,
    params: Any,
    batch: Batch | tuple[ArrayLike, ArrayLike],
    key: jax.Array | None,
    model_config: ModelConfig,
    qat_config: QATConfig,
    where: str = "",
) -> None:
    """Raise :class:`NonFiniteError` unless the step's parameters, loss and gradient were finite.

    Reads one flag from the device when all is well. Otherwise it recomputes the
    step's loss and gradient from the step's inputs (``params``, ``batch`` and
    ``key``, the same pure computation, so the same values) and names the step and
    the first non-finite leaf, looking first at the input parameters, then the
    loss, then the gradient, each in PyTree order.

    Args:
      metrics: :func:`update`'s metrics for the step.
      step: the 1-based global step, for the message.
      params, batch, key: the inputs the step was given.
      model_config, qat_config: the model.
      where: extra context for the message, e.g. ``"epoch 2, batch 5"``.

    Raises:
      NonFiniteError: something was NaN or infinite.
    """
    if bool(metrics.finite):
        return
    context = f" ({where})" if where else ""
    loss_value = float(metrics.loss)

    def fail(part: str, path: tuple[Any, ...]) -> NonFiniteError:
        name = jax.tree_util.keystr(path)
        return NonFiniteError(
            f"non-finite {part} at step {step}{context}: the first non-finite leaf is params{name} "
            f"({leaf_name(path)}); loss = {loss_value}. The run stops rather than continue with NaN or inf.",
            step=step,
            part=part,
            path=name,
        )

    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not np.isfinite(np.asarray(leaf)).all():
            raise fail("parameter", path)
    if not np.isfinite(loss_value):
        raise NonFiniteError(
            f"non-finite loss at step {step}{context}: loss = {loss_value} with finite parameters. "
            "Lower the learning rate or check the data; the run stops rather than continue.",
            step=step,
            part="loss",
            path="",
        )
    # The recomputation reuses the step's key on purpose (same key, same values);
    # a fresh ledger and JAX's checker off keep a debug-keys run from calling it reuse.
    with keys.checked(jax_check=False), jax.debug_key_reuse(False):
        grads = _compiled_grad(model_config, qat_config)(params, batch, key)
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
        if not np.isfinite(np.asarray(leaf)).all():
            raise fail("gradient", path)
    raise AssertionError(f"step {step}: the finite flag is False but no leaf is NaN or inf")  # pragma: no cover


@functools.lru_cache(maxsize=64)
def _compiled_grad(model_config: ModelConfig, qat_config: QATConfig):
    def grad(params, batch, key):
        return jax.grad(loss)(params, batch, model_config=model_config, qat_config=qat_config, key=key, train=True)

    return jax.jit(grad)


def leaf_name(path: tuple[Any, ...]) -> str:
    """A PyTree path as ``/``-joined keys, as :func:`stejax.model.param_spec` names leaves."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:  # pragma: no cover - every jax key type has one of the above
            parts.append(str(k))
    return "/".join(parts)


def _evaluate(params: Any, x: jax.Array, y: jax.Array, *, model_config: ModelConfig, qat_config: QATConfig):
    logits = cast(jax.Array, forward(params, x, model_config=model_config, qat_config=qat_config))
    value = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == y).astype(jnp.int32))
    return value, correct


@functools.lru_cache(maxsize=64)
def compiled_update(
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
    statistics: bool = True,
):
    """:func:`update` jitted for one model, QAT configuration and optimiser (cached).

    The returned function takes ``(params, opt_state, batch, key)``; every seed of
    a configuration reuses it, and it compiles once per batch shape.
    ``statistics=False`` is the step without the zero-gradient fractions (see :func:`update`).
    """
    step = functools.partial(
        update, model_config=model_config, qat_config=qat_config, optimizer=optimizer, statistics=statistics
    )
    return jax.jit(step)


def step_statistics(
    params: Any,
    batch: Batch | tuple[ArrayLike, ArrayLike],
    key: jax.Array | None,
    *,
    model_config: ModelConfig,
    qat_config: QATConfig,
) -> dict[str, dict[str, jax.Array]]:
    """The zero-gradient fractions :func:`update` reports for a step, without the step.

    A training-mode :func:`forward` of the step's inputs (the same ``params``,
    ``batch`` and ``key``, so the same dropout masks and quantiser inputs as the
    step's own forward pass), batch-averaged: the values of ``update(...,
    statistics=True).zero_grad`` bit for bit, from a program that computes
    nothing else. The key is read through a ``jax.random.clone``, so JAX's
    key-reuse checker accepts the step consuming it too.

    Args:
      params, batch, key, model_config, qat_config: as for :func:`update`.

    Returns:
      ``{"layer_i": {part: float32 ()}}``, :class:`StepMetrics`'s ``zero_grad``.
    """
    stats_key = None if key is None else jax.random.clone(key)
    out = forward(
        params, batch[0], model_config=model_config, qat_config=qat_config, key=stats_key, train=True, return_stats=True
    )
    if not isinstance(out, tuple):  # pragma: no cover - return_stats=True returns a pair
        raise TypeError(f"step_statistics: forward(..., return_stats=True) returned {type(out).__name__}.")
    return out[1]


@functools.lru_cache(maxsize=64)
def compiled_statistics(model_config: ModelConfig, qat_config: QATConfig):
    """:func:`step_statistics` jitted for one model and QAT configuration (cached): ``(params, batch, key)``."""
    return jax.jit(functools.partial(step_statistics, model_config=model_config, qat_config=qat_config))


class TrainStep:
    """The step :func:`stejax.train.train` takes, ``(params, opt_state, batch, key, log)``.

    Returns ``(params, opt_state, metrics)`` as :func:`update` does, from two
    compiled programs. Every step runs ``update(..., statistics=False)``
    (:func:`compiled_update`): the update, the loss and the finite flag, nothing
    else. A step with ``log`` True (``train`` logs an epoch's last batch) also
    runs :func:`compiled_statistics` on the same ``params``, ``batch`` and
    ``key``, a forward pass alone, and its metrics carry the fractions: the
    values ``update(..., statistics=True)`` computes, bit for bit. A step that
    logs nothing pays nothing for them, and the second program costs a
    forward-only compilation once per configuration. ``log`` is a Python bool
    (or a concrete bool array); a step that does not log reports ``zero_grad``
    empty, as ``statistics=False`` does.
    """

    def __init__(self, model_config: ModelConfig, qat_config: QATConfig, optimizer: optax.GradientTransformation):
        self.update = compiled_update(model_config, qat_config, optimizer, statistics=False)
        self.statistics = compiled_statistics(model_config, qat_config)

    def __call__(
        self,
        params: Any,
        opt_state: optax.OptState,
        batch: Batch | tuple[ArrayLike, ArrayLike],
        key: jax.Array | None,
        log: ArrayLike,
    ) -> tuple[Any, optax.OptState, StepMetrics]:
        # Dispatched first: it reads the parameters before the step replaces them.
        zero_grad = self.statistics(params, batch, key) if bool(log) else None
        new_params, opt_state, metrics = self.update(params, opt_state, batch, key)
        if zero_grad is not None:
            metrics = metrics._replace(zero_grad=zero_grad)
        return new_params, opt_state, metrics

    def _cache_size(self) -> int:
        """Compilations of the every-step program (the statistics program compiles on the first logged step)."""
        return self.update._cache_size()


@functools.lru_cache(maxsize=64)
def compiled_train_step(
    model_config: ModelConfig, qat_config: QATConfig, optimizer: optax.GradientTransformation
) -> TrainStep:
    """The step :func:`stejax.train.train` takes, for one model, QAT configuration and optimiser (cached).

    ``(params, opt_state, batch, key, log) -> (params, opt_state, metrics)``: a
    :class:`TrainStep`, ``log`` True on an epoch's last batch. Its programs
    compile once per configuration and batch shape and serve every seed.
    """
    return TrainStep(model_config, qat_config, optimizer)


@functools.lru_cache(maxsize=64)
def compiled_evaluate(model_config: ModelConfig, qat_config: QATConfig):
    """The jitted evaluation of one model and QAT configuration (cached): ``(params, x, y) -> (loss, correct)``."""
    return jax.jit(functools.partial(_evaluate, model_config=model_config, qat_config=qat_config))


def evaluate(
    params: Any, x: ArrayLike, y: ArrayLike, *, model_config: ModelConfig, qat_config: QATConfig
) -> tuple[float, float]:
    """The mean cross-entropy and the accuracy of ``params`` on a whole labelled set (eval mode).

    Checks ``x`` against the input contract and ``y`` (int32 labels in range)
    eagerly, then runs one jitted pass over all of it.

    Args:
      params: the parameter PyTree.
      x: float32 features ``(N, in_features)``, standardised as in training, N >= 1.
      y: int32 labels ``(N,)``.
      model_config, qat_config: the model.

    Returns:
      ``(loss, accuracy)`` as Python floats; the accuracy is a fraction in [0, 1].

    Raises:
      TypeError, ValueError: invalid features or labels (see :func:`loss`).
    """
    input_contract(model_config).check(x)
    if np.ndim(x) != 2 or np.shape(x)[0] == 0:
        raise ValueError(f"evaluate: x must be a non-empty batch (N, F); got shape {np.shape(x)}.")
    _check_labels(y, np.shape(x)[0], model_config.n_classes)
    value, correct = compiled_evaluate(model_config, qat_config)(params, jnp.asarray(x), jnp.asarray(y))
    return float(value), int(correct) / int(np.shape(x)[0])


def _check_labels(y: Any, n: int, n_classes: int) -> None:
    dtype = getattr(y, "dtype", None)
    if dtype is None or np.dtype(dtype) != np.int32:
        got = f"dtype {dtype}" if dtype is not None else f"a {type(y).__name__}"
        raise TypeError(f"loss: labels must be an int32 array; got {got}. Cast explicitly, e.g. y.astype(np.int32).")
    if tuple(np.shape(y)) != (n,):
        raise ValueError(f"loss: labels must have shape ({n},), one per example; got shape {np.shape(y)}.")
    if not isinstance(y, jax.core.Tracer):
        values = np.asarray(y)
        bad = (values < 0) | (values >= n_classes)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"loss: labels must be in [0, {n_classes}); got {values[i]} at index {i}.")
