"""stejax.bench: the statistics, the measuring protocol, the report's schema, and a quick run of every suite.

Correctness only: no test here judges a time.
"""

import copy
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stejax.bench import (
    FORMAT,
    SUITES,
    BenchSettings,
    CompileCounter,
    check_report,
    machine_info,
    measure,
    peers_suite,
    ratio_stats,
    run_bench,
    summarize,
    versions,
)
from stejax.model import PRESETS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ESTIMATORS = ["round_ste", "sign_ste", "rotation_trick"]


# ----------------------------------------------------------------------------- statistics


def test_summarize_gives_the_distribution_in_milliseconds():
    # 1 ms .. 100 ms: the q-th percentile sits at rank q/100 * 99 (linear interpolation).
    s = summarize([k / 1000 for k in range(1, 101)])
    assert s["n"] == 100
    assert s["min_ms"] == pytest.approx(1.0) and s["max_ms"] == pytest.approx(100.0)
    assert s["p50_ms"] == pytest.approx(50.5)  # rank 49.5: between 50 and 51
    assert s["p90_ms"] == pytest.approx(90.1)  # rank 89.1: 90 + 0.1
    assert s["p99_ms"] == pytest.approx(99.01)  # rank 98.01: 99 + 0.01
    assert s["mean_ms"] == pytest.approx(50.5)


def test_summarize_on_unsorted_samples():
    s = summarize([0.005, 0.001, 0.004, 0.002, 0.003])
    assert (s["min_ms"], s["p50_ms"], s["max_ms"]) == pytest.approx((1.0, 3.0, 5.0))
    assert s["p90_ms"] == pytest.approx(4.6) and s["p99_ms"] == pytest.approx(4.96)  # ranks 3.6 and 3.96


@pytest.mark.parametrize(
    ("samples", "message"),
    [([], "at least one duration"), ([0.1, float("nan")], "finite and >= 0"), ([-1e-3], "finite and >= 0")],
)
def test_summarize_rejects_bad_samples(samples, message):
    with pytest.raises(ValueError, match=message):
        summarize(samples)


def test_ratio_stats_are_per_round():
    r = ratio_stats([2.0, 4.0, 6.0], [1.0, 4.0, 2.0])  # ratios 2, 1, 3
    assert r["n"] == 3 and r["p50"] == pytest.approx(2.0)
    assert r["p10"] == pytest.approx(1.2) and r["p90"] == pytest.approx(2.8)
    with pytest.raises(ValueError, match="two equal, non-empty series"):
        ratio_stats([1.0], [1.0, 2.0])


# ----------------------------------------------------------------------------- the protocol


@pytest.mark.counts_compilations
def test_measure_warms_up_then_interleaves_in_rotating_order():
    order = []
    f = jax.jit(lambda x: x * 2.0 + 1.0)
    g = jax.jit(lambda x: jnp.sin(x))
    x = jnp.ones(5)

    def call(name, fn):
        def run():
            order.append(name)
            return fn(x)

        return run

    out = measure({"a": call("a", f), "b": call("b", g)}, repeats=4, warmup=2)
    warm, rounds = order[:4], order[4:]
    assert warm == ["a", "a", "b", "b"] and rounds == ["a", "b", "b", "a", "a", "b", "b", "a"]
    for name in ("a", "b"):
        assert len(out[name]["seconds"]) == 4 and out[name]["stats_ms"]["n"] == 4
        assert out[name]["compiles_warmup"] >= 1  # the first call compiled ...
        assert out[name]["compiles_timed"] == 0  # ... and no timed call did


def test_measure_cpu_clock_leaves_out_waiting_and_averages_calls_per_sample():
    order = []

    def sleeper():  # waits 20 ms and does (almost) no work: wall time counts it, CPU time does not
        order.append("s")
        time.sleep(0.02)
        return jnp.ones(1)

    wall = measure({"s": sleeper}, repeats=2, warmup=1)
    assert min(wall["s"]["seconds"]) >= 0.02
    order.clear()
    cpu = measure({"s": sleeper}, repeats=2, warmup=1, clock="cpu", calls_per_sample=3)
    assert len(order) == 1 + 2 * 3 and len(cpu["s"]["seconds"]) == 2
    assert max(cpu["s"]["seconds"]) < 0.01


