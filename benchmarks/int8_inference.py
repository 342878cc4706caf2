"""int8 integer inference against float32 on one 1024-wide layer at batch 1024, side by side in one process.

Run from the repository root:

    .venv/bin/python benchmarks/int8_inference.py [--width 1024] [--batch 1024] [--repeats 60] [--results docs/results]

``--results DIR`` writes ``DIR/int8_inference.json`` (the results file docs/artifacts.md renders).

Pairs, each timed after warm-up in interleaved rounds (one call of every variant
per round, the order rotating), medians compared:

* ``raw``: ``lax.dot_general`` of int8 x int8 with ``preferred_element_type=int32``
  against the float32 product of the same shapes;
* ``export (signed input)``: the exported model's own integer layer, as
  :class:`stejax.export.ExportedModel` runs a first layer (standardise, quantise
  the input to int8 codes, int8 x int8 -> int32, rescale, add the bias) against
  the float32 layer (standardise, float32 product, bias);
* ``export (unsigned input)``: the same for a hidden layer after a ReLU, whose
  8-bit codes 0..255 enter as ``q - 128`` with the zero point's correction,
  against the float32 layer with its ReLU.

The speed-up is the float32 median over the int8 median. Every int8 result is
checked against an exact NumPy int64 product before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stejax.bench.results import Figure, Recorder
from stejax.export import ExportedModel, InputFormat, LayerSpec, WeightFormat, pack_codes

_DOT = (((1,), (0,)), ((), ()))


def _model(width: int, *, signed: bool, rng: np.random.Generator) -> ExportedModel:
    """A one-layer exported model: 8-bit LSQ weights and inputs, ``width`` in and out."""
    layer = LayerSpec(
        kind="dense",
        in_shape=(width,),
        w_shape=(width, width),
        stride=1,
        relu=not signed,
        weights=WeightFormat("lsq", 8),
        inputs=InputFormat("lsq", 8, signed=signed),
    )
    codes = rng.integers(-128, 128, (width, width))
    weights = {
        "normalizer": {"mean": jnp.zeros(width, jnp.float32), "std": jnp.ones(width, jnp.float32)},
        "layers": (
            {
                "w": jnp.asarray(pack_codes(codes, "int8")),
                "w_scale": jnp.float32(0.01),
                "b": jnp.asarray(rng.normal(size=width).astype(np.float32)),
                "a_step": jnp.float32(0.02),
            },
        ),
    }
    # ExportedModel's first layer never has a ReLU; the hidden-layer variant keeps it by its spec.
    return ExportedModel(layers=(layer,), weights=weights, input_shape=(width,), n_classes=width)


def _float_layer(relu: bool):
    def layer(norm, w, b, x):
        u = (x - norm["mean"][None, :]) / norm["std"][None, :]
        u = jax.nn.relu(u) if relu else u
        return lax.dot_general(u, w, _DOT) + b[None, :]

    return jax.jit(layer)


def _time(variants: dict[str, tuple], repeats: int, warmup: int) -> dict[str, list[float]]:
    names = list(variants)
    for name in names:
        fn, args = variants[name]
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            fn, args = variants[name]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return times


def _command(options: argparse.Namespace) -> str:
    return (
        f"python benchmarks/int8_inference.py --width {options.width} --batch {options.batch} "
        f"--repeats {options.repeats} --results docs/results"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50, help="interleaved timed rounds")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per variant first")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--results", default=None, metavar="DIR", help="write DIR/int8_inference.json")
    options = parser.parse_args(argv)
    recorder = Recorder("int8_inference", command=_command(options))
    n, k = options.batch, options.width
    rng = np.random.default_rng(0)

    a8 = jnp.asarray(rng.integers(-128, 128, (n, k)).astype(np.int8))
    w8 = jnp.asarray(rng.integers(-128, 128, (k, k)).astype(np.int8))
    a32 = jnp.asarray(rng.normal(size=(n, k)).astype(np.float32))
    w32 = jnp.asarray(rng.normal(size=(k, k)).astype(np.float32) * 0.03)
    int_dot = jax.jit(lambda a, w: lax.dot_general(a, w, _DOT, preferred_element_type=jnp.int32))
    float_dot = jax.jit(lambda a, w: lax.dot_general(a, w, _DOT))
    exact = np.asarray(a8, np.int64) @ np.asarray(w8, np.int64)
    if not np.array_equal(np.asarray(int_dot(a8, w8)), exact):
        print("int8 dot_general disagrees with the exact int64 product", file=sys.stderr)
        return 1

    pairs = {}
    pairs["raw"] = {
        "int8": (int_dot, (a8, w8)),
        "float32": (float_dot, (a32, w32)),
    }
    x = jnp.asarray((rng.normal(size=(n, k)) * 2).astype(np.float32))
    for label, signed in (("export (signed input)", True), ("export (unsigned input)", False)):
        model = _model(k, signed=signed, rng=rng)
        p = model.weights["layers"][0]
        apply = jax.jit(model.apply)
        # Check the integer layer against NumPy: int64 product of the same codes, then the same scale and bias.
        u = np.maximum(np.asarray(x), 0) if not signed else np.asarray(x)
        lo, hi = model.layers[0].inputs.levels
        codes = np.round(np.clip(u * (np.float32(1) / np.float32(0.02)), lo, hi)).astype(np.int64)
        want = (codes @ np.asarray(p["w"], np.int64)).astype(np.float32) * np.float32(0.02 * 0.01) + np.asarray(p["b"])
        got = np.asarray(apply(model.weights, x))
        if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            print(f"{label}: the exported layer disagrees with NumPy", file=sys.stderr)
            return 1
        w_float = np.asarray(p["w"], np.float32) * np.float32(0.01)
        pairs[label] = {
            "int8": (apply, (model.weights, x)),
            "float32": (_float_layer(not signed), (model.weights["normalizer"], jnp.asarray(w_float), p["b"], x)),
        }

    variants = {f"{pair} {kind}": fn_args for pair, kinds in pairs.items() for kind, fn_args in kinds.items()}
    times = _time(variants, options.repeats, options.warmup)
    rows = []
    for pair in pairs:
        t_int = statistics.median(times[f"{pair} int8"])
        t_float = statistics.median(times[f"{pair} float32"])
        q_int = statistics.quantiles(times[f"{pair} int8"], n=4)
        q_float = statistics.quantiles(times[f"{pair} float32"], n=4)
        rows.append(
            {
                "pair": pair,
                "int8_ms": 1e3 * t_int,
                "float32_ms": 1e3 * t_float,
                "int8_iqr_ms": [1e3 * q_int[0], 1e3 * q_int[2]],
                "float32_iqr_ms": [1e3 * q_float[0], 1e3 * q_float[2]],
                "speedup": t_float / t_int,
            }
        )
    device = jax.devices()[0]
    environment = {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "jax": jax.__version__,
        "numpy": np.__version__,
    }
    settings = {"width": k, "batch": n, "repeats": options.repeats, "warmup": options.warmup}
    print(
        f"int8 vs float32, {k}-wide layer, batch {n}, {environment['backend']} ({environment['cpu_count']} cores), "
        f"median of {options.repeats} interleaved rounds after {options.warmup} warm-up calls"
    )
    print()
    print("| pair | int8 ms | float32 ms | speed-up (float32 / int8) |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['pair']} | {row['int8_ms']:.3f} | {row['float32_ms']:.3f} | {row['speedup']:.2f}x |")
    if options.results:
        recorder.write(
            Path(options.results) / "int8_inference.json",
            rows=[{k: row[k] for k in ("pair", "int8_ms", "float32_ms", "speedup")} for row in rows],
            columns=[
                ("pair", "pair"),
                ("int8_ms", "int8 ms", "{:.3f}"),
                ("float32_ms", "float32 ms", "{:.3f}"),
                ("speedup", "speed-up", "{:.2f}×"),
            ],
            figures={
                "raw_speedup": Figure(rows[0]["speedup"], f"{rows[0]['speedup']:.2f}×"),
                "export_signed_speedup": Figure(rows[1]["speedup"], f"{rows[1]['speedup']:.2f}×"),
            },
            notes=f"A {k}-wide layer at batch {n}: medians of {options.repeats} interleaved rounds.",
        )
    if options.out:
        with open(options.out, "w", encoding="utf-8") as f:
            json.dump({"settings": settings, "environment": environment, "results": rows}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
