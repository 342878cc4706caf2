"""The training loop: one explicit key stream, jitted steps, early stopping, the best parameters."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stejax import keys
from stejax.data import Normalizer, Splits, batches, load_digits, split
from stejax.model import ModelConfig, QATConfig, init_params
from stejax.train._config import TrainConfig, make_optimizer
from stejax.train._parallel import (
    DATA_AXIS,
    PARAM_SHARDINGS,
    compiled_parallel_update,
    gather,
    param_shardings,
    place,
    shard_batch,
)
from stejax.train._result import KeyCheck, TrainResult
from stejax.train._step import (
    Batch,
    StepMetrics,
    compiled_evaluate,
    compiled_train_step,
    needs_key,
    raise_if_nonfinite,
    update,
)

__all__ = ["KeyCheck", "TrainResult", "load_splits", "train"]

# Rows of the (standardised) training set used to initialise the LSQ input steps.
CALIBRATION_ROWS = 256


def load_splits(config: TrainConfig) -> Splits:
    """The scikit-learn digits, split by ``config.data_seed`` and the config's fractions."""
    return split(
        load_digits(),
        seed=config.data_seed,
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
    )


def train(
    config: TrainConfig,
    *,
    splits: Splits | None = None,
    out_dir: str | Path | None = None,
    debug_keys: int = 0,
    on_epoch: Callable[[Mapping[str, Any]], None] | None = None,
    mesh: Mesh | None = None,
    param_sharding: str = "replicated",
) -> TrainResult:
    r"""Train one model by ``config``; keep the parameters with the best validation accuracy.

    The data: ``splits`` (default: :func:`load_splits`), standardised by a
    :class:`stejax.data.Normalizer` fitted on the training split. Each epoch walks
    the training split in a fresh random order in batches of ``batch_size``
    (the remainder dropped), one :func:`compiled_train_step` per batch (compiled
    once per configuration and reused by every seed; the zero-gradient fractions
    are computed on the epoch's last batch only, the logging step, by a
    forward-only program beside the step), then scores the validation split.
    The test split is scored once, after training, with the best parameters; it
    never steers training or selection.

    The keys form one explicit stream from ``jax.random.key(config.seed)``:

    .. code-block:: text

       key(seed) -> init (one subkey per layer) | run
       run -> run | epoch shuffle   (once per epoch: jax.random.permutation)
       run -> run | step            (once per step, models with dropout only:
                                     one subkey per example, split again per layer)

    Every subkey is consumed by exactly one random operation; ``debug_keys=n``
    proves it for the initialisation, the first shuffle and the first ``n`` steps
    (at most one epoch) by running them eagerly under :func:`stejax.keys.checked`,
    which raises :class:`stejax.keys.KeyReuseError` at a second use.

    The best parameters are those of the epoch with the highest validation
    accuracy; ties (one example is ``1 / len(val)``, so they are common) go to the
    lower validation loss. Early stopping: after ``patience`` epochs in a row
    without a better epoch in this sense the run ends. Every step's loss, gradient and input parameters are
    checked (the step's finite flag is read once the next step has been dispatched,
    so the host does not wait for the device mid-epoch); a NaN or infinity raises
    :class:`NonFiniteError` naming the step and the first non-finite leaf before
    anything else is recorded (nothing is ever replaced by a number).

    Data parallel: with a ``mesh`` (:func:`data_mesh`), every batch is split over
    its ``"data"`` axis (:func:`shard_batch`), the parameters and the optimiser
    state are replicated (or split, ``param_sharding="sharded"``), and the step
    is :func:`compiled_parallel_update`: the same pure :func:`update`, so the same
    key stream, batches and arithmetic, with the gradient's sum over the batch
    done as per-device partial sums and an all-reduce. The results equal the
    one-device run up to that reduction order. Evaluation runs on the replicated
    validation and test sets. Across processes (after
    ``jax.distributed.initialize``), every process runs this same function on
    the same data and the mesh spans every process's devices; only process 0
    writes ``out_dir``. The returned parameters are gathered to ordinary
    single-device arrays in every process.

    Args:
      config: the recipe.
      splits: the data (default: the digits split by ``config``).
      out_dir: if given, the run directory: ``metrics.jsonl`` gets one line per
        epoch as training goes (the mean training loss over the epoch's steps, the
        validation loss and accuracy, the seconds, and the zero-gradient fractions
        of the epoch's last batch), and :func:`save_run` writes the rest at the end.
      debug_keys: the number of leading steps to check with the key ledger
        (default 0: off).
      on_epoch: called with each epoch's record (for a progress display).
      mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis for data-parallel
        training (default None: one device). ``batch_size`` must be a multiple
        of the axis size.
      param_sharding: with a mesh, ``"replicated"`` (default) or ``"sharded"``
        (see :func:`param_shardings`).

    Returns:
      A :class:`TrainResult`.

    Raises:
      NonFiniteError: a non-finite loss, gradient or parameter.
      stejax.keys.KeyReuseError: in debug mode, a key consumed twice.
      ValueError: a training split smaller than one batch, an empty validation or
        test split, or a config that does not fit the data; with a mesh, a batch
        size that does not split over its ``"data"`` axis, an unknown
        ``param_sharding``, or ``debug_keys`` (the ledger checks eager
        one-device steps; the key stream does not depend on the mesh, so check
        it without one).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"train: config must be a TrainConfig; got {type(config).__name__}.")
    if isinstance(debug_keys, bool) or not isinstance(debug_keys, int) or debug_keys < 0:
        raise ValueError(f"train: debug_keys must be an int >= 0 (steps to check); got {debug_keys!r}.")
    devices = _check_mesh(mesh, param_sharding, config.batch_size, debug_keys)
    started = time.perf_counter()
    splits = load_splits(config) if splits is None else splits
    for part in ("val", "test"):
        if len(getattr(splits, part)) == 0:
            raise ValueError(f"train: the {part} split is empty; it needs at least one example.")
    n_train = len(splits.train)
    steps_per_epoch = n_train // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"train: batch_size {config.batch_size} is larger than the training split ({n_train} examples)."
        )
    normalizer = Normalizer.fit(splits.train.x, per_feature=config.normalize == "feature")
    x_train, y_train = normalizer.apply(splits.train.x), np.asarray(splits.train.y)
    x_val, y_val = jnp.asarray(normalizer.apply(splits.val.x)), jnp.asarray(splits.val.y)
    model_config = config.model_config(splits.train)
    qat_config = config.qat_config()
    optimizer = make_optimizer(config, steps_per_epoch)
    # Only an epoch's last batch (the logging step) computes the zero-gradient fractions:
    # on one device by a forward-only program beside the step (TrainStep); with a mesh,
    # by the step compiled with them.
    train_step = compiled_train_step(model_config, qat_config, optimizer)
    if mesh is not None:
        step_fns = {
            s: compiled_parallel_update(model_config, qat_config, optimizer, mesh, param_sharding, statistics=s)
            for s in (False, True)
        }
        replicated = NamedSharding(mesh, PartitionSpec())
        x_val, y_val = place((x_val, y_val), replicated)
    evaluate_fn = compiled_evaluate(model_config, qat_config)
    with_key = needs_key(model_config, train=True)

    # Across processes every process trains; one writes.
    writer = jax.process_index() == 0
    metrics_path = None
    if out_dir is not None and writer:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = out_dir / "metrics.jsonl"
        metrics_path.write_text("", encoding="utf-8")

    # The debug block (ledger and eager mode) is closed after the checked steps, or
    # here on the way out, also when a step raises.
    with contextlib.ExitStack() as debug:
        ledger = None
        if debug_keys:
            ledger = debug.enter_context(keys.checked())
            debug.enter_context(jax.disable_jit())
        key_check = None

        k_init, k_run = keys.split(jax.random.key(config.seed), where="train: seed -> init, run")
        calibration = x_train[: min(CALIBRATION_ROWS, n_train)]
        params = init_params(k_init, model_config, qat_config, calibration_batch=calibration)
        opt_state = optimizer.init(params)
        if mesh is not None:
            params = place(params, param_shardings(params, mesh, param_sharding))
            opt_state = place(opt_state, param_shardings(opt_state, mesh, param_sharding))

        history: list[dict[str, Any]] = []
        best_params, best_epoch, best_val_accuracy, best_val_loss = params, 0, -1.0, float("inf")
        stale = 0
        stopped_early = False
        global_step = 0
        for epoch in range(1, config.epochs + 1):
            epoch_start = time.perf_counter()
            k_run, k_shuffle = keys.split(k_run, where=f"train: run -> run, epoch {epoch} shuffle")
            order = jax.random.permutation(keys.consume(k_shuffle, where=f"train: epoch {epoch} shuffle"), n_train)
            losses = []
            # The guard of a step is read after the next step is dispatched, so that the
            # host never waits for the device mid-epoch; a non-finite step still stops
            # the run, naming that step, before anything else happens on the host.
            pending: _Guard | None = None
            for b, (xb, yb) in enumerate(
                batches(x_train, y_train, batch_size=config.batch_size, order=np.asarray(order), drop_last=True),
                start=1,
            ):
                global_step += 1
                logging = b == steps_per_epoch
                k_step = None
                if with_key:
                    k_run, k_step = keys.split(k_run, where=f"train: run -> run, step {global_step}")
                step_params = params
                if mesh is not None:
                    # Host copies (NumPy, not a Batch of jax.Arrays), for the guard's recomputation.
                    batch: Batch | tuple[np.ndarray, np.ndarray] = (xb, yb)
                    sharded_batch = shard_batch(batch, mesh)
                    step_key = None if k_step is None else place(k_step, replicated)
                    params, opt_state, metrics = step_fns[logging](params, opt_state, sharded_batch, step_key)
                elif ledger is not None:
                    batch = Batch(jnp.asarray(xb), jnp.asarray(yb))
                    params, opt_state, metrics = update(
                        params,
                        opt_state,
                        batch,
                        k_step,
                        model_config=model_config,
                        qat_config=qat_config,
                        optimizer=optimizer,
                        statistics=logging,
                    )
                else:
                    batch = Batch(jnp.asarray(xb), jnp.asarray(yb))
                    params, opt_state, metrics = train_step(params, opt_state, batch, k_step, logging)
                if pending is not None:
                    pending.check(model_config, qat_config, mesh is not None)
                pending = _Guard(metrics, global_step, step_params, batch, k_step, f"epoch {epoch}, batch {b}")
                losses.append(metrics.loss)
                if ledger is not None and (global_step >= debug_keys or b == steps_per_epoch):
                    debug.close()
                    key_check = KeyCheck(global_step, len(ledger), ledger.unused())
                    ledger = None
            if pending is not None:
                pending.check(model_config, qat_config, mesh is not None)
            # The zero-gradient fractions of the epoch's last batch (the logging step).
            losses, zero_grad = jax.device_get((losses, metrics.zero_grad))
            val_loss, val_correct = evaluate_fn(params, x_val, y_val)
            val_accuracy = int(val_correct) / len(splits.val)
            record: dict[str, Any] = {
                "epoch": epoch,
                "train_loss": float(np.mean(losses)),
                "val_loss": float(val_loss),
                "val_accuracy": val_accuracy,
                "seconds": time.perf_counter() - epoch_start,
                "steps": global_step,
                "zero_grad_fraction": _flat_stats(zero_grad),
            }
            history.append(record)
            if metrics_path is not None:
                with metrics_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
            if on_epoch is not None:
                on_epoch(record)
            # Higher validation accuracy wins; on a tie (common: one example is
            # 1/len(val)), the lower validation loss.
            if (val_accuracy, -record["val_loss"]) > (best_val_accuracy, -best_val_loss):
                best_params, best_epoch, best_val_accuracy, best_val_loss = (
                    params,
                    epoch,
                    val_accuracy,
                    record["val_loss"],
                )
                stale = 0
            else:
                stale += 1
                if config.patience is not None and stale >= config.patience and epoch < config.epochs:
                    stopped_early = True
                    break

    x_test, y_test = jnp.asarray(normalizer.apply(splits.test.x)), jnp.asarray(splits.test.y)
    if mesh is not None:
        x_test, y_test = place((x_test, y_test), replicated)
    test_loss, test_correct = evaluate_fn(best_params, x_test, y_test)
    if mesh is not None:
        best_params = jax.tree.map(jnp.asarray, gather(best_params))
    result = TrainResult(
        config=config,
        model_config=model_config,
        qat_config=qat_config,
        params=best_params,
        normalizer=normalizer,
        history=tuple(history),
        best_epoch=best_epoch,
        best_val_accuracy=max(best_val_accuracy, 0.0),
        test_loss=float(test_loss),
        test_accuracy=int(test_correct) / len(splits.test),
        n_test=len(splits.test),
        stopped_early=stopped_early,
        seconds=time.perf_counter() - started,
        key_check=key_check,
        devices=devices,
        param_sharding=None if mesh is None else param_sharding,
    )
    if out_dir is not None and writer:
        from stejax.train._rundir import save_run

        save_run(result, out_dir, splits=splits)
    return result


def _check_mesh(mesh: Any, param_sharding: Any, batch_size: int, debug_keys: int) -> int:
    """The number of devices the batch is split over; raises on a mesh that cannot be used."""
    if mesh is None:
        return 1
    if not isinstance(mesh, Mesh):
        raise TypeError(f"train: mesh must be a jax.sharding.Mesh (see stejax.train.data_mesh); got {mesh!r}.")
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(f"train: the mesh needs an axis named {DATA_AXIS!r}; got axes {mesh.axis_names}.")
    if param_sharding not in PARAM_SHARDINGS:
        raise ValueError(f"train: param_sharding must be one of {list(PARAM_SHARDINGS)}; got {param_sharding!r}.")
    n = int(mesh.shape[DATA_AXIS])
    if batch_size % n:
        raise ValueError(
            f"train: batch_size {batch_size} does not split evenly over the {n} devices of the mesh; "
            f"use a multiple of {n}."
        )
    if debug_keys:
        raise ValueError(
            "train: debug_keys runs the first steps eagerly on one device and cannot be combined with a mesh; "
            "the key stream does not depend on the mesh, so check it in a one-device run."
        )
    return n


class _Guard(NamedTuple):
    """A step's finite flag and the inputs :func:`raise_if_nonfinite` needs to name the culprit."""

    metrics: StepMetrics
    step: int
    params: Any
    batch: Batch | tuple[np.ndarray, np.ndarray]
    key: jax.Array | None
    where: str

    def check(self, model_config: ModelConfig, qat_config: QATConfig, sharded: bool) -> None:
        """Raise :class:`NonFiniteError` if the step was not finite (reads one flag from the device)."""
        if bool(self.metrics.finite):
            return
        # The guard recomputes the failing step on one device, from host copies.
        params = jax.tree.map(jnp.asarray, gather(self.params)) if sharded else self.params
        raise_if_nonfinite(
            self.metrics,
            step=self.step,
            params=params,
            batch=self.batch,
            key=self.key,
            model_config=model_config,
            qat_config=qat_config,
            where=self.where,
        )


def _flat_stats(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """apply's fractions of one step as ``{"layer_i/part": fraction}``."""
    return {f"{layer}/{part}": float(value) for layer, parts in stats.items() for part, value in parts.items()}
