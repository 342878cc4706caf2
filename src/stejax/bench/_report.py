"""The benchmark report: ``bench.json`` (the schema below), ``bench.md`` and ``bench.png``.

``bench.json`` (format ``stejax-bench/1``)::

    {
      "format": "stejax-bench/1",
      "created": ISO 8601 time (UTC),
      "settings": {"suites": [...], "repeats": int, "warmup": int, "quick": bool, "estimator_size": int,
                   "rounds": int},
      "protocol": a paragraph: warm-up, compile exclusion, synchronisation, interleaving, statistics,
      "machine": {"cpu", "cores", "cores_usable", "device", "device_count", "backend", "os", "python",
                  "memory_gib", "load_average_1m", "xla_flags"},
      "versions": {distribution: version or null},
      "wall_seconds": float,
      "suites": {
        suite: {
          "status": "ok" | "skipped" | "error",
          "note": str ("" when ok),
          "seconds": float,
          "config": {...},
          "notes": [str, ...],
          "groups": [
            {"name": str, "baseline": str or null,
             "variants": {variant: {"stats_ms": {"n", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"},
                                    "compiles_warmup": int, "compiles_timed": int, "compile_seconds": float}},
             "ratios": {"a/b": {"n", "p10", "p50", "p90", "rounds": [one ratio per round, ...]}},
             "info": {...}},
            ...
          ],
          ... suite-specific keys ("targets", "skipped" for estimators)
        }
      }
    }
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stejax.bench._measure import STAT_KEYS

__all__ = ["FORMAT", "check_report", "markdown", "plot", "write_report"]

FORMAT = "stejax-bench/1"
STATUSES = ("ok", "skipped", "error")


def check_report(report: Mapping[str, Any]) -> None:
    """Raise ValueError, naming the place, where ``report`` does not follow the ``bench.json`` schema."""

    def need(cond: bool, where: str, what: str) -> None:
        if not cond:
            raise ValueError(f"bench report: {where}: {what}.")

    need(report.get("format") == FORMAT, "format", f"expected {FORMAT!r}, got {report.get('format')!r}")
    for key in ("created", "settings", "protocol", "machine", "versions", "wall_seconds", "suites"):
        need(key in report, key, "missing")
    for key in ("cpu", "cores", "device", "backend", "python"):
        need(key in report["machine"], f"machine.{key}", "missing")
    for key in ("jax", "jaxlib", "numpy", "stejax"):
        need(key in report["versions"], f"versions.{key}", "missing")
    for name, suite in report["suites"].items():
        where = f"suites.{name}"
        need(suite.get("status") in STATUSES, f"{where}.status", f"must be one of {list(STATUSES)}")
        need(isinstance(suite.get("note"), str), f"{where}.note", "must be a string")
        need(suite["status"] == "ok" or bool(suite["note"]), f"{where}.note", "a skipped or failed suite says why")
        need(isinstance(suite.get("seconds"), float), f"{where}.seconds", "must be a float")
        need(isinstance(suite.get("groups"), list), f"{where}.groups", "must be a list")
        for i, group in enumerate(suite["groups"]):
            gw = f"{where}.groups[{i}]"
            for key in ("name", "baseline", "variants", "ratios", "info"):
                need(key in group, f"{gw}.{key}", "missing")
            need(bool(group["variants"]), f"{gw}.variants", "must not be empty")
            for variant, m in group["variants"].items():
                vw = f"{gw}.variants[{variant!r}]"
                need(set(m.get("stats_ms", {})) == set(STAT_KEYS), f"{vw}.stats_ms", f"needs exactly {STAT_KEYS}")
                s = m["stats_ms"]
                need(s["min_ms"] <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"], vw, "unordered stats")
                for key in ("compiles_warmup", "compiles_timed"):
                    need(isinstance(m.get(key), int) and m[key] >= 0, f"{vw}.{key}", "must be an int >= 0")
            for ratio, r in group["ratios"].items():
                a, _, b = ratio.partition("/")
                need(a in group["variants"] and b in group["variants"], f"{gw}.ratios[{ratio!r}]", "names no variant")
                need({"n", "p10", "p50", "p90"} <= set(r), f"{gw}.ratios[{ratio!r}]", "needs n, p10, p50, p90")


def write_report(report: Mapping[str, Any], out_dir: str | os.PathLike, *, plots: bool = True) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.md`` and (with ``plots``) ``bench.png`` into ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "md": out / "bench.md"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown(report), encoding="utf-8")
    if plots:
        figure = plot(report, out / "bench.png")
        if figure is not None:
            paths["png"] = figure
    return paths


# ----------------------------------------------------------------------------- Markdown


def _ms(x: float) -> str:
    return f"{x:.4f}" if x < 1 else f"{x:.3f}" if x < 100 else f"{x:.1f}"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: the conditions, the protocol, then one section per suite."""
    m, v, s = report["machine"], report["versions"], report["settings"]
    versions = ", ".join(f"{k} {val}" for k, val in v.items() if val is not None)
    absent = ", ".join(k for k, val in v.items() if val is None)
    lines = [
        "# stejax bench",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m.get('cores_usable')} usable by the process), "
        f"JAX device {m['device']}, {m.get('memory_gib')} GiB; load average (1 min) at the start "
        f"{m.get('load_average_1m')}. {m['os']}, Python {m['python']}.",
        "",
        f"Versions: {versions}" + (f"; not installed: {absent}." if absent else "."),
        "",
        f"Settings: suites {', '.join(s['suites'])}; {s.get('rounds', 1)} round(s) of {s['repeats']} timed "
        f"passes, {s['warmup']} warm-up call(s) per variant{'; quick sizes' if s['quick'] else ''}. "
        f"Wall time {report['wall_seconds']:.1f} s.",
        "",
        f"Protocol: {report['protocol']}",
        "",
    ]
    for name, suite in report["suites"].items():
        lines += [f"## {name}", ""]
        if suite["status"] != "ok":
            lines += [f"**{suite['status']}**: {suite['note']}", ""]
            lines += [f"- {n}" for n in suite.get("notes", [])]
            lines += [""] if suite.get("notes") else []
            continue
        lines += [f"{suite['seconds']:.1f} s.", ""]
        if name == "estimators":
            lines += _estimator_lines(suite)
        else:
            for group in suite["groups"]:
                lines += _group_lines(group)
        lines += [f"- {n}" for n in suite.get("notes", [])]
        lines += [""] if suite.get("notes") else []
    return "\n".join(lines).rstrip() + "\n"