@pytest.mark.counts_compilations
def test_a_compile_in_the_timed_rounds_is_counted():
    x = jnp.ones(3)
    # A fresh function every call: every call compiles.
    out = measure({"recompiles": lambda: jax.jit(lambda v: v + 1.0)(x)}, repeats=3, warmup=1)
    assert out["recompiles"]["compiles_timed"] == 3


@pytest.mark.counts_compilations
def test_compile_counter_counts_compilations_only():
    f = jax.jit(lambda v: v * 3.0)
    x = jnp.ones(7)
    with CompileCounter() as first:
        f(x).block_until_ready()
    with CompileCounter() as second:
        f(x).block_until_ready()
    assert first.count >= 1 and first.seconds > 0
    assert second.count == 0 and second.seconds == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repeats": 0, "warmup": 1}, "repeats must be an int >= 1"),
        ({"repeats": 1, "warmup": 0}, "warmup must be"),
        ({"repeats": 1, "warmup": 1, "clock": "gpu"}, "clock must be one of"),
        ({"repeats": 1, "warmup": 1, "calls_per_sample": 0}, "calls_per_sample must be an int >= 1"),
    ],
)
def test_measure_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure({"a": lambda: jnp.ones(1)}, **kwargs)


def test_settings():
    full = BenchSettings.make()
    assert (full.rounds, full.repeats, full.warmup) == (5, 6, 3)
    quick = BenchSettings.make(quick=True, repeats=7)
    assert quick.quick and quick.repeats == 7 and quick.warmup == 1 and quick.estimator_size == 2**12
    assert quick.rounds == 1 and BenchSettings.make(quick=True, rounds=3).rounds == 3
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        BenchSettings.make(warmup=0)
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        BenchSettings.make(rounds=0)


def test_the_suites_with_figures_per_round_take_the_rounds_and_the_others_every_pass(monkeypatch):
    import stejax.bench._run as run_module

    seen: dict[str, dict] = {}

    def fake(name):
        def suite(**kwargs):
            seen[name] = kwargs
            return {"groups": [], "rows": []}

        return suite

    for runner, name in (("estimators_suite", "estimators"), ("train_suite", "train"), ("_onnx_suite", "onnx")):
        monkeypatch.setattr(run_module, runner, fake(name))
    settings = BenchSettings.make(quick=True, rounds=2, repeats=3)
    run_bench(["estimators", "train", "onnx"], out_dir=None, settings=settings)
    assert (seen["estimators"]["rounds"], seen["estimators"]["repeats"]) == (2, 3)
    assert (seen["onnx"]["rounds"], seen["onnx"]["repeats"]) == (2, 3)
    assert seen["train"]["repeats"] == 6 and "rounds" not in seen["train"]


def test_machine_and_versions():
    m = machine_info()
    assert m["cores"] >= 1 and m["device"].startswith(jax.devices()[0].platform) and m["cpu"]
    v = versions()
    assert v["jax"] == jax.__version__ and v["numpy"] == np.__version__ and "qwix" in v


# ----------------------------------------------------------------------------- a quick run of every suite
# One test per suite, each its own quick run (no shared fixture: the suites spread over the test workers).


def quick_run(suites, out, **kwargs):
    """``run_bench`` at quick sizes, 2 timed rounds, into ``out``; the report, checked against its schema, and
    its three files, checked against it."""
    report = run_bench(suites, out_dir=out, settings=BenchSettings.make(quick=True, repeats=2), **kwargs)
    check_report(report)
    assert report["format"] == FORMAT
    assert json.loads((out / "bench.json").read_text()) == json.loads(json.dumps(report))
    text = (out / "bench.md").read_text()
    for heading in ("# stejax bench", *(f"## {name}" for name in report["suites"]), "Protocol:"):
        assert heading in text, heading
    if any(suite["groups"] for suite in report["suites"].values()):
        assert (out / "bench.png").read_bytes()[:8] == PNG_SIGNATURE
    else:  # lm-decode alone: rows, no timed groups to draw
        assert not (out / "bench.png").exists()
    return report


