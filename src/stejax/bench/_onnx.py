"""The onnx suite: ONNX Runtime (CPU, 2 intra-op threads) on stejax's QDQ files, against stejax's own forward."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["onnx_figures", "onnx_suite"]

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


def onnx_figures(groups: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any]:
    """The figures of ``onnx.json`` from the measured groups (their per-round ratios) and the MLP's file sizes.

    A throughput ratio is the time ratio of the same round (float's time over int8's is int8's throughput over
    float's), one sample per round, written by :meth:`stejax.bench.results.Figure.ratio`: the median over
    rounds with its spread, "level with" where the spread contains 1, and a target met only when every
    round meets it.

    Args:
      groups: the suite's group records; the figures read ``mlp-*`` and (where measured) ``cnn`` at batch 256.
      sizes: the MLP's ONNX Runtime file bytes by format (``"float"``, ``"int8"``).
    """
    from stejax.bench.results import Figure

    at_256 = {g["info"]["model"].split("-")[0]: g["ratios"] for g in groups if g["info"]["batch"] == 256}
    mlp = at_256["mlp"]
    size = sizes["int8"] / sizes["float"]
    figures = {
        "int8_file_vs_float_mlp": Figure(size, f"{size:.2f}×", target="≤ 0.3×", met=size <= 0.3),
        "ort_int8_vs_float_mlp_b256": Figure.ratio(
            mlp["onnxruntime float/onnxruntime int8"]["rounds"], bound=1.5, lower_is_better=False
        ),
        "ort_int8_vs_stejax_mlp_b256": Figure.ratio(
            mlp["stejax int8/onnxruntime int8"]["rounds"], bound=1.0, lower_is_better=False
        ),
    }
    if "cnn" in at_256:  # not in a quick run
        cnn = at_256["cnn"]
        for key, fmt in (
            ("ort_qlinearconv_vs_float_cnn_b256", "int8"),
            ("ort_qlinearconv_int4_vs_float_cnn_b256", "int4"),
        ):
            samples = cnn[f"onnxruntime float/onnxruntime-qlinearconv {fmt}"]["rounds"]
            figures[key] = Figure.ratio(samples, bound=1.0, lower_is_better=False)
        figures["ort_convinteger_vs_float_cnn_b256"] = Figure.ratio(cnn["onnxruntime float/onnxruntime int8"]["rounds"])
    return figures


def onnx_groups(
    tmp: Path, *, width: int, quick: bool
) -> dict[str, tuple[str, int, dict[str, Any], dict[str, Any], list]]:
    """The groups :func:`onnx_suite` times, their files written into ``tmp``, untimed.

    Returns:
      ``{group name: (model, batch, variants, calls, pairs)}``: ``variants`` maps each variant to
      ``(input name or runtime, model or file, file bytes or 0)``, ``calls`` to its zero-argument call, and
      ``pairs`` are the ``(numerator, denominator)`` time ratios to report.
    """
    from stejax.onnx import export_nnx

    rng = np.random.default_rng(0)
    batches = (1, 256)
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
    timed: dict[str, tuple[str, int, dict[str, tuple[str, Any, int]], dict[str, Any], list]] = {}
    for model_name, variants, x_all in groups:
        for batch in batches:
            x = np.ascontiguousarray(x_all[:batch])
            calls = {key: _call(kind, obj, x) for key, (kind, obj, _) in variants.items()}
            pairs = [("onnxruntime float", "onnxruntime int8"), ("stejax int8", "onnxruntime int8")]
            if "onnxruntime-qlinearconv int8" in variants:  # the cnn's default graphs against float
                pairs.append(("onnxruntime float", "onnxruntime-qlinearconv int8"))
                pairs.append(("onnxruntime float", "onnxruntime-qlinearconv int4"))
            timed[f"{model_name} batch {batch}"] = (model_name, batch, variants, calls, pairs)
    return timed


def onnx_suite(
    *, repeats: int, warmup: int, quick: bool, results_dir: str | Path | None = None, rounds: int = 1
) -> dict:
    """Time ONNX Runtime on the float, int8 and int4 files of three models against stejax's own forward.

    Models: ``mlp-1024`` (three dense layers 1024 wide, random codes; int8 and
    int4 weights, 8-bit inputs), ``cnn`` (the digits CNN preset, w8a8 and w4a4,
    freshly initialised weights: timing does not depend on their values) and
    ``rules-mlp`` (an NNX MLP with an einsum, 256 wide, quantised by rules to
    8 bits). Runtimes: ``onnxruntime`` (CPU EP, ``intra_op_num_threads=2``,
    sequential) and ``stejax`` (the jitted integer forward
    :meth:`stejax.export.ExportedModel.compiled_apply`; for the rules model, the
    jitted fake-quantised NNX model, stejax's only forward for it). Batches 1
    and 256. Every (model, batch) group is timed in each of ``rounds`` interleaved
    rounds in one process (:func:`stejax.bench.measure_rounds`: ``repeats`` passes
    over the group's variants per round), so each round gives each ratio one
    sample; the figures are :func:`onnx_figures`. Writes ``RESULTS_DIR/onnx.json``
    when ``results_dir`` is given (not with ``quick``).

    Returns:
      ``{"config", "groups", "rows", "figures", "notes"}``, ``figures`` as JSON-ready dicts.
    """
    from stejax.bench._measure import group_record, measure_rounds
    from stejax.bench.results import Recorder

    recorder = Recorder(
        "onnx",
        command=f"stejax bench --suite onnx --rounds {rounds} --repeats {repeats} --warmup {warmup} --out bench-out "
        "--results docs/results",
    )
    width = 256 if quick else 1024
    mlp_name = f"mlp-{width}"
    rows: list[dict[str, Any]] = []
    bench_groups: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stejax-bench-onnx-") as tmp_dir:
        timed = onnx_groups(Path(tmp_dir), width=width, quick=quick)
        measured = measure_rounds(
            {label: t[3] for label, t in timed.items()}, rounds=rounds, repeats=repeats, warmup=warmup
        )
    for label, (model_name, batch, variants, _, pairs) in timed.items():
        group = group_record(
            label,
            measured[label],
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
    sizes = {r["format"]: r["file_bytes"] for r in rows if r["model"] == mlp_name and r["runtime"] == "onnxruntime"}
    figures = onnx_figures(bench_groups, sizes)
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
            rounds=rounds,
        )
    notes = [
        f"onnxruntime: CPU execution provider, intra_op_num_threads={THREADS}, one inter-op thread, sequential, "
        "threads not spinning between calls (the runtimes take turns on the same cores).",
        "The cnn's int4 file is its w4a4 preset: 4-bit hidden weights as ONNX INT4, 8-bit first and last layers.",
        "onnxruntime-qlinearconv: the cnn's default export (conv='qlinear', every convolution ORT's QLinearConv), "
        "int8 for the w8a8 preset and int4 for w4a4; its onnxruntime int8 and int4 rows are conv='integer' "
        "(ConvInteger, bit for bit stejax's integer forward).",
        "rules-mlp's stejax runtime is the jitted fake-quantised NNX model (stejax has no integer forward for it).",
        f"Throughput ratios at batch 256 on {mlp_name} (median and spread of {rounds} per-round ratios): "
        f"ORT int8 over ORT float {figures['ort_int8_vs_float_mlp_b256'].text}, ORT int8 over stejax int8 "
        f"{figures['ort_int8_vs_stejax_mlp_b256'].text}.",
    ]
    return {
        "config": {"width": width, "threads": THREADS, "rounds": rounds},
        "groups": bench_groups,
        "rows": rows,
        "figures": {key: figure.to_dict() for key, figure in figures.items()},
        "notes": notes,
    }
