"""The thing diagnosed: a user's parameters, one batch, a key and three pure functions."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.typing import ArrayLike

from stejax.model import InputContract

__all__ = ["Pipeline", "load_pipeline", "pipeline_from_run"]

# fold_in data that marks diagnose's key stream, apart from every key a run drew.
_DIAGNOSE_STREAM = 0xD1A6


@dataclasses.dataclass(frozen=True, eq=False)
class Pipeline:
    """A training pipeline as :func:`stejax.diagnose.diagnose` takes it: plain data and pure functions.

    Attributes:
      params: the parameter PyTree (floating leaves).
      batch: ``(inputs, labels)``: inputs of shape ``(N, *example_shape)``, labels of
        shape ``(N,)`` with an integer dtype.
      key: a typed PRNG key (``jax.random.key``); diagnose splits it into one key for
        ``forward`` and one for ``loss``.
      forward: ``forward(params, inputs, *, key) -> logits``, logits ``(N, n_classes)``.
      loss: ``loss(params, batch, *, key) -> scalar``.
      update: ``update(params, grads) -> params``, the new parameters of one step.
      contract: what one example must be (shape, dtype, the number of classes), or
        None to take the first example's shape and dtype as the contract.
      name: what the report calls the pipeline.
    """

    params: Any
    batch: tuple[ArrayLike, ArrayLike]
    key: jax.Array
    forward: Callable[..., Any]
    loss: Callable[..., Any]
    update: Callable[[Any, Any], Any]
    contract: InputContract | None = None
    name: str = "pipeline"


def pipeline_from_run(
    run_dir: str | os.PathLike,
    *,
    batch: tuple[ArrayLike, ArrayLike] | None = None,
    batch_size: int | None = None,
) -> Pipeline:
    """The reference pipeline of a run directory (``stejax train --out DIR``), ready for diagnose.

    * params: the run's best parameters;
    * batch: ``batch`` as given (raw features, standardised here by the run's
      normaliser, and int32 labels), or else the first ``batch_size`` (default: the
      run's batch size) examples of the run's training split of the digits,
      standardised by the run's normaliser;
    * key: ``jax.random.key(seed)`` of the run, folded with diagnose's own stream;
    * forward and loss: :func:`stejax.train.forward` and :func:`stejax.train.loss` in
      training mode (dropout on, with the key) for the run's model and QAT
      configuration;
    * update: one step of the run's optimiser from a fresh state, at the peak
      learning rate (a constant schedule: a warm-up would start at a rate of zero
      and leave the parameters unchanged, which proves nothing);
    * contract: the model's :func:`stejax.model.input_contract`.

    Args:
      run_dir: the run directory.
      batch: raw ``(features, labels)`` instead of the digits' training split.
      batch_size: how many examples of the training split to take.

    Returns:
      A :class:`Pipeline`.

    Raises:
      FileNotFoundError, ValueError: see :func:`stejax.train.load_run`; also a run
        on data other than the digits without ``batch``.
    """
    import optax

    from stejax.model import input_contract
    from stejax.train import forward, load_run, loss, make_optimizer

    run = load_run(run_dir)
    mc, qc = run.model_config, run.qat_config
    x_raw: ArrayLike
    raw_labels: ArrayLike
    if batch is None:
        from stejax.data import DIGITS_NAME

        name = str(run.data.get("name"))
        if name != DIGITS_NAME:
            raise ValueError(
                f"pipeline_from_run: the run at {run_dir} trained on {name!r}; pass its data as batch=(x, y)."
            )
        from stejax.train import load_splits

        train_split = load_splits(run.config).train
        n = run.config.batch_size if batch_size is None else int(batch_size)
        x_raw, raw_labels = train_split.x[:n], train_split.y[:n]
    else:
        x_raw, raw_labels = batch
    inputs = run.normalizer.apply(x_raw)
    labels = np.asarray(raw_labels)
    optimizer = make_optimizer(dataclasses.replace(run.config, schedule="constant"), 1)

    def update(params: Any, grads: Any) -> Any:
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        return optax.apply_updates(params, updates)

    return Pipeline(
        params=run.params,
        batch=(inputs, labels),
        key=jax.random.fold_in(jax.random.key(run.config.seed), _DIAGNOSE_STREAM),
        forward=functools.partial(forward, model_config=mc, qat_config=qc, train=True),
        loss=functools.partial(loss, model_config=mc, qat_config=qc, train=True),
        update=update,
        contract=input_contract(mc),
        name=f"run {os.fspath(run_dir)} ({run.config.preset}, {run.config.model})",
    )


def load_pipeline(spec: str, *, path: str | os.PathLike | None = None) -> Pipeline:
    """Call the factory named by ``MODULE:FACTORY`` (no arguments) and return its :class:`Pipeline`.

    Raises:
      ValueError, ImportError, AttributeError: see :func:`stejax.verify.load_callable`.
      TypeError: the factory is not callable or returns something else than a Pipeline.
      RuntimeError: the factory raised (the original error is its cause).
    """
    from stejax.verify import load_callable

    factory = load_callable(spec, path=path)
    try:
        pipeline = factory()
    except Exception as error:
        raise RuntimeError(f"the factory {spec!r} raised {type(error).__name__}: {error}") from error
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"{spec!r} returned a {type(pipeline).__name__}; expected a stejax.diagnose.Pipeline.")
    return pipeline
