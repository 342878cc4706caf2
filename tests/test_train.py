"""The reference QAT training pipeline (stejax.train): step functions, loop, run directory, CLI.

Small on purpose: a 400-example subset of the digits, tiny models and one or two
epochs, so that the whole file stays well under a minute. The full comparison is
what `stejax demo` runs.

Stated tolerances (also recorded in every compare report):
the jitted, eager and per-example paths compute the same float32 operations in
different orders (a batched matmul against one dot per example; XLA fuses under
jit), so they agree to rtol = atol = 1e-5 on logits and parameters, and to
rtol 1e-5 / atol 1e-6 on the loss.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click.testing import CliRunner

import stejax.train._compare as compare_module
import stejax.train._loop as loop_module
from stejax.bench import CompileCounter
from stejax.cli import main
from stejax.data import Normalizer, Splits, load_digits
from stejax.model import PRESETS, apply, check_params, init_params, param_spec, preset
from stejax.train import (
    Batch,
    NonFiniteError,
    StepMetrics,
    TrainConfig,
    compare,
    compiled_train_step,
    compiled_update,
    evaluate,
    forward,
    load_params,
    load_run,
    logged_update,
    loss,
    make_optimizer,
    paired_delta,
    raise_if_nonfinite,
    save_params,
    time_steps,
    train,
    update,
)
from stejax.train._compare import NUMERICAL_TOLERANCES
from stejax.train._targets import TARGETS, TARGETS_SET_FOR

from helpers import digits_400

LOGIT_TOL = NUMERICAL_TOLERANCES["jit_vs_eager_logits"]
LOSS_TOL = NUMERICAL_TOLERANCES["jit_vs_eager_loss"]

# The tiny recipe most tests share (one compiled step per preset, reused across tests).
TINY = TrainConfig(model="mlp", hidden=(16,), dropout=0.1, batch_size=32, epochs=2, patience=None)
TINY_CNN = dataclasses.replace(TINY, model="cnn", channels=(4, 6))


def _splits() -> Splits:
    return digits_400()


def _batch(n: int = 8) -> Batch:
    splits = _splits()
    x = Normalizer.fit(splits.train.x).apply(splits.train.x[:n])
    return Batch(x, np.asarray(splits.train.y[:n]))


@functools.cache
def _model(model: str, name: str):
    config = dataclasses.replace(TINY if model == "mlp" else TINY_CNN, preset=name)
    mc, qc = config.model_config(_splits().train), config.qat_config()
    # Uncalibrated: the fixed LSQ steps suit standardised features, and calibration
    # (an eager pass per layer) is what `train` does and is covered there.
    return mc, qc, init_params(jax.random.key(0), mc, qc)


def _np_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits.astype(np.float64)
    lse = np.log(np.sum(np.exp(z - z.max(axis=1, keepdims=True)), axis=1)) + z.max(axis=1)
    return float(np.mean(lse - z[np.arange(len(labels)), labels]))


# ----------------------------------------------------------------------------- shapes, dtypes, values


MODELS_AND_PRESETS = [("mlp", "float"), ("mlp", "w4a4"), ("mlp", "w1a1"), ("cnn", "w4a4")]


@pytest.mark.parametrize(("model", "name"), MODELS_AND_PRESETS)
def test_shapes_and_dtypes_follow_the_contract(model, name):
    mc, qc, params = _model(model, name)
    batch = _batch(32)
    jitted = jax.jit(functools.partial(forward, model_config=mc, qat_config=qc, return_stats=True))
    logits, stats = jitted(params, batch.x)
    assert logits.shape == (32, 10) and logits.dtype == jnp.float32
    for leaf in jax.tree.leaves(stats):
        assert leaf.shape == () and leaf.dtype == jnp.float32 and 0 <= float(leaf) <= 1
    opt = make_optimizer(TINY, 8)
    opt_state = opt.init(params)
    new, new_state, metrics = compiled_update(mc, qc, opt)(params, opt_state, batch, jax.random.key(1))
    check_params(new, param_spec(mc, qc))
    assert jax.tree.structure(new_state) == jax.tree.structure(opt_state)
    assert isinstance(metrics, StepMetrics)
    assert metrics.loss.shape == () and metrics.loss.dtype == jnp.float32
    assert metrics.finite.shape == () and metrics.finite.dtype == jnp.bool_ and bool(metrics.finite)
    assert jax.tree.structure(metrics.zero_grad) == jax.tree.structure(stats)


@pytest.mark.parametrize("name", ["float", "w4a4"])
def test_loss_is_the_mean_cross_entropy(name):
    mc, qc, params = _model("mlp", name)
    batch = _batch()
    logits = np.asarray(forward(params, batch.x, model_config=mc, qat_config=qc))
    got = float(loss(params, batch, model_config=mc, qat_config=qc))
    np.testing.assert_allclose(got, _np_cross_entropy(logits, batch.y), rtol=1e-6)


def test_update_is_one_optimiser_step_on_the_gradient():
    mc, qc, params = _model("mlp", "w4a4")
    mc = dataclasses.replace(mc, dropout=0.0)
    batch, opt = _batch(), optax.sgd(0.5)
    grads = jax.jit(jax.grad(functools.partial(loss, model_config=mc, qat_config=qc, train=True)))(params, batch)
    step = jax.jit(functools.partial(update, model_config=mc, qat_config=qc, optimizer=opt))
    new, _, metrics = step(params, opt.init(params), batch, None)
    expected = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert float(metrics.loss) == pytest.approx(float(loss(params, batch, model_config=mc, qat_config=qc)))


@pytest.mark.parametrize("name", PRESETS)
def test_loss_and_gradients_are_finite_on_a_normal_batch(name):
    mc, qc, params = _model("mlp", name)
    value_and_grad = jax.jit(jax.value_and_grad(functools.partial(loss, model_config=mc, qat_config=qc, train=True)))
    value, grads = value_and_grad(params, _batch(32), key=jax.random.key(2))
    assert np.isfinite(float(value))
    for g in jax.tree.leaves(grads):
        assert np.isfinite(np.asarray(g)).all()
    w = np.asarray(grads["layers"][0]["w"])
    if name == "w4a4_no_ste":
        # Plain rounding: nothing reaches the weights; this is the baseline's point.
        assert not w.any()
    else:
        assert w.any()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda x: x[:, :63], ValueError, r"expected 64 features.*got shape \(8, 63\)"),
        (lambda x: x.astype(np.float64), TypeError, r"expected dtype float32; got float64"),
        (lambda x: np.where(np.arange(64) == 5, np.float32(np.nan), x), ValueError, r"finite.*row 0.*feature 5"),
        (lambda x: x[0], ValueError, r"batch of shape \(N, 64\)"),
    ],
    ids=["features", "dtype", "nan", "one-example"],
)
def test_invalid_input_raises_instead_of_producing_output(make, error, message):
    mc, qc, params = _model("mlp", "w4a4")
    batch = _batch()
    x = make(batch.x)
    with pytest.raises(error, match=message):
        forward(params, x, model_config=mc, qat_config=qc)
    if x.ndim == 2:
        with pytest.raises(error, match=message):
            loss(params, (x, batch.y), model_config=mc, qat_config=qc)
        with pytest.raises(error, match=message):
            evaluate(params, x, batch.y, model_config=mc, qat_config=qc)


@pytest.mark.parametrize(
    ("labels", "error", "message"),
    [
        (np.zeros(8, np.int64), TypeError, r"labels must be an int32 array; got dtype int64"),
        (np.zeros(7, np.int32), ValueError, r"labels must have shape \(8,\)"),
        (np.full(8, 10, np.int32), ValueError, r"labels must be in \[0, 10\); got 10 at index 0"),
    ],
)
def test_invalid_labels_raise(labels, error, message):
    mc, qc, params = _model("mlp", "float")
    with pytest.raises(error, match=message):
        loss(params, (_batch().x, labels), model_config=mc, qat_config=qc)


def test_training_with_dropout_needs_a_key():
    mc, qc, params = _model("mlp", "float")
    with pytest.raises(TypeError, match=r"dropout 0\.1 needs a PRNG key"):
        forward(params, _batch().x, model_config=mc, qat_config=qc, train=True)


# ----------------------------------------------------------------------------- plain, jit and vmap agree


@pytest.mark.parametrize(("model", "name"), MODELS_AND_PRESETS)
def test_plain_jit_and_vmap_paths_agree(model, name):
    mc, qc, params = _model(model, name)
    batch = _batch(32)
    jitted = np.asarray(
        jax.jit(functools.partial(forward, model_config=mc, qat_config=qc))(params, jnp.asarray(batch.x))
    )
    # Without vmap: one example at a time through the model's own apply.
    one = jax.jit(functools.partial(apply, model_config=mc, qat_config=qc))
    one_by_one = np.stack([one(params, x) for x in jnp.asarray(batch.x[:8])])
    np.testing.assert_allclose(one_by_one, jitted[:8], **NUMERICAL_TOLERANCES["vmap_vs_loop_logits"])
    if model == "mlp":  # op by op (the CNN's first eager run costs seconds of per-op compiles)
        with jax.disable_jit():
            plain = np.asarray(forward(params, batch.x, model_config=mc, qat_config=qc))
        np.testing.assert_allclose(jitted, plain, **LOGIT_TOL)


# ----------------------------------------------------------------------------- the loop


def test_update_compiles_once_for_all_seeds():
    config = dataclasses.replace(TINY, preset="w2a2")
    # Other tests on this worker fill the bounded cache (64 entries) in a random order; start from an empty one so
    # an eviction by them cannot pass for a recompilation here.
    compiled_train_step.cache_clear()
    train(dataclasses.replace(config, seed=0), splits=_splits())
    # The second seed compiles nothing: one step program and one statistics program serve every step and seed,
    # logging steps included. Counted as XLA compilations, not by the jitted functions' cache sizes, which read 0
    # right after training in two fresh-clone runs.
    with CompileCounter() as counter:
        train(dataclasses.replace(config, seed=1), splits=_splits())
    assert counter.count == 0


def test_seeds_are_reproducible_and_distinct():
    a = train(TINY, splits=_splits())
    b = train(TINY, splits=_splits())
    c = train(dataclasses.replace(TINY, seed=1), splits=_splits())
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        assert np.array_equal(x, y)
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert [r["train_loss"] for r in a.history] != [r["train_loss"] for r in c.history]


def _nan_at(params, layer: int, leaf: str):
    layers = list(params["layers"])
    value = layers[layer][leaf]
    layers[layer] = dict(layers[layer], **{leaf: value.at[(0,) * value.ndim].set(jnp.nan)})
    return {"layers": tuple(layers)}


def test_non_finite_parameter_stops_the_run_naming_step_and_leaf(monkeypatch):
    real_init = loop_module.init_params
    monkeypatch.setattr(loop_module, "init_params", lambda *a, **k: _nan_at(real_init(*a, **k), 1, "w"))
    with pytest.raises(
        NonFiniteError, match=r"parameter at step 1 \(epoch 1, batch 1\).*params\['layers'\]\[1\]\['w'\]"
    ) as info:
        train(TINY, splits=_splits())
    assert (info.value.step, info.value.part, info.value.path) == (1, "parameter", "['layers'][1]['w']")


def test_non_finite_guard_counts_steps(monkeypatch):
    # The step after the third returns a NaN bias; the fourth step meets it.
    calls = []
    real = loop_module.compiled_train_step

    def poisoning(*args):
        step = real(*args)

        def wrapped(params, opt_state, batch, key, log):
            calls.append(1)
            params, opt_state, metrics = step(params, opt_state, batch, key, log)
            return (_nan_at(params, 0, "b") if len(calls) == 3 else params), opt_state, metrics

        return wrapped

    monkeypatch.setattr(loop_module, "compiled_train_step", poisoning)
    with pytest.raises(NonFiniteError, match=r"step 4 .*params\['layers'\]\[0\]\['b'\] \(layers/0/b\)"):
        train(TINY, splits=_splits())


def test_logged_update_is_update_with_the_fractions_on_logging_steps_only():
    # Dropout on (TINY): the second forward pass must see the step's own masks.
    mc, qc, params = _model("mlp", "w4a4")
    # Features scaled up so that some inputs saturate: the fractions are not all 0.
    batch, key, opt = _batch()._replace(x=_batch().x * np.float32(8)), jax.random.key(3), make_optimizer(TINY, 8)
    want = compiled_update(mc, qc, opt)(params, opt.init(params), batch, key)
    step = jax.jit(functools.partial(logged_update, model_config=mc, qat_config=qc, optimizer=opt))
    for log in (True, False):
        new, state, metrics = step(params, opt.init(params), batch, key, log)
        for a, b in zip(jax.tree.leaves((new, state)), jax.tree.leaves(want[:2]), strict=True):
            np.testing.assert_array_equal(a, b)
        assert float(metrics.loss) == float(want[2].loss) and bool(metrics.finite)
        assert jax.tree.structure(metrics.zero_grad) == jax.tree.structure(want[2].zero_grad)
        fractions = jax.tree.leaves(metrics.zero_grad)
        if log:
            assert fractions == jax.tree.leaves(want[2].zero_grad) and any(float(f) > 0 for f in fractions)
        else:
            assert all(float(f) == 0 for f in fractions)


def test_train_step_computes_the_fractions_only_when_it_logs_with_update_s_values():
    # Dropout on (TINY): the statistics program must see the step's own masks.
    mc, qc, params = _model("mlp", "w4a4")
    batch, key, opt = _batch()._replace(x=_batch().x * np.float32(8)), jax.random.key(3), make_optimizer(TINY, 8)
    want = compiled_update(mc, qc, opt)(params, opt.init(params), batch, key)
    step = compiled_train_step(mc, qc, opt)
    with CompileCounter() as counter:
        _, _, quiet = step(params, opt.init(params), batch, key, False)
    compiled_quietly = counter.count
    for log in (True, False):
        new, state, metrics = step(params, opt.init(params), batch, key, log)
        for a, b in zip(jax.tree.leaves((new, state)), jax.tree.leaves(want[:2]), strict=True):
            np.testing.assert_array_equal(a, b)
        assert float(metrics.loss) == float(want[2].loss) and bool(metrics.finite)
        if log:
            assert jax.tree.structure(metrics.zero_grad) == jax.tree.structure(want[2].zero_grad)
            fractions = jax.tree.leaves(metrics.zero_grad)
            assert fractions == jax.tree.leaves(want[2].zero_grad) and any(float(f) > 0 for f in fractions)
        else:
            assert metrics.zero_grad == {}
    # A step that does not log runs the update alone: the statistics program is compiled on the first logged step.
    assert quiet.zero_grad == {} and compiled_quietly <= 1


def test_non_finite_loss_is_named():
    mc, qc, params = _model("mlp", "float")
    huge = {"layers": tuple(dict(p, w=p["w"] * np.float32(1e37)) for p in params["layers"])}
    batch = _batch()
    opt = optax.sgd(0.1)
    _, _, metrics = update(
        huge, opt.init(huge), batch, jax.random.key(0), model_config=mc, qat_config=qc, optimizer=opt
    )
    with pytest.raises(NonFiniteError, match=r"non-finite loss at step 7") as info:
        raise_if_nonfinite(
            metrics, step=7, params=huge, batch=batch, key=jax.random.key(0), model_config=mc, qat_config=qc
        )
    assert info.value.part == "loss"


def test_early_stopping_stops():
    # A learning rate too small to change a float32 parameter: validation never improves.
    config = dataclasses.replace(TINY, learning_rate=1e-30, schedule="constant", epochs=10, patience=2)
    result = train(config, splits=_splits())
    assert result.stopped_early and len(result.history) == 3 and result.best_epoch == 1


def test_best_parameters_are_those_of_the_best_validation_epoch():
    result = train(TINY, splits=_splits())
    best = max(result.history, key=lambda r: (r["val_accuracy"], -r["val_loss"]))
    assert result.best_epoch == best["epoch"] and result.best_val_accuracy == best["val_accuracy"]
    x = result.normalizer.apply(_splits().val.x)
    _, accuracy = evaluate(
        result.params, x, _splits().val.y, model_config=result.model_config, qat_config=result.qat_config
    )
    assert accuracy == result.best_val_accuracy


def test_the_test_split_is_scored_once_at_the_end(monkeypatch):
    seen = []
    real = loop_module.compiled_evaluate

    def spying(*args):
        fn = real(*args)

        def wrapped(params, x, y):
            seen.append(x.shape[0])
            return fn(params, x, y)

        return wrapped

    monkeypatch.setattr(loop_module, "compiled_evaluate", spying)
    splits = _splits()
    # Make the test split's size unique so that its calls can be told apart.
    test = dataclasses.replace(splits.test, x=splits.test.x[:-1], y=splits.test.y[:-1])
    result = train(TINY, splits=dataclasses.replace(splits, test=test))
    assert seen == [len(splits.val)] * 2 + [len(test)]
    assert result.n_test == len(test)


# ----------------------------------------------------------------------------- the run directory


def test_metrics_jsonl_has_the_fields(tmp_path):
    result = train(dataclasses.replace(TINY, preset="w4a4"), splits=_splits(), out_dir=tmp_path)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records == list(result.history)
    parts = {f"layer_{i}/{p}" for i in range(2) for p in ("weights", "activations")}
    for r in records:
        assert {"epoch", "train_loss", "val_loss", "val_accuracy", "seconds", "zero_grad_fraction"} <= set(r)
        assert set(r["zero_grad_fraction"]) == parts
        assert all(0 <= v <= 1 for v in r["zero_grad_fraction"].values())
        assert np.isfinite([r["train_loss"], r["val_loss"]]).all() and 0 <= r["val_accuracy"] <= 1


def test_run_directory_round_trips(tmp_path):
    splits = _splits()
    result = train(dataclasses.replace(TINY_CNN, preset="w4a4"), splits=splits, out_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "metrics.jsonl",
        "normalizer.json",
        "params.safetensors",
        "report.json",
    ]
    run = load_run(tmp_path)
    assert run.config == result.config and run.model_config == result.model_config
    for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(result.params), strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(run.normalizer.mean, result.normalizer.mean)
    _, accuracy = evaluate(
        run.params,
        run.normalizer.apply(splits.test.x),
        splits.test.y,
        model_config=run.model_config,
        qat_config=run.qat_config,
    )
    assert accuracy == run.report["test_accuracy"] == result.test_accuracy
    assert run.data["n_test"] == len(splits.test) and run.report["n_test"] == len(splits.test)


def test_safetensors_leaves_are_named_by_their_path(tmp_path):
    from safetensors.numpy import load_file

    mc, qc, params = _model("mlp", "w4a4")
    save_params(params, tmp_path / "w4a4.safetensors")
    assert list(load_file(str(tmp_path / "w4a4.safetensors"))) == sorted(param_spec(mc, qc))
    with pytest.raises(ValueError, match=r"holds 'layers/0/a_step', not a parameter"):
        load_params(tmp_path / "w4a4.safetensors", mc, preset("float"))
    save_params(_model("mlp", "float")[2], tmp_path / "float.safetensors")
    with pytest.raises(ValueError, match=r"lacks 'layers/0/w_step'"):
        load_params(tmp_path / "float.safetensors", mc, qc)


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"preset": "w3a3"}, ValueError, r"preset must be one of \['float', .*'w4a4_no_ste'\]; got 'w3a3'"),
        ({"model": "rnn"}, ValueError, r"model must be one of \['mlp', 'cnn'\]"),
        ({"epochs": 0}, ValueError, r"epochs must be an int >= 1; got 0"),
        ({"batch_size": 2.0}, TypeError, r"batch_size must be an int; got 2.0"),
        ({"learning_rate": 0.0}, ValueError, r"learning_rate must be a float in \(0.0, inf\); got 0.0"),
        ({"dropout": 1.0}, ValueError, r"dropout must be a float in \[0.0, 1.0\); got 1.0"),
        ({"strides": (1,)}, ValueError, r"strides must have one entry per channel entry \(2\); got 1"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, ValueError, r"val_fraction \+ test_fraction must be below 1"),
        ({"optimizer": "lamb"}, ValueError, r"optimizer must be one of"),
        ({"normalize": "pixel"}, ValueError, r"normalize must be one of \['global', 'feature'\]; got 'pixel'"),
    ],
)
def test_train_config_rejects_bad_values(change, error, message):
    with pytest.raises(error, match=f"TrainConfig: {message}"):
        TrainConfig(**change)


def test_train_config_round_trips_through_json(tmp_path):
    config = TrainConfig(preset="w2a2", hidden=(32, 16), patience=None)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config.to_dict()))
    assert TrainConfig.from_file(path) == config
    assert TrainConfig.from_file(path, epochs=3, seed=None).epochs == 3
    with pytest.raises(ValueError, match=r"unknown field 'lr'; the fields are \['preset'"):
        TrainConfig.from_dict({"lr": 0.1})


def test_cnn_needs_image_data():
    digits = load_digits()
    flat = dataclasses.replace(digits, image_shape=None)
    with pytest.raises(ValueError, match="model 'cnn' needs image data"):
        TrainConfig(model="cnn").model_config(flat)


def test_optimizer_is_cached_per_recipe():
    assert make_optimizer(TINY, 8) is make_optimizer(dataclasses.replace(TINY, seed=3), 8)
    assert make_optimizer(TINY, 8) is not make_optimizer(TINY, 9)


# ----------------------------------------------------------------------------- compare


def _summary(**accuracy):
    """A compare summary with two seeds per configuration, each 0.1 point either side of the given mean."""
    per_seed = {name: [acc - 0.001, acc + 0.001] for name, acc in accuracy.items()}
    out = {}
    for name, accs in per_seed.items():
        row = {"test_accuracy_mean": accuracy[name], "step_ratio_vs_float_p50": 1.2 if name == "w4a4" else 1.0}
        if name != "float" and "float" in per_seed:
            d = paired_delta(accs, per_seed["float"])
            row.update(delta_vs_float_mean=d["mean"], delta_vs_float_se=d["se"], delta_vs_float_ci95=d["ci95"])
        out[name] = row
    return out


def test_targets_are_judged_as_stated():
    s = _summary(float=0.98, w8a8=0.978, w4a4=0.9765, w2a2=0.99, w1a32=0.974, w1a1=0.965, w4a4_no_ste=0.25)
    results = {r["target"]: r for r in (t.evaluate(s) for t in TARGETS)}
    assert [t.preset for t in TARGETS] == ["float", "w8a8", "w4a4", "w2a2", "w1a32", "w1a1", "w4a4_no_ste", "w4a4"]
    assert [t.threshold for t in TARGETS] == [98.0, -0.2, -0.3, -0.5, -0.5, -1.5, 25.0, 1.10]
    assert results["float >= 98%"]["met"]
    assert results["w8a8 paired delta vs float >= -0.2 points"]["met"]  # exactly -0.2 points
    assert not results["w4a4 paired delta vs float >= -0.3 points"]["met"]  # -0.35 points
    assert results["w2a2 paired delta vs float >= -0.5 points"]["met"]  # above float
    assert not results["w1a32 paired delta vs float >= -0.5 points"]["met"]  # -0.6
    assert results["w1a1 paired delta vs float >= -1.5 points"]["met"]  # -1.5
    assert results["w4a4_no_ste at or below 25%"]["met"]
    ratio = results["w4a4 step <= 1.10 x float step"]
    assert ratio["value"] == pytest.approx(1.2) and not ratio["met"]
    missing = TARGETS[1].evaluate(_summary(w8a8=0.9))
    assert missing["met"] is None and missing["measured"] == "not run (needs w8a8, float)"
    assert results["w2a2 paired delta vs float >= -0.5 points"]["measured"].startswith("+1.00 points vs float (95% CI")


def test_paired_delta_matches_a_hand_computation():
    acc, ref = [0.97, 0.99, 0.95, 0.98], [0.96, 0.99, 0.97, 0.965]
    d = 100 * (np.array(acc) - np.array(ref))  # 1, 0, -2, 1.5
    out = paired_delta(acc, ref)
    se = d.std(ddof=1) / 2
    assert out["mean"] == pytest.approx(0.125) and out["se"] == pytest.approx(se)
    # t(0.975, 3) = 3.182446305284263 (tables); the interval is symmetric about the mean.
    assert out["ci95"] == pytest.approx([0.125 - 3.182446305284263 * se, 0.125 + 3.182446305284263 * se])
    one = paired_delta([0.9], [0.8])
    assert one["mean"] == pytest.approx(10.0) and one["se"] is None and one["ci95"] is None
    with pytest.raises(ValueError, match="equal, non-empty lists"):
        paired_delta([0.9, 0.8], [0.9])


@pytest.mark.parametrize(
    ("accuracy", "reference", "message"),
    [
        ([0.9, 97.5], [0.9, 0.9], r"fractions in \[0, 1\]; got accuracy\[1\] = 97.5 \(a percentage\? divide by 100\)"),
        ([0.9, 0.9], [98.0, 97.0], r"got reference\[0\] = 98.0 \(a percentage"),
        ([0.9, -0.1], [0.9, 0.9], r"got accuracy\[1\] = -0.1\.$"),
        ([0.9, float("nan")], [0.9, 0.9], r"got accuracy\[1\] = nan\.$"),
        ([1.0, 0.0], [0.0, 1.5], r"got reference\[1\] = 1.5 \(a percentage"),
    ],
)
def test_paired_delta_refuses_values_outside_zero_one(accuracy, reference, message):
    # Percentages instead of fractions would give a difference 100 times too large.
    with pytest.raises(ValueError, match=message):
        paired_delta(accuracy, reference)
    assert paired_delta([1.0, 0.0], [0.0, 1.0])["mean"] == 0.0  # the bounds themselves are fractions


def test_time_steps_interleaves_and_uses_fresh_keys():
    order, used = [], []

    def step(name):
        def call(x, key):
            order.append(name)
            used.append(key)
            return x

        return call

    times = time_steps(
        {"a": (step("a"), (jnp.zeros(()),), list(range(5))), "b": (step("b"), (jnp.zeros(()),), list(range(5)))},
        repeats=3,
        warmup=2,
    )
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert order == ["a", "a", "b", "b", "a", "b", "b", "a", "a", "b"]
    assert used == [0, 1, 0, 1, 2, 2, 3, 3, 4, 4]


@functools.cache
def _small_digits():
    digits = load_digits()
    rows = np.sort(np.random.default_rng(0).choice(len(digits), 400, replace=False))
    return dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits-400")


def test_compare_writes_the_report_with_a_split_per_seed_and_paired_deltas(tmp_path):
    report = compare(
        ["float", "w4a4", "w4a4_no_ste"], seeds=2, base=TINY, out_dir=tmp_path, data=_small_digits(), timing_repeats=3
    )
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert list(saved["summary"]) == ["float", "w4a4", "w4a4_no_ste"]
    assert saved["setup"]["split"] == "per-seed" and saved["setup"]["split_seeds"] == [0, 1]
    for name, row in saved["summary"].items():
        assert {"test_accuracy_mean", "test_accuracy_std", "step_ms_median", "step_ratio_vs_float_p50"} <= set(row)
        assert len(row["test_accuracy_per_seed"]) == 2 and row["step_ms_median"] > 0
        assert row["test_accuracy_mean"] == pytest.approx(np.mean(row["test_accuracy_per_seed"]))
        assert [r["data_seed"] for r in saved["runs"][name]] == [0, 1]
    float_acc = np.array(saved["summary"]["float"]["test_accuracy_per_seed"])
    for name in ("w4a4", "w4a4_no_ste"):
        row = saved["summary"][name]
        d = 100 * (np.array(row["test_accuracy_per_seed"]) - float_acc)
        assert row["delta_vs_float_per_seed"] == pytest.approx(d.tolist())
        assert row["delta_vs_float_mean"] == pytest.approx(d.mean())
        assert row["delta_vs_float_se"] == pytest.approx(d.std(ddof=1) / np.sqrt(2))
        half = 12.706204736174698 * row["delta_vs_float_se"]  # t(0.975, 1)
        assert row["delta_vs_float_ci95"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert "delta_vs_float_mean" not in saved["summary"]["float"]
    # Each seed met its own split: the runs' test sets differ.
    first = load_run(tmp_path / "runs" / "float" / "seed-0")
    second = load_run(tmp_path / "runs" / "float" / "seed-1")
    assert first.config.data_seed == 0 and second.config.data_seed == 1 and second.config.seed == 1
    assert saved["environment"]["seeds"] == [0, 1] and saved["environment"]["jax"] == jax.__version__
    assert "w4a4: hidden layers weights 4-bit lsq" in saved["setup"]["qat"]["w4a4"]
    assert saved["targets_set_for"] == TARGETS_SET_FOR and "model" in saved["recipe_differs_from_targets_recipe"]
    markdown = (tmp_path / "report.md").read_text()
    for text in (
        "## Targets",
        "float >= 98%",
        "w4a4 step <= 1.10 x float step",
        "first layer",
        "jax ",
        "split per seed",
        f"The targets were set for {TARGETS_SET_FOR}",
        "the targets are shown for reference",
        "paired delta vs float",
    ):
        assert text in markdown, text
    n_test = saved["setup"]["data"]["n_test"]
    assert f"one test example is {100 / n_test:.2f} points of one seed's accuracy" in markdown
    for target in saved["targets"]:
        if target["met"] is not None:
            assert f"| {target['target']} | {target['measured']} | {'yes' if target['met'] else '**no**'} |" in markdown
    for figure in saved["figures"].values():
        assert (tmp_path / figure).read_bytes().startswith(b"\x89PNG")


def test_compare_with_one_fixed_split_and_one_seed_says_n_a(tmp_path):
    # Fresh step objects for this test: with one made by an earlier test on this worker, the w8a8 count read 0
    # once in a fresh-clone run (its executables were gone; JAX's process-wide cache of jitted functions is
    # bounded, the likely cause).
    compiled_train_step.cache_clear()
    # Two workers: w8a8 trains in a spawned process, with the same result as here.
    report = compare(
        ["float", "w8a8"],
        seeds=[3],
        base=TINY,
        out_dir=tmp_path,
        split="fixed",
        splits=_splits(),
        plots=False,
        timing_repeats=3,
        workers=2,
    )
    here = train(dataclasses.replace(TINY, preset="w8a8", seed=3), splits=_splits())
    assert report["runs"]["w8a8"][0]["test_accuracy"] == here.test_accuracy
    assert report["runs"]["w8a8"][0]["test_loss"] == here.test_loss
    # Training, the warm-up of the other worker's step and the timing share one compilation at most
    # (none is left in this process's cache when another test has cleared JAX's caches since).
    for name in ("float", "w8a8"):
        config = dataclasses.replace(TINY, preset=name)
        mc, qc = config.model_config(_splits().train), config.qat_config()
        opt = make_optimizer(config, len(_splits().train) // config.batch_size)
        assert compiled_train_step(mc, qc, opt)._cache_size() <= 1
    assert report["setup"]["split"] == "fixed" and report["setup"]["split_seeds"] == [0]
    assert report["runs"]["w8a8"][0]["data_seed"] == 0 and report["runs"]["w8a8"][0]["seed"] == 3
    row = report["summary"]["w8a8"]
    assert row["test_accuracy_std"] is None and row["delta_vs_float_se"] is None and row["delta_vs_float_ci95"] is None
    markdown = (tmp_path / "report.md").read_text()
    assert "± n/a" in markdown and "(se n/a)" in markdown and "shared by every seed" in markdown
    assert "(one seed: no interval)" in markdown


def test_compare_rejects_unknown_presets_bad_seeds_and_mixed_split_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown QAT preset 'w3a3'"):
        compare(["w3a3"], out_dir=tmp_path)
    with pytest.raises(ValueError, match="seeds must be a positive count"):
        compare(["float"], seeds=0, out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"split must be one of \['per-seed', 'fixed'\]; got 'random'"):
        compare(["float"], split="random", out_dir=tmp_path)
    with pytest.raises(ValueError, match="splits= is one shared split"):
        compare(["float"], splits=_splits(), out_dir=tmp_path)
    with pytest.raises(ValueError, match="data= is split per seed"):
        compare(["float"], split="fixed", data=_small_digits(), out_dir=tmp_path)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        compare(["float"], workers=0, out_dir=tmp_path)


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture
def runner():
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def tiny_data(monkeypatch):
    """The CLI loads the full digits; these tests give it the 400-example subset instead."""
    monkeypatch.setattr(loop_module, "load_splits", lambda config: _splits())
    monkeypatch.setattr(compare_module, "load_splits", lambda config: _splits())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "1"], "exactly one of --preset NAME or --config FILE"),
        (["--preset", "w3a3"], "'w3a3' is not one of"),
    ],
)
def test_cli_train_usage_errors(runner, tmp_path, args, message):
    result = runner.invoke(main, ["train", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and message in result.output


def test_cli_train_reports_a_non_finite_run(runner, tmp_path, tiny_data, monkeypatch):
    real_init = loop_module.init_params
    monkeypatch.setattr(loop_module, "init_params", lambda *a, **k: _nan_at(real_init(*a, **k), 0, "w"))
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(TINY.to_dict()))
    result = runner.invoke(main, ["train", "--config", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "NonFiniteError: non-finite parameter at step 1" in result.output


def test_cli_compare_end_to_end(runner, tmp_path, tiny_data):
    out = tmp_path / "cmp"
    args = ["compare", "--seeds", "1", "--epochs", "1", "--model", "mlp", "--configs", "float,w4a4", "--split", "fixed"]
    result = runner.invoke(main, [*args, "--repeats", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert list(report["summary"]) == ["float", "w4a4"] and report["setup"]["split"] == "fixed"
    assert "n/a" in result.output  # one seed: no std
    assert "w4a4 paired delta vs float >= -0.3 points" in result.output and "report:" in result.output
    assert Path(out / "report.md").exists()


def test_cli_compare_rejects_an_unknown_configuration(runner, tmp_path):
    result = runner.invoke(main, ["compare", "--configs", "float,w3a3", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown configuration 'w3a3'" in result.output


def test_cli_demo_runs_the_comparison(runner, tmp_path, monkeypatch):
    # `compare` itself runs end to end above; here only what demo asks of it.
    calls = []

    def fake_compare(names, **kwargs):
        calls.append((names, kwargs))
        return {"summary": {}, "targets": []}

    monkeypatch.setattr("stejax.train.compare", fake_compare)
    result = runner.invoke(main, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    ((names, kwargs),) = calls
    assert names == PRESETS and kwargs["seeds"] == 10 and kwargs["split"] == "per-seed"
    assert kwargs["out_dir"] == tmp_path
    assert kwargs["base"] == TrainConfig() and kwargs["workers"] == 2
    assert f"report: {(tmp_path / 'report.md').resolve()}" in result.output.replace("\n", "")
