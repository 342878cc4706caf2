"""The comparison's figures (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["draw_all"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def draw_all(
    folder: Path,
    summary: Mapping[str, Mapping[str, Any]],
    curves: Mapping[str, Sequence[float]],
    example: Mapping[str, Any],
) -> dict[str, Path]:
    """Draw the figures into ``folder``; return ``{name: path}``."""
    folder.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    paths = {
        "accuracy_per_surrogate": _accuracy(plt, folder / "accuracy_per_surrogate.png", summary),
        "loss_curves": _losses(plt, folder / "loss_curves.png", summary, curves),
        "spike_rate_per_layer": _rates(plt, folder / "spike_rate_per_layer.png", summary),
    }
    if example:
        paths["raster_and_membrane"] = _raster(plt, folder / "raster_and_membrane.png", example)
    return paths


def _groups(summary) -> dict[tuple[int, int], list[str]]:
    groups: dict[tuple[int, int], list[str]] = {}
    for key, row in summary.items():
        groups.setdefault((row["hidden_layers"], row["T"]), []).append(key)
    return groups


def _accuracy(plt, path: Path, summary) -> Path:
    groups = _groups(summary)
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.8 * len(groups)), squeeze=False)
    for ax, ((n_layers, n_steps), names) in zip(axes[:, 0], groups.items(), strict=True):
        means = [100 * summary[k]["test_accuracy_mean"] for k in names]
        stds = [100 * summary[k]["test_accuracy_std"] for k in names]
        ax.bar(range(len(names)), means, yerr=stds, color="tab:blue", capsize=3)
        ax.set_xticks(range(len(names)), [k.rsplit("_h", 1)[0] for k in names], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("test accuracy %")
        ax.set_title(f"{n_layers} hidden layer(s), T = {n_steps}", fontsize=9)
        ax.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _losses(plt, path: Path, summary, curves) -> Path:
    groups = _groups(summary)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
    for ax, ((n_layers, n_steps), names) in zip(axes[0], groups.items(), strict=True):
        for k in names:
            c = curves[k]
            ax.plot(range(1, len(c) + 1), c, label=k.rsplit("_h", 1)[0])
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (mean over seeds)")
        ax.set_title(f"{n_layers} hidden layer(s), T = {n_steps}", fontsize=9)
    axes[0, -1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rates(plt, path: Path, summary) -> Path:
    keys = [k for k, r in summary.items() if r["spike_rate"] is not None]
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(keys) + 2), 3.6))
    depth = max((len(summary[k]["spike_rate"]) for k in keys), default=1)
    width = 0.8 / depth
    for layer in range(depth):
        values = [summary[k]["spike_rate"][layer] if layer < len(summary[k]["spike_rate"]) else 0 for k in keys]
        ax.bar(np.arange(len(keys)) + layer * width, values, width=width, label=f"layer {layer + 1}")
    ax.set_xticks(np.arange(len(keys)), keys, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("spikes / neuron / step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _raster(plt, path: Path, example) -> Path:
    from stejax.data import load_digits
    from stejax.snn._encode import rate
    from stejax.snn._network import forward

    digits = load_digits()
    x = jax.numpy.asarray(np.clip(digits.x[:1] / np.max(digits.x), 0, 1).astype(np.float32))
    n_steps = int(example["key"].rsplit("_t", 1)[1])
    spikes_in = rate(x, n_steps, key=jax.random.key(0))
    out = forward(example["net"], example["params"], spikes_in)
    hidden = np.asarray(out.spikes[0][:, 0, :])
    traces = np.asarray(out.traces[:, 0, :])
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    t, n = np.nonzero(hidden)
    a.scatter(t, n, s=4, marker="|", color="black")
    a.set_ylabel("hidden neuron")
    a.set_title(f"{example['key']}: first digit (label {int(digits.y[0])}), layer-1 spikes", fontsize=9)
    for c in range(traces.shape[1]):
        b.plot(traces[:, c], label=str(c), lw=2.0 if c == int(digits.y[0]) else 0.8)
    b.set_xlabel("time step")
    b.set_ylabel("readout membrane")
    b.legend(fontsize=6, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
