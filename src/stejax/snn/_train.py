r"""Training a spiking network on the digits, several split seeds at once (``jax.vmap`` over seeds).

One seed is one data split (:func:`stejax.data.split` with that seed, as the QAT
comparison splits per seed), one initialisation and one key stream, all from
``jax.random.key(seed)``:

.. code-block:: text

   key(seed) -> init | run | val encoding | test encoding
   run -> run | epoch                  (once per epoch)
   epoch -> shuffle | steps            (steps: one key per batch, consumed by the rate encoder)

A whole epoch (shuffle, then a ``jax.lax.scan`` over its batches: encode, forward,
loss, gradient, optax update) is one jitted function, vmapped over the seeds, so
the seeds train in one program. The validation and test sets are rate-encoded
once, with their own keys, and scored after every epoch (validation) and once at
the end (test, with the parameters of the best validation epoch).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from stejax import keys
from stejax.data import Splits, load_digits, split
from stejax.snn._encode import rate
from stejax.snn._losses import accuracy_rate, ce_mean_membrane, ce_per_step, ce_spike_count, mse_count, spike_stats
from stejax.snn._network import NetConfig, forward, init_net

if TYPE_CHECKING:  # training needs optax (stejax[train]); the package imports without it
    import optax

__all__ = ["SNNTrainConfig", "SeedsResult", "load_seed_splits", "make_train_step", "train_seeds"]

LOSSES = {
    "ce_mean_membrane": ce_mean_membrane,
    "ce_per_step": ce_per_step,
    "ce_spike_count": ce_spike_count,
    "mse_count": mse_count,
}


@dataclasses.dataclass(frozen=True)
class SNNTrainConfig:
    """The recipe (hashable).

    Attributes:
      n_steps: time steps per example, :math:`T` (default 25).
      epochs: training epochs (default 30).
      batch_size: default 64 (the remainder of each epoch is dropped).
      learning_rate: Adam's peak rate, cosine-decayed to 0 over the run (default 2e-3).
      weight_decay: decoupled weight decay (AdamW) on every parameter (default 0).
      loss: on the readout's output (``NetOutput.traces``): ``"ce_mean_membrane"``
        (default; cross-entropy of the time mean, the integrator readout's loss),
        ``"ce_per_step"``, ``"ce_spike_count"`` (cross-entropy of the counts) or
        ``"mse_count"`` (squared error of the counts against 80% of the steps for the
        label and 20% for the others), the LIF readout's losses.
      val_fraction, test_fraction: the split (0.15 each, as the QAT pipeline).
    """

    n_steps: int = 25
    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 2e-3
    weight_decay: float = 0.0
    loss: str = "ce_mean_membrane"
    val_fraction: float = 0.15
    test_fraction: float = 0.15

    def __post_init__(self) -> None:
        for name in ("n_steps", "epochs", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SNNTrainConfig: {name} must be a positive int; got {v!r}.")
        if not self.learning_rate > 0:
            raise ValueError(f"SNNTrainConfig: learning_rate must be positive; got {self.learning_rate!r}.")
        if self.loss not in LOSSES:
            raise ValueError(f"SNNTrainConfig: loss must be one of {tuple(LOSSES)}; got {self.loss!r}.")


class SeedsResult(NamedTuple):
    """Results of :func:`train_seeds`, one entry per seed (NumPy)."""

    seeds: list[int]
    test_accuracy: np.ndarray  # float (S,)
    best_epoch: np.ndarray  # int (S,), 1-based
    train_loss: np.ndarray  # float (S, epochs): mean training loss of each epoch
    val_accuracy: np.ndarray  # float (S, epochs)
    spike_rate: np.ndarray  # float (S, layers): test-set spikes per neuron per step, best parameters
    silent_fraction: np.ndarray  # float (S, layers)
    all_finite: np.ndarray  # bool (S,): every gradient of every step finite
    params: Any  # the best parameters, stacked over seeds
    seconds: float


def load_seed_splits(seeds: Sequence[int], config: SNNTrainConfig) -> list[Splits]:
    """The digits split by each seed (stratified, duplicate-free; equal sizes across seeds)."""
    digits = load_digits()
    return [split(digits, seed=s, val_fraction=config.val_fraction, test_fraction=config.test_fraction) for s in seeds]


def _scale(x: np.ndarray, top: float) -> np.ndarray:
    # Intensities in [0, 1] for the rate encoder: divided by the training split's largest value.
    return np.clip(np.asarray(x, np.float32) / np.float32(top), 0.0, 1.0)


def make_optimizer(
    config: SNNTrainConfig, steps_per_epoch: int, *, flatten: bool = True
) -> optax.GradientTransformation:
    """Adam (AdamW with ``weight_decay``), the rate cosine-decayed to 0 over ``epochs * steps_per_epoch`` steps.

    ``flatten`` (default True) keeps Adam's two moments as one vector each over all
    the parameters (``optax.flatten``): every entry gets the same arithmetic, but an
    update is one fused kernel
    per moment instead of one per parameter array, and the optimiser state is four
    arrays instead of two per parameter array. Training steps are short, so this
    bookkeeping is a large share of them: on the two-layer network of the Spyx
    comparison at T = 8 the step takes about 8% less CPU time (``docs/snn.md``,
    "Speed"). The results agree with ``flatten=False`` to rounding, not bit for
    bit (XLA contracts multiplies and adds into fused multiply-adds differently in
    the two programs). The state is then the flat vectors: initialise it with this
    optimiser's ``init``, as always.
    """
    import optax

    schedule = optax.cosine_decay_schedule(config.learning_rate, config.epochs * steps_per_epoch)
    if config.weight_decay:
        inner = optax.adamw(schedule, weight_decay=config.weight_decay)
    else:
        inner = optax.adam(schedule)
    if flatten:
        inner = optax.flatten(inner)

    # optax mixes its int32 step count with floats, which strict promotion refuses; all values stay float32.
    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return inner.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return inner.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def make_train_step(
    net: NetConfig, config: SNNTrainConfig, optimizer: optax.GradientTransformation
) -> Callable[..., Any]:
    """One training step ``(params, opt_state, x, y, key) -> (params, opt_state, loss, finite)``.

    ``x`` is a batch of intensities ``(B, F)`` in [0, 1], rate-encoded with
    ``key``; ``finite`` says whether every gradient entry was finite. Pure; jit it.
    """
    import optax

    loss_fn = LOSSES[config.loss]

    def train_step(params, opt_state, x, y, key):
        spikes_in = rate(x, config.n_steps, key=key)

        def objective(p):
            return loss_fn(forward(net, p, spikes_in).traces, y)

        value, grads = jax.value_and_grad(objective)(params)
        # One check over all the gradients as one vector: with the flattened optimiser XLA
        # shares the concatenation with Adam's, so the check costs one reduction.
        finite = jnp.all(jnp.isfinite(ravel_pytree(grads)[0]))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, finite

    return train_step


def _make_epoch(
    net: NetConfig, config: SNNTrainConfig, optimizer: optax.GradientTransformation, n_train: int
) -> Callable[..., Any]:
    train_step = make_train_step(net, config, optimizer)
    n_batches = n_train // config.batch_size

    def epoch(params, opt_state, key, x, y):
        k_shuffle, k_steps = keys.split(key, where="snn epoch: shuffle | steps")
        order = jax.random.permutation(keys.consume(k_shuffle, where="snn epoch shuffle"), n_train)
        order = order[: n_batches * config.batch_size].reshape(n_batches, config.batch_size)
        step_keys = keys.split(k_steps, n_batches, where="snn epoch: one key per step")

        def body(carry, item):
            p, s = carry
            idx, k = item
            p, s, value, finite = train_step(p, s, x[idx], y[idx], k)
            return (p, s), (value, finite)

        (params, opt_state), (losses, finite) = jax.lax.scan(body, (params, opt_state), (order, step_keys))
        return params, opt_state, jnp.mean(losses), jnp.all(finite)

    return epoch


def _evaluate(net: NetConfig, params, spikes_in, y):
    out = forward(net, params, spikes_in)
    stats = [spike_stats(s) for s in out.spikes]
    return (
        accuracy_rate(out.traces, y),
        jnp.stack([st["rate"] for st in stats]),
        jnp.stack([st["silent_fraction"] for st in stats]),
    )


def _keep_improved(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per seed (leading axis), ``new`` where ``mask`` else ``old``."""
    return jax.tree.map(lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


def train_seeds(
    net: NetConfig,
    config: SNNTrainConfig,
    seeds: Sequence[int],
    *,
    splits: Sequence[Splits] | None = None,
    on_epoch: Callable[[Mapping[str, Any]], None] | None = None,
) -> SeedsResult:
    """Train ``net`` by ``config`` once per seed, all seeds in one vmapped program.

    Args:
      net: the network (its ``in_features`` and ``n_classes`` must fit the data).
      config: the recipe.
      seeds: distinct non-negative seeds: each gives its split, initialisation and keys.
      splits: the data per seed (default :func:`load_seed_splits`); all of equal sizes.
      on_epoch: called after each epoch with ``{"epoch", "train_loss", "val_accuracy"}`` (per-seed lists).

    Returns:
      A :class:`SeedsResult`.

    Raises:
      ValueError: no seeds or repeated ones, splits of unequal sizes or the wrong width.
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"train_seeds: seeds must be distinct non-negative ints, at least one; got {seeds}.")
    splits = load_seed_splits(seeds, config) if splits is None else list(splits)
    if len(splits) != len(seeds):
        raise ValueError(f"train_seeds: {len(seeds)} seeds but {len(splits)} splits.")
    sizes = {(len(s.train), len(s.val), len(s.test)) for s in splits}
    if len(sizes) != 1:
        raise ValueError(f"train_seeds: the splits must have equal sizes to train together; got {sorted(sizes)}.")
    if splits[0].train.x.shape[1] != net.in_features:
        raise ValueError(
            f"train_seeds: net.in_features is {net.in_features} but the data has {splits[0].train.x.shape[1]} features."
        )
    n_train = len(splits[0].train)
    if n_train < config.batch_size:
        raise ValueError(f"train_seeds: batch_size {config.batch_size} exceeds the {n_train} training examples.")
    started = time.perf_counter()
    top = [float(np.max(s.train.x)) for s in splits]
    x_train = jnp.asarray(np.stack([_scale(s.train.x, t) for s, t in zip(splits, top, strict=True)]))
    y_train = jnp.asarray(np.stack([s.train.y for s in splits]).astype(np.int32))
    y_val = jnp.asarray(np.stack([s.val.y for s in splits]).astype(np.int32))
    y_test = jnp.asarray(np.stack([s.test.y for s in splits]).astype(np.int32))

    roots = [keys.split(jax.random.key(s), 4, where=f"snn seed {s}: init | run | val | test") for s in seeds]
    init_keys = jnp.stack([r[0] for r in roots])
    run_keys = jnp.stack([r[1] for r in roots])
    # The evaluation sets are encoded once, so that every epoch is scored on the same spikes.
    val_in = jnp.stack(
        [rate(_scale(s.val.x, t), config.n_steps, key=r[2]) for s, t, r in zip(splits, top, roots, strict=True)]
    )
    test_in = jnp.stack(
        [rate(_scale(s.test.x, t), config.n_steps, key=r[3]) for s, t, r in zip(splits, top, roots, strict=True)]
    )

    optimizer = make_optimizer(config, n_train // config.batch_size)
    params = jax.vmap(lambda k: init_net(net, key=k))(init_keys)
    opt_state = jax.vmap(optimizer.init)(params)
    epoch = jax.jit(jax.vmap(_make_epoch(net, config, optimizer, n_train)))
    evaluate = jax.jit(jax.vmap(lambda p, s, y: _evaluate(net, p, s, y)))
    split_run = jax.jit(jax.vmap(lambda k: tuple(jax.random.split(k))))

    best = params
    best_acc = np.full(len(seeds), -1.0)
    best_epoch = np.zeros(len(seeds), np.int64)
    losses, val_accs = [], []
    finite = np.ones(len(seeds), bool)
    for e in range(config.epochs):
        run_keys, epoch_keys = split_run(run_keys)
        params, opt_state, loss, ok = epoch(params, opt_state, epoch_keys, x_train, y_train)
        val_acc, _, _ = evaluate(params, val_in, y_val)
        loss, ok, val_acc = np.asarray(loss), np.asarray(ok), np.asarray(val_acc)
        finite &= ok
        improved = val_acc > best_acc
        best_acc = np.where(improved, val_acc, best_acc)
        best_epoch = np.where(improved, e + 1, best_epoch)
        best = _keep_improved(jnp.asarray(improved), params, best)
        losses.append(loss)
        val_accs.append(val_acc)
        if on_epoch is not None:
            on_epoch({"epoch": e + 1, "train_loss": loss.tolist(), "val_accuracy": val_acc.tolist()})
    test_acc, rates, silent = (np.asarray(a) for a in evaluate(best, test_in, y_test))
    return SeedsResult(
        seeds=seeds,
        test_accuracy=test_acc.astype(np.float64),
        best_epoch=best_epoch,
        train_loss=np.stack(losses, axis=1).astype(np.float64),
        val_accuracy=np.stack(val_accs, axis=1).astype(np.float64),
        spike_rate=rates.astype(np.float64),
        silent_fraction=silent.astype(np.float64),
        all_finite=finite,
        params=best,
        seconds=time.perf_counter() - started,
    )
