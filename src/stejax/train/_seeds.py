"""Many seeds of one recipe as one vmapped program: per-seed splits, keys and early stopping by masking."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stejax import keys
from stejax.data import Normalizer, Splits
from stejax.model import ConvConfig, ModelConfig, QATConfig, init_params
from stejax.train._config import TrainConfig, make_optimizer
from stejax.train._loop import CALIBRATION_ROWS, load_splits
from stejax.train._result import TrainResult
from stejax.train._step import (
    Batch,
    NonFiniteError,
    _evaluate,
    compiled_update,
    logged_update,
    needs_key,
    raise_if_nonfinite,
)

__all__ = ["train_seeds"]

# The fields that may differ between the runs of one vmapped program.
_PER_RUN_FIELDS = ("seed", "data_seed")


def train_seeds(
    configs: Sequence[TrainConfig],
    *,
    splits: Sequence[Splits] | None = None,
    out_dirs: Sequence[str | Path] | None = None,
    on_epoch: Callable[[int, Mapping[str, Any]], None] | None = None,
    vmap_runs: bool | None = None,
) -> list[TrainResult]:
    r"""Train several runs of one recipe at once: one jitted, vmapped program over the runs.

    The runs may differ only in ``seed`` and ``data_seed`` (and so in their
    data split): every array then has the same shape in every run, and
    :func:`stejax.train.train`'s epoch becomes one ``jax.vmap`` over runs of a
    ``jax.lax.scan`` over the epoch's steps, compiled once. Each run keeps the
    meaning of :func:`stejax.train.train`:

    * its own key stream, the same as ``train``'s (``key(seed) -> init | run``,
      ``run -> run | epoch shuffle`` once per epoch, ``run -> run | step`` once
      per step with dropout), so the same initialisation, batches and dropout
      masks; the arithmetic is the same up to XLA's fusion and reduction order;
    * its own split and :class:`stejax.data.Normalizer` fitted on its own
      training part;
    * its own early stopping, by masking: after each epoch every run still
      going compares its validation result with its best so far (a higher
      accuracy, or the same accuracy and a lower loss) and keeps its best
      parameters with ``jnp.where``; a run whose patience has run out is
      stopped (its later epochs, still computed with the others, are neither
      recorded nor selected), and the program ends when every run has stopped
      or ``epochs`` is reached;
    * the test part scored once, at the end, with each run's best parameters;
    * the non-finite guard: a NaN or infinity in a running run's step (its
      parameters, loss or gradient) raises :class:`NonFiniteError` naming the
      step and the first non-finite leaf. The epoch is checked when it ends;
      the failing run's epoch is then replayed step by step with
      :func:`stejax.train.update` up to the failing step, whose inputs the
      guard inspects.

    Per-step losses come out of every step and are averaged per epoch as in
    ``train``; the zero-gradient fractions, as in ``train``, are those of the
    epoch's last batch (the only step that computes them). The epoch's wall time (``seconds`` in
    each record) is the whole program's, shared by the runs.

    Args:
      configs: the runs' recipes, at least one; equal but for ``seed`` and
        ``data_seed``; distinct.
      splits: one :class:`stejax.data.Splits` per run (default:
        :func:`stejax.train.load_splits` of each config); every run's parts must
        have the same sizes.
      out_dirs: one run directory per run (optional), written by
        :func:`stejax.train.save_run` at the end.
      on_epoch: called as ``on_epoch(run_index, record)`` after each epoch of each
        run still going.

    Returns:
      One :class:`TrainResult` per run, in order.

    Raises:
      ValueError: no configs, configs that differ in more than ``seed`` and
        ``data_seed`` or repeat a run, a length mismatch, parts of different
        sizes, or data too small for one batch.
      NonFiniteError: a non-finite step in a run still going.

    Example:
      >>> import dataclasses
      >>> from stejax.data import load_digits, split
      >>> from stejax.train import TrainConfig, train_seeds
      >>> base = TrainConfig(model="mlp", hidden=(8,), dropout=0.0, epochs=1, batch_size=128)
      >>> runs = [dataclasses.replace(base, seed=s, data_seed=s) for s in (0, 1)]
      >>> results = train_seeds(runs)
      >>> [r.config.seed for r in results], [r.n_test for r in results]
      ([0, 1], [269, 269])
    """
    configs = _check_configs(configs)
    base = configs[0]
    n_runs = len(configs)
    splits = [load_splits(c) for c in configs] if splits is None else list(splits)
    if len(splits) != n_runs:
        raise ValueError(f"train_seeds: needs one Splits per config ({n_runs}); got {len(splits)}.")
    if out_dirs is not None and len(out_dirs) != n_runs:
        raise ValueError(f"train_seeds: needs one out_dir per config ({n_runs}); got {len(out_dirs)}.")
    sizes = _check_sizes(splits)
    started = time.perf_counter()
    n_train = sizes[0]
    steps_per_epoch = n_train // base.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"train_seeds: batch_size {base.batch_size} is larger than the training split ({n_train} examples)."
        )
    normalizers = [Normalizer.fit(s.train.x, per_feature=base.normalize == "feature") for s in splits]

    def stacked(part: str) -> tuple[jax.Array, jax.Array]:
        x = np.stack([n.apply(getattr(s, part).x) for n, s in zip(normalizers, splits, strict=True)])
        y = np.stack([np.asarray(getattr(s, part).y) for s in splits])
        return jnp.asarray(x), jnp.asarray(y)

    (x_train, y_train), (x_val, y_val) = stacked("train"), stacked("val")
    model_config = base.model_config(splits[0].train)
    qat_config = base.qat_config()
    optimizer = make_optimizer(base, steps_per_epoch)
    with_key = needs_key(model_config, train=True)

    # Each run's key stream starts as train's: key(seed) -> init | run.
    k_runs, run_params = [], []
    for s, config in enumerate(configs):
        k_init, k_run = keys.split(jax.random.key(config.seed), where="train_seeds: seed -> init, run")
        calibration = x_train[s, : min(CALIBRATION_ROWS, n_train)]
        run_params.append(init_params(k_init, model_config, qat_config, calibration_batch=calibration))
        k_runs.append(k_run)
    if vmap_runs is None:
        # XLA:CPU batches a convolution whose kernel differs per run as a grouped
        # convolution, which measured several times slower than the runs one after
        # another; dense models gain from the batching.
        vmap_runs = not isinstance(model_config, ConvConfig)
    groups = [np.arange(n_runs)] if vmap_runs else [np.array([s]) for s in range(n_runs)]

    def stack(values: Sequence[Any], rows: np.ndarray) -> Any:
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *[values[int(r)] for r in rows])

    # Per group: the stacked state (params, opt_state, k_run) and data.
    state = []
    for rows in groups:
        params = stack(run_params, rows)
        state.append((params, jax.vmap(optimizer.init)(params), stack(k_runs, rows)))
    data = [(x_train[rows], y_train[rows], x_val[rows], y_val[rows]) for rows in groups]
    best_params = [g[0] for g in state]
    shuffle_fn = _compiled_shuffle(n_train)
    step_fn = _compiled_step(model_config, qat_config, optimizer, base.batch_size, with_key)
    evaluate_fn = _compiled_evaluate_runs(model_config, qat_config)

    metrics_paths: list[Path | None] = [None] * n_runs
    if out_dirs is not None:
        for s, d in enumerate(out_dirs):
            Path(d).mkdir(parents=True, exist_ok=True)
            path = Path(d) / "metrics.jsonl"
            path.write_text("", encoding="utf-8")
            metrics_paths[s] = path

    history: list[list[dict[str, Any]]] = [[] for _ in range(n_runs)]
    best_epoch = np.zeros(n_runs, np.int64)
    best_acc = np.full(n_runs, -1.0)
    best_loss = np.full(n_runs, np.inf)
    stale = np.zeros(n_runs, np.int64)
    running = np.ones(n_runs, bool)
    stopped_early = np.zeros(n_runs, bool)
    for epoch in range(1, base.epochs + 1):
        epoch_start = time.perf_counter()
        active = [g for g, rows in enumerate(groups) if running[rows].any()]
        start = {g: state[g] for g in active}
        orders = {}
        for g in active:
            params, opt_state, k_run = state[g]
            k_run, orders[g] = shuffle_fn(k_run)
            state[g] = (params, opt_state, k_run)
        # Every step of every group is dispatched without waiting: nothing is read
        # back until the epoch ends (the finite flags are checked then).
        per_step: dict[int, list[Any]] = {g: [] for g in active}
        for b in range(steps_per_epoch):
            for g in active:
                x, y = data[g][0], data[g][1]
                # As in train: the zero-gradient fractions on the epoch's last batch only.
                log = jnp.bool_(b == steps_per_epoch - 1)
                *new_state, metrics = step_fn(*state[g], x, y, orders[g], jnp.int32(b), log)
                state[g] = tuple(new_state)
                per_step[g].append(metrics)
        val = {g: evaluate_fn(state[g][0], data[g][2], data[g][3]) for g in active}
        outputs = jax.device_get((per_step, val))
        seconds = time.perf_counter() - epoch_start
        for g in active:
            steps, (val_loss, val_correct) = outputs[0][g], outputs[1][g]
            for i, s in enumerate(groups[g]):
                if not running[s]:
                    continue
                finite = np.array([m.finite[i] for m in steps])
                if not finite.all():
                    _replay_and_raise(
                        int(s), epoch, int(np.argmin(finite)), steps_per_epoch,
                        jax.tree.map(lambda a, i=i: a[i], start[g]),
                        (data[g][0][i], data[g][1][i]), model_config, qat_config, optimizer, base.batch_size,
                        with_key,
                    )  # fmt: skip
                val_accuracy = int(val_correct[i]) / sizes[1]
                last = steps[-1].zero_grad
                record = {
                    "epoch": epoch,
                    "train_loss": float(np.mean([m.loss[i] for m in steps])),
                    "val_loss": float(val_loss[i]),
                    "val_accuracy": val_accuracy,
                    "seconds": seconds,
                    "steps": epoch * steps_per_epoch,
                    "zero_grad_fraction": {
                        f"{layer}/{part}": float(v[i]) for layer, parts in last.items() for part, v in parts.items()
                    },
                }
                history[s].append(record)
                path = metrics_paths[s]
                if path is not None:
                    with path.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(record) + "\n")
                if on_epoch is not None:
                    on_epoch(int(s), record)
                loss_s = float(val_loss[i])
                if (val_accuracy, -loss_s) > (best_acc[s], -best_loss[s]):
                    best_epoch[s], best_acc[s], best_loss[s], stale[s] = epoch, val_accuracy, loss_s, 0
                else:
                    stale[s] += 1
                    if base.patience is not None and stale[s] >= base.patience and epoch < base.epochs:
                        stopped_early[s], running[s] = True, False
            improved = jnp.asarray(best_epoch[groups[g]] == epoch)
            if bool(improved.any()):
                best_params[g] = _keep_where(improved, state[g][0], best_params[g])
        if not running.any():
            break

    x_test, y_test = stacked("test")
    tests = jax.device_get([evaluate_fn(best_params[g], x_test[rows], y_test[rows]) for g, rows in enumerate(groups)])
    test_loss, test_correct = np.zeros(n_runs), np.zeros(n_runs, np.int64)
    for (loss_g, correct_g), rows in zip(tests, groups, strict=True):
        test_loss[rows], test_correct[rows] = loss_g, correct_g
    where = {int(s): (g, i) for g, rows in enumerate(groups) for i, s in enumerate(rows)}
    seconds = time.perf_counter() - started
    results = []
    for s, config in enumerate(configs):
        result = TrainResult(
            config=config,
            model_config=model_config,
            qat_config=qat_config,
            params=jax.tree.map(lambda a, s=s: a[where[s][1]], best_params[where[s][0]]),
            normalizer=normalizers[s],
            history=tuple(history[s]),
            best_epoch=int(best_epoch[s]),
            best_val_accuracy=max(float(best_acc[s]), 0.0),
            test_loss=float(test_loss[s]),
            test_accuracy=int(test_correct[s]) / sizes[2],
            n_test=sizes[2],
            stopped_early=bool(stopped_early[s]),
            seconds=seconds,
        )
        if out_dirs is not None:
            from stejax.train._rundir import save_run

            save_run(result, out_dirs[s], splits=splits[s])
        results.append(result)
    return results


def _check_configs(configs: Sequence[TrainConfig]) -> list[TrainConfig]:
    configs = list(configs)
    if not configs:
        raise ValueError("train_seeds: needs at least one TrainConfig; got none.")
    for i, c in enumerate(configs):
        if not isinstance(c, TrainConfig):
            raise TypeError(f"train_seeds: configs[{i}] must be a TrainConfig; got {type(c).__name__}.")
    shared = _PER_RUN_FIELDS
    first = dataclasses.replace(configs[0], seed=0, data_seed=0)
    for i, c in enumerate(configs[1:], start=1):
        if dataclasses.replace(c, seed=0, data_seed=0) != first:
            diff = [
                f.name
                for f in dataclasses.fields(c)
                if f.name not in shared and getattr(c, f.name) != getattr(configs[0], f.name)
            ]
            raise ValueError(
                f"train_seeds: configs may differ only in {list(_PER_RUN_FIELDS)}; configs[{i}] differs from "
                f"configs[0] in {diff}."
            )
    runs = [(c.seed, c.data_seed) for c in configs]
    if len(set(runs)) != len(runs):
        raise ValueError(f"train_seeds: every run needs its own (seed, data_seed); got {runs}.")
    return configs


def _check_sizes(splits: Sequence[Splits]) -> tuple[int, int, int]:
    sizes = [(len(s.train), len(s.val), len(s.test)) for s in splits]
    if len(set(sizes)) != 1:
        raise ValueError(
            "train_seeds: every run's split must have the same (train, val, test) sizes, so that one program "
            f"serves them all; got {sizes}."
        )
    _, n_val, n_test = sizes[0]
    for name, n in (("val", n_val), ("test", n_test)):
        if n == 0:
            raise ValueError(f"train_seeds: the {name} split is empty; it needs at least one example.")
    return sizes[0]


@functools.lru_cache(maxsize=8)
def _compiled_shuffle(n_train: int):
    """Every run's epoch order, jitted: ``k_run -> (k_run, order)``, as train splits its run key."""

    def one_run(k_run):
        k_run, k_shuffle = keys.split(k_run, where="train_seeds: run -> run, epoch shuffle")
        return k_run, jax.random.permutation(keys.consume(k_shuffle, where="train_seeds: epoch shuffle"), n_train)

    return jax.jit(jax.vmap(one_run))