def _group_lines(group: Mapping[str, Any]) -> list[str]:
    lines = [f"### {group['name']}", ""]
    info = group.get("info", {})
    facts = [
        f"{k}: {val}" for k, val in info.items() if isinstance(val, (str, int, float)) and not isinstance(val, bool)
    ]
    if facts:
        lines += ["; ".join(facts) + ".", ""]
    lines += [
        "| variant | p50 ms | min | p90 | p99 | max | compiles (warm-up / timed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, m in group["variants"].items():
        st = m["stats_ms"]
        lines.append(
            f"| {variant} | **{_ms(st['p50_ms'])}** | {_ms(st['min_ms'])} | {_ms(st['p90_ms'])} | "
            f"{_ms(st['p99_ms'])} | {_ms(st['max_ms'])} | {m['compiles_warmup']} / {m['compiles_timed']} |"
        )
    if group["ratios"]:
        lines += ["", "| ratio (per pass) | p50 | p10 | p90 |", "|---|---|---|---|"]
        for ratio, r in group["ratios"].items():
            lines.append(f"| {ratio} | **{r['p50']:.3f}** | {r['p10']:.3f} | {r['p90']:.3f} |")
    lines.append("")
    return lines


def _estimator_lines(suite: Mapping[str, Any]) -> list[str]:
    cfg, targets = suite["config"], suite["targets"]
    lines = [
        f"Forward + gradient, float32, {cfg['size']:,} values per call, {cfg.get('rounds', 1)} interleaved "
        f"round(s) of {cfg['repeats']} calls per variant. "
        "ms as p50 [min, p99]; ratios are medians of the ratios of calls timed in the same pass. "
        "Targets: ours/stop_gradient <= "
        f"{targets['ours/stop_gradient']}, ours/fused <= {targets['ours/fused']}.",
        "",
        "| estimator | stop_gradient form | ours | stop_gradient | fused | ours/sg | ours/fused | targets met "
        "| max abs grad diff | compiles (warm-up / timed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in suite["groups"]:
        cells = []
        for variant in ("ours", "stop_gradient", "fused"):
            if variant in g["variants"]:
                st = g["variants"][variant]["stats_ms"]
                cells.append(f"{_ms(st['p50_ms'])} [{_ms(st['min_ms'])}, {_ms(st['p99_ms'])}]")
            else:
                cells.append("n/a")
        vs_sg = g["ratios"]["ours/stop_gradient"]["p50"]
        vs_fused = g["ratios"].get("ours/fused", {}).get("p50")
        info = g["info"]
        met = f"sg {_yes(info['meets_stop_gradient_target'])}, fused {_yes(info['meets_fused_target'])}"
        if info.get("status") == "failed":
            met = "**FAILED**: gradients differ"
        diff = max(info["max_grad_diff"].values()) if info["max_grad_diff"] else 0.0
        compiles = "/".join(
            f"{sum(m[k] for m in g['variants'].values())}" for k in ("compiles_warmup", "compiles_timed")
        )
        lines.append(
            f"| `{g['name']}` | `{info['form']}` | {' | '.join(cells)} | {vs_sg:.3f} | "
            f"{'n/a' if vs_fused is None else f'{vs_fused:.3f}'} | {met} | {diff:.1e} | {compiles} |"
        )
    for s in suite.get("skipped", []):
        lines.append(f"\nSkipped `{s['name']}`: {s['reason']}.")
    lines.append("")
    return lines


def _yes(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "**no**")


# ----------------------------------------------------------------------------- the plot


def plot(report: Mapping[str, Any], path: str | os.PathLike) -> Path | None:
    """One figure: estimator ratios, then each other group's p50 with min-to-p90 whiskers. None if nothing ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Any]] = []
    for name, suite in report["suites"].items():
        if suite["status"] != "ok" or not suite["groups"]:
            continue
        if name == "estimators":
            panels.append(("estimators", suite))
        else:
            panels += [(name, g) for g in suite["groups"]]
    if not panels:
        return None
    heights = [
        max(2.0, 0.28 * (len(p[1]["groups"]) if p[0] == "estimators" else len(p[1]["variants"])) + 1.2) for p in panels
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights})
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (name, item) in zip(axes, panels, strict=True):
        if name == "estimators":
            _plot_estimators(ax, item)
        else:
            _plot_group(ax, name, item)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_estimators(ax, suite) -> None:
    groups = suite["groups"]
    names = [g["name"] for g in groups]
    ys = range(len(names))
    sg = [g["ratios"]["ours/stop_gradient"]["p50"] for g in groups]
    fused = [g["ratios"].get("ours/fused", {}).get("p50", float("nan")) for g in groups]
    ax.barh([y - 0.2 for y in ys], sg, height=0.4, label="ours / stop_gradient")
    ax.barh([y + 0.2 for y in ys], fused, height=0.4, label="ours / fused")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for value, style in ((suite["targets"]["ours/stop_gradient"], ":"), (suite["targets"]["ours/fused"], "--")):
        ax.axvline(value, color="grey", linestyle=style, linewidth=0.8)
    ax.set_yticks(list(ys), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio, median of interleaved rounds (lower is faster for ours)")
    ax.set_title("estimators: forward + gradient", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)


def _plot_group(ax, suite: str, group) -> None:
    names = list(group["variants"])
    stats = [group["variants"][v]["stats_ms"] for v in names]
    p50 = [s["p50_ms"] for s in stats]
    lower = [s["p50_ms"] - s["min_ms"] for s in stats]
    upper = [s["p90_ms"] - s["p50_ms"] for s in stats]
    ax.barh(range(len(names)), p50, xerr=[lower, upper], capsize=3, color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per call: p50, whiskers min to p90")
    ax.set_title(f"{suite}: {group['name']}", fontsize=9)
