r"""The surrogate comparison on the digits: every configuration over split seeds, the targets, the report.

For each group (hidden layers :math:`L`, time steps :math:`T`) and each
configuration, :func:`stejax.snn.train_seeds` trains all seeds in one vmapped
program; then the groups' single-seed training steps are timed side by side.
``report.json`` keeps ``summary`` keyed by configuration name
(``<config>_h<L>_t<T>``), the per-seed results in ``runs``, the targets, the
setup and the environment.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import platform
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
from stejax.snn._network import NetConfig
from stejax.snn._spike import SURROGATES, Spike
from stejax.snn._train import SNNTrainConfig, _scale, load_seed_splits, make_optimizer, make_train_step, train_seeds

__all__ = ["CONFIGS", "FULL", "QUICK", "Tier", "compare", "config_name"]

# The comparison's configurations: name -> the hidden neurons' spike function (None: the ReLU reference).
CONFIGS: dict[str, Spike | None] = {
    **{name: Spike(name) for name in SURROGATES},
    "fast_sigmoid_slope100": Spike("fast_sigmoid", (("slope", 100.0),)),
    "identity": Spike("identity"),
    "no_surrogate": Spike("no_surrogate"),
    "ann": None,
}

_TIMING_STREAM = 0x5117


@dataclasses.dataclass(frozen=True)
class Tier:
    """How much of the comparison to run.

    Attributes:
      configs: names from :data:`CONFIGS`.
      seeds: the split seeds.
      hidden_layers: the depths to run (each layer ``width`` LIF neurons).
      steps: the values of :math:`T`.
      width: hidden layer width (128).
      epochs: training epochs.
      timing_repeats, timing_warmup: the step timing's rounds.
      readout: the spiking configurations' readout, ``"lif"`` (default: a spiking
        output layer, so that every trained weight sits behind a spike) or
        ``"integrator"`` (the non-spiking leaky integrator); see
        :class:`stejax.snn.NetConfig`. The non-spiking reference always has the
        integrator.
      readout_loss: the loss of the LIF readout (default ``"mse_count"``); the
        integrator readout takes the recipe's loss (``"ce_mean_membrane"``).
    """

    configs: tuple[str, ...]
    seeds: tuple[int, ...]
    hidden_layers: tuple[int, ...]
    steps: tuple[int, ...]
    width: int = 128
    epochs: int = 30
    timing_repeats: int = 30
    timing_warmup: int = 3
    readout: str = "lif"
    readout_loss: str = "mse_count"


FULL = Tier(tuple(CONFIGS), (0, 1, 2, 3, 4), (1, 2), (25, 8))
"""The full comparison: 10 configurations, 5 seeds, 1 and 2 hidden layers, T = 25 and 8."""

QUICK = Tier(("fast_sigmoid", "ann"), (0, 1), (1,), (4,), width=16, epochs=10, timing_repeats=3, timing_warmup=1)
"""The smoke test: one surrogate and the ANN, 2 seeds, one hidden layer of 16, T = 4, 10 epochs."""


def config_name(config: str, hidden_layers: int, n_steps: int) -> str:
    """The report's key of a configuration in a group: ``"<config>_h<L>_t<T>"``."""
    return f"{config}_h{hidden_layers}_t{n_steps}"


def _network(name: str, tier: Tier, n_layers: int, recipe: SNNTrainConfig) -> tuple[NetConfig, SNNTrainConfig]:
    """The network and recipe of configuration ``name``: the tier's readout for the spiking ones."""
    spike = CONFIGS[name]
    readout = "integrator" if spike is None else tier.readout
    net = NetConfig(64, 10, hidden=(tier.width,) * n_layers, spike=spike, readout=readout)
    return net, (dataclasses.replace(recipe, loss=tier.readout_loss) if readout == "lif" else recipe)


def _surrogate_of(config: str) -> str:
    spike = CONFIGS[config]
    return "ann" if spike is None else spike.surrogate


