r"""Training by steps: AdamW, warm-up and cosine decay, gradient clipping, one key stream, a non-finite guard.

Each step draws ``batch_size`` windows of ``context + 1`` bytes at random
offsets of the training stream (the key for step :math:`t` is split from the
run's key with :func:`stejax.keys.split`), and minimises the mean next-byte
cross-entropy. The learning rate rises linearly for ``warmup`` steps to
``learning_rate`` and follows a cosine to ``min_lr_ratio * learning_rate`` at
the last step. AdamW (:math:`\beta = (0.9, 0.95)`) decays the weights of
matrices only (not norms). Gradients are clipped to a global norm.

BitNet b1.58's two-stage recipe (Ma et al., "BitNet b1.58 2B4T Technical
Report", 2025; "The Era of 1-bit LLMs: Training Tips, Code and FAQ", 2024) is
two options. ``two_stage=True``: after the warm-up the rate follows a cosine
from the peak to ``stage_one_end * learning_rate`` at the midpoint
:math:`m = \lfloor steps / 2 \rfloor`, drops there to
``stage_two_start * learning_rate`` and follows a second cosine to
``min_lr_ratio * learning_rate`` at the last step (the report's 1.5e-3 to 8e-4,
then 5e-4 down: the defaults 8/15 and 1/3). ``stage_two_weight_decay=0.0``:
the decay is ``weight_decay`` before step :math:`m` and 0 from it on. For a
quantised model the decay acts on the latent float kernels that the quantiser
reads.

A step whose loss, gradient or input parameters are not finite stops the run
with :class:`stejax.train.NonFiniteError` naming the step, the part and the
first non-finite leaf (recomputed from the step's inputs), as the digits
pipeline does; nothing is ever replaced by a number.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stejax import keys
from stejax.train import NonFiniteError, save_params

__all__ = [
    "LMTrainResult",
    "TrainSettings",
    "bits_per_byte",
    "learning_rate_schedule",
    "load_checkpoint",
    "save_checkpoint",
    "train_lm",
    "weight_decay_schedule",
]

LN2 = math.log(2.0)
# The dtypes a training step can compute in (the master weights and the optimiser state stay float32).
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How long and how fast to train.

    Attributes:
      steps: optimiser steps.
      batch_size: windows per step.
      learning_rate: the peak learning rate.
      warmup: linear warm-up steps.
      min_lr_ratio: the final learning rate over the peak.
      weight_decay: AdamW's decoupled decay (matrices only).
      clip: the global gradient-norm bound.
      eval_every: steps between validation evaluations (and metrics lines).
      eval_windows: validation windows per evaluation.
      two_stage: BitNet b1.58's two-stage rate: a cosine to ``stage_one_end`` of the peak at the midpoint,
        a drop to ``stage_two_start`` of the peak, a cosine to ``min_lr_ratio`` of it.
      stage_one_end: the rate just before the midpoint over the peak (``two_stage`` only).
      stage_two_start: the rate at the midpoint over the peak (``two_stage`` only).
      stage_two_weight_decay: the weight decay from the midpoint on (None: ``weight_decay`` throughout;
        BitNet b1.58: 0).
      compute_dtype: ``"float32"``, or ``"bfloat16"`` for mixed precision: the forward and backward passes
        run on bfloat16 copies of the parameters (norm statistics, the softmax of the loss and the logits stay
        float32), while the optimiser keeps and updates float32 master weights.
      checkpoint_every: steps between checkpoints (a multiple of ``eval_every``; None: none), written with
        orbax-checkpoint under ``OUT/checkpoints`` when :func:`train_lm` has an ``out_dir``.
    """

    steps: int = 2000
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    eval_every: int = 250
    eval_windows: int = 64
    two_stage: bool = False
    stage_one_end: float = 8 / 15
    stage_two_start: float = 1 / 3
    stage_two_weight_decay: float | None = None
    compute_dtype: str = "float32"
    checkpoint_every: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_windows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainSettings: `{name}` must be an int >= 1; got {value!r}.")
        if not (isinstance(self.warmup, int) and 0 <= self.warmup <= self.steps):
            raise ValueError(f"TrainSettings: `warmup` must be an int in [0, steps={self.steps}]; got {self.warmup!r}.")
        if not self.learning_rate > 0 or not self.clip > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(
                "TrainSettings: expected learning_rate > 0, clip > 0 and min_lr_ratio in [0, 1]; got "
                f"{self.learning_rate}, {self.clip}, {self.min_lr_ratio}."
            )
        if not (self.weight_decay >= 0 and (self.stage_two_weight_decay is None or self.stage_two_weight_decay >= 0)):
            raise ValueError(
                "TrainSettings: expected weight_decay >= 0 and stage_two_weight_decay None or >= 0; got "
                f"{self.weight_decay}, {self.stage_two_weight_decay}."
            )
        if not (0 <= self.stage_one_end <= 1 and 0 <= self.stage_two_start <= 1):
            raise ValueError(
                "TrainSettings: expected stage_one_end and stage_two_start in [0, 1]; got "
                f"{self.stage_one_end}, {self.stage_two_start}."
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"TrainSettings: `compute_dtype` must be one of {list(COMPUTE_DTYPES)}; got {self.compute_dtype!r}."
            )
        if self.checkpoint_every is not None and (
            isinstance(self.checkpoint_every, bool)
            or not isinstance(self.checkpoint_every, int)
            or self.checkpoint_every < 1
            or self.checkpoint_every % self.eval_every
        ):
            raise ValueError(
                "TrainSettings: `checkpoint_every` must be None or a positive multiple of `eval_every` "
                f"({self.eval_every}): a checkpoint is written right after an evaluation; "
                f"got {self.checkpoint_every!r}."
            )
        if self.two_stage and self.warmup > self.midpoint:
            raise ValueError(
                f"TrainSettings: with two_stage the warm-up ({self.warmup}) must end by the midpoint ({self.midpoint})."
            )

    @property
    def midpoint(self) -> int:
        """The first step of the second stage, :math:`\\lfloor steps / 2 \\rfloor` (0-based, as optax counts)."""
        return self.steps // 2

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LMTrainResult:
    """What :func:`train_lm` returns.

    Attributes:
      model: the trained model (the last step's parameters).
      history: one record per evaluation (``step``, ``train_loss``, ``val_bpb``,
        ``learning_rate``, ``seconds``).
      step_ms: wall milliseconds of each step after the first (which compiles).
    """

    model: nnx.Module
    history: tuple[dict[str, float], ...]
    step_ms: tuple[float, ...]

    @property
    def step_ms_median(self) -> float:
        """The median step time in milliseconds (NaN if fewer than two steps)."""
        return float(np.median(self.step_ms)) if self.step_ms else float("nan")