def suite_ran_and_no_timed_call_compiled(name, suite):
    assert suite["status"] == "ok", (name, suite["note"])
    # lm-decode reports rows (one per model, configuration, path and batch) instead of timed groups.
    assert suite["groups"] or suite.get("rows"), name
    if name == "lm-decode":
        assert all(row["compiles"] == 0 for row in suite["rows"]), suite["rows"]
    for group in suite["groups"]:
        for variant, m in group["variants"].items():
            assert m["compiles_timed"] == 0, (name, group["name"], variant)
            assert m["stats_ms"]["n"] == 2


def test_all_runs_every_suite_in_order_and_writes_one_report(monkeypatch, tmp_path):
    import stejax.bench._run as run_module

    def fake(name):
        def suite(**kwargs):
            assert kwargs["repeats"] == 2 and kwargs["warmup"] == 1
            group = {"name": name, "baseline": None, "ratios": {}, "info": {}}
            variant = {"seconds": [1e-3, 2e-3], "stats_ms": summarize([1e-3, 2e-3])}
            variants = {name: {**variant, "compiles_warmup": 1, "compiles_timed": 0}}
            return {"groups": [{**group, "variants": variants}], "rows": []}  # rows: lm-decode's

        return suite

    # Each suite's own run is below; here all but the (fast) estimators suite stand in for themselves.
    runners = ("train_suite", "inference_suite", "peers_suite", "_onnx_suite", "_lm_decode_suite", "_train_step_suite")
    for runner, name in zip(runners, SUITES[1:], strict=True):
        monkeypatch.setattr(run_module, runner, fake(name))
    report = quick_run(["all"], tmp_path, estimators=["round_ste"])
    assert list(report["suites"]) == list(SUITES) and report["settings"]["suites"] == list(SUITES)
    for name, suite in report["suites"].items():
        suite_ran_and_no_timed_call_compiled(name, suite)
        assert [g["name"] for g in suite["groups"]] == ["round_ste" if name == "estimators" else name]


@pytest.mark.counts_compilations
def test_the_estimators_suite_compares_ours_with_both_forms(tmp_path):
    suite = quick_run(["estimators"], tmp_path, estimators=ESTIMATORS)["suites"]["estimators"]
    suite_ran_and_no_timed_call_compiled("estimators", suite)
    assert [g["name"] for g in suite["groups"]] == ESTIMATORS
    by_name = {g["name"]: g for g in suite["groups"]}
    assert set(by_name["round_ste"]["variants"]) == {"ours", "stop_gradient", "fused"}
    assert set(by_name["round_ste"]["ratios"]) == {"ours/stop_gradient", "ours/fused"}
    assert by_name["round_ste"]["info"]["form"] == "x + sg(f(x) - x)"
    # A tangent map has no fused form.
    assert "fused" not in by_name["rotation_trick"]["variants"]
    assert by_name["rotation_trick"]["info"]["meets_fused_target"] is None
    for g in suite["groups"]:
        assert all(d == 0 for d in g["info"]["max_grad_diff"].values()), g["name"]
        # The first, compiling calls are counted as warm-up.
        assert all(m["compiles_warmup"] >= 1 for m in g["variants"].values())


def test_the_train_suite_times_every_preset_against_float(tmp_path):
    report = quick_run(["train"], tmp_path)
    suite_ran_and_no_timed_call_compiled("train", report["suites"]["train"])
    (group,) = report["suites"]["train"]["groups"]
    variants = list(group["variants"])
    full = [f"{p} (with statistics)" for p in ("float", "w8a8", "w4a4")]  # the update with its statistics
    assert [v for v in variants if v not in full] == list(PRESETS) and set(full) <= set(variants)
    assert group["baseline"] == "float"
    assert set(group["ratios"]) == {f"{v}/float" for v in variants if v != "float"}
    # check_report names what is wrong.
    broken = copy.deepcopy(report)
    del broken["suites"]["train"]["groups"][0]["variants"]["float"]["stats_ms"]["p99_ms"]
    with pytest.raises(ValueError, match=r"suites\.train\.groups\[0\]\.variants\['float'\]\.stats_ms"):
        check_report(broken)
    broken = copy.deepcopy(report)
    broken["suites"]["train"].update(status="skipped", note="")
    with pytest.raises(ValueError, match="a skipped or failed suite says why"):
        check_report(broken)


