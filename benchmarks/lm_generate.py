"""Generation speed of the LM: the key-value cache against recomputing the prefix, quantised against float.

    .venv/bin/python benchmarks/lm_generate.py [--config w1.58a8] [--tokens 48] [--repeats 5]

One process, one model (the quick tier's architecture, random weights: speed does not
depend on training), interleaved rounds after a warm-up. Forms: the float model; the
exported artifact of the quantised configuration as ``stejax lm sample`` loads it
(codes dequantised once at load, input quantisers kept); the fake-quantised training
model (weights re-quantised at every call); the float model without the cache; prints the median tokens per
second of each form and the median of the per-round ratios. The machine's load average
is printed beside them: on a shared machine the ratios are what to quote.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from stejax.lm import QUICK, Transformer, generate, quantize_lm
from stejax.lm._export import export_lm, load_lm_artifact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="w1.58a8")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    model = Transformer(QUICK.model, rngs=nnx.Rngs(params=0))
    quantised = quantize_lm(model, options.config)
    with tempfile.TemporaryDirectory() as tmp:
        artifact = load_lm_artifact(export_lm(quantised, options.config, Path(tmp) / "art")).model
    forms = {
        "float, cached": (model, True),
        f"{options.config} artifact, cached": (artifact, True),
        f"{options.config} fake-quantised, cached": (quantised, True),
        "float, uncached": (model, False),
    }
    key = jax.random.key(0)
    rates: dict[str, list[float]] = {name: [] for name in forms}
    with jax.debug_key_reuse(False):
        for m, cached in forms.values():  # warm-up: compile every shape once
            generate(m, b"def ", tokens=options.tokens, key=key, temperature=0.0, cached=cached)
        for _ in range(options.repeats):
            for name, (m, cached) in forms.items():
                out = generate(m, b"def ", tokens=options.tokens, key=key, temperature=0.0, cached=cached)
                rates[name].append(out.tokens_per_second)
    print(f"load average {os.getloadavg()}; {options.tokens} tokens, {options.repeats} interleaved rounds")
    for name, values in rates.items():
        print(f"{name:>24}: {np.median(values):8.1f} tokens/s (median)")
    base = np.array(rates["float, cached"])
    for name, values in rates.items():
        if name != "float, cached":
            print(f"{name:>24}: {np.median(np.array(values) / base):.3f} x float cached (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