def learning_rate_schedule(settings: TrainSettings) -> optax.Schedule:
    """The rate of update :math:`t` (0-based): warm-up then one cosine, or BitNet's two stages (``two_stage``)."""
    peak = settings.learning_rate
    if not settings.two_stage:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=peak,
            warmup_steps=settings.warmup,
            decay_steps=max(settings.steps, settings.warmup + 1),
            end_value=peak * settings.min_lr_ratio,
        )
    mid = settings.midpoint
    first = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=settings.warmup,
        decay_steps=max(mid, settings.warmup + 1),
        end_value=peak * settings.stage_one_end,
    )
    second = optax.cosine_decay_schedule(
        init_value=peak * settings.stage_two_start,
        decay_steps=max(settings.steps - mid, 1),
        alpha=settings.min_lr_ratio / settings.stage_two_start if settings.stage_two_start > 0 else 0.0,
    )
    return optax.join_schedules([first, second], boundaries=[mid])


def weight_decay_schedule(settings: TrainSettings) -> float | optax.Schedule:
    """AdamW's decoupled decay of update :math:`t`: a constant, or a step to ``stage_two_weight_decay`` at the
    midpoint."""
    if settings.stage_two_weight_decay is None:
        return settings.weight_decay
    before, after, mid = settings.weight_decay, settings.stage_two_weight_decay, settings.midpoint
    return lambda count: jnp.where(count < mid, jnp.float32(before), jnp.float32(after))


