"""`stejax bench` and `stejax diagnose` on the command line."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

import stejax.diagnose
from stejax.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runner():
    return CliRunner(env={"COLUMNS": "200"})


def nan_update():
    """A pipeline factory whose update makes NaN (for `--pipeline test_cli_bench:nan_update`)."""
    from test_diagnose import healthy

    def update(params, grads):
        return jax.tree.map(lambda p: p + jnp.log(p - p), params)  # log(0): -inf

    return dataclasses.replace(healthy(), update=update, name="nan update")


def test_bench_writes_the_report(runner, tmp_path):
    out = tmp_path / "bench"
    args = [
        "bench",
        "--suite",
        "estimators",
        "--estimator",
        "round_ste",
        "--quick",
        "--repeats",
        "2",
        "--rounds",
        "3",
        "--out",
        str(out),
    ]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "running the estimators suite" in result.output and "round_ste" in result.output
    report = json.loads((out / "bench.json").read_text())
    assert list(report["suites"]) == ["estimators"] and report["settings"]["repeats"] == 2
    assert report["settings"]["rounds"] == 3  # each round gives each ratio one sample
    (group,) = report["suites"]["estimators"]["groups"]
    assert len(group["ratios"]["ours/stop_gradient"]["rounds"]) == 3 and group["variants"]["ours"]["stats_ms"]["n"] == 6
    assert [g["name"] for g in report["suites"]["estimators"]["groups"]] == ["round_ste"]
    assert (out / "bench.md").exists() and (out / "bench.png").read_bytes()[:8] == PNG_SIGNATURE


def test_bench_reports_a_skipped_suite(runner, tmp_path, monkeypatch):
    import stejax.bench._run as run_module

    monkeypatch.setattr(
        run_module, "peers_suite", lambda **kw: {"status": "skipped", "note": "qwix not installed", "groups": []}
    )
    result = runner.invoke(main, ["bench", "--suite", "peers", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "peers: skipped: qwix not installed" in result.output


def test_bench_exits_1_when_a_suite_fails(runner, tmp_path, monkeypatch):
    import stejax.bench._run as run_module

    def broken(**kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(run_module, "train_suite", broken)
    result = runner.invoke(main, ["bench", "--suite", "train", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "train: error: RuntimeError: planted" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "speed"], "'speed' is not one of"),
        (["--estimator", "round"], "no estimator named 'round'"),
        (["--repeats", "0"], "0 is not in the range x>=1"),
        (["--rounds", "0"], "0 is not in the range x>=1"),
    ],
)
def test_bench_usage_errors(runner, tmp_path, args, message):
    result = runner.invoke(main, ["bench", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output


def test_diagnose_a_healthy_pipeline(runner, tmp_path):
    out = tmp_path / "diag"
    result = runner.invoke(main, ["diagnose", "--pipeline", "test_diagnose:healthy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "toy: all 10 stages passed on 2 example(s)" in result.output
    data = json.loads((out / "diagnose.json").read_text())
    assert data["ok"] is True and data["first_failure"] is None


def test_diagnose_names_the_failing_stage_and_exits_1(runner):
    result = runner.invoke(main, ["diagnose", "--pipeline", "test_cli_bench:nan_update", "--examples", "3"])
    assert result.exit_code == 1
    text = " ".join(result.output.split())  # rich wraps long lines
    assert "the first failure is at stage 'update'" in text and "FAILED" in text
    assert "the first inf comes from log at" in text  # the operation that made it is named


def test_diagnose_reports_a_factory_that_raises(runner):
    result = runner.invoke(main, ["diagnose", "--pipeline", "test_diagnose:_cross_entropy"])
    assert result.exit_code == 1
    assert "the factory 'test_diagnose:_cross_entropy' raised TypeError" in result.output


def test_diagnose_a_run_directory_uses_its_reference_pipeline(runner, tmp_path, monkeypatch):
    from test_diagnose import healthy

    seen = []

    def fake_pipeline_from_run(run_dir):
        seen.append(Path(run_dir))
        return healthy()

    monkeypatch.setattr(stejax.diagnose, "pipeline_from_run", fake_pipeline_from_run)
    result = runner.invoke(main, ["diagnose", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen == [tmp_path]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of RUN or --pipeline MODULE:FACTORY"),
        (["--pipeline", "nocolon"], "expected MODULE:FUNC"),
        (["--pipeline", "builtins:dict"], "returned a dict; expected a stejax.diagnose.Pipeline"),
    ],
)
def test_diagnose_usage_errors(runner, args, message):
    result = runner.invoke(main, ["diagnose", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_bench_exits_1_when_an_estimators_forms_compute_different_gradients(runner, tmp_path, monkeypatch):
    import stejax.bench._estimators as estimators_module

    def wrong_form(entry, x, args, key, call, partial_x):
        sg = jax.lax.stop_gradient
        return "planted", lambda x, args, key: sg(call(entry.forward, x, args, key)) + 2.0 * (x - sg(x))

    monkeypatch.setattr(estimators_module, "stop_gradient_form", wrong_form)
    args = ["bench", "--suite", "estimators", "--estimator", "round_ste", "--quick", "--out", str(tmp_path)]
    result = runner.invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "FAILED: gradients of the compared forms differ for round_ste" in result.output


def test_bench_writes_results_files_only_into_results(runner, tmp_path, monkeypatch):
    # A full (not --quick) train-step run, one small width and one variant: bench.json goes to --out and
    # nothing to the working directory; the results file only into --results.
    import stejax.bench._run as run_module
    from stejax.bench._train_step import train_step_suite

    monkeypatch.setattr(
        run_module, "_train_step_suite", lambda **kwargs: train_step_suite(variants=("float32",), **kwargs)
    )
    monkeypatch.chdir(tmp_path)
    args = ["bench", "--suite", "train-step", "--width", "32", "--repeats", "1", "--warmup", "1", "--out", "X"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X"] and (tmp_path / "X" / "bench.json").exists()
    assert not any(p.suffix == ".json" and p.name != "bench.json" for p in (tmp_path / "X").iterdir())
    result = runner.invoke(main, [*args, "--results", "R"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / "R").iterdir()] == [f"train_step_{jax.default_backend()}.json"]
    assert not (tmp_path / "docs").exists()


def test_bench_hands_results_and_figures_to_the_suites_that_write_them(runner, tmp_path, monkeypatch):
    import inspect

    import stejax.bench._run as run_module
    from stejax.bench._lm_decode import lm_decode_suite
    from stejax.bench._onnx import onnx_suite
    from stejax.bench._train_step import train_step_suite

    for suite in (onnx_suite, lm_decode_suite, train_step_suite):  # from Python too, nothing by default
        assert inspect.signature(suite).parameters["results_dir"].default is None, suite.__name__
    assert inspect.signature(lm_decode_suite).parameters["image"].default is None
    seen: dict[str, dict] = {}

    def fake(name):
        def suite(**kwargs):
            seen[name] = kwargs
            return {"groups": [], "rows": []}

        return suite

    for runner_name, name in [("_onnx_suite", "onnx"), ("_lm_decode_suite", "lm-decode"), ("_train_step_suite", "ts")]:
        monkeypatch.setattr(run_module, runner_name, fake(name))
    suites = ["--suite", "onnx", "--suite", "lm-decode", "--suite", "train-step", "--out", str(tmp_path / "o")]
    assert runner.invoke(main, ["bench", *suites]).exit_code == 0
    assert all(kwargs["results_dir"] is None for kwargs in seen.values()) and seen["lm-decode"]["image"] is None
    extra = ["--results", str(tmp_path / "r"), "--figures", str(tmp_path / "f")]
    assert runner.invoke(main, ["bench", *suites, *extra]).exit_code == 0
    assert all(Path(kwargs["results_dir"]) == tmp_path / "r" for kwargs in seen.values())
    assert Path(seen["lm-decode"]["image"]) == tmp_path / "f" / "lm_decode.png"
