"""The comparison of QAT configurations over seeds: accuracy, step time, targets, report."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys
from stejax.data import Normalizer, Splits
from stejax.model import PRESETS, init_params, preset
from stejax.train._config import TrainConfig, make_optimizer
from stejax.train._loop import load_splits, train
from stejax.train._step import Batch, compiled_update, needs_key

__all__ = ["TARGETS", "Target", "compare", "time_steps"]

# fold_in data that marks the step timing's key stream.
_TIMING_STREAM = 0x7153

# The numerical tolerances the test suite states for the training functions
# (tests/test_train.py); recorded in the report's environment.
NUMERICAL_TOLERANCES = {
    "jit_vs_eager_logits": {"rtol": 1e-5, "atol": 1e-5},
    "jit_vs_eager_loss": {"rtol": 1e-5, "atol": 1e-6},
    "vmap_vs_loop_logits": {"rtol": 1e-5, "atol": 1e-5},
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of the comparison, as data.

    Attributes:
      name: the target as the report states it.
      preset: the configuration it is about.
      kind: ``"at_least"`` (mean test accuracy >= ``threshold`` percent),
        ``"at_most"`` (mean test accuracy <= ``threshold`` percent), ``"gap"``
        (float's mean minus this configuration's mean <= ``threshold``
        percentage points; scoring above float meets it) or ``"step_ratio"``
        (median step time over float's <= ``threshold``).
      threshold: the bound, in the unit ``kind`` says.
    """

    name: str
    preset: str
    kind: str
    threshold: float

    def evaluate(self, summary: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Judge the target on a comparison's summary.

        Returns:
          ``{"target", "preset", "value", "unit", "measured", "met"}``: the value in
          its unit (percent, percentage points float minus the configuration, or
          times float's step), a sentence ``measured`` for the report, and ``met``;
          ``met`` is None (and ``value`` None) when a needed configuration was not run.
        """
        out: dict[str, Any] = {"target": self.name, "preset": self.preset, "value": None, "met": None}
        needs = [self.preset] + (["float"] if self.kind in ("gap", "step_ratio") and self.preset != "float" else [])
        if any(p not in summary for p in needs):
            return {**out, "unit": "", "measured": f"not run (needs {', '.join(needs)})"}
        mine = summary[self.preset]
        # A hair of slack so that a value equal to the bound in decimal is not
        # refused for its binary rounding.
        eps = 1e-9
        if self.kind in ("at_least", "at_most"):
            value = 100 * mine["test_accuracy_mean"]
            met = value >= self.threshold - eps if self.kind == "at_least" else value <= self.threshold + eps
            return {**out, "value": value, "unit": "%", "measured": f"{value:.2f}%", "met": met}
        if self.kind == "gap":
            value = 100 * (summary["float"]["test_accuracy_mean"] - mine["test_accuracy_mean"])
            side = f"{value:.2f} points below float" if value >= 0 else f"{-value:.2f} points above float"
            return {**out, "value": value, "unit": "points", "measured": side, "met": value <= self.threshold + eps}
        value = mine["step_ms_median"] / summary["float"]["step_ms_median"]
        return {
            **out,
            "value": value,
            "unit": "x float",
            "measured": f"{value:.3f} x float",
            "met": value <= self.threshold + eps,
        }


TARGETS: tuple[Target, ...] = (
    Target("float >= 98%", "float", "at_least", 98.0),
    Target("w8a8 within 0.2 points of float", "w8a8", "gap", 0.2),
    Target("w4a4 within 0.3 points of float", "w4a4", "gap", 0.3),
    Target("w2a2 within 1.0 point of float", "w2a2", "gap", 1.0),
    Target("w1a32 within 1.0 point of float", "w1a32", "gap", 1.0),
    Target("w1a1 within 3.0 points of float", "w1a1", "gap", 3.0),
    Target("w4a4_no_ste at or below 25%", "w4a4_no_ste", "at_most", 25.0),
    Target("w4a4 step <= 1.15 x float step", "w4a4", "step_ratio", 1.15),
)


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
    seeds: int | Sequence[int] = 5,
    base: TrainConfig | None = None,
    out_dir: str | os.PathLike,
    splits: Splits | None = None,
    timing_repeats: int = 200,
    timing_warmup: int = 10,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Train every preset over several seeds, time their steps, and write the report.

    Each ``(preset, seed)`` is one :func:`train` run of ``base`` with that preset
    and seed, all on one data split (``base.data_seed``), each in its own run
    directory ``out_dir/runs/<preset>/seed-<s>``. The test split scores the best
    parameters of each run once; selection uses the validation split only.

    Then the jitted training step of each preset (the very functions the runs
    compiled) is timed side by side: ``timing_warmup`` calls each, then
    ``timing_repeats`` rounds of one call per preset in rotating order, each on
    the same training batch with the first seed's best parameters. The median is
    the preset's ``step_ms_median``.

    Writes ``out_dir/report.json``, ``out_dir/report.md`` and (with ``plots``)
    ``out_dir/plots/*.png``.

    Args:
      presets: the QAT presets to compare (default: all of :data:`stejax.model.PRESETS`).
      seeds: the number of seeds (``0..n-1``; default 5) or the seeds themselves.
      base: the recipe (default ``TrainConfig()``); its ``preset`` and ``seed``
        are replaced per run.
      out_dir: the output folder (created).
      splits: the data (default: the digits split by ``base``).
      timing_repeats: timed rounds (default 200).
      timing_warmup: untimed calls per preset first (default 10).
      on_event: called with ``{"event": "epoch", "preset", "seed", "record"}``
        after each epoch, ``{"event": "run", "preset", "seed", "test_accuracy"}``
        after each run and ``{"event": "timing"}`` before the timing.
      plots: draw the figures (matplotlib) (default True).

    Returns:
      The report (as written to ``report.json``).

    Raises:
      ValueError: an unknown preset, no seeds, or a repeated seed or preset.
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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = load_splits(base) if splits is None else splits
    started = time.perf_counter()

    runs: dict[str, list[dict[str, Any]]] = {}
    first_params: dict[str, Any] = {}
    normalizer: Normalizer | None = None
    for name in presets:
        runs[name] = []
        for seed in seed_list:
            config = dataclasses.replace(base, preset=name, seed=seed)

            def epoch_event(record, name=name, seed=seed):
                if on_event is not None:
                    on_event({"event": "epoch", "preset": name, "seed": seed, "record": record})

            result = train(config, splits=splits, out_dir=out / "runs" / name / f"seed-{seed}", on_epoch=epoch_event)
            if name not in first_params:
                first_params[name] = result.params
            normalizer = result.normalizer
            runs[name].append(
                {
                    "seed": seed,
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
            if on_event is not None:
                on_event({"event": "run", "preset": name, "seed": seed, "test_accuracy": result.test_accuracy})
    train_seconds = time.perf_counter() - started

    if on_event is not None:
        on_event({"event": "timing"})
    assert normalizer is not None
    step_times = _time_presets(presets, base, splits, normalizer, first_params, timing_repeats, timing_warmup)

    summary: dict[str, dict[str, Any]] = {}
    for name in presets:
        accuracies = [r["test_accuracy"] for r in runs[name]]
        summary[name] = {
            "describe": preset(name).describe(),
            "bits": _bits(name),
            "test_accuracy_mean": float(np.mean(accuracies)),
            "test_accuracy_std": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else 0.0,
            "test_accuracy_per_seed": accuracies,
            "step_ms_median": 1e3 * statistics.median(step_times[name]),
            "step_ms_quartiles": [1e3 * q for q in statistics.quantiles(step_times[name], n=4)[::2]]
            if len(step_times[name]) > 1
            else [1e3 * step_times[name][0]] * 2,
            "best_val_accuracy_mean": float(np.mean([r["best_val_accuracy"] for r in runs[name]])),
            "best_epoch_mean": float(np.mean([r["best_epoch"] for r in runs[name]])),
            "epochs_run_mean": float(np.mean([r["epochs_run"] for r in runs[name]])),
        }
    ratio = None
    if "w4a4" in summary and "float" in summary:
        ratio = summary["w4a4"]["step_ms_median"] / summary["float"]["step_ms_median"]
    targets = [t.evaluate(summary) for t in TARGETS]

    example = dataclasses.replace(base, preset=presets[0])
    report = {
        "format": "stejax-compare/1",
        "summary": summary,
        "w4a4_over_float_step_ratio": ratio,
        "targets": targets,
        "runs": {name: [{k: v for k, v in r.items() if k != "history"} for r in rs] for name, rs in runs.items()},
        "setup": {
            "presets": list(presets),
            "seeds": seed_list,
            "train_config": {k: v for k, v in base.to_dict().items() if k not in ("preset", "seed")},
            "model": _model_text(example, splits),
            "qat": {name: preset(name).describe() for name in presets},
            "data": {
                "name": splits.train.name.removesuffix("[train]"),
                "split_seed": splits.seed,
                "n_train": len(splits.train),
                "n_val": len(splits.val),
                "n_test": len(splits.test),
            },
            "selection": "best validation accuracy (ties: lower validation loss); the test split scores "
            "each run's best parameters once, at the end",
            "accuracy_unit": "fraction of the test split in [0, 1]; std over seeds with ddof=1",
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
        step = compiled_update(model_config, qat_config, optimizer)
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


def _bits(name: str) -> dict[str, int]:
    """The hidden layers' weight and input bit widths (32 for float)."""
    lq = preset(name).hidden
    return {
        "weights": lq.weights.bits if lq.weights else 32,
        "activations": lq.activations.bits if lq.activations else 32,
    }


def _model_text(config: TrainConfig, splits: Splits) -> str:
    mc = config.model_config(splits.train)
    if config.model == "mlp":
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


def _resolution(n_test: int, n_seeds: int, summary: Mapping[str, Mapping[str, Any]]) -> str:
    # How finely the test split can tell configurations apart: every seed meets the
    # same test examples, so the split's own sampling error does not average out.
    p = summary["float"]["test_accuracy_mean"] if "float" in summary else 0.97
    se = 100 * math.sqrt(p * (1 - p) / n_test)
    return (
        f"Resolution: one test example is {100 / n_test:.2f} points of one seed's accuracy and "
        f"{100 / n_test / n_seeds:.3f} points of a {n_seeds}-seed mean. All seeds share one test split, so its "
        f"sampling error (binomial standard error {se:.2f} points at {100 * p:.1f}%) is common to every "
        "configuration and does not shrink with more seeds: it bounds how well the absolute level is known, "
        "while differences between configurations, measured on the same examples, are known better."
    )


def _markdown(report: Mapping[str, Any]) -> str:
    s, setup, env = report["summary"], report["setup"], report["environment"]
    data = setup["data"]
    lines = [
        "# stejax compare: quantisation-aware training on the digits",
        "",
        f"{len(setup['presets'])} configurations x {len(setup['seeds'])} seeds (seeds {setup['seeds']}), "
        f"{data['name']} split by seed {data['split_seed']} into {data['n_train']} train / {data['n_val']} "
        f"validation / {data['n_test']} test examples. The test accuracy is the mean over seeds of each run's "
        "best parameters (chosen by validation accuracy) on the test split, which is used once per run, at the end.",
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
        "| configuration | test accuracy % (mean ± std) | per seed % | validation % of the chosen epoch (mean) "
        "| best epoch (mean) | step ms (median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in s.items():
        per_seed = ", ".join(_pct(a) for a in row["test_accuracy_per_seed"])
        lines.append(
            f"| `{name}` | {_pct(row['test_accuracy_mean'])} ± {_pct(row['test_accuracy_std'])} | {per_seed} "
            f"| {_pct(row['best_val_accuracy_mean'])} | {row['best_epoch_mean']:.1f} | {row['step_ms_median']:.3f} |"
        )
    ratio = report["w4a4_over_float_step_ratio"]
    if ratio is not None:
        lines += ["", f"Step time ratio w4a4 / float: **{ratio:.3f}**."]
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['measured']} | {met} |")
    missed = [t["target"] for t in report["targets"] if t["met"] is False]
    lines += [
        "",
        "All targets that were run are met." if not missed else "Missed: " + "; ".join(missed) + ".",
        "",
        "A gap target compares the means: float's mean minus the configuration's, in percentage points "
        "(a configuration above float meets it). Std is over seeds with ddof=1. The validation accuracy "
        "of the chosen epoch is optimistic (it did the choosing); the test accuracy is not.",
        "",
        _resolution(data["n_test"], len(setup["seeds"]), s),
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