def test_the_inference_suite_has_float_fake_quant_and_integer(tmp_path):
    suite = quick_run(["inference"], tmp_path)["suites"]["inference"]
    suite_ran_and_no_timed_call_compiled("inference", suite)
    assert [g["info"]["batch_size"] for g in suite["groups"]] == [1, 32]
    expected = {"float", "fake-quant w8a8", "fake-quant w4a4", "integer w8a8", "integer w4a4"}
    for group in suite["groups"]:
        assert set(group["variants"]) == expected


def test_the_train_step_suite_counts_the_int8_products(tmp_path):
    from stejax.bench._train_step import _write, results_path, train_step_suite
    from stejax.bench.results import Recorder, load_results

    suite = train_step_suite(
        repeats=1, warmup=1, quick=True, variants=("float32", "stejax int8 fwd+bwd"), results_dir=None
    )
    rows = {r["variant"]: r for r in suite["rows"]}
    # 2 blocks x 7 linears: 14 forward products, and 2 backward products each in int8.
    assert (rows["float32"]["int8_dots"], rows["stejax int8 fwd+bwd"]["int8_dots"]) == (0, 42)
    assert rows["float32"]["vs_float32"] == 1.0 and rows["stejax int8 fwd+bwd"]["vs_float32"] > 0
    # A width measured later is merged into the file of the same device, the other widths' rows kept.
    recorder = Recorder(results_path(tmp_path).stem, command="stejax bench --suite train-step")
    _write(recorder, tmp_path, [dict(r, width=64) for r in suite["rows"]])
    _write(recorder, tmp_path, suite["rows"])
    doc = load_results(results_path(tmp_path))
    assert [(r["width"], r["variant"]) for r in doc["rows"]] == [
        (32, "float32"),
        (32, "stejax int8 fwd+bwd"),
        (64, "float32"),
        (64, "stejax int8 fwd+bwd"),
    ]


@pytest.mark.parametrize("name", ["onnx", "lm-decode"])
def test_the_onnx_and_lm_decode_suites_run(tmp_path, name):
    suite_ran_and_no_timed_call_compiled(name, quick_run([name], tmp_path)["suites"][name])


def test_the_peers_suite_runs_qwix_with_quantised_products(monkeypatch, tmp_path):
    import importlib.util

    import stejax.bench._peers_lm
    import stejax.bench._peers_rules

    # The groups by rules and on the language model are checked below, on their own (the suite's two halves
    # then go to different test workers); here they stand aside with a note each.
    monkeypatch.setattr(stejax.bench._peers_rules, "rules_peer_groups", lambda **kw: ([], ["rules: checked apart"]))
    monkeypatch.setattr(stejax.bench._peers_lm, "lm_peer_groups", lambda **kw: ([], ["lm: checked apart"]))
    suite = quick_run(["peers"], tmp_path)["suites"]["peers"]
    suite_ran_and_no_timed_call_compiled("peers", suite)
    group, cnn, *snn = suite["groups"]
    assert set(group["variants"]) == {
        "stejax float",
        "stejax w8a8",
        "stejax w8a8 (with statistics)",
        "stejax int8",
        "stejax int8 (integer products)",
        "flax float",
        "qwix int8",
    }
    assert {
        "qwix int8/stejax w8a8",
        "stejax int8/qwix int8",
        "stejax int8 (integer products)/qwix int8",
        "stejax w8a8 (with statistics)/stejax w8a8",
        "stejax w8a8/stejax float",
    } <= set(group["ratios"])
    assert set(cnn["variants"]) == {"stejax int8", "flax float", "qwix int8"}
    assert "stejax int8/qwix int8" in cnn["ratios"] and cnn["info"]["qwix_quantised_dot_generals"] > 0
    assert group["info"]["qwix_quantised_dot_generals"] > 0
    assert any("AQT" in note for note in suite["notes"])
    assert {"rules: checked apart", "lm: checked apart"} <= set(suite["notes"])
    # The spiking peer: Spyx's step beside stejax.snn's (quick: T = 8 only); without Spyx, no group and a note
    # (tests/test_snn_peers.py).
    if importlib.util.find_spec("spyx") is None:
        assert snn == [] and any("Spyx not installed" in note for note in suite["notes"])
    else:
        (spiking,) = snn
        assert set(spiking["variants"]) == {"stejax", "spyx"}
        ratio = spiking["ratios"]["stejax/spyx"]
        assert ratio["n"] == 2 and ratio["p50"] > 0
        assert spiking["info"]["T"] == 8 and "superspike" in spiking["info"]["spike function"]


