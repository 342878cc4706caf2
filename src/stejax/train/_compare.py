"""The comparison of QAT configurations over seeds: accuracy, step time, targets, report."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import platform
import queue
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys
from stejax.data import Dataset, Normalizer, Splits
from stejax.data import split as split_dataset
from stejax.model import PRESETS, MLPConfig, init_params, preset
from stejax.train._config import TrainConfig, make_optimizer
from stejax.train._loop import load_splits, train
from stejax.train._step import Batch, compiled_train_step, needs_key
from stejax.train._targets import TARGETS, TARGETS_SET_FOR

__all__ = ["SPLITS", "compare", "paired_delta", "time_steps"]

# fold_in data that marks the step timing's key stream.
_TIMING_STREAM = 0x7153

# The numerical tolerances the test suite states for the training functions
# (tests/test_train.py); recorded in the report's environment.
NUMERICAL_TOLERANCES = {
    "jit_vs_eager_logits": {"rtol": 1e-5, "atol": 1e-5},
    "jit_vs_eager_loss": {"rtol": 1e-5, "atol": 1e-6},
    "vmap_vs_loop_logits": {"rtol": 1e-5, "atol": 1e-5},
}


SPLITS = ("per-seed", "fixed")


def paired_delta(accuracy: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    r"""The paired difference of two configurations' accuracies over the same seeds and splits, in points.

    With :math:`d_s = 100\,(a_s - r_s)` for seed :math:`s = 1..n`:

    .. math::

       \bar d = \frac{1}{n}\sum_s d_s, \qquad
       \mathrm{se} = \frac{\operatorname{sd}(d)}{\sqrt n}
       \ (\text{ddof} = 1), \qquad
       \bar d \pm t_{0.975,\,n-1}\,\mathrm{se}

    (Student t, 95%, two-sided). With one seed the standard error and the interval
    are None: one difference says nothing about its spread.

    Args:
      accuracy: this configuration's accuracy per seed, fractions in [0, 1].
      reference: the reference's (float's) accuracy on the same seeds, same order.

    Returns:
      ``{"mean", "se", "ci95", "per_seed"}``: points; ``ci95`` a ``[low, high]`` pair.

    Raises:
      ValueError: the two lists differ in length, or are empty, or hold a value
        outside [0, 1] (or NaN): a percentage instead of a fraction would make a
        difference 100 times too large.

    Example:
      >>> from stejax.train import paired_delta
      >>> d = paired_delta([0.98, 0.97, 0.99], [0.97, 0.97, 0.97])
      >>> round(d["mean"], 6), round(d["se"], 6), [round(v, 3) for v in d["ci95"]]
      (1.0, 0.57735, [-1.484, 3.484])
    """
    a, r = np.asarray(accuracy, np.float64), np.asarray(reference, np.float64)
    if a.shape != r.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"paired_delta: needs two equal, non-empty lists of per-seed accuracies; got {a.shape} and {r.shape}."
        )
    for name, values in (("accuracy", a), ("reference", r)):
        outside = np.flatnonzero(~((values >= 0) & (values <= 1)))
        if outside.size:
            i = int(outside[0])
            hint = " (a percentage? divide by 100)" if 1 < values[i] <= 100 else ""
            raise ValueError(
                f"paired_delta: accuracies are fractions in [0, 1]; got {name}[{i}] = {float(values[i])}{hint}."
            )
    d = 100 * (a - r)
    mean = float(d.mean())
    if d.size == 1:
        return {"mean": mean, "se": None, "ci95": None, "per_seed": d.tolist()}
    from scipy import stats

    se = float(d.std(ddof=1) / math.sqrt(d.size))
    half = float(stats.t.ppf(0.975, d.size - 1)) * se
    return {"mean": mean, "se": se, "ci95": [mean - half, mean + half], "per_seed": d.tolist()}


def time_steps(
    setups: Mapping[str, tuple[Callable[..., Any], tuple[Any, ...], Sequence[Any]]],
    *,
    repeats: int,
    warmup: int,
) -> dict[str, list[float]]:
    """Time jitted steps side by side: after warm-up, one call of each per round, in rotating order.

    Each setup is ``(step, args, step_keys)``: the call is ``step(*args, key)``
    with a fresh key from ``step_keys`` each time (None entries for a step that
    takes no key), and ``jax.block_until_ready`` on its output ends the timing.
    Interleaving the configurations round by round spreads any slow phase of the
    machine over all of them alike.

    Returns:
      ``{name: [seconds per call, ...]}``, ``repeats`` entries each.
    """
    names = list(setups)
    for name in names:
        step, args, step_keys = setups[name]
        for i in range(warmup):
            jax.block_until_ready(step(*args, step_keys[i]))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            step, args, step_keys = setups[name]
            key = step_keys[warmup + r]
            start = time.perf_counter()
            jax.block_until_ready(step(*args, key))
            times[name].append(time.perf_counter() - start)
    return times


def compare(
    presets: Sequence[str] = PRESETS,
    *,
    seeds: int | Sequence[int] = 10,
    base: TrainConfig | None = None,
    out_dir: str | os.PathLike,
    split: str = "per-seed",
    data: Dataset | None = None,
    splits: Splits | None = None,
    timing_repeats: int = 200,
    timing_warmup: int = 10,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    plots: bool = True,
    workers: int = 1,
) -> dict[str, Any]:
    """Train every preset over several seeds, compare each with float paired by seed, time the steps, report.

    Each ``(preset, seed)`` is one :func:`train` run of ``base`` with that preset
    and seed, in its own run directory ``out_dir/runs/<preset>/seed-<s>``. The
    data split:

    * ``split="per-seed"`` (default): run seed ``s`` trains, selects and is
      tested on its own stratified split, ``data_seed = s``, the same for every
      preset. The test split's own sampling error then averages over seeds
      instead of being shared by all of them.
    * ``split="fixed"``: every run uses one split, ``base.data_seed`` (or
      ``splits``).

    Every preset is compared with ``float`` **paired**: the same seed and split,
    so the split's difficulty cancels in the difference (:func:`paired_delta`:
    mean, standard error over seeds, Student-t 95% interval). The test split
    scores the best parameters of each run once; selection uses the validation
    split only.

    Then the jitted training step of each preset (the very functions the runs
    compiled) is timed side by side: ``timing_warmup`` calls each, then
    ``timing_repeats`` rounds of one call per preset in rotating order, each on
    the same training batch with the first seed's best parameters. The median is
    the preset's ``step_ms_median``; the median of the per-round ratios over
    float's is its ``step_ratio_vs_float_p50``.

    Writes ``out_dir/report.json``, ``out_dir/report.md`` and (with ``plots``)
    ``out_dir/plots/*.png``.

    Args:
      presets: the QAT presets to compare (default: all of :data:`stejax.model.PRESETS`).
      seeds: the number of seeds (``0..n-1``; default 10) or the seeds themselves.
      base: the recipe (default ``TrainConfig()``); its ``preset`` and ``seed``
        (and with per-seed splits ``data_seed``) are replaced per run.
      out_dir: the output folder (created).
      split: ``"per-seed"`` (default) or ``"fixed"``.
      data: the dataset to split per seed (default: the digits); per-seed only.
      splits: the one split of ``split="fixed"`` (default: the digits split by
        ``base.data_seed``).
      timing_repeats: timed rounds (default 200).
      timing_warmup: untimed calls per preset first (default 10).
      on_event: called with ``{"event": "epoch", "preset", "seed", "record"}``
        after each epoch, ``{"event": "run", "preset", "seed", "test_accuracy"}``
        after each run and ``{"event": "timing"}`` before the timing.
      plots: draw the figures (matplotlib) (default True).
      workers: processes that train at once (default 1: this one only). With
        ``n > 1`` the presets are shared out, whole (every seed of a preset in one
        process, so each compiles its step once), between this process and
        ``n - 1`` spawned ones; the runs and their results are the same as with
        one (each run is the same pure computation), only the order of the
        ``on_event`` calls differs. XLA:CPU runs these small programs on about
        one core each, so two workers use a two-core machine. The spawned
        processes import the caller's main module: a script that calls this
        with ``workers > 1`` needs the ``if __name__ == "__main__":`` guard.

    Returns:
      The report (as written to ``report.json``).

    Raises:
      ValueError: an unknown preset or split mode, no seeds, a repeated seed or
        preset, ``splits`` with per-seed splits, ``data`` with a fixed split, or
        ``workers`` not a positive int.
    """
    base = TrainConfig() if base is None else base
    presets = tuple(presets)
    for name in presets:
        preset(name)  # raises on an unknown name, listing the presets
    if len(set(presets)) != len(presets) or not presets:
        raise ValueError(f"compare: presets must be distinct and at least one; got {list(presets)}.")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise ValueError(f"compare: seeds must be a positive count or distinct seeds; got {seeds!r}.")
    if split not in SPLITS:
        raise ValueError(f"compare: split must be one of {list(SPLITS)}; got {split!r}.")
    if split == "per-seed" and splits is not None:
        raise ValueError(
            "compare: splits= is one shared split, but split='per-seed' makes a split per seed; pass "
            "split='fixed' with it, or data= (the dataset to split) instead."
        )
    if split == "fixed" and data is not None:
        raise ValueError("compare: data= is split per seed; with split='fixed' pass splits= (or neither).")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"compare: workers must be a positive int (processes that train at once); got {workers!r}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run_splits = _run_splits(base, seed_list, split, data, splits)
    started = time.perf_counter()

    runs, first_params, normalizer = _train_all(presets, base, seed_list, run_splits, out, on_event, workers)
    train_seconds = time.perf_counter() - started

    if on_event is not None:
        on_event({"event": "timing"})
    assert normalizer is not None
    step_times = _time_presets(presets, base, run_splits[0], normalizer, first_params, timing_repeats, timing_warmup)

    summary: dict[str, dict[str, Any]] = {}
    for name in presets:
        accuracies = [r["test_accuracy"] for r in runs[name]]
        row: dict[str, Any] = {
            "describe": preset(name).describe(),
            "bits": _bits(name),
            "test_accuracy_mean": float(np.mean(accuracies)),
            # One seed has no spread: None (n/a), not 0.
            "test_accuracy_std": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else None,
            "test_accuracy_per_seed": accuracies,
        }
        if "float" in runs and name != "float":
            delta = paired_delta(accuracies, [r["test_accuracy"] for r in runs["float"]])
            row.update(
                delta_vs_float_mean=delta["mean"],
                delta_vs_float_se=delta["se"],
                delta_vs_float_ci95=delta["ci95"],
                delta_vs_float_per_seed=delta["per_seed"],
            )
        row.update(
            step_ms_median=1e3 * statistics.median(step_times[name]),
            step_ms_quartiles=[1e3 * q for q in statistics.quantiles(step_times[name], n=4)[::2]]
            if len(step_times[name]) > 1
            else [1e3 * step_times[name][0]] * 2,
            best_val_accuracy_mean=float(np.mean([r["best_val_accuracy"] for r in runs[name]])),
            best_epoch_mean=float(np.mean([r["best_epoch"] for r in runs[name]])),
            epochs_run_mean=float(np.mean([r["epochs_run"] for r in runs[name]])),
        )
        if "float" in step_times:
            row["step_ratio_vs_float_p50"] = float(
                np.median(np.asarray(step_times[name]) / np.asarray(step_times["float"]))
            )
        summary[name] = row
    ratio = summary["w4a4"].get("step_ratio_vs_float_p50") if "w4a4" in summary else None
    targets = [t.evaluate(summary) for t in TARGETS]

    example = dataclasses.replace(base, preset=presets[0])
    first = run_splits[0]
    default = TrainConfig().to_dict()
    per_run = ("preset", "seed", "data_seed")
    differs = [k for k, v in base.to_dict().items() if k not in per_run and v != default[k]]
    report = {
        "format": "stejax-compare/2",
        "summary": summary,
        "w4a4_over_float_step_ratio": ratio,
        "targets": targets,
        "targets_set_for": TARGETS_SET_FOR,
        "recipe_differs_from_targets_recipe": differs,
        "runs": {name: [{k: v for k, v in r.items() if k != "history"} for r in rs] for name, rs in runs.items()},
        "setup": {
            "presets": list(presets),
            "seeds": seed_list,
            "split": split,
            "split_seeds": [sp.seed for sp in run_splits],
            "train_config": {k: v for k, v in base.to_dict().items() if k not in ("preset", "seed", "data_seed")},
            "model": _model_text(example, first),
            "qat": {name: preset(name).describe() for name in presets},
            "data": {
                "name": first.train.name.removesuffix("[train]"),
                "split_seed": first.seed if split == "fixed" else None,
                "n_train": len(first.train),
                "n_val": len(first.val),
                "n_test": len(first.test),
            },
            "selection": "best validation accuracy (ties: lower validation loss); the test split scores "
            "each run's best parameters once, at the end",
            "accuracy_unit": "fraction of the test split in [0, 1]; std over seeds with ddof=1 (None for one seed)",
            "delta_unit": "percentage points, configuration minus float on the same seed and split; se = sd/sqrt(n) "
            "with ddof=1; ci95 = mean +- t(0.975, n-1) se",
            "timing": {"repeats": timing_repeats, "warmup": timing_warmup, "batch_size": base.batch_size},
            "train_seconds": train_seconds,
        },
        "environment": _environment(seed_list),
    }
    history = {name: [r["history"] for r in rs] for name, rs in runs.items()}
    figures = {}
    if plots:
        from stejax.train._plots import draw_all

        figures = draw_all(out / "plots", summary, history)
    report["figures"] = {k: str(Path(v).relative_to(out)) for k, v in figures.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_markdown(report), encoding="utf-8")
    return report


def _train_all(
    presets: tuple[str, ...],
    base: TrainConfig,
    seed_list: list[int],
    run_splits: list[Splits],
    out: Path,
    on_event: Callable[[Mapping[str, Any]], None] | None,
    workers: int,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], Normalizer]:
    """Every (preset, seed) run, here or shared with ``workers - 1`` spawned processes.

    Returns the run rows per preset (in ``presets`` order), each preset's first
    seed's best parameters (for the timing) and that run's normaliser.
    """
    emit = on_event if on_event is not None else (lambda event: None)
    shares = _shares(presets, workers)
    done: dict[str, tuple[list[dict[str, Any]], Any, Normalizer]] = {}
    if len(shares) == 1:
        done.update(_train_presets(shares[0], base, seed_list, run_splits, out, emit))
    else:
        context = multiprocessing.get_context("spawn")  # JAX's threads do not survive a fork
        events = context.Queue()

        def drain() -> None:
            while True:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    return
                emit(event)

        def emit_here(event: Mapping[str, Any]) -> None:
            emit(event)
            drain()

        with ProcessPoolExecutor(
            len(shares) - 1, mp_context=context, initializer=_set_events, initargs=(events,)
        ) as pool:
            futures: list[Future[Any]] = [
                pool.submit(_train_presets_child, share, base, seed_list, run_splits, out) for share in shares[1:]
            ]
            done.update(_train_presets(shares[0], base, seed_list, run_splits, out, emit_here))
            # While the others train, compile their steps here for the timing that follows.
            for share in shares[1:]:
                for name in share:
                    _warm_step(name, base, run_splits[0])
                    drain()
            while not all(f.done() for f in futures):
                time.sleep(0.1)
                drain()
            drain()
            for future in futures:
                for name, (rows, params, normalizer) in future.result().items():
                    done[name] = (rows, jax.tree.map(jnp.asarray, params), normalizer)
    runs = {name: done[name][0] for name in presets}
    first_params = {name: done[name][1] for name in presets}
    return runs, first_params, done[presets[0]][2]


def _shares(presets: tuple[str, ...], workers: int) -> list[list[str]]:
    """The presets shared out over the processes, whole, greedily by expected cost (w4a4_no_ste stops early)."""
    n = min(workers, len(presets))
    cost = {name: 0.5 if name == "w4a4_no_ste" else 1.0 for name in presets}
    shares: list[list[str]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for name in presets:
        i = loads.index(min(loads))
        shares[i].append(name)
        loads[i] += cost[name]
    return shares


def _train_presets(
    names: Sequence[str],
    base: TrainConfig,
    seed_list: list[int],
    run_splits: list[Splits],
    out: Path,
    emit: Callable[[Mapping[str, Any]], None],
) -> dict[str, tuple[list[dict[str, Any]], Any, Normalizer]]:
    """Train every seed of each preset in ``names``: ``{name: (rows, first seed's params, its normaliser)}``."""
    done = {}
    for name in names:
        rows: list[dict[str, Any]] = []
        first: tuple[Any, Normalizer] | None = None
        for seed, run_split in zip(seed_list, run_splits, strict=True):
            config = dataclasses.replace(base, preset=name, seed=seed, data_seed=run_split.seed)

            def epoch_event(record, name=name, seed=seed):
                emit({"event": "epoch", "preset": name, "seed": seed, "record": record})

            result = train(config, splits=run_split, out_dir=out / "runs" / name / f"seed-{seed}", on_epoch=epoch_event)
            if first is None:
                first = (result.params, result.normalizer)
            rows.append(
                {
                    "seed": seed,
                    "data_seed": run_split.seed,
                    "test_accuracy": result.test_accuracy,
                    "test_loss": result.test_loss,
                    "best_epoch": result.best_epoch,
                    "best_val_accuracy": result.best_val_accuracy,
                    "epochs_run": len(result.history),
                    "stopped_early": result.stopped_early,
                    "seconds": result.seconds,
                    "run_dir": f"runs/{name}/seed-{seed}",
                    "history": list(result.history),
                }
            )
            emit({"event": "run", "preset": name, "seed": seed, "test_accuracy": result.test_accuracy})
        assert first is not None  # at least one seed
        done[name] = (rows, first[0], first[1])
    return done


_EVENTS: Any = None  # a spawned worker's queue of on_event records, set by _set_events


def _set_events(events: Any) -> None:
    global _EVENTS
    _EVENTS = events


def _train_presets_child(
    names: Sequence[str], base: TrainConfig, seed_list: list[int], run_splits: list[Splits], out: Path
) -> dict[str, tuple[list[dict[str, Any]], Any, Normalizer]]:
    """:func:`_train_presets` in a spawned worker: events go to the queue, parameters come back as NumPy."""
    done = _train_presets(names, base, seed_list, run_splits, out, _EVENTS.put)
    return {name: (rows, jax.device_get(params), normalizer) for name, (rows, params, normalizer) in done.items()}


def _warm_step(name: str, base: TrainConfig, splits: Splits) -> None:
    """Compile (by one call) the step of ``name`` that the timing will call."""
    config = dataclasses.replace(base, preset=name)
    model_config, qat_config = config.model_config(splits.train), config.qat_config()
    optimizer = make_optimizer(config, len(splits.train) // base.batch_size)
    params = init_params(jax.random.key(0), model_config, qat_config)
    x = jnp.zeros((base.batch_size, model_config.in_features), jnp.float32)
    batch = Batch(x, jnp.zeros((base.batch_size,), jnp.int32))
    key = jax.random.key(0) if needs_key(model_config, train=True) else None
    step = compiled_train_step(model_config, qat_config, optimizer)
    # `log` a Python bool, as train passes it (a bool array would be another signature).
    jax.block_until_ready(step(params, optimizer.init(params), batch, key, False))


def _run_splits(
    base: TrainConfig, seeds: list[int], mode: str, data: Dataset | None, splits: Splits | None
) -> list[Splits]:
    """One split per seed: its own (``data_seed = seed``) or the one shared split."""
    if mode == "fixed":
        shared = load_splits(base) if splits is None else splits
        return [shared] * len(seeds)
    if data is None:
        return [load_splits(dataclasses.replace(base, data_seed=s)) for s in seeds]
    return [
        split_dataset(data, seed=s, val_fraction=base.val_fraction, test_fraction=base.test_fraction) for s in seeds
    ]


def _time_presets(presets, base, splits, normalizer, first_params, repeats, warmup) -> dict[str, list[float]]:
    steps_per_epoch = len(splits.train) // base.batch_size
    x = jnp.asarray(normalizer.apply(splits.train.x[: base.batch_size]))
    batch = Batch(x, jnp.asarray(splits.train.y[: base.batch_size]))
    # The timing's own key stream, one fresh key per call. fold_in derives it from
    # the base seed's key without drawing on any run's stream (key(seed) is split,
    # never folded, by train).
    root = jax.random.fold_in(jax.random.key(base.seed), _TIMING_STREAM)
    stream = keys.split(root, len(presets), where="compare: timing, one key per preset")
    setups = {}
    for name, k in zip(presets, stream, strict=True):
        config = dataclasses.replace(base, preset=name)
        model_config = config.model_config(splits.train)
        qat_config = config.qat_config()
        optimizer = make_optimizer(config, steps_per_epoch)
        # The step as train takes it on every batch but an epoch's last (no fractions).
        step = _without_fractions(compiled_train_step(model_config, qat_config, optimizer))
        params = first_params.get(name)
        if params is None:  # pragma: no cover - every preset ran at least one seed
            params = init_params(jax.random.key(0), model_config, qat_config)
        n = warmup + repeats
        step_keys = (
            list(keys.split(k, n, where=f"compare: timing keys of {name}"))
            if needs_key(model_config, train=True)
            else [None] * n
        )
        setups[name] = (step, (params, optimizer.init(params), batch), step_keys)
    return time_steps(setups, repeats=repeats, warmup=warmup)


def _without_fractions(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step(params, opt_state, batch, key)`` as ``compiled_train_step``'s call with ``log`` False.

    ``log`` goes by position and as a Python bool, exactly as :func:`train` passes it,
    so that the call reuses train's compilation (a keyword, or a bool array, would be
    another signature and compile again).
    """

    def call(params: Any, opt_state: Any, batch: Batch, key: jax.Array | None) -> Any:
        return step(params, opt_state, batch, key, False)

    return call


def _bits(name: str) -> dict[str, int]:
    """The hidden layers' weight and input bit widths (32 for float)."""
    lq = preset(name).hidden
    return {
        "weights": lq.weights.bits if lq.weights else 32,
        "activations": lq.activations.bits if lq.activations else 32,
    }


def _model_text(config: TrainConfig, splits: Splits) -> str:
    mc = config.model_config(splits.train)
    if isinstance(mc, MLPConfig):
        widths = " -> ".join(str(w) for w in (mc.in_features, *mc.hidden, mc.n_classes))
        return f"MLP {widths}, ReLU, dropout {mc.dropout}"
    convs = ", ".join(f"conv 3x3 {c} stride {s}" for c, s in zip(mc.channels, mc.strides, strict=True))
    image = "x".join(map(str, mc.image_shape))
    return f"CNN on the {image} image: {convs}, dense -> {mc.n_classes}; ReLU, dropout {mc.dropout}"


def _environment(seeds: list[int]) -> dict[str, Any]:
    import jaxlib

    device = jax.devices()[0]
    return {
        "device": f"{device.device_kind} ({device})",
        "platform": jax.default_backend(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "seeds": seeds,
        "dtypes": {"params": "float32", "features": "float32", "labels": "int32", "compute": "float32"},
        "tolerances": {
            "targets": {t.name: t.threshold for t in TARGETS},
            "numerical": NUMERICAL_TOLERANCES,
        },
    }


def _recipe(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's fields without the other architecture's widths."""
    other = ("channels", "strides") if fields.get("model") == "mlp" else ("hidden",)
    return {k: v for k, v in fields.items() if k not in other}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _resolution(n_test: int, n_seeds: int, split: str, summary: Mapping[str, Mapping[str, Any]]) -> str:
    # How finely the test split can tell configurations apart.
    p = summary["float"]["test_accuracy_mean"] if "float" in summary else 0.97
    se = 100 * math.sqrt(p * (1 - p) / n_test)
    head = (
        f"Resolution: one test example is {100 / n_test:.2f} points of one seed's accuracy and "
        f"{100 / n_test / n_seeds:.3f} points of a {n_seeds}-seed mean; the binomial standard error of one "
        f"seed's accuracy is {se:.2f} points at {100 * p:.1f}%. "
    )
    if split == "fixed":
        return head + (
            "All seeds share one test split, so its sampling error is common to every configuration and does "
            "not shrink with more seeds; differences between configurations, measured on the same examples, "
            "are known better (the paired deltas)."
        )
    return head + (
        "Each seed has its own split, so the split's sampling error averages over seeds (the std over seeds "
        "includes it); each paired delta is taken on one seed's own split, where the split's difficulty cancels."
    )


def _delta_text(row: Mapping[str, Any]) -> str:
    if "delta_vs_float_mean" not in row:
        return "-"
    if row["delta_vs_float_se"] is None:
        return f"{row['delta_vs_float_mean']:+.2f} (se n/a)"
    low, high = row["delta_vs_float_ci95"]
    return f"{row['delta_vs_float_mean']:+.2f} ± {row['delta_vs_float_se']:.2f} [{low:+.2f}, {high:+.2f}]"


def _markdown(report: Mapping[str, Any]) -> str:
    s, setup, env = report["summary"], report["setup"], report["environment"]
    data = setup["data"]
    if setup["split"] == "fixed":
        split_text = (
            f"{data['name']} split once, by seed {data['split_seed']}, shared by every seed, into {data['n_train']} "
            f"train / {data['n_val']} validation / {data['n_test']} test examples"
        )
    else:
        split_text = (
            f"{data['name']} split per seed (run seed s trains and is tested on split seed s, the same for every "
            f"configuration), each into {data['n_train']} train / {data['n_val']} validation / {data['n_test']} "
            "test examples"
        )
    lines = [
        "# stejax compare: quantisation-aware training on the digits",
        "",
        f"{len(setup['presets'])} configurations x {len(setup['seeds'])} seeds (seeds {setup['seeds']}), "
        f"{split_text}. The test accuracy is the mean over seeds of each run's best parameters (chosen by "
        "validation accuracy) on its test split, which is used once per run, at the end.",
        "",
        f"Model: {setup['model']}.",
        "",
        "Recipe: " + ", ".join(f"{k}={v}" for k, v in _recipe(setup["train_config"]).items()) + ".",
        "",
        "The default recipe was chosen by repeated stratified holdout inside the training and validation "
        "splits (`benchmarks/recipe_cv.py`); the test split played no part in choosing it.",
        "",
        "## Results",
        "",
        "Paired delta: the configuration's test accuracy minus float's on the same seed and split, in points: "
        "mean ± standard error over seeds [Student-t 95% interval].",
        "",
        "| configuration | test accuracy % (mean ± std) | paired delta vs float | per seed % "
        "| validation % of the chosen epoch (mean) | best epoch (mean) | step ms (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in s.items():
        per_seed = ", ".join(_pct(a) for a in row["test_accuracy_per_seed"])
        std = "n/a" if row["test_accuracy_std"] is None else _pct(row["test_accuracy_std"])
        lines.append(
            f"| `{name}` | {_pct(row['test_accuracy_mean'])} ± {std} | {_delta_text(row)} | {per_seed} "
            f"| {_pct(row['best_val_accuracy_mean'])} | {row['best_epoch_mean']:.1f} | {row['step_ms_median']:.3f} |"
        )
    ratio = report["w4a4_over_float_step_ratio"]
    if ratio is not None:
        lines += ["", f"Step time w4a4 / float (median of the per-round ratios): **{ratio:.3f}**."]
    lines += ["", "## Targets", "", f"The targets were set for {report['targets_set_for']}."]
    if report["recipe_differs_from_targets_recipe"]:
        lines += [
            "",
            "This run's recipe differs from it in "
            + ", ".join(f"`{k}`" for k in report["recipe_differs_from_targets_recipe"])
            + ": the targets are shown for reference, not as its benchmark.",
        ]
    if len(setup["seeds"]) != 10 or setup["split"] != "per-seed":
        lines += ["", f"This run has {len(setup['seeds'])} seed(s) and a {setup['split']} split."]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['measured']} | {met} |")
    missed = [t["target"] for t in report["targets"] if t["met"] is False]
    lines += [
        "",
        "All targets that were run are met." if not missed else "Missed: " + "; ".join(missed) + ".",
        "",
        "A delta target is judged on the mean paired delta (a configuration above float meets it); its "
        "interval says how well the mean is known. Std is over seeds with ddof=1 (n/a for one seed). The "
        "validation accuracy of the chosen epoch is optimistic (it did the choosing); the test accuracy is not.",
        "",
        _resolution(data["n_test"], len(setup["seeds"]), setup["split"], s),
        "",
        "## QAT policies (first and last layers)",
        "",
    ]
    lines += [f"- {text}" for text in setup["qat"].values()]
    lines += [
        "",
        "## Figures",
        "",
    ]
    for key, path in report.get("figures", {}).items():
        lines.append(f"- {key.replace('_', ' ')}: [{path}]({path})")
    lines += [
        "",
        "## Environment",
        "",
        f"- device: {env['device']}, platform {env['platform']}, {env['cpu_count']} CPUs, {env['machine']}",
        f"- jax {env['jax']}, jaxlib {env['jaxlib']}, Python {env['python']}",
        f"- dtypes: {env['dtypes']}",
        f"- step timing: {setup['timing']['repeats']} interleaved rounds after {setup['timing']['warmup']} "
        f"warm-up calls per configuration, batch {setup['timing']['batch_size']}, block_until_ready",
        f"- training wall time: {setup['train_seconds']:.1f} s",
        "",
    ]
    return "\n".join(lines)
