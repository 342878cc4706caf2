"""The from-scratch recipe of `stejax lm compare`'s full tier, part by part, on the validation split only.

    python benchmarks/lm_recipe.py --workers 15 --results docs/results

Each variant changes the from-scratch schedule of one configuration (``float`` or
``w1.58a8``) as ``CompareSettings.scratch_recipes`` would, starting from the full tier's
schedule before any recipe (peak 1e-2, warm-up 10%, weight decay 0.1, a cosine to 0.1 of
the peak), and trains it from scratch exactly as the comparison does
(:func:`stejax.lm.train_from_scratch`: the same initial weights, batches and budget) for
each seed. The seeds (10, 11 and 12 by default) are not the
comparison's (0, 1, 2), so the recipe is not chosen on the runs it is reported on. Every
run is scored on the first ``--val-bytes`` of the **validation** split; the test split is
never read. The parts are BitNet b1.58's published recipe (the b1.58 2B4T technical report;
"The Era of 1-bit LLMs: Training Tips, Code and FAQ"): a higher peak learning rate than
float's, the two-stage schedule (the rate drops at the midpoint), no weight decay from the
midpoint on, the weight decay on the latent weights, and the warm-up.

Writes ``RESULTS/lm_recipe.json`` (one row per variant: the mean validation bits per byte
over the seeds, each seed's value, the change against the same configuration's base
recipe, and the gap to float's base recipe) and the figures of the kept recipe, which
:data:`stejax.lm.FULL` uses (checked). ``--log FILE`` keeps one JSON line per run and
``--resume`` skips the runs already in it; ``--conditions FILE`` takes the date, machine and
load from the results file written where the logged runs ran (the file is then written
from the log alone).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

# name -> (configuration, from-scratch recipe changes)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "float base": ("float", {}),
    "float two-stage": ("float", {"two_stage": True}),
    "float two-stage, wd 0 from the midpoint": ("float", {"two_stage": True, "stage_two_weight_decay": 0.0}),
    "float peak 1.5e-2": ("float", {"learning_rate": 1.5e-2}),
    "w1.58a8 base": ("w1.58a8", {}),
    "w1.58a8 peak 1.5e-2": ("w1.58a8", {"learning_rate": 1.5e-2}),
    "w1.58a8 peak 2e-2": ("w1.58a8", {"learning_rate": 2e-2}),
    "w1.58a8 peak 3e-2": ("w1.58a8", {"learning_rate": 3e-2}),
    "w1.58a8 two-stage": ("w1.58a8", {"two_stage": True}),
    "w1.58a8 wd 0 from the midpoint": ("w1.58a8", {"stage_two_weight_decay": 0.0}),
    "w1.58a8 two-stage, wd 0 from the midpoint": ("w1.58a8", {"two_stage": True, "stage_two_weight_decay": 0.0}),
    "w1.58a8 wd 0": ("w1.58a8", {"weight_decay": 0.0}),
    "w1.58a8 wd 0.05": ("w1.58a8", {"weight_decay": 0.05}),
    "w1.58a8 wd 0.2": ("w1.58a8", {"weight_decay": 0.2}),
    "w1.58a8 no warm-up": ("w1.58a8", {"warmup_fraction": 0.0}),
    "w1.58a8 warm-up 20%": ("w1.58a8", {"warmup_fraction": 0.2}),
    "w1.58a8 BitNet (peak 1.5e-2, two-stage, wd 0 from the midpoint)": (
        "w1.58a8",
        {"learning_rate": 1.5e-2, "two_stage": True, "stage_two_weight_decay": 0.0},
    ),
    "w1.58a8 BitNet (peak 2e-2, two-stage, wd 0 from the midpoint)": (
        "w1.58a8",
        {"learning_rate": 2e-2, "two_stage": True, "stage_two_weight_decay": 0.0},
    ),
    "w1.58a8 peak 1.5e-2, two-stage": ("w1.58a8", {"learning_rate": 1.5e-2, "two_stage": True}),
    "w1.58a8 peak 1.5e-2, wd 0 from the midpoint": (
        "w1.58a8",
        {"learning_rate": 1.5e-2, "stage_two_weight_decay": 0.0},
    ),
    "w1.58a8 BitNet (peak 1.5e-2, two-stage, wd 0 from the midpoint), final lr 0": (
        "w1.58a8",
        {"learning_rate": 1.5e-2, "two_stage": True, "stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0},
    ),
    "w1.58a8 BitNet (peak 1.5e-2, two-stage, wd 0 from the midpoint), wd 0.2": (
        "w1.58a8",
        {"learning_rate": 1.5e-2, "two_stage": True, "stage_two_weight_decay": 0.0, "weight_decay": 0.2},
    ),
    "float two-stage, wd 0 from the midpoint, final lr 0": (
        "float",
        {"two_stage": True, "stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0},
    ),
    # The parts that helped w1.58a8 alone, together, and the same parts for float.
    "w1.58a8 warm-up 30%": ("w1.58a8", {"warmup_fraction": 0.3}),
    "w1.58a8 warm-up 20%, wd 0 from the midpoint": (
        "w1.58a8",
        {"warmup_fraction": 0.2, "stage_two_weight_decay": 0.0},
    ),
    "w1.58a8 warm-up 20%, wd 0.05": ("w1.58a8", {"warmup_fraction": 0.2, "weight_decay": 0.05}),
    "w1.58a8 warm-up 20%, wd 0.05, wd 0 from the midpoint": (
        "w1.58a8",
        {"warmup_fraction": 0.2, "weight_decay": 0.05, "stage_two_weight_decay": 0.0},
    ),
    "w1.58a8 wd 0.05, wd 0 from the midpoint": ("w1.58a8", {"weight_decay": 0.05, "stage_two_weight_decay": 0.0}),
    "w1.58a8 warm-up 20%, peak 1.5e-2": ("w1.58a8", {"warmup_fraction": 0.2, "learning_rate": 1.5e-2}),
    "w1.58a8 warm-up 20%, two-stage, wd 0 from the midpoint": (
        "w1.58a8",
        {"warmup_fraction": 0.2, "two_stage": True, "stage_two_weight_decay": 0.0},
    ),
    "float warm-up 20%": ("float", {"warmup_fraction": 0.2}),
    "float wd 0.05": ("float", {"weight_decay": 0.05}),
    "float wd 0 from the midpoint": ("float", {"stage_two_weight_decay": 0.0}),
    "float warm-up 20%, wd 0 from the midpoint": ("float", {"warmup_fraction": 0.2, "stage_two_weight_decay": 0.0}),
    "float warm-up 30%": ("float", {"warmup_fraction": 0.3}),
    "w1.58a8 warm-up 30%, wd 0 from the midpoint": (
        "w1.58a8",
        {"warmup_fraction": 0.3, "stage_two_weight_decay": 0.0},
    ),
    "float warm-up 20%, final lr 0": ("float", {"warmup_fraction": 0.2, "min_lr_ratio": 0.0}),
    "w1.58a8 warm-up 20%, wd 0 from the midpoint, final lr 0": (
        "w1.58a8",
        {"warmup_fraction": 0.2, "stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0},
    ),
    "w1.58a8 final lr 0": ("w1.58a8", {"min_lr_ratio": 0.0}),
    "w1.58a8 warm-up 20%, final lr 0": ("w1.58a8", {"warmup_fraction": 0.2, "min_lr_ratio": 0.0}),
    "w1.58a8 warm-up 30%, wd 0 from the midpoint, final lr 0": (
        "w1.58a8",
        {"warmup_fraction": 0.3, "stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0},
    ),
}


# The variants whose changes the full tier keeps (float's applies to every from-scratch run).
KEPT = {"float": "float warm-up 30%", "w1.58a8": "w1.58a8 warm-up 30%, wd 0 from the midpoint, final lr 0"}


def _check_kept() -> None:
    from stejax.lm import FULL

    shared = dict(FULL.scratch_recipe)
    for config, variant in KEPT.items():
        if {**shared, **FULL.scratch_recipes.get(config, {})} != VARIANTS[variant][1]:
            raise SystemExit(f"lm_recipe: FULL's from-scratch recipe of {config} is not the variant {variant!r}.")


def _run(variant: str, seed: int, val_bytes: int, corpus: str | None) -> dict[str, Any]:
    from stejax.lm import FULL, bits_per_byte, build_corpus, train_from_scratch

    config, recipe = VARIANTS[variant]
    settings = FULL.replace(scratch_recipe={}, scratch_recipes={config: recipe})
    data = build_corpus(corpus).data
    run = train_from_scratch(settings, config, seed, data["train"], data["validation"])
    return {
        "variant": variant,
        "config": config,
        "recipe": recipe,
        "seed": seed,
        "val_bpb": bits_per_byte(run.model, data["validation"][:val_bytes]),
        "step_ms_median": run.step_ms_median,
    }


def _rows(runs: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    by_variant: dict[str, dict[int, float]] = {}
    for r in runs:
        by_variant.setdefault(r["variant"], {})[r["seed"]] = r["val_bpb"]
    complete = {v: by for v, by in by_variant.items() if all(s in by for s in seeds)}
    means = {v: sum(by[s] for s in seeds) / len(seeds) for v, by in complete.items()}
    rows = []
    for variant in VARIANTS:
        if variant not in means:
            continue
        config, recipe = VARIANTS[variant]
        base = means.get(f"{config} base")
        float_base = means.get("float base")
        rows.append(
            {
                "variant": variant,
                "config": config,
                "recipe": json.dumps(recipe, sort_keys=True) if recipe else "the tier's",
                "val_bpb": means[variant],
                "per_seed": ", ".join(f"{complete[variant][s]:.4f}" for s in seeds),
                "vs_base_pct": None if base is None else 100 * (means[variant] - base) / base,
                "gap_vs_float_pct": None if float_base is None else 100 * (means[variant] - float_base) / float_base,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12], help="Seeds (not the comparison's).")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME")
    parser.add_argument("--val-bytes", type=int, default=131072, help="Bytes of the validation split scored.")
    parser.add_argument("--workers", type=int, default=1, help="Processes (about one core each).")
    parser.add_argument("--corpus", default=None, help="A corpus directory (default: the installed jax sources).")
    parser.add_argument("--results", type=Path, default=None, help="Write RESULTS/lm_recipe.json there.")
    parser.add_argument("--log", type=Path, default=None, help="One JSON line per run.")
    parser.add_argument("--resume", action="store_true", help="Skip the runs already in --log.")
    parser.add_argument("--conditions", type=Path, default=None, help="Date, machine, load from this results file.")
    options = parser.parse_args(argv)
    _check_kept()

    from stejax.bench.results import Recorder

    recorder = Recorder("lm_recipe", command="python benchmarks/lm_recipe.py --workers 15 --results docs/results")
    done: list[dict[str, Any]] = []
    if options.resume and options.log is not None and options.log.exists():
        done = [json.loads(line) for line in options.log.read_text().splitlines() if line.strip()]
    seen = {(r["variant"], r["seed"]) for r in done}
    jobs = [(v, s) for v in options.variants for s in options.seeds if (v, s) not in seen]
    log = options.log.open("a", encoding="utf-8") if options.log is not None else None
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=options.workers, mp_context=context) as pool:
        futures = [pool.submit(_run, v, s, options.val_bytes, options.corpus) for v, s in jobs]
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            done.append(record)
            print(json.dumps(record), flush=True)
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()
    if log is not None:
        log.close()
    runs = [r for r in done if r["variant"] in options.variants and r["seed"] in options.seeds]
    rows = _rows(runs, options.seeds)
    for row in rows:
        print(f"{row['variant']:66s} {row['val_bpb']:.4f}  vs base {row['vs_base_pct'] or 0:+.2f}%", flush=True)
    if options.results is not None:
        from stejax.bench.results import Figure

        figures = {}
        by = {r["variant"]: r for r in rows}
        pairs = {"base": ("float base", "w1.58a8 base"), "kept": (KEPT["float"], KEPT["w1.58a8"])}
        for label, (f, t) in pairs.items():
            if f in by and t in by:
                gap = 100 * (by[t]["val_bpb"] - by[f]["val_bpb"]) / by[f]["val_bpb"]
                figures[f"{label}_gap"] = Figure(round(gap, 4), f"{gap:+.2f}%")
        for config, variant in KEPT.items():
            if variant in by and by[variant]["vs_base_pct"] is not None:
                change = by[variant]["vs_base_pct"]
                figures[f"kept_{config.replace('.', '')}_vs_base"] = Figure(round(change, 4), f"{change:+.2f}%")
        conditions: dict[str, Any] = {}
        if options.conditions is not None:
            earlier = json.loads(options.conditions.read_text())
            conditions = {k: earlier[k] for k in ("date", "machine", "load")}
        recorder.write(
            options.results / "lm_recipe.json",
            rows=rows,
            columns=[
                ("variant", "variant"),
                ("recipe", "changes to the from-scratch schedule"),
                ("val_bpb", "validation bpb (mean)", "{:.4f}"),
                ("per_seed", "per seed"),
                ("vs_base_pct", "vs its base", "{:+.2f}%"),
                ("gap_vs_float_pct", "gap to float's base", "{:+.2f}%"),
            ],
            figures=figures,
            notes="Validation bits per byte (the first 128 KiB of the validation split), mean over the seeds; "
            "every run trained from scratch for the full tier's 800 steps. Run with --corpus set to the .py files "
            "of jax 0.10.2 (the pinned corpus, the same bytes) where the installed jax is another version.",
            **conditions,
        )
        print(f"wrote {options.results / 'lm_recipe.json'}", file=sys.stderr)
    print(f"load average {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