def test_the_peer_groups_by_rules_and_on_the_language_model():
    from stejax.bench._peers_lm import lm_peer_groups
    from stejax.bench._peers_rules import rules_peer_groups

    rules, _ = rules_peer_groups(repeats=2, warmup=1, quick=True)
    lm, _ = lm_peer_groups(repeats=2, warmup=1, quick=True)
    suite_ran_and_no_timed_call_compiled("peers", {"status": "ok", "note": "", "groups": [*rules, *lm]})
    assert [g["info"]["model"] for g in rules] == ["digits CNN", "transformer block"]
    for group in rules:
        assert set(group["variants"]) == {"flax float", "qwix int8", "stejax int8"}, group["name"]
        assert set(group["ratios"]) == {"stejax int8/qwix int8", "qwix int8/flax float", "stejax int8/flax float"}
        assert group["info"]["qwix_quantised_dot_generals"] > 0 and group["info"]["stejax_quantised_sites"]
    (group,) = lm
    assert set(group["variants"]) == {
        "flax float",
        "qwix int8",
        "stejax w8a8",
        "qwix int4 weight-only",
        "stejax w4 weight-only",
    }
    assert set(group["ratios"]) == {
        "stejax w8a8/qwix int8",
        "stejax w4 weight-only/qwix int4 weight-only",
        "qwix int8/flax float",
        "stejax w8a8/flax float",
    }
    assert group["info"]["qwix_quantised_dot_generals"] > 0


# ----------------------------------------------------------------------------- skips and errors


def test_peers_is_skipped_with_a_note_without_qwix(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "qwix", None)  # `import qwix` now raises ImportError
    result = peers_suite(repeats=1, warmup=1, quick=True)
    assert result["status"] == "skipped" and result["groups"] == []
    assert "qwix not installed" in result["note"] and "stejax[peers]" in result["note"]
    report = run_bench(["peers"], out_dir=tmp_path, settings=BenchSettings.make(quick=True))
    check_report(report)
    assert report["suites"]["peers"]["status"] == "skipped"
    assert "**skipped**: qwix not installed" in (tmp_path / "bench.md").read_text()


