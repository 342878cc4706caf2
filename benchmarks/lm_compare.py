"""The full tier of `stejax lm compare` and its results file, ``RESULTS/lm_compare.json``.

    python benchmarks/lm_compare.py --out bench-out/lm-full --workers 2 --qwix --results docs/results

runs exactly what ``stejax lm compare --out bench-out/lm-full --workers 2 --qwix`` runs
(:data:`stejax.lm.FULL`: 3 seeds; float 600 + 200 steps and every configuration fine-tuned
from the float checkpoint; ``float``, ``w1.58a8``, ``w4a8`` and ``w4a8_no_ste`` also from
scratch for all 800 steps on the recipe of ``benchmarks/lm_recipe.py``), then writes the
results file: one row per configuration (``table=summary``: test bits per byte, the
baseline it is read against and the gap, the gap against float from the checkpoint, PTQ),
one row per seed of each from-scratch run against ``float_scratch`` (``table=paired``),
the references (``table=reference``) and the targets as figures. ``--from-report`` writes
the results file again from ``OUT/report.json`` (its date and load are the run's).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = "python benchmarks/lm_compare.py --out bench-out/lm-full --workers 2 --qwix --results docs/results"
MINUTES_TARGET = 60.0


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    ptq = report.get("ptq", {})
    for name, row in report["summary"].items():
        scratch = name.endswith("_scratch")
        base = name.removesuffix("_scratch")
        rows.append(
            {
                "table": "summary",
                "config": name,
                "start": "from scratch" if scratch else ("float checkpoint" if base in _configs() else "peer"),
                "test_bpb": row["test_bpb_mean"],
                "test_bpb_std": row["test_bpb_std"],
                "bpb": f"{row['test_bpb_mean']:.4f} ± {row['test_bpb_std']:.4f}",
                "seeds": len(report["per_seed"][name]),
                "baseline": row["baseline"],
                "delta_pct": row["delta_pct"],
                "delta_vs_float_pct": row["delta_vs_float_pct"],
                "ptq_bpb": ptq[name]["test_bpb_mean"] if (not scratch and name in ptq) else None,
            }
        )
    for name, pair in report.get("paired", {}).items():
        for r in pair["per_seed"]:
            rows.append(
                {
                    "table": "paired",
                    "config": name,
                    "seed": r["seed"],
                    "test_bpb": r["test_bpb"],
                    "float_scratch_test_bpb": r["float_scratch_test_bpb"],
                    "delta_pct": r["delta_pct"],
                }
            )
    for name, value in report["references"].items():
        rows.append({"table": "reference", "config": name, "test_bpb": value["bpb"]})
    return rows


def _configs() -> tuple[str, ...]:
    from stejax.lm import CONFIGS

    return tuple(CONFIGS)


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    from stejax.bench.results import Figure

    s, figures = report["summary"], {}
    judged = report["targets"]["judged"]

    def verdict(met: bool) -> bool | None:
        return met if judged else None

    for key, row in report["targets"]["rows"].items():
        if key.startswith("w1.58a8_scratch delta"):
            d = row["measured"]
            figures["ternary_scratch_gap"] = Figure(
                round(d, 4), f"{d:+.2f}%", target=f"≤ +{row['bound']:g}%", met=verdict(row["met"])
            )
            figures["ternary_scratch_gap_moonshot"] = Figure(
                round(d, 4), f"{d:+.2f}%", target=f"≤ +{row['moonshot']:g}%", met=verdict(row["moonshot_met"])
            )
        elif key.startswith("w4a8_no_ste"):
            figures["no_ste_scratch_margin"] = Figure(
                round(row["measured"], 4),
                f"{row['measured']:+.3f} bpb over {row['worst_ste']}",
                target=f"≥ +{row['bound']:g} bpb",
                met=verdict(row["met"]),
            )
            other = row.get("other_pairing")
            if other:
                figures["no_ste_checkpoint_margin"] = Figure(
                    round(other["measured"], 4), f"{other['measured']:+.3f} bpb over {other['worst_ste']}"
                )
        elif " delta <= " in key:
            name = key.split(" ")[0]
            figures[f"{name}_gap"] = Figure(
                round(row["measured"], 4),
                f"{row['measured']:+.2f}%",
                target=f"≤ +{row['bound']:g}%",
                met=verdict(row["met"]),
            )
        elif key.startswith("float < "):
            figures["float_vs_ngram3"] = Figure(
                round(row["measured"], 4),
                f"{row['measured']:.3f} bpb",
                target=f"< {row['bound']:.3f} bpb (ngram-3)",
                met=verdict(row["met"]),
            )
    pair = report.get("paired", {}).get("w1.58a8_scratch")
    if pair:
        seeds = ", ".join(f"{r['delta_pct']:+.2f}%" for r in pair["per_seed"])
        figures["ternary_scratch_paired"] = Figure(
            round(pair["delta_pct_mean"], 4),
            f"{pair['delta_pct_mean']:+.2f}% ± {pair['delta_pct_std']:.2f} (per seed {seeds})",
        )
    for name in ("float", "float_scratch", "w1.58a8_scratch"):
        if name in s:
            figures[f"{name.replace('.', '')}_bpb"] = Figure(
                round(s[name]["test_bpb_mean"], 4), f"{s[name]['test_bpb_mean']:.3f} ± {s[name]['test_bpb_std']:.3f}"
            )
    minutes = report["seconds"] / 60
    figures["minutes"] = Figure(
        round(minutes, 2), f"{minutes:.1f} min", target=f"≤ {MINUTES_TARGET:g} min", met=minutes <= MINUTES_TARGET
    )
    return figures


COLUMNS = [
    ("config", "configuration"),
    ("start", "start"),
    ("bpb", "test bpb (mean ± std)"),
    ("seeds", "seeds"),
    ("baseline", "read against"),
    ("delta_pct", "Δ vs baseline", "{:+.2f}%"),
    ("delta_vs_float_pct", "Δ vs float", "{:+.2f}%"),
    ("ptq_bpb", "PTQ bpb", "{:.4f}"),
    ("seed", "seed"),
    ("test_bpb", "test bpb", "{:.4f}"),
    ("float_scratch_test_bpb", "float_scratch bpb", "{:.4f}"),
]


def write_results(report: dict[str, Any], results: Path, *, recorder: Any = None) -> Path:
    from stejax.bench.results import Recorder

    if recorder is None:  # a transcription: the run's own date and load
        recorder = Recorder("lm_compare", command=COMMAND)
        env = report["environment"]
        extra = {
            "date": report.get("started"),
            "load": {
                "start": round(env["load_average_at_start"][0], 2),
                "end": round(env["load_average_at_end"][0], 2),
            },
        }
    else:
        extra = {}
    path = results / "lm_compare.json"
    recorder.write(
        path,
        rows=_rows(report),
        columns=COLUMNS,
        figures=_figures(report),
        notes="Test bits per byte on the first 128 KiB of the test split. A *_scratch row is read against "
        "float_scratch (float trained from scratch on the same steps, initialisation and batches); every other "
        "row against float (pre-trained, then continued on the fine-tuning schedule).",
        **{k: v for k, v in extra.items() if v is not None},
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="The comparison's folder.")
    parser.add_argument("--workers", type=int, default=2, help="Processes for the seeds.")
    parser.add_argument("--qwix", action="store_true", help="Also fine-tune Qwix's int8 QAT and int4 weight-only.")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="Where lm_compare.json goes.")
    parser.add_argument("--from-report", action="store_true", help="Write the results from OUT/report.json.")
    options = parser.parse_args(argv)
    if options.from_report:
        report = json.loads((options.out / "report.json").read_text())
        print(f"wrote {write_results(report, options.results)}", file=sys.stderr)
        return 0
    from stejax.bench.results import Recorder
    from stejax.lm import FULL, compare_lm

    recorder = Recorder("lm_compare", command=COMMAND)
    extra = {}
    if options.qwix:
        from stejax.bench._peers_lm import QWIX_LM_KINDS, qwix_lm

        extra = {kind: functools.partial(qwix_lm, kind=kind) for kind in QWIX_LM_KINDS}
    tic = time.perf_counter()
    report = compare_lm(
        FULL,
        out_dir=options.out,
        workers=options.workers,
        extra=extra,
        on_event=lambda e: print(json.dumps(dict(e)), f"{time.perf_counter() - tic:.0f}s", flush=True),
    )
    print(f"wrote {write_results(report, options.results, recorder=recorder)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