@functools.lru_cache(maxsize=32)
def _compiled_step(
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
    batch_size: int,
    with_key: bool,
):
    """One step of every run of a group, jitted and vmapped over the runs.

    ``(params, opt_state, k_run, x, y, order, b, log) -> (params, opt_state, k_run, metrics)``:
    batch ``b`` is rows ``order[b * batch_size : (b + 1) * batch_size]``, gathered
    on the device; the step key is split from the run key inside, as train does;
    ``log`` (shared by the runs) asks for the zero-gradient fractions
    (:func:`stejax.train.logged_update`).
    """

    def one_run(params, opt_state, k_run, x, y, order, b, log):
        rows = jax.lax.dynamic_slice_in_dim(order, b * batch_size, batch_size)
        k_step = None
        if with_key:
            k_run, k_step = keys.split(k_run, where="train_seeds: run -> run, step")
        batch = Batch(x[rows], y[rows])
        params, opt_state, metrics = logged_update(
            params, opt_state, batch, k_step, log, model_config=model_config, qat_config=qat_config, optimizer=optimizer
        )
        return params, opt_state, k_run, metrics

    return jax.jit(jax.vmap(one_run, in_axes=(0, 0, 0, 0, 0, 0, None, None)))


@functools.lru_cache(maxsize=32)
def _compiled_evaluate_runs(model_config: ModelConfig, qat_config: QATConfig):
    """Every run's ``(loss, correct)`` on its own labelled set, jitted."""
    evaluate = functools.partial(_evaluate, model_config=model_config, qat_config=qat_config)
    return jax.jit(jax.vmap(evaluate))


