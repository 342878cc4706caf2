"""The full tier of `stejax lm compare` and its results file, ``RESULTS/lm_compare.json``.

    python benchmarks/lm_compare.py --out bench-out/lm-full --workers 3 --results docs/results

runs exactly what ``stejax lm compare --out bench-out/lm-full --workers 3`` runs
(:data:`stejax.lm.FULL`: 3 seeds; float 600 + 200 steps and every configuration fine-tuned
from the float checkpoint; ``float``, ``w1.58a8``, ``w4a8`` and ``w4a8_no_ste`` also from
scratch for all 800 steps on the recipe of ``benchmarks/lm_recipe.py``), then writes the
results file: one row per configuration (``table=summary``: test bits per byte, the
baseline it is read against and the gap, the gap against float from the checkpoint, PTQ),
one row per seed of each from-scratch run against ``float_scratch`` (``table=paired``),
the references (``table=reference``) and the targets as figures. ``--from-report`` writes
the results file again from ``OUT/report.json`` (its date and load are the run's).
``--partial`` scores the runs of a comparison that stopped before its report (every
``OUT/seed*/<run>`` with its ``params.safetensors``, on the same test bytes) and writes the
results of those runs only, each configuration's mean over the seeds it finished, with
``partial`` in the notes.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

COMMAND = "python benchmarks/lm_compare.py --out bench-out/lm-full --workers 3 --results docs/results"
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
            figures["ternary_scratch_gap_stretch"] = Figure(
                round(d, 4), f"{d:+.2f}%", target=f"≤ +{row['stretch']:g}%", met=verdict(row["stretch_met"])
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
    if report.get("seconds") is not None:
        minutes = report["seconds"] / 60
        figures["minutes"] = Figure(
            round(minutes, 2), f"{minutes:.1f} min", target=f"≤ {MINUTES_TARGET:g} min", met=minutes <= MINUTES_TARGET
        )
    return figures


def partial_report(out: Path) -> dict[str, Any]:
    """The report of the finished runs of a comparison that stopped before writing its own."""
    from flax import nnx

    from stejax.lm import FULL, Transformer, bits_per_byte, build_corpus, load_checkpoint, quantize_lm, references
    from stejax.lm._compare import _paired, _summary, _targets

    data = build_corpus().data
    text = data["test"][: FULL.eval_bytes]
    names = [*FULL.configs, *(f"{c}_scratch" for c in FULL.scratch_names)]
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for seed in FULL.seeds:
        for name in names:
            run = out / f"seed{seed}" / name
            if not (run / "params.safetensors").is_file():
                continue
            config = json.loads((run / "config.json").read_text())["config"]
            model = load_checkpoint(Transformer(FULL.model, rngs=nnx.Rngs(0)), run / "params.safetensors")
            bpb = bits_per_byte(quantize_lm(model, config), text)
            per_seed.setdefault(name, []).append({"seed": seed, "test_bpb": bpb, "step_ms_median": float("nan")})
            print(f"seed {seed} {name}: {bpb:.4f}", flush=True)
    per_seed = {n: per_seed[n] for n in names if n in per_seed}
    refs = references(data["train"], data["validation"], text, context_bytes=FULL.reference_context_bytes)
    summary = _summary(per_seed)
    targets = _targets(summary, refs, FULL)
    targets["judged"] = False
    return {
        "tier": FULL.tier,
        "summary": summary,
        "paired": _paired(per_seed),
        "per_seed": per_seed,
        "references": refs,
        "targets": targets,
        "seconds": None,
        "partial": True,
    }


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

    partial = bool(report.get("partial"))
    if partial:
        recorder = Recorder("lm_compare", command=COMMAND + " (stopped; then --partial)")
        extra: dict[str, Any] = {}
    elif recorder is None:  # a transcription: the run's own date and load
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
        notes=("Partial: only the runs that finished; each mean is over the seeds of its row. " if partial else "")
        + "Test bits per byte on the first 128 KiB of the test split. A *_scratch row is read against "
        "float_scratch (float trained from scratch on the same steps, initialisation and batches); every other "
        "row against float (pre-trained, then continued on the fine-tuning schedule).",
        **{k: v for k, v in extra.items() if v is not None},
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="The comparison's folder.")
    parser.add_argument("--workers", type=int, default=3, help="Processes for the seeds (one per seed).")
    parser.add_argument("--qwix", action="store_true", help="Also fine-tune Qwix's int8 QAT and int4 weight-only.")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="Where lm_compare.json goes.")
    parser.add_argument("--from-report", action="store_true", help="Write the results from OUT/report.json.")
    parser.add_argument("--partial", action="store_true", help="Score the finished runs of a stopped comparison.")
    options = parser.parse_args(argv)
    if options.partial:
        print(f"wrote {write_results(partial_report(options.out), options.results)}", file=sys.stderr)
        return 0
    if options.from_report:
        report = json.loads((options.out / "report.json").read_text())
        print(f"wrote {write_results(report, options.results)}", file=sys.stderr)
        return 0
    from stejax.bench.results import Recorder
    from stejax.lm import FULL, compare_lm

    command = f"python benchmarks/lm_compare.py --out {options.out} --workers {options.workers}"
    command += " --qwix" * options.qwix + f" --results {options.results}"
    recorder = Recorder("lm_compare", command=command)
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