def make_optimizer(settings: TrainSettings) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Clipping, then AdamW on :func:`learning_rate_schedule` (decay on matrices only, by
    :func:`weight_decay_schedule`)."""
    schedule = learning_rate_schedule(settings)
    tx = optax.chain(
        optax.clip_by_global_norm(settings.clip),
        optax.adamw(
            schedule,
            b1=0.9,
            b2=0.95,
            weight_decay=weight_decay_schedule(settings),
            mask=lambda p: jax.tree.map(_is_matrix, p),
        ),
    )
    return _standard_promotion(tx), schedule


def _is_matrix(leaf: jax.Array) -> bool:
    return jnp.ndim(leaf) >= 2


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` under JAX's standard dtype promotion: optax raises a Python float to an int32 count
    (``decay**count``), which strict promotion (as the test suite runs) refuses; values stay float32."""

    def init(params: Any) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def _windows(stream: jax.Array, starts: jax.Array, length: int) -> jax.Array:
    return jax.vmap(lambda s: jax.lax.dynamic_slice(stream, (s,), (length,)))(starts)


def _compute_copy(params: Any, dtype: str) -> Any:
    """The floating parameters cast to ``dtype`` (the cast's gradient brings the cotangent back to float32)."""
    if dtype == "float32":
        return params
    target = jnp.dtype(dtype)
    return jax.tree.map(lambda p: p.astype(target) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)


def _loss(graphdef: Any, params: Any, rest: Any, batch: jax.Array, dtype: str = "float32") -> jax.Array:
    model = nnx.merge(graphdef, _compute_copy(params, dtype), rest)
    if dtype == "float32":
        logits = model(batch[:, :-1])
    else:
        # Flax's norms take their statistics in float32 by promoting the input's dtype with float32, which
        # strict promotion (as the test suite runs) refuses; every other cast of the model is explicit.
        with jax.numpy_dtype_promotion("standard"):
            logits = model(batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:].astype(jnp.int32)).mean()


@functools.partial(jax.jit, static_argnums=0)
def _nats(graphdef: Any, state: Any, x: jax.Array, y: jax.Array, weight: jax.Array) -> jax.Array:
    """The summed next-byte cross-entropy (nats) of the weighted positions; one program per model structure."""
    logits = nnx.merge(graphdef, state)(x)
    return (optax.softmax_cross_entropy_with_integer_labels(logits, y) * weight).sum()


def bits_per_byte(
    model: nnx.Module, text: np.ndarray, *, batch_size: int = 32, max_windows: int | None = None
) -> float:
    """Mean bits per byte of ``model`` on ``text``: non-overlapping windows, every byte after the first scored.

    Window :math:`w` feeds bytes :math:`[wL, (w+1)L)` and scores
    :math:`[wL+1, (w+1)L]`, :math:`L` the model's context; the last, shorter
    window is scored too.
    """
    length = model.config.context  # type: ignore[attr-defined]
    text = np.asarray(text, np.uint8)
    n = (text.size - 1 + length - 1) // length
    if max_windows is not None:
        n = min(n, max_windows)
    graphdef, state = nnx.split(model)

    total, count = 0.0, 0
    padded = np.concatenate([text, np.zeros(length + 1, np.uint8)])
    for first in range(0, n, batch_size):
        rows = range(first, min(first + batch_size, n))
        x = np.stack([padded[w * length : (w + 1) * length] for w in rows])
        y = np.stack([padded[w * length + 1 : (w + 1) * length + 1] for w in rows]).astype(np.int32)
        valid = np.stack([np.arange(w * length + 1, (w + 1) * length + 1) < text.size for w in rows])
        if len(rows) < batch_size:  # pad the batch so that one program serves every call
            extra = batch_size - len(rows)
            x, y = np.pad(x, ((0, extra), (0, 0))), np.pad(y, ((0, extra), (0, 0)))
            valid = np.pad(valid, ((0, extra), (0, 0)))
        total += float(_nats(graphdef, state, jnp.asarray(x), jnp.asarray(y), jnp.asarray(valid, jnp.float32)))
        count += int(valid.sum())
    return total / max(count, 1) / LN2


