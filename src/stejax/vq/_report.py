"""Write the comparison's report: report.json, report.md and two plots (usage against K, MSE against bits)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_report"]

_PLOTS = ("usage_vs_k.png", "mse_vs_bits.png")


def write_report(
    report: dict[str, Any], out_dir: str | os.PathLike[str], *, figures_dir: str | os.PathLike[str] | None = None
) -> dict[str, Path]:
    """Write ``report.json``, ``report.md``, ``usage_vs_k.png`` and ``mse_vs_bits.png`` into ``out_dir``.

    ``report`` is what :func:`stejax.vq.compare` returns. With ``figures_dir`` the
    two plots are copied there too (the documentation's images). Needs matplotlib
    (``stejax[cli]``) for the plots.

    Returns:
      The written paths by name (``json``, ``markdown``, ``usage_vs_k``, ``mse_vs_bits``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown(report))
    paths["usage_vs_k"] = out / _PLOTS[0]
    paths["mse_vs_bits"] = out / _PLOTS[1]
    _plot(report["summary"], "usage", "usage over the validation epoch (mean over seeds)", paths["usage_vs_k"])
    _plot(report["summary"], "val_mse", "validation MSE (mean over seeds)", paths["mse_vs_bits"])
    if figures_dir is not None:
        target = Path(figures_dir)
        target.mkdir(parents=True, exist_ok=True)
        for name in _PLOTS:
            shutil.copyfile(out / name, target / name)
    return paths


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page: the table (means over seeds), the targets, the data cap, the settings."""
    s = report["settings"]
    lines = [
        "# Where codebooks collapse",
        "",
        f"{len(s['seeds'])} seeds ({', '.join(map(str, s['seeds']))}), {s['steps']} steps of batch {s['batch_size']}; "
        "usage and perplexity over the validation epoch, per-batch usage over its batches.",
        "",
        "| set-up | variant | K | d | usage | per-batch usage | perplexity / K | val MSE | MSE / FSQ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in report["summary"]:
        lines.append(
            f"| {e.get('setup')} | {e['variant']} | {e['codebook_size']} | {e['code_dim']} "
            f"| {e['usage']:.3f} ± {e['usage_std']:.3f} "
            f"| {e['batch_usage']:.4f} | {e['perplexity_over_k']:.3f} | {e['val_mse']:.4f} ± {e['val_mse_std']:.4f} "
            f"| {_fmt(e['mse_over_fsq'], '.2f')} |"
        )
    diag = [
        ("usage_start", ".3f"),
        ("z_norm_start", ".2f"),
        ("z_norm_end", ".2f"),
        ("q_norm_used_end", ".2f"),
        ("q_norm_all_end", ".2f"),
        ("quant_error_start", ".2f"),
        ("quant_error_end", ".2f"),
        ("cosine_start", ".2f"),
        ("cosine_end", ".2f"),
    ]
    lines += ["", "## Collapse diagnostics (validation epoch, start and end)", ""]
    lines += ["| set-up | variant | K | d | " + " | ".join(k for k, _ in diag) + " |"]
    lines += ["|" + "---|" * (4 + len(diag))]
    for e in report["summary"]:
        cells = " | ".join(_fmt(e.get(k), spec) for k, spec in diag)
        lines.append(f"| {e.get('setup')} | {e['variant']} | {e['codebook_size']} | {e['code_dim']} | {cells} |")
    if report.get("digits"):
        dg = report["digits"]
        lines += ["", f"## Digits VQ-VAE (reference set-up, {dg['steps']} steps)", ""]
        lines += [
            "| variant | K | d | usage | perplexity / K | test MSE | MSE / FSQ |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in dg["summary"]:
            lines.append(
                f"| {e['variant']} | {e['codebook_size']} | {e['code_dim']} | {e['usage']:.3f} "
                f"| {e['perplexity_over_k']:.3f} | {e['val_mse']:.4f} | {_fmt(e['mse_over_fsq'], '.2f')} |"
            )
    lines += ["", "## Targets", ""]
    for t in report["targets"]:
        lines.append(f"- {'MET' if t['passed'] else 'MISSED'} {t['name']}: {t['detail']}")
    lines += ["", "## Data", "", "```", json.dumps(report["data"], indent=1), "```"]
    lines += ["", "## Settings", "", "```", json.dumps(s, indent=1), "```", ""]
    lines += [f"![{name}]({name})" for name in _PLOTS] + [""]
    return "\n".join(lines)


def _plot(summary: list[dict[str, Any]], key: str, ylabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((e.get("setup"), e["code_dim"]) for e in summary))
    variants = list(dict.fromkeys(e["variant"] for e in summary))
    bits = [e["bits"] for e in summary]
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, 20))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, (setup, d) in zip(axes[0], panels, strict=True):
        for i, v in enumerate(variants):
            pts = sorted(
                (e["bits"], e[key])
                for e in summary
                if e["variant"] == v and (e.get("setup"), e["code_dim"]) == (setup, d)
            )
            if not pts:
                continue
            style = "--" if v in ("fsq", "no_gradient") else "-"
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, style, marker="o", ms=4, color=colours[(2 * i) % 20 + (2 * i) // 20], label=v)
        ax.set_xlim(min(bits) - 0.5, max(bits) + 0.5)
        ax.set_xlabel("bits per token (log2 K)")
        ax.set_title(f"set-up {setup}, code dimension {d}" if setup else f"code dimension {d}", fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        if key == "usage":
            ax.set_ylim(0, 1.03)
        else:
            ax.set_yscale("log")
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
