"""Write the comparison's report: report.json, report.md and three pictures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_report"]


def write_report(report: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``report.json``, ``report.md``, ``reconstructions.png``, ``usage.png`` and ``histogram.png``.

    ``report`` is what :func:`stejax.vq.compare` returns; its ``pictures`` are
    drawn and left out of the JSON. Needs matplotlib (``stejax[cli]``) for the
    pictures.

    Returns:
      The written paths by name.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "report.json",
        "markdown": out / "report.md",
        "reconstructions": out / "reconstructions.png",
        "usage": out / "usage.png",
        "histogram": out / "histogram.png",
    }
    data = {k: v for k, v in report.items() if k != "pictures"}
    paths["json"].write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown(data))
    pictures = report["pictures"]
    _plot_reconstructions(pictures, paths["reconstructions"])
    _plot_usage(pictures, paths["usage"])
    _plot_histograms(pictures, paths["histogram"])
    return paths


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page: the table, the references, the targets, the settings."""
    s = report["settings"]
    lines = [
        "# Vector-quantised digits autoencoders",
        "",
        f"{len(s['seeds'])} seeds ({', '.join(map(str, s['seeds']))}), {s['epochs']} epochs, "
        f"{s['tokens']} tokens x {s['codebook_size']} codes = "
        f"{next(iter(report['summary'].values()))['bits_per_image']:g} bits per image"
        if report["summary"]
        else "",
        "Test MSE on pixels in [0, 1]; usage and perplexity of the codes on the test split.",
        "",
        "| configuration | quantizer | codebook | test MSE | usage | perplexity | quantisation error |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in report["summary"].items():
        lines.append(
            f"| {name} | {r['quantizer']} | {r['codebook']} | {r['test_mse_mean']:.5f} ± {r['test_mse_std']:.5f} "
            f"| {r['usage_mean']:.3f} | {r['perplexity_mean']:.1f} | {r['quantization_error_mean']:.4f} |"
        )
    refs = report["references"]
    lines += ["", "## References (computed on the same splits)", "", "| reference | test MSE |", "|---|---|"]
    lines.append(
        f"| mean image | {refs['mean_image']['test_mse_mean']:.5f} ± {refs['mean_image']['test_mse_std']:.5f} |"
    )
    lines.append(
        f"| PCA, {refs['pca']['components']} continuous components | "
        f"{refs['pca']['test_mse_mean']:.5f} ± {refs['pca']['test_mse_std']:.5f} |"
    )
    lines.append(
        f"| k-means, one token of {refs['kmeans']['codes']} codes ({refs['kmeans']['bits_per_image']:g} bits) | "
        f"{refs['kmeans']['test_mse_mean']:.5f} ± {refs['kmeans']['test_mse_std']:.5f} |"
    )
    lines += ["", "## Targets", ""]
    for t in report["targets"]:
        lines.append(f"- {'PASS' if t['passed'] else 'FAIL'} {t['name']}: {t['detail']}")
    lines += ["", "## Settings", "", "```", json.dumps(s, indent=1), "```", ""]
    lines += [
        "![reconstructions](reconstructions.png)",
        "",
        "![usage](usage.png)",
        "",
        "![histogram](histogram.png)",
        "",
    ]
    return "\n".join(lines)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_reconstructions(pictures, path: Path) -> None:
    plt = _figure()
    rows = [("original", pictures["originals"]), *pictures["reconstructions"].items()]
    n = len(pictures["originals"])
    fig, axes = plt.subplots(len(rows), n, figsize=(n * 0.9 + 1.6, len(rows) * 0.95), squeeze=False)
    for r, (name, images) in enumerate(rows):
        for c in range(n):
            ax = axes[r][c]
            ax.imshow(np.clip(np.asarray(images[c]).reshape(8, 8), 0, 1), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
    fig.suptitle("test images (seed 0): originals and reconstructions", fontsize=9)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _plot_usage(pictures, path: Path) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in pictures["usage_per_epoch"].items():
        ax.plot(np.arange(1, len(values) + 1), values, label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of codes used in the epoch (mean over seeds)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=6)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _plot_histograms(pictures, path: Path) -> None:
    plt = _figure()
    items = list(pictures["histograms"].items())
    cols = 3
    rows = max(1, -(-len(items) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3.2, rows * 2.2), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(items):
            ax.axis("off")
            continue
        name, counts = items[i]
        ax.bar(np.arange(len(counts)), counts, width=1.0)
        ax.set_title(name, fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle("test-split code histograms (seed 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
