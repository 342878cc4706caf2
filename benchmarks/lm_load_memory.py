"""Peak host memory of loading a low-bit LM artifact, against the artifact's size.

    python benchmarks/lm_load_memory.py --out docs/results/lm_load_memory.json
    python benchmarks/lm_load_memory.py --models 25M --out /tmp/lm_load_memory.json   # a minute

Each model of ``stejax.bench._lm_decode.LARGE`` (random weights) is exported once per
configuration (w8a8, w4a8, w1.58a8) to a temporary directory; then each load runs in a
fresh Python process that has imported everything first, so its memory is the load's alone:

* ``peak_load_bytes``: the process's peak resident set (``VmHWM`` of ``/proc/self/status``,
  reset through ``/proc/self/clear_refs`` just before the load) minus its resident set just
  before. Resident pages are what the load costs the machine, whoever allocated them
  (numpy, XLA's buffers, the allocator's slack), which ``tracemalloc`` would not see. On a
  CPU backend the device is the host, so this includes the loaded model itself.
* ``host_staging_bytes``: the peak of ``tracemalloc`` in a second fresh process: Python and
  numpy allocations only, i.e. the host copies the load makes on the way to the device
  (XLA's own buffers are not traced). On a CPU backend XLA may keep an aligned host array as
  the device buffer itself, which is then traced too: an upper bound of the copies.

``stejax.lm.load_lowbit`` streams the weights file tensor by tensor; ``stejax.lm._export.load_lm_artifact``
(the float32 model and its integer forward, both dequantised) is measured beside it on the 25M model
for comparison. The target: peak host memory at most 1.5x the artifact's bytes, judged on the 350M model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET = 1.5
ARTIFACTS = {"int8": "w8a8", "int4": "w4a8", "ternary-2bit": "w1.58a8", "ternary-int8": "w1.58a8"}

CHILD = r"""
import json, re, sys, tracemalloc
import jax, jax.numpy as jnp
from flax import nnx
import stejax.artifacts, stejax.export, stejax.lm._export, stejax.lm._lowbit
from stejax.lm import load_lowbit
from stejax.lm._export import load_lm_artifact

path, method, form, mode = sys.argv[1:5]

def status(key):
    return 1024 * int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1))

def load():
    if method == "load_lm_artifact":
        loaded = load_lm_artifact(path)
        return (loaded.model, loaded.float_model)
    return (load_lowbit(path, ternary="2bit" if form == "ternary-2bit" else "int8").model,)

jnp.zeros(8).block_until_ready()  # the backend, before the baseline
if mode == "tracemalloc":
    tracemalloc.start()
    models = load()
    jax.block_until_ready([nnx.state(m) for m in models])
    print(json.dumps({"host_staging_bytes": tracemalloc.get_traced_memory()[1]}))
else:
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    models = load()
    jax.block_until_ready([nnx.state(m) for m in models])
    from stejax.lowbit.nnx import Resident
    buffers = {id(x): x for m in models for x in jax.tree.leaves(nnx.state(m, nnx.Param, Resident))}
    print(json.dumps({
        "device": str(jax.devices()[0].platform),
        "rss_before_bytes": before,
        "peak_load_bytes": status("VmHWM") - before,
        "after_load_bytes": status("VmRSS") - before,
        "resident_weight_bytes": sum(int(x.nbytes) for x in buffers.values()),
    }))