def test_a_failing_suite_is_recorded_and_the_others_still_run(monkeypatch):
    import stejax.bench._run as run_module

    def broken(**kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(run_module, "train_suite", broken)
    report = run_bench(
        ["train", "estimators"],
        out_dir=None,
        settings=BenchSettings.make(quick=True, repeats=1),
        estimators=["round_ste"],
    )
    check_report(report)
    assert (
        report["suites"]["train"]["status"] == "error" and "RuntimeError: planted" in report["suites"]["train"]["note"]
    )
    assert report["suites"]["estimators"]["status"] == "ok"


def test_unknown_suites_and_estimators_are_refused():
    with pytest.raises(ValueError, match="unknown suite 'speed'"):
        run_bench(["speed"], out_dir=None)
    with pytest.raises(ValueError, match="no estimator named 'round'"):
        run_bench(["estimators"], out_dir=None, settings=BenchSettings.make(quick=True), estimators=["round"])


# ----------------------------------------------------------------------------- gradients before times


def test_estimators_with_trainable_parameters_time_every_gradient():
    from stejax.bench._estimators import estimators_suite

    suite = estimators_suite(repeats=1, warmup=1, size=256, names=["lsq", "lsq_plus", "pact"])
    wrt = {g["name"]: g["info"]["grad_wrt"] for g in suite["groups"]}
    assert wrt == {"lsq": ["x", "step"], "lsq_plus": ["x", "step", "offset"], "pact": ["x", "alpha"]}
    for g in suite["groups"]:
        assert g["info"]["status"] == "ok" and g["info"]["grad_tolerance"] == 0.0, g["info"]["failure"]
        assert set(g["info"]["max_grad_diff"]) == {"stop_gradient", "fused"}
        assert all(d == 0 for d in g["info"]["max_grad_diff"].values()), g["name"]
        assert "(step - sg(step)) * sg(d_step)" in g["info"]["form"] or g["name"] == "pact"
    assert suite["notes"] == []


def test_a_stop_gradient_form_with_another_gradient_fails_the_estimator(monkeypatch):
    import stejax.bench._estimators as estimators_module
    from stejax.bench._report import markdown

    def wrong_form(entry, x, args, key, call, partial_x):
        sg = jax.lax.stop_gradient
        # Twice the declared derivative: the same value, another gradient.
        return "planted", lambda x, args, key: sg(call(entry.forward, x, args, key)) + 2.0 * (x - sg(x))

    monkeypatch.setattr(estimators_module, "stop_gradient_form", wrong_form)
    suite = estimators_module.estimators_suite(repeats=1, warmup=1, size=64, names=["round_ste"])
    (group,) = suite["groups"]
    info = group["info"]
    assert info["status"] == "failed" and info["max_grad_diff"]["stop_gradient"] > 0
    assert info["meets_stop_gradient_target"] is False and info["meets_fused_target"] is False
    assert info["failure"].startswith("stop_gradient: the gradient with respect to x differs from ours by")
    assert "the tolerance is 0 * max(1, |ours|)" in info["failure"]
    assert suite["notes"] and suite["notes"][0].startswith("FAILED round_ste: gradients disagree")
    report = run_bench(
        ["estimators"], out_dir=None, settings=BenchSettings.make(quick=True, repeats=1), estimators=["round_ste"]
    )
    check_report(report)
    text = markdown(report)
    assert "**FAILED**: gradients differ" in text and "- FAILED round_ste" in text


# ----------------------------------------------------------------------------- the persistent compilation cache


def test_cache_dir_is_under_the_user_s_cache_directory(monkeypatch, tmp_path):
    from stejax._compile_cache import cache_dir

    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "stejax" / "jax"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir({"XDG_CACHE_HOME": ""}) == tmp_path / ".cache" / "stejax" / "jax"


def test_the_command_line_keeps_compiled_programs_in_the_cache_only_when_asked(monkeypatch, tmp_path):
    from click.testing import CliRunner
    from jax._src import compilation_cache

    from stejax.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        monkeypatch.delenv(name, raising=False)
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        # The suite's own cache (tests/conftest.py) stands aside: the command line starts from no cache.
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()
        # Off in the suite (STEJAX_COMPILE_CACHE=0): nothing is configured.
        assert CliRunner().invoke(main, ["list"]).exit_code == 0
        assert jax.config.jax_compilation_cache_dir is None
        result = CliRunner().invoke(main, ["--compile-cache", "list"])
        assert result.exit_code == 0, result.output
        directory = tmp_path / "stejax" / "jax"
        assert jax.config.jax_compilation_cache_dir == str(directory)
        compilation_cache.reset_cache()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.jit(lambda x: jnp.sin(x) * 3.5 + 0.25)(jnp.arange(7.0)).block_until_ready()
        assert any(directory.iterdir())
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache.reset_cache()
