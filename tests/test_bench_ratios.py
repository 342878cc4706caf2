"""The ratios the pages cite, measured in interleaved rounds: benchmarks/estimators.py, peers_results.py, qat_step.py
and ``stejax bench --suite onnx``.

Each command runs here at tiny settings (2 rounds, 2 timed calls of each variant per round) on stand-in calls
whose times a test sets round by round, on a clock that only those calls move: the order of the calls shows the
rounds interleaved, and every ratio gets one sample per round, written with its spread by ``Figure.ratio``. Each
command has one ratio whose rounds straddle 1 ("level with", its target missed though its median meets it) and
one that is wholly on its target's side. One run of estimators.py times real estimators.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import stejax.bench._measure as measure_module
from stejax.bench import measure_rounds, round_ratios
from stejax.bench.results import Figure, check_markers, check_results, load_results, render_markdown

from helpers import benchmark_script

ROOT = Path(__file__).resolve().parents[1]

# Times per round (seconds, binary fractions so that the clock's sums are exact): against a denominator of
# (1, 2), CLEAR gives the ratios (0.75, 0.8125), wholly below 1; STRADDLE gives (0.8125, 1.0625), whose median
# (0.9375) meets a bound of 0.95 or 1.0 that its spread does not.
DENOMINATOR = (1.0, 2.0)
CLEAR = (0.75, 1.625)
STRADDLE = (0.8125, 2.125)


class Clock:
    """A clock that only stand-in calls move, and the order in which they were called."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def call(self, name: str, times: tuple[float, ...], *, warmup: int, repeats: int, per_sample: int = 1):
        """A call that takes ``times[r]`` in round ``r`` (its first ``warmup`` calls take none)."""
        made = [0]

        def run() -> None:
            timed = made[0] - warmup
            made[0] += 1
            self.calls.append(name)
            if timed >= 0:
                self.now += times[timed // (repeats * per_sample)]

        return run


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    for name in ("wall", "cpu"):
        monkeypatch.setitem(measure_module.CLOCKS, name, fake)
    return fake


def interleaved(groups: dict[str, list[str]], *, rounds: int, repeats: int, warmup: int) -> list[str]:
    """The order of calls measure_rounds promises: warm-up, then each round every group in turn (rotated by one each
    round), ``repeats`` passes over its variants (rotated by one each pass)."""
    order = [name for names in groups.values() for name in names for _ in range(warmup)]
    labels = list(groups)
    for r in range(rounds):
        for k in range(len(labels)):
            names = groups[labels[(r + k) % len(labels)]]
            for p in range(repeats):
                order += [names[(r * repeats + p + j) % len(names)] for j in range(len(names))]
    return order


def script(name: str):
    return benchmark_script(name)


def check_figure(figure: dict, samples: list[float], *, bound: float, lower_is_better: bool = True) -> None:
    """``figure`` (as written) is Figure.ratio of ``samples``: text, spread and a target judged on the spread."""
    expected = Figure.ratio(samples, bound=bound, lower_is_better=lower_is_better)
    lo, hi = min(samples), max(samples)
    assert list(figure["spread"]) == pytest.approx([lo, statistics.median(samples), hi])
    assert figure["text"] == expected.text and figure["target"] == expected.target
    assert figure["met"] is (hi <= bound if lower_is_better else lo >= bound)
    if lo <= 1 <= hi:
        assert figure["text"].startswith("level with (") and figure["met"] is False


# ----------------------------------------------------------------------------- the protocol


def test_measure_rounds_interleaves_the_groups_and_gives_one_ratio_per_round(clock):
    groups = {
        "A": {
            "a": clock.call("a", CLEAR, warmup=1, repeats=2),
            "b": clock.call("b", DENOMINATOR, warmup=1, repeats=2),
        },
        "B": {
            "c": clock.call("c", STRADDLE, warmup=1, repeats=2),
            "d": clock.call("d", DENOMINATOR, warmup=1, repeats=2),
        },
    }
    measured = measure_rounds(groups, rounds=2, repeats=2, warmup=1)
    assert clock.calls == interleaved({"A": ["a", "b"], "B": ["c", "d"]}, rounds=2, repeats=2, warmup=1)
    assert measured["A"]["a"]["rounds"] == [[0.75, 0.75], [1.625, 1.625]]
    assert round_ratios(measured["A"], "a", "b") == [0.75, 0.8125]
    assert round_ratios(measured["B"], "c", "d") == [0.8125, 1.0625]
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        measure_rounds(groups, rounds=0, repeats=1, warmup=1)


def test_a_spread_that_straddles_the_bound_misses_the_target_its_median_meets():
    figure = Figure.ratio([0.875, 1.125], bound=1.05)
    assert figure.value == 1.0 and figure.text == "level with (0.88–1.12×)" and figure.met is False


# ----------------------------------------------------------------------------- benchmarks/estimators.py


def test_estimators_figures_are_per_round_medians_over_the_catalog(clock, monkeypatch, tmp_path):
    import stejax.bench._estimators as estimators_module

    # Per round, the members' ratios are (0.75, 0.8125), (0.8125, 1.1875) and (0.625, 0.96875): the catalog's
    # medians (0.75, 0.96875), whose median (0.86) meets 0.9 and whose spread does not.
    times = {"round_ste": CLEAR, "sign_ste": (0.8125, 2.375), "floor_ste": (0.625, 1.9375)}

    def prepared(entry, *, size):
        name = entry.name
        calls = {
            "ours": clock.call(f"{name} ours", times[name], warmup=1, repeats=2),
            "stop_gradient": clock.call(f"{name} sg", DENOMINATOR, warmup=1, repeats=2),
            "fused": clock.call(f"{name} fused", DENOMINATOR, warmup=1, repeats=2),
        }
        info = {"family": entry.family, "form": "x + sg(f(x) - x)", "max_grad_diff": {}, "max_abs_grad": 1.0}
        ratios = [("ours", "stop_gradient"), ("ours", "fused")]
        return {"name": name, "calls": calls, "ratios": ratios, "info": info, "first_compiles": {}, "failures": []}

    monkeypatch.setattr(estimators_module, "estimator_calls", prepared)
    args = ["--rounds", "2", "--repeats", "2", "--warmup", "1", "--results", str(tmp_path)]
    names = [arg for name in times for arg in ("--estimator", name)]
    assert script("estimators").main([*args, *names]) == 0
    variants = ["ours", "sg", "fused"]
    groups = {name: [f"{name} {v}" for v in variants] for name in times}
    assert clock.calls == interleaved(groups, rounds=2, repeats=2, warmup=1)
    doc = load_results(tmp_path / "estimators.json")
    assert doc["rounds"] == 2 and "2 rounds" in render_markdown('{{ results_source("estimators") }}', tmp_path)
    rows = {row["estimator"]: row for row in doc["rows"]}
    assert rows["round_ste"]["ours_vs_stop_gradient_rounds"] == [0.75, 0.8125]
    assert rows["sign_ste"]["ours_vs_stop_gradient_rounds"] == [0.8125, 1.1875]
    figures = doc["figures"]
    check_figure(figures["median_vs_stop_gradient"], [0.75, 0.96875], bound=0.9)
    assert figures["median_vs_stop_gradient"]["text"] == "0.86× (0.75–0.97×)"
    assert figures["median_vs_stop_gradient"]["met"] is False
    # round_ste is at or below 0.9 in every round; floor_ste in one only (its median is below), sign_ste in one.
    assert figures["members_faster"]["text"] == "1 of 3"


def test_estimators_on_real_estimators_write_one_sample_per_round(tmp_path):
    args = ["--rounds", "2", "--repeats", "2", "--warmup", "1", "--size", "64", "--results", str(tmp_path)]
    assert script("estimators").main([*args, "--estimator", "round_ste", "--estimator", "sign_ste"]) == 0
    doc = load_results(tmp_path / "estimators.json")
    assert doc["rounds"] == 2 and doc["command"].endswith("--estimator round_ste --estimator sign_ste --size 64")
    assert all(len(row["ours_vs_stop_gradient_rounds"]) == 2 for row in doc["rows"])
    per_round = [statistics.median(row["ours_vs_stop_gradient_rounds"][r] for row in doc["rows"]) for r in range(2)]
    check_figure(doc["figures"]["median_vs_stop_gradient"], per_round, bound=0.9)


# ----------------------------------------------------------------------------- benchmarks/peers_results.py


def test_peers_results_write_each_ratio_over_rounds(clock, monkeypatch, tmp_path):
    pytest.importorskip("spyx")  # without it the spiking groups are skipped with a note
    import stejax.bench._peers_rules as rules_module
    import stejax.bench._peers_snn as snn_module

    def rules_calls(*, quick):
        built = []
        for model, stejax in (("digits CNN", STRADDLE), ("transformer block", CLEAR)):
            calls = {
                "flax float": clock.call(f"{model} flax", DENOMINATOR, warmup=1, repeats=2),
                "qwix int8": clock.call(f"{model} qwix", DENOMINATOR, warmup=1, repeats=2),
                "stejax int8": clock.call(f"{model} stejax", stejax, warmup=1, repeats=2),
            }
            built.append((f"int8 QAT step by rules, {model}", calls, {"model": model, "batch": [64, 64]}))
        return built, []

    def snn_calls(*, quick, calls):
        assert calls == 1 + 2 * 3  # a key for every call: the warm-up and each round's
        built = []
        for steps, stejax in ((8, STRADDLE), (25, CLEAR), (100, CLEAR)):
            step = {
                "stejax": clock.call(f"T{steps} stejax", stejax, warmup=1, repeats=3),
                "spyx": clock.call(f"T{steps} spyx", DENOMINATOR, warmup=1, repeats=3),
            }
            built.append((f"SNN training step, T = {steps}", step, {"T": steps}))
        return built, []

    monkeypatch.setattr(rules_module, "rules_peer_calls", rules_calls)
    monkeypatch.setattr(snn_module, "snn_peer_calls", snn_calls)
    args = ["--rounds", "2", "--repeats", "2", "--snn-repeats", "3", "--warmup", "1", "--results", str(tmp_path)]
    assert script("peers_results").main(args) == 0
    rules = {m: [f"{m} {v}" for v in ("flax", "qwix", "stejax")] for m in ("digits CNN", "transformer block")}
    snn = {t: [f"T{t} stejax", f"T{t} spyx"] for t in (8, 25, 100)}
    assert clock.calls == [
        *interleaved(rules, rounds=2, repeats=2, warmup=1),
        *interleaved(snn, rounds=2, repeats=3, warmup=1),
    ]
    doc = load_results(tmp_path / "rules_peers.json")
    assert doc["rounds"] == 2 and "--rounds 2 --repeats 2 --snn-repeats 3" in doc["command"]
    check_figure(doc["figures"]["cnn"], [0.8125, 1.0625], bound=0.95)
    check_figure(doc["figures"]["block"], [0.75, 0.8125], bound=0.95)
    assert doc["figures"]["cnn"]["text"] == "level with (0.81–1.06×)" and doc["figures"]["block"]["met"] is True
    assert [row["rounds"] for row in doc["rows"]] == [[0.8125, 1.0625], [0.75, 0.8125]]
    # The table shows each figure's text: a page that renders it agrees with the figures.
    assert "level with (0.81–1.06×)" in render_markdown('{{ results_table("rules_peers") }}', tmp_path)
    doc = load_results(tmp_path / "snn_peers.json")
    assert doc["rounds"] == 2 and sorted(doc["figures"]) == ["t100", "t25", "t8"]
    check_figure(doc["figures"]["t8"], [0.8125, 1.0625], bound=0.9)
    check_figure(doc["figures"]["t25"], [0.75, 0.8125], bound=0.9)


# ----------------------------------------------------------------------------- stejax bench --suite onnx


@pytest.mark.parametrize("quick", [False, True])
def test_the_onnx_suite_writes_throughput_ratios_over_rounds(clock, monkeypatch, tmp_path, quick):
    import stejax.bench._onnx as onnx_module

    # ORT int8 against float on the MLP: CLEAR's ratios inverted (1.333, 1.231), short of 1.5 in every round;
    # stejax's forward over ORT int8's: STRADDLE's ratios; the CNN's QLinearConv graphs: above 1 in every round.
    times = {
        "mlp": {"onnxruntime float": DENOMINATOR, "onnxruntime int8": CLEAR, "stejax int8": (0.609375, 1.7265625)},
        "cnn": {
            "onnxruntime float": DENOMINATOR,
            "onnxruntime int8": (8.0, 16.0),
            "onnxruntime-qlinearconv int8": CLEAR,
            "onnxruntime-qlinearconv int4": CLEAR,
        },
    }

    order: dict[str, list[str]] = {}

    def groups(tmp, *, width, quick):
        timed = {}
        for model in ("mlp", "cnn")[: 1 if quick else 2]:
            name = f"mlp-{width}" if model == "mlp" else model
            variants = {v: ("features", None, 4000 if v == "onnxruntime float" else 1000) for v in times[model]}
            pairs = [("onnxruntime float", "onnxruntime int8"), ("stejax int8", "onnxruntime int8")]
            if model == "cnn":
                variants["stejax int8"] = ("stejax", None, 0)
                pairs += [("onnxruntime float", f"onnxruntime-qlinearconv {b}") for b in ("int8", "int4")]
            for batch in (1, 256):
                seconds = {v: times[model].get(v, DENOMINATOR) for v in variants}
                calls = {v: clock.call(f"{name} {batch} {v}", t, warmup=1, repeats=2) for v, t in seconds.items()}
                timed[f"{name} batch {batch}"] = (name, batch, variants, calls, pairs)
                order[f"{name} batch {batch}"] = [f"{name} {batch} {v}" for v in calls]
        return timed

    monkeypatch.setattr(onnx_module, "onnx_groups", groups)
    suite = onnx_module.onnx_suite(repeats=2, warmup=1, quick=quick, results_dir=tmp_path, rounds=2)
    assert len(order) == (2 if quick else 4)
    assert clock.calls == interleaved(order, rounds=2, repeats=2, warmup=1)
    figures = suite["figures"]
    check_figure(figures["ort_int8_vs_float_mlp_b256"], [1 / 0.75, 1 / 0.8125], bound=1.5, lower_is_better=False)
    check_figure(figures["ort_int8_vs_stejax_mlp_b256"], [0.8125, 1.0625], bound=1.0, lower_is_better=False)
    assert figures["ort_int8_vs_float_mlp_b256"]["text"] == "1.28× (1.23–1.33×)"
    assert figures["int8_file_vs_float_mlp"]["text"] == "0.25×"
    if quick:  # a quick run checks the suite; it writes no results file
        assert not (tmp_path / "onnx.json").exists() and "ort_qlinearconv_vs_float_cnn_b256" not in figures
        return
    doc = load_results(tmp_path / "onnx.json")
    assert doc["rounds"] == 2 and "--rounds 2 --repeats 2 --warmup 1" in doc["command"]
    assert {k: f["text"] for k, f in doc["figures"].items()} == {k: f["text"] for k, f in figures.items()}
    for key in ("ort_qlinearconv_vs_float_cnn_b256", "ort_qlinearconv_int4_vs_float_cnn_b256"):
        check_figure(figures[key], [1 / 0.75, 1 / 0.8125], bound=1.0, lower_is_better=False)
    assert figures["ort_convinteger_vs_float_cnn_b256"]["text"] == "0.12× (0.12–0.12×)"


# ----------------------------------------------------------------------------- benchmarks/qat_step.py


def test_qat_step_writes_each_ratio_over_rounds(clock, monkeypatch, tmp_path):
    pytest.importorskip("optax")
    qat_step = script("qat_step")
    steps = sorted({name for a, b, _ in qat_step.PAIRS.values() for name in (a, b)})
    # The digits CNN's int8 step against Qwix's straddles 1; stejax w8a8 against float is wholly below it.
    times = {"CNN int8 stejax int8": STRADDLE, "stejax w8a8": CLEAR}

    def step_calls(quick):
        calls = {s: clock.call(s, times.get(s, DENOMINATOR), warmup=1, repeats=2, per_sample=3) for s in steps}
        return calls, {}

    def moonshot_calls(width, batch):
        names = {"float": DENOMINATOR, "int8 fake-quant": DENOMINATOR, "int8 products": STRADDLE}
        return {f"width {width} {n}": clock.call(f"{width} {n}", t, warmup=2, repeats=2) for n, t in names.items()}

    monkeypatch.setattr(qat_step, "compile_costs", lambda presets: [{"preset": "w4a4", "step_alone": 1.0}])
    monkeypatch.setattr(qat_step, "step_calls", step_calls)
    monkeypatch.setattr(qat_step, "moonshot_calls", moonshot_calls)
    monkeypatch.setattr(qat_step, "MOONSHOT", ((1024, (2, 2)), (4096, (2, 2))))
    qat_step.main(["--rounds", "2", "--repeats", "2", "--warmup", "1", "--results", str(tmp_path)])
    # Each sample is 3 calls of one step in a row; then each width's int8-product MLPs, in rounds of their own.
    steps_order = interleaved({"": steps}, rounds=2, repeats=2, warmup=1)
    moonshot = {w: [f"{w} {n}" for n in ("float", "int8 fake-quant", "int8 products")] for w in (1024, 4096)}
    assert clock.calls == [
        *steps_order[: len(steps)],
        *(s for s in steps_order[len(steps) :] for _ in range(3)),
        *interleaved({"": moonshot[1024]}, rounds=2, repeats=2, warmup=2),
        *interleaved({"": moonshot[4096]}, rounds=2, repeats=2, warmup=2),
    ]
    doc = load_results(tmp_path / "qat_step.json")
    assert doc["rounds"] == 2 and doc["command"].startswith("python benchmarks/qat_step.py --rounds 2 --repeats 2")
    figures = doc["figures"]
    check_figure(figures["cnn_int8_vs_qwix"], [0.8125, 1.0625], bound=1.0)
    check_figure(figures["mlp_w8a8_vs_float"], [0.75, 0.8125], bound=1.15)
    check_figure(figures["int8_products_w8a8_vs_float_1024"], [0.8125, 1.0625], bound=1.0)
    assert figures["cnn_int8_vs_qwix"]["text"] == "level with (0.81–1.06×)"
    assert set(figures) == {k for k, (_, _, bound) in qat_step.PAIRS.items() if bound is not None} | {
        "int8_products_w8a8_vs_float_1024",
        "int8_products_w8a8_vs_float_4096",
    }
    rows = {row["ratio"]: row for row in doc["rows"]}
    assert rows["CNN int8 stejax int8 / CNN int8 qwix int8"]["rounds"] == [0.8125, 1.0625]


# ----------------------------------------------------------------------------- the committed files


def test_a_file_without_rounds_still_reads_and_a_bad_count_is_refused():
    # A file measured as one series has no `rounds`: it loads, and the README's texts still agree with it.
    for name in ("estimators", "rules_peers", "snn_peers", "onnx", "qat_step"):
        doc = load_results(ROOT / "docs" / "results" / f"{name}.json")
        assert "rounds" not in doc or doc["rounds"] >= 5, name  # the rule for a cited ratio: at least 5 rounds
    assert check_markers((ROOT / "README.md").read_text("utf-8"), ROOT / "docs" / "results") == []
    doc = json.loads((ROOT / "docs" / "results" / "onnx.json").read_text("utf-8"))
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="`rounds` must be an int >= 1"):
            check_results({**doc, "rounds": bad})
