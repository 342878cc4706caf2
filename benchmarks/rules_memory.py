"""Peak memory of quantize_model on a model with about 100 MB of parameters, against the parameters' size.

Each measurement runs in a fresh subprocess: resident set size (VmRSS from
/proc/self/status) before the model is built and after, then the process's
peak (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) after quantising. The
figure is ``(peak - RSS before the model) / parameter bytes``: 1.0 means the
quantised model costs nothing beyond its parameters. ``--peer qwix`` measures
``qwix.quantize_model`` with its QAT provider (int8 weights and activations)
the same way. Linux only (``/proc``).

    python benchmarks/rules_memory.py [--layers 24] [--width 1024] [--peer stejax|qwix|both] [--results DIR]

``--results DIR`` writes ``DIR/rules_memory.json`` (docs/rules.md renders it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys
import jax, jax.numpy as jnp
from flax import nnx

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

peer, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = jnp.ones((1, width), jnp.float32)
jax.block_until_ready(x + 1)  # start the runtime before the baseline
before = rss()
model = nnx.Sequential(*[nnx.Linear(width, width, rngs=nnx.Rngs(i)) for i in range(layers)])
params = sum(v.nbytes for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
built, peak_built = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if peer == "stejax":
    from stejax.flax import Quant, Rule, quantize_model
    rules = [Rule(weights=Quant("fake_quant", bits=8, axis=-1), inputs=Quant("fake_quant", bits=8, scale="dynamic"))]
    q = quantize_model(model, rules, x)
else:
    import qwix
    rules = [qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8")]
    q = qwix.quantize_model(model, qwix.QtProvider(rules), x)
jax.block_until_ready(jax.tree.leaves(nnx.state(q)))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peer": peer, "param_bytes": params, "rss_before": before, "rss_built": built,
                  "peak_built": peak_built, "peak": peak}))
"""


def measure(peer: str, layers: int, width: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, peer, str(layers), str(width)], capture_output=True, text=True, check=True
    )
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["peak_over_params"] = (r["peak"] - r["rss_before"]) / r["param_bytes"]
    r["quantize_added_over_params"] = (r["peak"] - r["rss_built"]) / r["param_bytes"]
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--peer", choices=("stejax", "qwix", "both"), default="both")
    parser.add_argument("--results", type=Path, default=None, metavar="DIR", help="write DIR/rules_memory.json")
    args = parser.parse_args()
    from stejax.bench.results import Figure, Recorder

    recorder = Recorder(
        "rules_memory",
        command=f"python benchmarks/rules_memory.py --layers {args.layers} --width {args.width} --peer {args.peer}",
    )
    rows = []
    for peer in ("stejax", "qwix") if args.peer == "both" else (args.peer,):
        r = measure(peer, args.layers, args.width)
        rows.append(
            {
                "peer": peer,
                "param_mb": r["param_bytes"] / 1e6,
                "build_peak_over_params": (r["peak_built"] - r["rss_before"]) / r["param_bytes"],
                "quantize_added_over_params": r["quantize_added_over_params"],
                "with_params_over_params": 1 + r["quantize_added_over_params"],
            }
        )
        mb = 1 / 2**20
        hidden = " (not above the build's own peak: an upper bound)" if r["peak"] <= r["peak_built"] else ""
        print(
            f"{peer:7s} params {r['param_bytes'] * mb:6.1f} MB; RSS of the built float model "
            f"+{(r['rss_built'] - r['rss_before']) * mb:6.1f} MB; peak after quantize_model "
            f"+{(r['peak'] - r['rss_before']) * mb:6.1f} MB; quantize_model's peak above the built model "
            f"{(r['peak'] - r['rss_built']) * mb:6.1f} MB = {r['quantize_added_over_params']:.2f} x params{hidden}; "
            f"peak (model and quantize_model) / params = {r['peak_over_params']:.2f} (target: at most 1.5)"
        )
    if args.results is not None:
        mine = next((row for row in rows if row["peer"] == "stejax"), None)
        figures = {}
        if mine is not None:
            figures = {
                "extra_peak": Figure(mine["quantize_added_over_params"], f"{mine['quantize_added_over_params']:.2f}×"),
                "total": Figure(
                    mine["with_params_over_params"],
                    f"{mine['with_params_over_params']:.2f}×",
                    target="≤ 1.5×",
                    met=mine["with_params_over_params"] <= 1.5,
                ),
            }
        recorder.write(
            args.results / "rules_memory.json",
            rows=rows,
            columns=[
                ("peer", "quantize_model of"),
                ("param_mb", "parameters, MB", "{:.0f}"),
                ("build_peak_over_params", "building the float model, peak", "{:.2f}×"),
                ("quantize_added_over_params", "quantize_model's extra peak", "{:.2f}×"),
                ("with_params_over_params", "parameters + quantize_model's extra", "{:.2f}×"),
            ],
            figures=figures,
            notes=(
                f"{args.layers} nnx.Linear({args.width}, {args.width}); fresh subprocesses; peak resident memory "
                "(ru_maxrss) over the parameters' bytes: the float model's build measured from before it, "
                "quantize_model's extra from the built model."
            ),
        )


if __name__ == "__main__":
    main()