def train_lm(
    model: nnx.Module,
    train: np.ndarray,
    validation: np.ndarray,
    settings: TrainSettings,
    *,
    key: jax.Array,
    out_dir: str | os.PathLike | None = None,
    on_eval: Callable[[Mapping[str, float]], None] | None = None,
    on_step: Callable[[Mapping[str, float]], None] | None = None,
    mesh: Mesh | None = None,
    param_sharding: str = "replicated",
    resume: bool = False,
) -> LMTrainResult:
    """Train ``model`` (float or quantised) for ``settings.steps`` steps from its current parameters.

    Args:
      model: a :class:`stejax.lm.Transformer`, possibly quantised by
        :func:`stejax.lm.quantize_lm`; not modified (a trained copy is returned).
      train, validation: the byte streams (``uint8``; a ``np.memmap`` is read
        once, onto the devices).
      settings: the schedule, precision and checkpoint interval.
      key: a typed PRNG key (``jax.random.key``); every step's batch key is
        split from it.
      out_dir: if given, ``metrics.jsonl`` (one line per evaluation),
        ``params.safetensors`` (the final parameters) and, with
        ``settings.checkpoint_every``, orbax checkpoints under ``checkpoints/``
        are written there.
      on_eval: called with each evaluation record.
      on_step: called after each step with ``step``, ``loss`` (nats) and
        ``bytes_per_s`` (training bytes a second since the first step), for a
        progress bar.
      mesh: a mesh with a ``"data"`` axis (:func:`stejax.train.data_mesh`):
        each step's windows are split over it (data parallel) and the
        parameters and optimiser state are laid out as ``param_sharding``
        says. ``batch_size`` must be a multiple of the axis size. None: the
        default device.
      param_sharding: ``"replicated"``, or ``"sharded"`` (FSDP: each
        parameter and its optimiser state split over the ``"data"`` axis along
        its largest divisible axis; :func:`stejax.train.param_shardings`).
      resume: continue from the newest checkpoint in ``out_dir`` (its
        parameters, optimiser state, step and key): the run then ends with the
        parameters it would have had without the stop. Without a checkpoint
        the run starts from ``model``.

    Returns:
      :class:`LMTrainResult`.

    Raises:
      NonFiniteError: a non-finite loss, gradient or parameter (the message
        names the step and the leaf).
      ValueError: a stream shorter than one window; a batch the mesh cannot
        split; ``resume`` without ``out_dir``; a checkpoint of another model
        or schedule (the message names what differs).
    """
    keys.check_key(key)
    length = model.config.context + 1  # type: ignore[attr-defined]
    for name, given in (("train", train), ("validation", validation)):
        if np.asarray(given).size < length + 1:
            raise ValueError(f"train_lm: the {name} stream has {np.asarray(given).size} bytes; expected > {length}.")
    if resume and out_dir is None:
        raise ValueError("train_lm: resume=True needs the out_dir whose checkpoints/ it continues from; got None.")
    optimizer, schedule = make_optimizer(settings)
    graphdef, params, rest = nnx.split(nnx.clone(model), nnx.Param, ...)  # type: ignore[misc]
    opt_state = optimizer.init(params)
    stream: jax.Array
    batch_constraint: Callable[[jax.Array], jax.Array] = lambda batch: batch  # noqa: E731
    if mesh is None:
        stream = jnp.asarray(np.asarray(train, np.uint8))
        shardings = None
    else:
        from stejax.train._parallel import DATA_AXIS, _data_size, param_shardings, place

        n = _data_size(mesh, "train_lm")
        if settings.batch_size % n:
            raise ValueError(
                f"train_lm: the batch of {settings.batch_size} windows does not split evenly over the {n} devices "
                f"of the mesh's {DATA_AXIS!r} axis; use a batch size that is a multiple of {n}."
            )
        replicated = NamedSharding(mesh, PartitionSpec())
        shardings = (
            param_shardings(params, mesh, param_sharding),
            param_shardings(opt_state, mesh, param_sharding),
        )
        params = place(params, shardings[0])
        opt_state = place(opt_state, shardings[1])
        rest = place(rest, replicated)
        stream = place(np.asarray(train, np.uint8), replicated)
        batch_sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))
        batch_constraint = lambda batch: jax.lax.with_sharding_constraint(batch, batch_sharding)  # noqa: E731
    high = stream.size - length
    dtype = settings.compute_dtype

    def step_fn(params: Any, opt_state: Any, batch_key: jax.Array) -> tuple[Any, Any, jax.Array, jax.Array]:
        starts = jax.random.randint(batch_key, (settings.batch_size,), 0, high)
        batch = batch_constraint(_windows(stream, starts, length))
        loss, grads = jax.value_and_grad(_loss, argnums=1)(graphdef, params, rest, batch, dtype)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        finite = (
            jnp.isfinite(loss)
            & jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
            & jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
        )
        return optax.apply_updates(params, updates), opt_state, loss, finite

    if shardings is None:
        step = jax.jit(step_fn)
    else:
        scalar = NamedSharding(mesh, PartitionSpec())  # type: ignore[arg-type]
        step = jax.jit(step_fn, out_shardings=(shardings[0], shardings[1], scalar, scalar))

    checkpoints = None
    first = 1
    run_key = key
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if settings.checkpoint_every is not None or resume:
            checkpoints = _Checkpoints(out / "checkpoints", settings)
        if resume:
            assert checkpoints is not None
            restored = checkpoints.restore(params, opt_state, key)
            if restored is not None:
                params, opt_state, run_key, done = restored
                first = done + 1
        # Evaluations after the step the run continues from are dropped: they will be made again.
        _keep_metrics(out / "metrics.jsonl", first - 1)
    metrics_file = None if out_dir is None else (Path(out_dir) / "metrics.jsonl").open("a", encoding="utf-8")
    history: list[dict[str, float]] = []
    step_ms: list[float] = []
    losses: list[jax.Array] = []
    start = time.perf_counter()
    step_bytes = settings.batch_size * (length - 1)
    try:
        for t in range(first, settings.steps + 1):
            run_key, batch_key = keys.split(run_key, where=f"train_lm: run -> run, step {t} batch")
            tic = time.perf_counter()
            new_params, opt_state, loss, finite = step(params, opt_state, keys.consume(batch_key, where=f"batch {t}"))
            if not bool(finite):
                _raise_nonfinite(
                    t, float(loss), params, graphdef, rest, stream, batch_key, settings, length, high, dtype
                )
            if t > first:
                step_ms.append(1000 * (time.perf_counter() - tic))
            params = new_params
            losses.append(loss)
            if on_step is not None:
                elapsed = time.perf_counter() - start
                on_step({"step": t, "loss": float(loss), "bytes_per_s": (t - first + 1) * step_bytes / elapsed})
            if t % settings.eval_every == 0 or t == settings.steps:
                current = nnx.merge(graphdef, params, rest)
                record = {
                    "step": t,
                    "train_loss": float(np.mean(jax.device_get(losses))),
                    "train_bpb": float(np.mean(jax.device_get(losses))) / LN2,
                    "val_bpb": bits_per_byte(current, validation, max_windows=settings.eval_windows),
                    "learning_rate": float(schedule(jnp.asarray(t, jnp.float32))),
                    "seconds": time.perf_counter() - start,
                }
                losses = []
                history.append(record)
                if metrics_file is not None:
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                if on_eval is not None:
                    on_eval(record)
                if checkpoints is not None and settings.checkpoint_every and t % settings.checkpoint_every == 0:
                    checkpoints.save(t, params, opt_state, run_key)
    finally:
        if metrics_file is not None:
            metrics_file.close()
        if checkpoints is not None:
            checkpoints.close()
    trained = nnx.merge(graphdef, params, rest)
    if out_dir is not None:
        save_checkpoint(trained, Path(out_dir) / "params.safetensors")
    return LMTrainResult(model=trained, history=tuple(history), step_ms=tuple(step_ms))