"""


def _child(path: Path, method: str, form: str, mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), method, form, mode],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the load of {path} ({method}, {mode}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _export(name: str, configs: set[str], root: Path) -> dict[str, Path]:
    """The model ``name`` with random weights, exported once per configuration (in a child: its memory is freed)."""
    code = (
        "import sys\nfrom flax import nnx\nfrom stejax.bench._lm_decode import LARGE\n"
        "from stejax.lm import LMConfig, Transformer\nfrom stejax.lm._export import export_lm\n"
        "model = Transformer(LMConfig(**LARGE[sys.argv[1]]), rngs=nnx.Rngs(params=0))\n"
        "for c in sys.argv[3:]:\n    export_lm(model, c, f'{sys.argv[2]}/{c}')\n"
    )
    subprocess.run([sys.executable, "-c", code, name, str(root), *sorted(configs)], check=True)
    return {c: root / c for c in configs}


def measure(models: list[str], forms: list[str], workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        paths = _export(name, {ARTIFACTS[f] for f in forms}, workdir / name)
        methods = [("load_lowbit", f) for f in forms]
        if name == "25M":
            methods += [("load_lm_artifact", c) for c in sorted({ARTIFACTS[f] for f in forms})]
        for method, form in methods:
            path = paths[ARTIFACTS.get(form, form)]
            artifact = (path / "weights.safetensors").stat().st_size
            rss = _child(path, method, form, "rss")
            traced = _child(path, method, form, "tracemalloc")
            row = {
                "device": rss["device"],
                "model": name,
                "load": method,
                "weights": form if method == "load_lowbit" else f"{form} (float32 models)",
                "artifact_bytes": artifact,
                "resident_weight_bytes": rss["resident_weight_bytes"],
                "peak_load_bytes": rss["peak_load_bytes"],
                "peak_vs_artifact": rss["peak_load_bytes"] / artifact,
                "host_staging_bytes": traced["host_staging_bytes"],
                "staging_vs_artifact": traced["host_staging_bytes"] / artifact,
                "after_load_bytes": rss["after_load_bytes"],
                "rss_before_bytes": rss["rss_before_bytes"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from stejax.bench.results import Figure

    out = {}
    judged = "350M" if any(r["model"] == "350M" for r in rows) else rows[0]["model"]
    for r in rows:
        if r["model"] != judged or r["load"] != "load_lowbit":
            continue
        share = r["peak_vs_artifact"]
        note = (
            f"{r['model']} model, {r['weights']}: peak resident set of the load over the weights file's "
            f"{r['artifact_bytes']:,} bytes, measured on a CPU backend (the loaded model is host memory there)"
        )
        if r["resident_weight_bytes"] > TARGET * r["artifact_bytes"]:
            note += (
                f"; the resident form alone is {r['resident_weight_bytes'] / r['artifact_bytes']:.2f}x the file "
                "(ternary codes stored five to a byte, held one to a byte)"
            )
        out[f"peak_vs_artifact_{judged}_{r['weights'].replace('-', '_')}"] = Figure(
            round(share, 3), f"{share:.2f}x", target=f"≤ {TARGET}x", met=share <= TARGET, note=note
        )
    streamed = [r for r in rows if r["model"] == judged and r["load"] == "load_lowbit"]
    if streamed:
        worst = max(streamed, key=lambda r: r["staging_vs_artifact"])
        share = worst["staging_vs_artifact"]
        out[f"host_staging_vs_artifact_{judged}"] = Figure(
            round(share, 3),
            f"{share:.2f}x",
            target=f"≤ {TARGET}x",
            met=share <= TARGET,
            note=(
                f"{judged} model, the largest over the resident forms ({worst['weights']}): tracemalloc's peak of "
                "the host copies made on the way to the device, over the weights file's bytes; an estimate of "
                "the host memory a load needs beside an accelerator's own, measured on a CPU backend (where it "
                "also counts host arrays kept as device buffers: an upper bound)"
            ),
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/lm_load_memory.py", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="25M,350M", help="bench models (25M, 350M, 1B), comma-separated")
    parser.add_argument("--forms", default=",".join(ARTIFACTS), help=f"resident forms among {list(ARTIFACTS)}")
    parser.add_argument("--out", required=True, help="the results file to write")
    args = parser.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(forms) - set(ARTIFACTS))
    if unknown:
        parser.error(f"--forms: {unknown} unknown; expected some of {list(ARTIFACTS)}")
    from stejax.bench.results import Recorder

    command = " ".join(["python benchmarks/lm_load_memory.py", *(argv if argv is not None else sys.argv[1:])])
    recorder = Recorder(Path(args.out).stem, command=command)
    with tempfile.TemporaryDirectory(prefix="lm-load-") as tmp:
        rows = measure([m for m in args.models.split(",") if m], forms, Path(tmp))
    columns: list[tuple[str, str] | tuple[str, str, str]] = [
        ("device", "device"),
        ("model", "model"),
        ("load", "loader"),
        ("weights", "resident form"),
        ("artifact_bytes", "weights file bytes", "{:,}"),
        ("resident_weight_bytes", "resident bytes", "{:,}"),
        ("peak_load_bytes", "peak resident set of the load", "{:,}"),
        ("peak_vs_artifact", "of the file", "{:.2f}"),
        ("host_staging_bytes", "traced host allocations (peak)", "{:,}"),
    ]
    recorder.write(
        args.out,
        rows=rows,
        columns=columns,
        figures=figures(rows),
        notes=(
            "Each load ran in a fresh process, after its imports. 'peak resident set of the load' "
            "is the process's peak resident set during the load minus its resident set before (VmHWM, reset just "
            "before the load); on a CPU backend, the device being the host, it includes the loaded model. 'traced host "
            "allocations' is tracemalloc's peak in a second fresh process: the Python and numpy copies made on the "
            "way to the device, without XLA's own buffers; on a CPU backend XLA may keep an aligned host array as "
            "the device buffer itself, which is then traced too, so this bounds the copies from above."
        ),
    )


if __name__ == "__main__":
    main()
