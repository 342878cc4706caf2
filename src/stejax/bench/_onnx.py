"""The onnx suite: ONNX Runtime (CPU, 2 intra-op threads) on stejax's QDQ files, against stejax's own forward."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["onnx_suite"]

THREADS = 2  # ORT's intra_op_num_threads, set explicitly (the machine's other cores are not ours)


def _mlp(width: int, bits: int, rng: np.random.Generator) -> Any:
    """A 3-layer MLP, ``width`` wide, random codes: ``bits``-bit LSQ weights, 8-bit inputs (signed first)."""
    from stejax.export import ExportedModel, InputFormat, LayerSpec, WeightFormat, pack_codes
    from stejax.lowbit._packing import container_for

    shapes = [(width, width), (width, width), (width, 10)]
    layers, params = [], []
    for i, (k, n) in enumerate(shapes):
        layer = LayerSpec(
            kind="dense",
            in_shape=(k,),
            w_shape=(k, n),
            stride=1,
            relu=i > 0,
            weights=WeightFormat("lsq", bits, "channel"),
            inputs=InputFormat("lsq", 8, signed=i == 0),
        )
        half = 2 ** (bits - 1)
        codes = rng.integers(-half, half, (k, n))
        layers.append(layer)
        params.append(
            {
                "w": jnp.asarray(pack_codes(codes, container_for(bits, binary=False))),
                "w_scale": jnp.asarray(rng.uniform(0.5, 1.5, n).astype(np.float32) / (half * np.sqrt(k))),
                "b": jnp.asarray(rng.normal(size=n).astype(np.float32) * 0.1),
                "a_step": jnp.float32(0.03 if i == 0 else 0.01),
            }
        )
    weights = {
        "normalizer": {"mean": jnp.zeros(width, jnp.float32), "std": jnp.ones(width, jnp.float32)},
        "layers": tuple(params),
    }
    return ExportedModel(layers=tuple(layers), weights=weights, input_shape=(width,), n_classes=10)


def _cnn(preset_name: str) -> tuple[Any, np.ndarray]:
    from stejax.data import Normalizer
    from stejax.export import export_model
    from stejax.model import init_params, preset
    from stejax.train import TrainConfig, load_splits

    config = TrainConfig(model="cnn")
    splits = load_splits(config)
    model_config = config.model_config(splits.train)
    qc = preset(preset_name)
    params = init_params(jax.random.key(0), model_config, qc)
    return export_model(params, model_config, qc, Normalizer.fit(splits.train.x)), np.asarray(splits.test.x, np.float32)


def _digits_files(model: Any, tmp: Path, name: str) -> dict[str, Path]:
    from stejax.onnx._digits import weight_format_name
    from stejax.onnx._export import write_digits

    out = {}
    for float_model in (False, True):
        fmt = weight_format_name(model, float_model=float_model)
        out[fmt] = write_digits(model, tmp / f"{name}-{fmt}.onnx", float_model=float_model, metadata={}, conv="integer")
    if any(layer.kind == "conv" for layer in model.layers):
        out["qlinear"] = write_digits(
            model, tmp / f"{name}-qlinear.onnx", float_model=False, metadata={}, conv="qlinear"
        )
    return out


def _rules_model(width: int) -> tuple[Any, np.ndarray]:
    from flax import nnx

    from stejax.flax import Quant, Rule, calibrate, quantize_model

    class EinsumMLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.fc1 = nnx.Linear(64, width, rngs=rngs)
            self.mix = nnx.Param(jax.random.normal(rngs.params(), (width, width)) / np.sqrt(width))
            self.head = nnx.Linear(width, 10, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.fc1(x))
            h = jax.nn.relu(jnp.einsum("bi,io->bo", h, self.mix[...]))
            return self.head(h)

    x = np.asarray(jax.random.normal(jax.random.key(1), (256, 64)), np.float32)
    rules = [Rule(weights=Quant("lsq", bits=8, axis=-1), inputs=Quant("fake_quant", bits=8, signed=False))]
    q = quantize_model(EinsumMLP(nnx.Rngs(0)), rules, jnp.asarray(x))
    calibrate(q, [jnp.asarray(x)])
    return q, x


def _call(kind: str, obj: Any, x: np.ndarray) -> Any:
    if kind == "stejax":
        weights, xj = obj.weights, jnp.asarray(x)
        return lambda: jax.block_until_ready(obj.compiled_apply(weights, xj))
    if kind == "nnx":
        xj = jnp.asarray(x)
        return lambda: jax.block_until_ready(obj(xj))
    from stejax.onnx import open_runtime

    s = open_runtime(obj, threads=THREADS, allow_spinning=False)  # the runtimes take turns on the same cores
    return lambda: s.run(None, {kind: x})[0]


def _faster_than_float(stats: dict[str, float]) -> Any:
    """The figure of a graph's throughput over float's (per-round time ratios), with their spread.

    The value is the median; met only when the 10th percentile is at least 1 too. A spread that contains 1
    (the machine's load leaves the comparison open) is not a target met, and the note says so.
    """
    from stejax.bench.results import Figure

    value, lo, hi = stats["p50"], stats["p10"], stats["p90"]
    spread = f"per-round ratios over {stats['n']} rounds: p10 {lo:.2f}×, p90 {hi:.2f}×"
    if lo < 1 <= hi:
        spread += "; the spread contains 1, so this run does not settle it"
    text = f"{value:.2f}× (p10 {lo:.2f}×, p90 {hi:.2f}×)"
    return Figure(value, text, target="≥ 1.0×", met=lo >= 1.0, note=spread + ".")


def onnx_suite(*, repeats: int, warmup: int, quick: bool, results_dir: str | Path | None = None) -> dict:
    """Time ONNX Runtime on the float, int8 and int4 files of three models against stejax's own forward.

    Models: ``mlp-1024`` (three dense layers 1024 wide, random codes; int8 and
    int4 weights, 8-bit inputs), ``cnn`` (the digits CNN preset, w8a8 and w4a4,
    freshly initialised weights: timing does not depend on their values) and
    ``rules-mlp`` (an NNX MLP with an einsum, 256 wide, quantised by rules to
    8 bits). Runtimes: ``onnxruntime`` (CPU EP, ``intra_op_num_threads=2``,
    sequential) and ``stejax`` (the jitted integer forward
    :meth:`stejax.export.ExportedModel.compiled_apply`; for the rules model, the
    jitted fake-quantised NNX model, stejax's only forward for it). Batches 1
    and 256; each (model, batch) group is timed in interleaved rounds in one
    process. Writes ``RESULTS_DIR/onnx.json`` when ``results_dir`` is given (not with ``quick``).
    """
    from stejax.bench._measure import compare
    from stejax.bench.results import Figure, Recorder
    from stejax.onnx import export_nnx

    recorder = Recorder("onnx", command="stejax bench --suite onnx --out bench-out --results docs/results")
    rng = np.random.default_rng(0)
    width = 256 if quick else 1024
    batches = (1, 256)
    rows: list[dict[str, Any]] = []
    bench_groups: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    spreads: dict[str, dict[str, float]] = {}  # per-round ratio statistics (n, p10, p50, p90)
    with tempfile.TemporaryDirectory(prefix="stejax-bench-onnx-") as tmp_dir:
        tmp = Path(tmp_dir)
        groups: list[tuple[str, dict[str, tuple[str, Any, int]], np.ndarray]] = []
        # mlp-1024: int8 and int4 (+ float from the int8 model's dequantised weights)
        mlp_name = f"mlp-{width}"
        m8, m4 = _mlp(width, 8, rng), _mlp(width, 4, rng)
        f8, f4 = _digits_files(m8, tmp, "mlp8"), _digits_files(m4, tmp, "mlp4")
        x_mlp = rng.normal(size=(256, width)).astype(np.float32)
        groups.append(
            (
                mlp_name,
                {
                    "onnxruntime float": ("features", f8["float"], f8["float"].stat().st_size),
                    "onnxruntime int8": ("features", f8["int8"], f8["int8"].stat().st_size),
                    "onnxruntime int4": ("features", f4["int4"], f4["int4"].stat().st_size),
                    "stejax int8": ("stejax", m8, 0),
                    "stejax int4": ("stejax", m4, 0),
                },
                x_mlp,
            )
        )
        if not quick:
            c8, x_cnn = _cnn("w8a8")
            c4, _ = _cnn("w4a4")
            g8, g4 = _digits_files(c8, tmp, "cnn8"), _digits_files(c4, tmp, "cnn4")
            x_cnn = np.resize(x_cnn, (256, x_cnn.shape[1])).astype(np.float32)
            groups.append(
                (
                    "cnn",
                    {
                        "onnxruntime float": ("features", g8["float"], g8["float"].stat().st_size),
                        "onnxruntime int8": ("features", g8["int8"], g8["int8"].stat().st_size),
                        "onnxruntime int4": ("features", g4["int8"], g4["int8"].stat().st_size),
                        "onnxruntime-qlinearconv int8": ("features", g8["qlinear"], g8["qlinear"].stat().st_size),
                        "onnxruntime-qlinearconv int4": ("features", g4["qlinear"], g4["qlinear"].stat().st_size),
                        "stejax int8": ("stejax", c8, 0),
                        "stejax int4": ("stejax", c4, 0),
                    },
                    x_cnn,
                )
            )
        q, x_rules = _rules_model(256)
        rq = export_nnx(q, x_rules, tmp / "rules-int8.onnx")
        rf = export_nnx(q, x_rules, tmp / "rules-float.onnx", float_model=True)
        qfn = jax.jit(lambda v: q(v))
        groups.append(
            (
                "rules-mlp",
                {
                    "onnxruntime float": ("input", rf, rf.stat().st_size),
                    "onnxruntime int8": ("input", rq, rq.stat().st_size),
                    "stejax int8": ("nnx", qfn, 0),
                },
                x_rules,
            )
        )
        for model_name, variants, x_all in groups:
            for batch in batches:
                x = np.ascontiguousarray(x_all[:batch])
                calls = {key: _call(kind, obj, x) for key, (kind, obj, _) in variants.items()}
                pairs = [("onnxruntime float", "onnxruntime int8"), ("stejax int8", "onnxruntime int8")]
                if "onnxruntime-qlinearconv int8" in variants:  # the cnn's default graphs against float
                    pairs.append(("onnxruntime float", "onnxruntime-qlinearconv int8"))
                    pairs.append(("onnxruntime float", "onnxruntime-qlinearconv int4"))
                group = compare(
                    f"{model_name} batch {batch}",
                    calls,
                    repeats=repeats,
                    warmup=warmup,
                    ratios=pairs,
                    info={"model": model_name, "batch": batch, "threads": THREADS},
                )
                bench_groups.append(group)
                for key, m in group["variants"].items():
                    runtime, fmt = key.split(" ")
                    rows.append(
                        {
                            "model": model_name,
                            "format": fmt,
                            "runtime": runtime,
                            "batch": batch,
                            "ms_p50": float(m["stats_ms"]["p50_ms"]),
                            "ms_p99": float(m["stats_ms"]["p99_ms"]),
                            "file_bytes": int(variants[key][2]) or None,
                        }
                    )
                if model_name == "cnn" and batch == 256:
                    for fmt in ("int8", "int4"):
                        spreads[f"cnn_float_over_qlinear_{fmt}"] = group["ratios"][
                            f"onnxruntime float/onnxruntime-qlinearconv {fmt}"
                        ]
                    ratios["cnn_float_over_qlinear"] = float(spreads["cnn_float_over_qlinear_int8"]["p50"])
                    ratios["cnn_float_over_integer"] = float(
                        group["ratios"]["onnxruntime float/onnxruntime int8"]["p50"]
                    )
                if model_name == mlp_name and batch == 256:
                    # Time ratios of the same round: float / int8 is int8's throughput over float's.
                    ratios["float_over_int8"] = float(group["ratios"]["onnxruntime float/onnxruntime int8"]["p50"])
                    ratios["stejax_over_ort"] = float(group["ratios"]["stejax int8/onnxruntime int8"]["p50"])
    a, b = ratios["float_over_int8"], ratios["stejax_over_ort"]
    sizes = {r["format"]: r["file_bytes"] for r in rows if r["model"] == mlp_name and r["runtime"] == "onnxruntime"}
    size = sizes["int8"] / sizes["float"]
    figures = {
        "int8_file_vs_float_mlp": Figure(size, f"{size:.2f}×", target="≤ 0.3×", met=size <= 0.3),
        "ort_int8_vs_float_mlp_b256": Figure(a, f"{a:.2f}×", target="≥ 1.5×", met=a >= 1.5),
        "ort_int8_vs_stejax_mlp_b256": Figure(b, f"{b:.2f}×", target="≥ 1.0×", met=b >= 1.0),
    }
    if "cnn_float_over_qlinear" in ratios:  # not in a quick run
        for key, fmt in (
            ("ort_qlinearconv_vs_float_cnn_b256", "int8"),
            ("ort_qlinearconv_int4_vs_float_cnn_b256", "int4"),
        ):
            figures[key] = _faster_than_float(spreads[f"cnn_float_over_qlinear_{fmt}"])
        d = ratios["cnn_float_over_integer"]
        figures["ort_convinteger_vs_float_cnn_b256"] = Figure(d, f"{d:.2f}×")
    if results_dir is not None and not quick:  # a quick run checks the suite; it does not replace the figures
        recorder.write(
            Path(results_dir) / "onnx.json",
            rows=rows,
            columns=[
                ("model", "model"),
                ("format", "format"),
                ("runtime", "runtime"),
                ("batch", "batch"),
                ("ms_p50", "p50 ms", "{:.3f}"),
                ("ms_p99", "p99 ms", "{:.3f}"),
                ("file_bytes", "file bytes", "{:,}"),
            ],
            figures=figures,
        )
    notes = [
        f"onnxruntime: CPU execution provider, intra_op_num_threads={THREADS}, one inter-op thread, sequential, "
        "threads not spinning between calls (the runtimes take turns on the same cores).",
        "The cnn's int4 file is its w4a4 preset: 4-bit hidden weights as ONNX INT4, 8-bit first and last layers.",
        "onnxruntime-qlinearconv: the cnn's default export (conv='qlinear', every convolution ORT's QLinearConv), "
        "int8 for the w8a8 preset and int4 for w4a4; its onnxruntime int8 and int4 rows are conv='integer' "
        "(ConvInteger, bit for bit stejax's integer forward).",
        "rules-mlp's stejax runtime is the jitted fake-quantised NNX model (stejax has no integer forward for it).",
        f"Throughput ratios at batch 256 on {mlp_name} (median of per-round ratios): ORT float / ORT int8 "
        f"{a:.2f}, stejax int8 / ORT int8 {b:.2f}.",
    ]
    return {"config": {"width": width, "threads": THREADS}, "groups": bench_groups, "rows": rows, "notes": notes}
