"""Tune the fine-tuning recipe of one configuration on the validation split (never the test split).

    .venv/bin/python benchmarks/lm_tune.py [--config w1.58a8] [--seeds 0 1] [--variants base wd0 ...]

For each seed the float model is trained as :func:`stejax.lm.compare_lm` trains it (the same
keys, the full tier's settings unless a variant changes the split); the configuration then
fine-tunes from that checkpoint with the variant's recipe, and the float baseline continues for
the same steps, so both see the same total budget. Everything is scored on the first
``--val-bytes`` of the validation split. Prints one line per (variant, seed) and, per variant,
the mean validation bpb of the configuration and of float and their relative gap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

import jax
from flax import nnx

from stejax import keys
from stejax.lm import FULL, Transformer, bits_per_byte, build_corpus, quantize_lm
from stejax.lm._train import train_lm

# name -> (CompareSettings changes, fine-tuning TrainSettings changes for the configuration only)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "base": ({}, {}),
    "wd0": ({}, {"weight_decay": 0.0}),
    "lr2e-3": ({}, {"learning_rate": 2e-3}),
    "lr5e-3": ({}, {"learning_rate": 5e-3}),
    "warm0": ({}, {"warmup": 0}),
    "warm25": ({}, {"warmup": 50}),
    "minlr0": ({}, {"min_lr_ratio": 0.0}),
    "split500": ({"float_steps": 500, "finetune_steps": 300}, {}),
    "split400": ({"float_steps": 400, "finetune_steps": 400}, {}),
    "split400_wd0": ({"float_steps": 400, "finetune_steps": 400}, {"weight_decay": 0.0}),
    "wd0_minlr0": ({}, {"weight_decay": 0.0, "min_lr_ratio": 0.0}),
    "wd0_minlr0_lr5e-3": ({}, {"weight_decay": 0.0, "min_lr_ratio": 0.0, "learning_rate": 5e-3}),
    "wd0_minlr0_warm25": ({}, {"weight_decay": 0.0, "min_lr_ratio": 0.0, "warmup": 50}),
    "split500_wd0_minlr0": ({"float_steps": 500, "finetune_steps": 300}, {"weight_decay": 0.0, "min_lr_ratio": 0.0}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="w1.58a8")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--val-bytes", type=int, default=131072)
    options = parser.parse_args(argv)
    data = build_corpus().data
    val = data["validation"][: options.val_bytes]
    floats: dict[tuple[int, int], tuple[Any, float]] = {}
    results: dict[str, list[tuple[float, float]]] = {}
    print(f"load average {os.getloadavg()}", flush=True)
    for variant in options.variants:
        changes, tune_changes = VARIANTS[variant]
        settings = FULL.replace(**changes)
        main_s, finetune, _ = settings.schedules()
        if tune_changes.get("warmup"):
            tune_changes = {**tune_changes, "warmup": int(settings.finetune_steps * 0.25)}
        for seed in options.seeds:
            k_init, k_float, k_tune, _, _ = keys.split(jax.random.key(seed), 5, where="seed")
            init_seed = int(jax.random.randint(keys.consume(k_init, where="init"), (), 0, 2**31 - 1))
            index = settings.configs.index(options.config)
            tune_keys = keys.split(k_tune, len(settings.configs), where="tune keys")
            slot = (seed, settings.float_steps)
            if slot not in floats:
                fresh = Transformer(settings.model, rngs=nnx.Rngs(params=init_seed))
                base = train_lm(fresh, data["train"], data["validation"], main_s, key=k_float).model
                cont = train_lm(base, data["train"], data["validation"], finetune, key=tune_keys[0]).model
                floats[slot] = (base, bits_per_byte(cont, val))
            base, float_bpb = floats[slot]
            recipe = dataclasses.replace(settings.finetune_for(options.config, finetune), **tune_changes)
            run = train_lm(
                quantize_lm(base, options.config), data["train"], data["validation"], recipe, key=tune_keys[index]
            )
            bpb = bits_per_byte(run.model, val)
            results.setdefault(variant, []).append((bpb, float_bpb))
            print(
                json.dumps({"variant": variant, "seed": seed, "val_bpb": bpb, "float_val_bpb": float_bpb}), flush=True
            )
        runs = results[variant]
        q = sum(r[0] for r in runs) / len(runs)
        f = sum(r[1] for r in runs) / len(runs)
        print(f"== {variant}: {options.config} {q:.4f}  float {f:.4f}  gap {100 * (q - f) / f:+.2f}%", flush=True)
    print(f"load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