def _keep_metrics(path: Path, last_step: int) -> None:
    """Keep the lines of ``metrics.jsonl`` up to ``last_step`` (none for a new run)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text("utf-8").splitlines() if line and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept), "utf-8")


class _Checkpoints:
    """The run's orbax-checkpoint manager: parameters, optimiser state, the run's key and its step.

    The key is saved as its raw data (``jax.random.key_data``) with its implementation's name; the step is
    orbax's step number. The schedule is saved beside them and checked on restore: a checkpoint continues
    only the run it was made by.
    """

    def __init__(self, directory: Path, settings: TrainSettings):
        import orbax.checkpoint as ocp  # type: ignore[import-untyped]

        self._ocp = ocp
        self._settings = settings.to_dict()
        self._manager = ocp.CheckpointManager(
            directory.resolve(),
            options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False),
        )

    def save(self, t: int, params: Any, opt_state: Any, run_key: jax.Array) -> None:
        ocp = self._ocp
        state = {"params": params, "opt_state": opt_state, "key": jax.random.key_data(run_key)}
        meta = {"settings": self._settings, "key_impl": str(jax.random.key_impl(run_key))}
        self._manager.save(t, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

    def restore(self, params: Any, opt_state: Any, key: jax.Array) -> tuple[Any, Any, jax.Array, int] | None:
        ocp = self._ocp
        t = self._manager.latest_step()
        if t is None:
            return None
        meta = self._manager.restore(t, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        saved = dict(meta["settings"])
        changed = sorted(k for k in self._settings if saved.get(k) != self._settings[k])
        if changed:
            raise ValueError(
                f"train_lm: the checkpoint at step {t} in {self._manager.directory} was made with other settings "
                f"({', '.join(f'{k}: {saved.get(k)!r}, now {self._settings[k]!r}' for k in changed)}); expected the "
                "settings of the run it continues."
            )
        target = {"params": params, "opt_state": opt_state, "key": jax.random.key_data(key)}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            state = self._manager.restore(t, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        except (ValueError, KeyError) as e:
            raise ValueError(
                f"train_lm: the checkpoint at step {t} in {self._manager.directory} does not fit this model: {e}"
            ) from e
        run_key = jax.random.wrap_key_data(state["key"], impl=meta["key_impl"])
        return state["params"], state["opt_state"], run_key, int(t)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _raise_nonfinite(
    t: int,
    loss: float,
    params: Any,
    graphdef: Any,
    rest: Any,
    stream: jax.Array,
    batch_key: jax.Array,
    settings,
    length,
    high,
    dtype: str = "float32",
) -> None:
    """Name the first non-finite parameter, else the loss, else the first non-finite gradient leaf."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not np.isfinite(np.asarray(leaf)).all():
            name = jax.tree_util.keystr(path)
            raise NonFiniteError(
                f"non-finite parameter at step {t}: the first non-finite leaf is params{name}; loss = {loss}. "
                "The run stops rather than continue with NaN or inf.",
                step=t,
                part="parameter",
                path=name,
            )
    if not math.isfinite(loss):
        raise NonFiniteError(
            f"non-finite loss at step {t}: loss = {loss} with finite parameters. Lower the learning rate or check "
            "the data; the run stops rather than continue.",
            step=t,
            part="loss",
            path="",
        )
    # Recompute the step's gradient from the same inputs (the same key: the same batch).
    with keys.checked(jax_check=False), jax.debug_key_reuse(False):
        starts = jax.random.randint(batch_key, (settings.batch_size,), 0, high)
        grads = jax.grad(_loss, argnums=1)(graphdef, params, rest, _windows(stream, starts, length), dtype)
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
        if not np.isfinite(np.asarray(leaf)).all():
            name = jax.tree_util.keystr(path)
            raise NonFiniteError(
                f"non-finite gradient at step {t}: the first non-finite leaf is grads{name}; loss = {loss}.",
                step=t,
                part="gradient",
                path=name,
            )
    raise NonFiniteError(f"non-finite step {t} that could not be located; loss = {loss}.", step=t, part="", path="")


