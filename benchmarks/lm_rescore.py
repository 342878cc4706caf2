"""Score the checkpoints of a `stejax lm compare` folder again: test bits per byte per configuration.

    .venv/bin/python benchmarks/lm_rescore.py bench-out/lm-longer [--tier quick]

For a comparison that stopped before writing report.json: every
``seed*/<config>/params.safetensors`` is loaded into the tier's architecture,
quantised as its folder name says (``<config>_scratch`` as ``<config>``) and scored
on the tier's test bytes (the first ``eval_bytes`` of the test split), as the
comparison scores them. Prints one line per run and the delta against float.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flax import nnx

from stejax.lm import CONFIGS, FULL, QUICK, Transformer, bits_per_byte, build_corpus, load_checkpoint, quantize_lm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tier", choices=("quick", "full"), default="quick")
    options = parser.parse_args(argv)
    settings = QUICK if options.tier == "quick" else FULL
    test = build_corpus().data["test"]
    text = test if settings.eval_bytes is None else test[: settings.eval_bytes]
    scores: dict[str, float] = {}
    for checkpoint in sorted(options.folder.glob("seed*/*/params.safetensors")):
        run = checkpoint.parent.name
        config = run.removesuffix("_scratch")
        if config not in CONFIGS:  # float_base: the pre-training checkpoint, scored as float
            config = "float"
        model = load_checkpoint(Transformer(settings.model, rngs=nnx.Rngs(0)), checkpoint)
        scores[f"{checkpoint.parent.parent.name}/{run}"] = bits_per_byte(quantize_lm(model, config), text)
    for name, bpb in scores.items():
        base = scores.get(f"{name.split('/')[0]}/float")
        delta = f"{100 * (bpb - base) / base:+.2f}%" if base else ""
        print(f"{name:32s} {bpb:.4f} bpb {delta}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