def compare(
    tier: Tier = FULL,
    *,
    out_dir: str | os.PathLike,
    recipe: SNNTrainConfig | None = None,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    plots: bool = True,
    workers: int = 1,
) -> dict[str, Any]:
    """Run the comparison of ``tier``; write ``report.json``, ``report.md`` and ``plots/`` under ``out_dir``.

    The report is rewritten after every group, so an interrupted run leaves the
    groups it finished. Groups run in the order of ``tier.hidden_layers`` then
    ``tier.steps``.

    Args:
      tier: what to run (default :data:`FULL`; :data:`QUICK` for a smoke test).
      out_dir: the output folder (created).
      recipe: the training recipe (default ``SNNTrainConfig(epochs=tier.epochs)``);
        its ``n_steps`` is replaced per group.
      on_event: called with ``{"event": "config", ...}`` after each configuration.
      plots: draw the figures (matplotlib).
      workers: processes that train at once (default 1: this one only). With
        ``n > 1`` the configurations of each group train in ``n`` spawned
        processes, every seed of a configuration in one; the results are the
        same (each training is the same pure computation), and the step timing
        stays in this process. A script that calls this with ``workers > 1``
        needs the ``if __name__ == "__main__":`` guard.

    Returns:
      The report, as written.

    Raises:
      ValueError: an unknown configuration, or ``workers`` not a positive int.
    """
    unknown = [c for c in tier.configs if c not in CONFIGS]
    if unknown or not tier.configs:
        raise ValueError(f"compare: unknown configuration(s) {unknown}; expected names from {tuple(CONFIGS)}.")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"compare: workers must be a positive int (processes that train at once); got {workers!r}.")
    recipe = SNNTrainConfig(epochs=tier.epochs) if recipe is None else recipe
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    splits = load_seed_splits(tier.seeds, recipe)
    summary: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    curves: dict[str, list[float]] = {}
    example: dict[str, Any] = {}
    report: dict[str, Any] = {}
    # JAX's threads do not survive a fork: the workers are spawned.
    pool = None if workers == 1 else ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    for n_layers in tier.hidden_layers:
        for n_steps in tier.steps:
            config = dataclasses.replace(recipe, n_steps=n_steps)
            steps_setup = {}
            futures: dict[str, Future[Any]] = {}
            if pool is not None:
                futures = {name: pool.submit(_train_one, name, tier, n_layers, config, splits) for name in tier.configs}
            for name in tier.configs:
                key = config_name(name, n_layers, n_steps)
                net, net_recipe = _network(name, tier, n_layers, config)
                if pool is None:
                    result = train_seeds(net, net_recipe, tier.seeds, splits=splits)
                else:
                    result = futures[name].result()
                summary[key], runs[key] = _summarise(name, n_layers, n_steps, result)
                curves[key] = result.train_loss.mean(axis=0).tolist()
                first = jax.tree.map(lambda a: a[0], result.params)
                steps_setup[key] = (net, net_recipe, first)
                if not example or (
                    CONFIGS[name] is not None and summary[key]["test_accuracy_mean"] > example["accuracy"]
                ):
                    if n_layers == tier.hidden_layers[0] and n_steps == tier.steps[0]:
                        example = {
                            "key": key,
                            "net": net,
                            "params": first,
                            "accuracy": summary[key]["test_accuracy_mean"],
                        }
                if on_event is not None:
                    on_event({"event": "config", "config": key, **{k: summary[key][k] for k in _EVENT_FIELDS}})
            times = _time_steps(steps_setup, config, splits, tier)
            for key, t in times.items():
                summary[key]["step_ms_median"] = 1e3 * statistics.median(t)
            report = _report(tier, recipe, summary, runs, splits, time.perf_counter() - started)
            _write(out, report, curves, example, plots)
    if pool is not None:
        pool.shutdown()
    return report


def _train_one(name: str, tier: Tier, n_layers: int, config: SNNTrainConfig, splits: Sequence[Any]) -> Any:
    """One configuration's seeds in a worker process, as :func:`compare` trains them in its own."""
    net, net_recipe = _network(name, tier, n_layers, config)
    return jax.device_get(train_seeds(net, net_recipe, tier.seeds, splits=splits))


_EVENT_FIELDS = ("test_accuracy_mean", "test_accuracy_std", "train_loss_epoch5", "train_loss_epoch10", "spike_rate")


def _loss_at(result, epoch: int) -> float | None:
    return float(result.train_loss[:, epoch - 1].mean()) if result.train_loss.shape[1] >= epoch else None


def _summarise(name: str, n_layers: int, n_steps: int, result) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spike = CONFIGS[name]
    spiking = spike is not None
    acc = result.test_accuracy
    entry = {
        "surrogate": _surrogate_of(name),
        "surrogate_params": dict(spike.params) if spike is not None else {},
        "hidden_layers": n_layers,
        "T": n_steps,
        "test_accuracy_mean": float(acc.mean()),
        "test_accuracy_std": float(acc.std(ddof=1)) if acc.size > 1 else 0.0,
        "test_accuracy_per_seed": acc.tolist(),
        "train_loss_epoch5": _loss_at(result, 5),
        "train_loss_epoch10": _loss_at(result, 10),
        "spike_rate": result.spike_rate.mean(axis=0).tolist() if spiking else None,
        "silent_fraction": result.silent_fraction.mean(axis=0).tolist() if spiking else None,
        "all_gradients_finite": bool(result.all_finite.all()),
        "best_epoch_mean": float(result.best_epoch.mean()),
        "train_seconds": result.seconds,
        "step_ms_median": None,
    }
    per_seed = [
        {
            "seed": s,
            "test_accuracy": float(result.test_accuracy[i]),
            "best_epoch": int(result.best_epoch[i]),
            "train_loss": result.train_loss[i].tolist(),
            "val_accuracy": result.val_accuracy[i].tolist(),
            "spike_rate": result.spike_rate[i].tolist() if spiking else None,
            "silent_fraction": result.silent_fraction[i].tolist() if spiking else None,
            "all_gradients_finite": bool(result.all_finite[i]),
        }
        for i, s in enumerate(result.seeds)
    ]
    return entry, per_seed


