"""The lm-decode benchmark's own machinery: its rows, figures, results files and plots, on the CPU and accelerator
paths, with tiny models (the benchmark itself: ``stejax bench --suite lm-decode`` and
``benchmarks/lm_decode_device.sh``)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from stejax.lm import LMConfig, LowBitLinear, Transformer
from stejax.lm._export import export_lm

TINY = LMConfig(context=272, width=32, depth=1, heads=2, hidden=64)
PROMPTS = (b"def main():", b"x = y + 1\n")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    model = Transformer(TINY, rngs=nnx.Rngs(params=7))
    root = tmp_path_factory.mktemp("bench_lm_decode")
    return model, {c: export_lm(model, c, root / c) for c in ("float", "w1.58a8")}


def test_the_lm_decode_rows_figures_results_file_and_plot(artifacts, tmp_path):
    from stejax.bench._lm_decode import COLUMNS, BenchModel, compiled_rows, figures, plot
    from stejax.bench.results import Recorder, load_results

    model, paths = artifacts
    bench = BenchModel("tiny", TINY, 1, model, {c: paths[c] for c in ("float", "w1.58a8")})
    rows = compiled_rows(
        [bench], list(PROMPTS), batches=(1,), tokens=8, loop_tokens=4, repeats=1, warmup=1, configs=("float", "w1.58a8")
    )
    fields = {"model", "params", "config", "batch", "path", "bytes_per_s", "first_byte_ms"}
    fields |= {"resident_weight_bytes", "compiles"}
    assert all(fields <= set(r) for r in rows)
    kinds = {(r["weights"], r["path"]) for r in rows}
    assert kinds == {("float32", "loop"), ("float32", "compiled"), ("ternary-int8", "loop")} | {
        ("ternary-int8", "compiled"),
        ("ternary-2bit", "compiled"),
    }
    assert all(r["compiles"] == 0 and r["bytes_per_s"] > 0 for r in rows)
    judged = figures(rows, None)
    assert judged["compiles_after_warmup"].met is True and judged["ternary_bytes_vs_float32"].met is True
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    doc = Recorder("lm_decode", command="stejax bench --suite lm-decode").write(
        tmp_path / "lm_decode.json", rows=public, columns=COLUMNS, figures=judged
    )
    assert load_results(tmp_path / "lm_decode.json")["rows"] == doc["rows"]
    assert plot(public, tmp_path / "lm_decode.png").stat().st_size > 0


def test_random_large_model_forms_and_accelerator_rows(tmp_path):
    from stejax.bench._lm_decode import (
        DEVICE_COLUMNS,
        _commits_apart,
        device_figures,
        device_plot,
        device_rows,
        merge_device_results,
        random_model,
    )
    from stejax.bench.results import Recorder, load_results
    from stejax.lowbit._packing import unpack_slices

    small = LMConfig(context=32, width=64, depth=1, heads=2, hidden=128)
    model, params = random_model("small", "ternary-2bit", config=small, fuse_projections=False)
    layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, LowBitLinear)]
    shapes = nnx.state(nnx.eval_shape(lambda: Transformer(small, rngs=nnx.Rngs(0))), nnx.Param)  # no program
    assert len(layers) == 7 and params == sum(int(x.size) for x in jax.tree.leaves(shapes))
    codes = np.concatenate([np.asarray(c).ravel() for c in unpack_slices(layers[0].codes[...], 2)])
    assert set(np.unique(codes).tolist()) == {-1, 0, 1}  # valid ternary codes, packed
    with jax.numpy_dtype_promotion("standard"):  # a bfloat16 model meets float32 rotary angles (as users run it)
        rows = device_rows(
            "small", ("bfloat16", "int4"), (1,), tokens=4, repeats=1, loop_bytes=3, config=small, prompt_bytes=8
        )
    assert [(r["weights"], r["batch"], r["path"]) for r in rows] == [
        ("bfloat16", 1, "compiled"),
        ("bfloat16", 1, "loop"),
        ("int4", 1, "compiled"),
        ("int4", 1, "loop"),
    ]
    for r in rows:
        assert r["compiles"] == 0 and r["implementation"] == "xla"  # no kernel chosen off a verified TPU
        assert r["roofline"] == pytest.approx(r["resident_weight_bytes"] / (r["step_us"] * 1e-6) / 819e9)
    figures = device_figures(rows)
    assert figures["compiles_after_warmup"].met is True
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"part{i}.json")
        Recorder("lm_decode_device", command="test").write(
            parts[-1], rows=rows[2 * i : 2 * i + 2], columns=DEVICE_COLUMNS
        )
    doc = merge_device_results(parts, tmp_path / "merged.json", command="bash benchmarks/lm_decode_device.sh")
    assert [{k: v for k, v in r.items() if k not in ("commit", "date")} for r in doc["rows"]] == rows
    assert "compiles_after_warmup" in doc["figures"]
    # A later run's row replaces the same row of an earlier one and keeps its own run's commit.
    later = {**rows[0], "step_us": rows[0]["step_us"] / 2}
    Recorder("lm_decode_device", command="test").write(
        tmp_path / "later.json", rows=[later], columns=DEVICE_COLUMNS, commit={"id": "later"}, date="2999-01-01"
    )
    again = merge_device_results([*parts, tmp_path / "later.json"], tmp_path / "again.json", command="test")
    assert len(again["rows"]) == len(rows) and again["rows"][-1]["step_us"] == later["step_us"]
    assert again["rows"][-1]["commit"] == "later" and again["commit"]["id"] == "later"
    assert {r["commit"] for r in again["rows"][:-1]} == {doc["rows"][0]["commit"]}
    # A ratio over rows of different runs says so (the rows' commits); over one run's rows it does not.
    assert _commits_apart(rows[0], rows[1]) == "" == _commits_apart(again["rows"][0], again["rows"][1])
    apart = _commits_apart(again["rows"][-1], {**again["rows"][0], "commit": "abc"})
    assert apart == "; its rows were measured at different commits (abc, later)"
    other = load_results(parts[0])
    other["machine"]["device"] = "some other device"
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="different devices"):
        merge_device_results([parts[0], tmp_path / "other.json"], tmp_path / "no.json", command="test")
    assert device_plot(doc["rows"], tmp_path / "plot.png").stat().st_size > 0


def test_decode_bench_forms_choose_the_vector_unit_and_its_figures_compare_the_products(tmp_path):
    from stejax.bench._lm_decode import _implementation, device_figures, main, random_model

    small = LMConfig(context=32, width=64, depth=1, heads=2, hidden=128)
    model, _ = random_model("small", "ternary-2bit", implementation="pallas-vpu", config=small, fuse_projections=False)
    layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, LowBitLinear)]
    assert len(layers) == 7 and all(m.method == "vpu" and m.implementation == "pallas" for m in layers)
    assert _implementation(model, 1) == "pallas-vpu" and _implementation(model, 9) == "pallas"
    mxu, _ = random_model("small", "ternary-2bit", implementation="pallas", config=small)
    assert _implementation(mxu, 1) == "pallas"

    def row(weights, implementation, rate):
        return {
            "model": "1B",
            "weights": weights,
            "implementation": implementation,
            "batch": 1,
            "path": "compiled",
            "decode_bytes_per_s": rate,
            "roofline": 0.5,
            "compiles": 0,
        }

    rows = [
        row("bfloat16", "xla", 100.0),
        row("ternary-2bit", "pallas", 150.0),
        row("ternary-2bit", "pallas-vpu", 450.0),
    ]
    figures = device_figures(rows)
    assert figures["ternary_2bit_vpu_vs_mxu_1B"].value == 3.0
    assert figures["ternary_2bit_vs_bf16_1B"].value == 4.5 and figures["ternary_2bit_vs_bf16_1B"].met is True
    assert "pallas-vpu" in figures["ternary_2bit_vs_bf16_1B"].note
    with pytest.raises(SystemExit):
        main(["--model", "1B", "--forms", "int8@cuda", "--out", str(tmp_path / "x.json")])


def test_the_decode_bench_fuses_the_projections_by_default_and_records_it(tmp_path):
    from stejax.bench._lm_decode import DEVICE_COLUMNS, _projections, device_rows, merge_device_results, random_model
    from stejax.bench.results import Recorder
    from stejax.lowbit.nnx import SplitLinear

    small = LMConfig(context=32, width=64, depth=1, heads=2, hidden=128)
    for form in ("int8", "int4", "ternary-int8", "ternary-2bit"):
        model, _ = random_model("small", form, config=small)
        layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, LowBitLinear)]
        assert len(layers) == 4 and _projections(model) == "fused", form
        attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
        assert isinstance(attn.qkv, SplitLinear) and attn.qkv.widths == (64, 64, 64)
        assert isinstance(mlp.gate_up, SplitLinear) and mlp.gate_up.widths == (128, 128)
        assert not hasattr(attn, "q") and not hasattr(mlp, "gate")
    separate, _ = random_model("small", "ternary-2bit", config=small, fuse_projections=False)
    assert _projections(separate) == "separate"
    rows = device_rows("small", ("ternary-2bit",), (1,), tokens=3, repeats=1, config=small, prompt_bytes=8)
    rows += device_rows(
        "small", ("ternary-2bit",), (1,), tokens=3, repeats=1, config=small, prompt_bytes=8, fuse_projections=False
    )
    assert [r["projections"] for r in rows] == ["fused", "separate"]
    # Fused and separate rows of one form stand side by side in a merged file; a row without the field is a
    # separate one (measured before projections were fused) and is replaced by a newer separate row.
    old = {k: v for k, v in rows[1].items() if k != "projections"}
    for i, part in enumerate(([old], rows)):
        Recorder("lm_decode_device", command="test").write(tmp_path / f"p{i}.json", rows=part, columns=DEVICE_COLUMNS)
    doc = merge_device_results([tmp_path / "p0.json", tmp_path / "p1.json"], tmp_path / "m.json", command="test")
    assert [r["projections"] for r in doc["rows"]] == ["fused", "separate"]