def _pure(model: nnx.Module) -> dict[str, Any]:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def save_checkpoint(model: nnx.Module, path: str | os.PathLike) -> Path:
    """Write the model's ``nnx.Param`` values to a safetensors file (names: ``blocks/0/attn/q/kernel``)."""
    return save_params(_pure(model), path)


def load_checkpoint(model: nnx.Module, path: str | os.PathLike) -> nnx.Module:
    """A copy of ``model`` with the parameters of :func:`save_checkpoint`'s file.

    Raises:
      ValueError: a parameter missing from the file, an extra one, or one of another shape (the message names it).
    """
    from safetensors.numpy import load_file

    from stejax.train._step import leaf_name

    tensors = load_file(str(path))
    model = nnx.clone(model)
    state = nnx.state(model, nnx.Param)
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
    names = {leaf_name(p): (p, leaf) for p, leaf in flat}
    extra = sorted(set(tensors) - set(names))
    if extra:
        raise ValueError(f"load_checkpoint: {path} holds {extra[0]!r}, not a parameter of this model.")
    for name, (_, leaf) in names.items():
        if name not in tensors:
            raise ValueError(f"load_checkpoint: {path} lacks {name!r}; expected {sorted(names)[:4]}...")
        if tensors[name].shape != np.shape(leaf):
            raise ValueError(
                f"load_checkpoint: {path}: {name!r} has shape {tensors[name].shape}; expected {np.shape(leaf)}."
            )
    pure = jax.tree_util.tree_map_with_path(lambda p, _: jnp.asarray(tensors[leaf_name(p)]), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    return model