def _time_steps(setups, config: SNNTrainConfig, splits, tier: Tier) -> dict[str, list[float]]:
    """Each configuration's single-seed jitted training step, timed in interleaved rounds (first seed's data)."""
    from stejax.train import time_steps

    train = splits[0].train
    top = float(np.max(train.x))
    x = jnp.asarray(_scale(train.x[: config.batch_size], top))
    y = jnp.asarray(train.y[: config.batch_size].astype(np.int32))
    n = tier.timing_warmup + tier.timing_repeats
    root = jax.random.fold_in(jax.random.key(tier.seeds[0]), _TIMING_STREAM)
    streams = keys.split(root, len(setups), where="snn compare: timing, one stream per configuration")
    calls = {}
    for (key, (net, net_recipe, params)), k in zip(setups.items(), streams, strict=True):
        optimizer = make_optimizer(net_recipe, len(train) // config.batch_size)
        step = jax.jit(make_train_step(net, net_recipe, optimizer))
        calls[key] = (step, (params, optimizer.init(params), x, y), list(keys.split(k, n, where=f"timing {key}")))
    return time_steps(calls, repeats=tier.timing_repeats, warmup=tier.timing_warmup)


def _targets(summary: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict]:
    out = []
    one = {k: v for k, v in summary.items() if v["hidden_layers"] == 1 and v["T"] == 25}
    spiking = {k: v for k, v in one.items() if v["surrogate"] in SURROGATES and not v["surrogate_params"]}
    ann = next((k for k, v in one.items() if v["surrogate"] == "ann"), None)
    if spiking:
        best = max(spiking, key=lambda k: spiking[k]["test_accuracy_mean"])
        value = 100 * spiking[best]["test_accuracy_mean"]
        out.append(_target("best surrogate >= 97.5% (1 hidden layer, T = 25)", best, value, "%", value >= 97.5))
        if ann is not None:
            from stejax.train import paired_delta

            delta = paired_delta([r["test_accuracy"] for r in runs[best]], [r["test_accuracy"] for r in runs[ann]])
            gap = -delta["mean"]  # the ANN's lead over the best surrogate, points
            out.append(
                _target(
                    "best surrogate within 1.0 point of the ANN (paired over seeds)", best, gap, "points", gap <= 1.0
                )
            )
    else:
        out.append(_target("best surrogate >= 97.5% (1 hidden layer, T = 25)", None, None, "%", None))
    for key, row in summary.items():
        if row["surrogate"] == "no_surrogate":
            value = 100 * row["test_accuracy_mean"]
            out.append(_target(f"no surrogate <= 25% ({key})", key, value, "%", value <= 25.0))
    finite = all(row["all_gradients_finite"] for row in summary.values())
    out.append(_target("every gradient finite in every run", None, None, "", finite))
    for key, row in summary.items():
        bad = row["surrogate_params"] or row["surrogate"] == "identity"
        if not bad or row["train_loss_epoch10"] is None:
            continue
        group = [
            v
            for v in summary.values()
            if v["hidden_layers"] == row["hidden_layers"]
            and v["T"] == row["T"]
            and v["surrogate"] in SURROGATES
            and not v["surrogate_params"]
        ]
        if not group:
            continue
        ref5 = statistics.median(v["train_loss_epoch5"] for v in group)
        ref10 = statistics.median(v["train_loss_epoch10"] for v in group)
        r5, r10 = row["train_loss_epoch5"] / ref5, row["train_loss_epoch10"] / ref10
        out.append(
            {
                "target": f"{key}: training loss worse than the default surrogates' median at epochs 5 and 10",
                "config": key,
                "value": [r5, r10],
                "unit": "x the defaults' median loss (epoch 5, epoch 10)",
                "measured": f"{r5:.2f}x at epoch 5, {r10:.2f}x at epoch 10",
                "met": bool(r5 > 1 and r10 > 1),
            }
        )
    return out


def _target(name, config, value, unit, met) -> dict[str, Any]:
    if value is None:
        measured = "not run" if met is None else ("yes" if met else "no")
    else:
        measured = f"{value:.2f} {unit}".strip()
    return {"target": name, "config": config, "value": value, "unit": unit, "measured": measured, "met": met}


def _report(tier, recipe, summary, runs, splits, seconds) -> dict[str, Any]:
    import jaxlib

    device = jax.devices()[0]
    return {
        "format": "stejax-snn-compare/1",
        "summary": summary,
        "targets": _targets(summary, runs),
        "runs": runs,
        "setup": {
            "tier": dataclasses.asdict(tier),
            "recipe": dataclasses.asdict(recipe),
            "network": f"64 -> [{tier.width} LIF] x L -> 10 "
            + (
                "LIF readout read by its spike counts (every trained weight behind a spike; output bias starts at "
                "the drive that holds it at threshold)"
                if tier.readout == "lif"
                else "leaky-integrator readout read by its membrane"
            )
            + "; LIF decay 0.9 and threshold 1.0 per neuron (learned), reset by subtraction without gradient; the "
            "ANN replaces each hidden LIF by a ReLU and reads a leaky integrator",
            "encoding": "rate (Bernoulli) coding of the pixels divided by the training split's maximum",
            "loss": (f"{tier.readout_loss} on the output spikes, " if tier.readout == "lif" else "")
            + f"{recipe.loss} on the readout membrane (ANN), Adam with cosine decay from lr {recipe.learning_rate}",
            "selection": "parameters of the epoch with the best validation accuracy; the test split scores them once",
            "data": {
                "name": "digits",
                "split_seeds": list(tier.seeds),
                "n_train": len(splits[0].train),
                "n_val": len(splits[0].val),
                "n_test": len(splits[0].test),
            },
            "accuracy_unit": "fraction of the test split in [0, 1]; std over seeds with ddof=1",
            "spike_rate_unit": "spikes per neuron per time step on the test split, best parameters, mean over seeds",
            "step_timing": f"single-seed jitted training step (encode, forward, gradient, Adam), batch "
            f"{recipe.batch_size}; median of {tier.timing_repeats} interleaved rounds after {tier.timing_warmup} "
            "warm-up calls",
            "seconds": seconds,
        },
        "environment": {
            "device": f"{device.device_kind} ({device})",
            "platform": jax.default_backend(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "dtypes": {"params": "float32", "spikes": "float32", "labels": "int32"},
        },
    }


def _write(out: Path, report: dict[str, Any], curves, example, plots: bool) -> None:
    figures: dict[str, Path] = {}
    if plots:
        from stejax.snn._plots import draw_all

        figures = draw_all(out / "plots", report["summary"], curves, example)
    report["figures"] = {k: str(Path(v).relative_to(out)) for k, v in figures.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_markdown(report), encoding="utf-8")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}"


def _num(x: float | None, fmt: str = ".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _markdown(report: Mapping[str, Any]) -> str:
    s, setup, env = report["summary"], report["setup"], report["environment"]
    tier = setup["tier"]
    lines = [
        "# stejax snn compare: surrogate gradients on the digits",
        "",
        f"{len(tier['configs'])} configurations x {len(tier['seeds'])} split seeds {tier['seeds']}, "
        f"hidden layers {tier['hidden_layers']}, T {tier['steps']}, {setup['recipe']['epochs']} epochs. "
        f"Network: {setup['network']}. Input: {setup['encoding']}. Loss: {setup['loss']}. "
        f"Selection: {setup['selection']}.",
        "",
        "## Results",
        "",
        "| configuration | surrogate | L | T | test accuracy % (mean ± std) | loss ep. 5 | loss ep. 10 "
        "| spike rate per layer | step ms (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in s.items():
        rates = "n/a" if r["spike_rate"] is None else ", ".join(f"{v:.3f}" for v in r["spike_rate"])
        params = (
            "" if not r["surrogate_params"] else " " + ", ".join(f"{k}={v:g}" for k, v in r["surrogate_params"].items())
        )
        lines.append(
            f"| `{key}` | {r['surrogate']}{params} | {r['hidden_layers']} | {r['T']} "
            f"| {_pct(r['test_accuracy_mean'])} ± {_pct(r['test_accuracy_std'])} | {_num(r['train_loss_epoch5'])} "
            f"| {_num(r['train_loss_epoch10'])} | {rates} | {_num(r['step_ms_median'], '.3f')} |"
        )
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['measured']} | {met} |")
    lines += ["", "## Figures", ""]
    lines += [f"- {k.replace('_', ' ')}: [{p}]({p})" for k, p in report.get("figures", {}).items()]
    lines += [
        "",
        "## Environment",
        "",
        f"- device: {env['device']}, {env['cpu_count']} CPUs, load average {env['load_average']}",
        f"- jax {env['jax']}, jaxlib {env['jaxlib']}, Python {env['python']}",
        f"- step timing: {setup['step_timing']}",
        f"- wall time so far: {setup['seconds']:.0f} s",
        "",
    ]
    return "\n".join(lines)
