"""llama.cpp against stejax's compiled decoding on the same llama-compatible models, and the GGUF sizes.

For each model (``tiny``: :data:`stejax.lm.LLAMA`, 0.1M parameters; ``25M``: width 512, 8 blocks, 8 heads,
hidden 1280, every row a multiple of 256 so ternary weights are TQ2_0) and configuration (float, w8a8,
w4a8, w1.58a8), the same initialised weights are exported once as an LM artifact and once as GGUF.
Decoding speed does not depend on what the weights learned, so the models are not trained.

Timed, interleaved round by round (one stejax call, then one llama.cpp call, per configuration), batch 1,
greedy, the same prompts and byte budget:

- ``path: "stejax"``: ``stejax.lm.decode`` (one compiled loop) on the artifact loaded with its quantised
  layers resident in integer form (``load_lowbit``), after a compiling call;
- ``path: "llama.cpp"``: :func:`stejax.lm.llamacpp_rows`' loop (``llama_decode`` per byte through
  llama-cpp-python), two threads, float32 key-value cache.

Run: ``.venv/bin/python benchmarks/lm_llamacpp.py --results docs/results`` (``--quick``: the tiny model only).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from stejax.bench.results import Figure, Recorder
from stejax.lm import LLAMA, Transformer, export_gguf, llamacpp_greedy, load_llama
from stejax.lm._export import export_lm

MODELS = {
    "tiny": LLAMA.replace(context=192),
    "25M": LLAMA.replace(context=192, width=512, depth=8, heads=8, hidden=1280),
}
CONFIGS = ("float", "w8a8", "w4a8", "w1.58a8")
PROMPTS = (b"def main():\n    ", b"import numpy as np\n")


def _stejax_decoder(artifact: Path):
    key = jax.random.key(0)
    try:
        from stejax.lm import decode, load_lowbit
    except ImportError:  # without the compiled loop: the cached per-byte generate
        from stejax.lm import generate
        from stejax.lm._export import load_lm_artifact

        reference = load_lm_artifact(artifact).model

        def run_generate(prompt: bytes, tokens: int) -> tuple[float, float]:
            with jax.debug_key_reuse(False):
                out = generate(reference, prompt, tokens=tokens, key=key, temperature=0)
            return out.seconds, float("nan")

        return run_generate
    model = load_lowbit(artifact).model

    def run(prompt: bytes, tokens: int) -> tuple[float, float]:
        with jax.debug_key_reuse(False):
            out = decode(model, [prompt], tokens=tokens, key=key, temperature=0)
        return out.seconds, out.first_byte_seconds

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="Write lm_llamacpp.json into this folder.")
    parser.add_argument("--quick", action="store_true", help="The tiny model only.")
    parser.add_argument("--tokens", type=int, default=128, help="Bytes generated per prompt.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed rounds (medians reported).")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed rounds first.")
    parser.add_argument("--threads", default="2", help="llama.cpp's threads; a comma list measures each.")
    args = parser.parse_args()
    threads = [int(t) for t in str(args.threads).split(",")]
    command = "python benchmarks/lm_llamacpp.py --results docs/results" + (" --quick" if args.quick else "")
    command += "" if threads == [2] else f" --threads {args.threads}"
    paths = ["stejax", *(f"llama.cpp/{t}" for t in threads)]
    recorder = Recorder("lm_llamacpp", command=command)
    root = Path(tempfile.mkdtemp())
    models = {k: v for k, v in MODELS.items() if not args.quick or k == "tiny"}
    rows, figures = [], {}
    for model_name, config in models.items():
        model = Transformer(config, rngs=nnx.Rngs(params=0))
        params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        runners, llms, sizes, types = {}, {}, {}, {}
        for name in CONFIGS:
            artifact = export_lm(model, name, root / f"{model_name}-{name}")
            result = export_gguf(artifact, root / f"{model_name}-{name}.gguf")
            sizes[name], types[name] = result.bytes, result
            runners[name] = _stejax_decoder(artifact)
            for t in threads:
                llms[(name, t)] = load_llama(result.path, threads=t, context=config.context)
        timings: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for round_ in range(args.warmup + args.repeats):
            for name in CONFIGS:
                for path in paths:
                    seconds, firsts, made = 0.0, [], 0
                    for prompt in PROMPTS:
                        if path == "stejax":
                            s, f = runners[name](prompt, args.tokens)
                        else:
                            t = int(path.split("/")[1])
                            g = llamacpp_greedy(llms[(name, t)], prompt, tokens=args.tokens)
                            s, f = g.seconds, g.first_byte_seconds
                        seconds, made = seconds + s, made + args.tokens
                        firsts.append(f)
                    if round_ >= args.warmup:
                        timings.setdefault((name, path), []).append((made / seconds, float(np.median(firsts))))
        for name in CONFIGS:
            kinds = sorted({t for g, t in types[name].types.items() if g.startswith("blk.") and "norm" not in g})
            for path in paths:
                rates = [r for r, _ in timings[(name, path)]]
                llama = path != "stejax"
                firsts = [f for _, f in timings[(name, path)]]
                rows.append(
                    {
                        "model": model_name,
                        "parameters": params,
                        "config": name,
                        "path": "llama.cpp" if llama else "stejax",
                        "batch": 1,
                        "threads": int(path.split("/")[1]) if llama else None,
                        "bytes_per_s": float(np.median(rates)),
                        "first_byte_ms": float(np.median(firsts)) * 1e3,
                        "gguf_type": "/".join(kinds) if llama else None,
                        "gguf_bytes": sizes[name] if llama else None,
                        "gguf_vs_float": sizes[name] / sizes["float"] if llama else None,
                    }
                )
            ours = float(np.median([r for r, _ in timings[(name, "stejax")]]))
            for t in threads:
                theirs = float(np.median([r for r, _ in timings[(name, f"llama.cpp/{t}")]]))
                ratio = ours / theirs
                key = f"stejax_vs_llamacpp_{model_name}_{name}" + ("" if t == 2 else f"_{t}thread")
                figures[key] = Figure(ratio, f"{ratio:.2f}×", target="≥ 0.5× (stretch 1.0×)", met=ratio >= 0.5)
        for llm in llms.values():
            llm.close()
        if model_name == "25M":
            share = sizes["w1.58a8"] / sizes["float"]
            figures["ternary_gguf_vs_float_25m"] = Figure(
                share, f"1/{1 / share:.1f}", target="≤ 1/7", met=share <= 1 / 7
            )
        print(model_name, [(r["config"], r["path"], r["threads"], round(r["bytes_per_s"])) for r in rows], flush=True)
    if args.results is not None:
        recorder.write(
            args.results / "lm_llamacpp.json",
            rows=rows,
            columns=[
                ("model", "model"),
                ("config", "config"),
                ("path", "path"),
                ("threads", "threads"),
                ("bytes_per_s", "bytes/s", "{:,.0f}"),
                ("first_byte_ms", "first byte ms", "{:.1f}"),
                ("gguf_type", "GGUF type"),
                ("gguf_bytes", "GGUF bytes", "{:,}"),
                ("gguf_vs_float", "of float GGUF", "{:.3f}"),
            ],
            figures=figures,
            notes=(
                "Batch 1, greedy, the same prompts and byte budget; stejax's compiled decode loop (integer-resident "
                "weights) and llama.cpp (two threads, float32 key-value cache) timed in alternation in one process. "
                "bytes/s counts generated bytes over wall time including the prompt's forward pass."
            ),
        )


if __name__ == "__main__":
    main()