@jax.jit
def _keep_where(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per run: ``new`` where ``mask`` (shape ``(runs,)``), else ``old``."""
    return jax.tree.map(lambda a, b: jnp.where(jnp.reshape(mask, (-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


def _replay_and_raise(
    run: int,
    epoch: int,
    failed: int,
    steps_per_epoch: int,
    start: tuple[Any, Any, jax.Array],
    data: tuple[jax.Array, jax.Array],
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
    batch_size: int,
    with_key: bool,
) -> None:
    """Replay run ``run``'s epoch step by step up to its first non-finite step, then let the guard name it."""
    params, opt_state, k_run = start
    x, y = data
    step_fn = compiled_update(model_config, qat_config, optimizer)
    k_run, k_shuffle = keys.split(k_run, where="train_seeds: replay, epoch shuffle")
    order = jax.random.permutation(keys.consume(k_shuffle, where="train_seeds: replay shuffle"), x.shape[0])
    for b in range(failed + 1):
        rows = order[b * batch_size : (b + 1) * batch_size]
        batch = Batch(x[rows], y[rows])
        k_step = None
        if with_key:
            k_run, k_step = keys.split(k_run, where="train_seeds: replay step")
        step_params = params
        params, opt_state, metrics = step_fn(params, opt_state, batch, k_step)
        raise_if_nonfinite(
            metrics,
            step=(epoch - 1) * steps_per_epoch + b + 1,
            params=step_params,
            batch=batch,
            key=k_step,
            model_config=model_config,
            qat_config=qat_config,
            where=f"run {run}, epoch {epoch}, batch {b + 1}",
        )
    # The vmapped program and the replay differ only in fusion order; a step that is
    # non-finite in one and finite in the other is reported as it was seen.
    raise NonFiniteError(
        f"non-finite step {(epoch - 1) * steps_per_epoch + failed + 1} in run {run} (epoch {epoch}, batch "
        f"{failed + 1}) of the vmapped program; the one-run replay of that step was finite.",
        step=(epoch - 1) * steps_per_epoch + failed + 1,
        part="unknown",
        path="",
    )
