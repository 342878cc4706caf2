"""The comparison's figures (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["draw_all"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _mean_curve(runs: Sequence[Sequence[Mapping[str, Any]]], field: str) -> tuple[np.ndarray, np.ndarray]:
    """Epochs and the mean of ``field`` over the runs that reached each epoch (runs stop early)."""
    longest = max(len(h) for h in runs)
    epochs, means = [], []
    for e in range(longest):
        values = [h[e][field] for h in runs if len(h) > e]
        epochs.append(e + 1)
        means.append(float(np.mean(values)))
    return np.asarray(epochs), np.asarray(means)


def draw_all(
    folder: Path, summary: Mapping[str, Mapping[str, Any]], history: Mapping[str, Sequence[Sequence[Mapping]]]
) -> dict[str, Path]:
    """Draw the three figures into ``folder``; return ``{name: path}``."""
    folder.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    paths = {
        "loss_curves": _loss_curves(plt, folder / "loss_curves.png", history),
        "accuracy_vs_bits": _accuracy_vs_bits(plt, folder / "accuracy_vs_bits.png", summary),
        "zero_gradient_fraction": _zero_gradient(plt, folder / "zero_gradient_fraction.png", history),
    }
    return paths


def _loss_curves(plt, path: Path, history) -> Path:
    names = list(history)
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names, strict=False):
        for field, style in (("train_loss", "-"), ("val_loss", "--")):
            epochs, mean = _mean_curve(history[name], field)
            ax.plot(epochs, mean, style, label=field.replace("_", " "))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("cross-entropy (mean over seeds)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Training and validation loss per configuration (train loss with dropout on)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _accuracy_vs_bits(plt, path: Path, summary) -> Path:
    # Left: every configuration. Right: the ones within 10 points of the best, zoomed in
    # (the no-STE baseline near chance would flatten the others into one line).
    best = max(100 * row["test_accuracy_mean"] for row in summary.values())
    close = {n: r for n, r in summary.items() if 100 * r["test_accuracy_mean"] >= best - 10}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rows in zip(axes, (summary, close), strict=True):
        for name, row in rows.items():
            bits = row["bits"]["weights"]
            mean, std = 100 * row["test_accuracy_mean"], 100 * (row["test_accuracy_std"] or 0.0)
            marker = "x" if name.endswith("no_ste") else ("s" if row["bits"]["activations"] == 32 else "o")
            ax.errorbar(bits, mean, yerr=std, fmt=marker, capsize=3)
            ax.annotate(name, (bits, mean), textcoords="offset points", xytext=(6, -3), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 32], labels=["1", "2", "4", "8", "32 (float)"])
        ax.set_xlim(0.8, 64)
        ax.set_xlabel("hidden-layer weight bits")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy % (mean ± std over seeds)")
    axes[0].set_title("all configurations", fontsize=10)
    axes[1].set_title("within 10 points of the best", fontsize=10)
    fig.suptitle("Test accuracy against bits (first and last layers stay 8-bit: see the report)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _zero_gradient(plt, path: Path, history) -> Path:
    layers = sorted(
        {key.split("/")[0] for runs in history.values() for record in runs[0] for key in record["zero_grad_fraction"]},
        key=lambda s: int(s.split("_")[1]),
    )
    if not layers:
        layers = ["layer_0"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4.2 * len(layers), 3.4), squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, layer in zip(axes[0], layers, strict=True):
        for c, name in enumerate(history):
            runs = history[name]
            for part, style in (("weights", "-"), ("activations", "--")):
                key = f"{layer}/{part}"
                if key not in runs[0][0]["zero_grad_fraction"]:
                    continue
                curves = [[{"v": r["zero_grad_fraction"][key]} for r in h] for h in runs]
                epochs, mean = _mean_curve(curves, "v")
                ax.plot(epochs, mean, style, color=colors[c % len(colors)], label=f"{name} {part}")
        ax.set_title(layer.replace("_", " "), fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("fraction in the zero-gradient region")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    for ax in axes[0]:
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab, strict=True):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    fig.legend(handles, labels, fontsize=7, loc="center right")
    fig.suptitle(
        "Quantiser inputs in the zero-gradient region per layer (solid: weights, dashed: inputs; mean over seeds)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
