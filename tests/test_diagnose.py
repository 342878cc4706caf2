"""stejax.diagnose: a fault planted at each stage is named at that stage; a healthy pipeline passes."""

import dataclasses
import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from stejax import keys
from stejax.diagnose import STAGES, TOLERANCES, Pipeline, diagnose, load_pipeline, pipeline_from_run
from stejax.model import InputContract

IN, CLASSES, N = 4, 3, 8
CONTRACT = InputContract(shape=(IN,), dtype="float32", feature_order="4 test features", n_classes=CLASSES)


def _forward(params, x, *, key):
    # Dropout on the inputs: the pipeline's one random operation, on its own key.
    keep = jax.random.bernoulli(keys.consume(key, where="test dropout"), 0.9, x.shape)
    x = jnp.where(keep, x / 0.9, jnp.zeros_like(x))
    return x @ params["w"] + params["b"][None, :]


def _cross_entropy(logits, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _loss(params, batch, *, key, forward=_forward):
    x, y = batch
    return _cross_entropy(forward(params, x, key=key), y)


def _update(params, grads):
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def healthy() -> Pipeline:
    """A small, correct pipeline (also the factory the CLI test loads)."""
    rng = np.random.default_rng(0)
    params = {
        "w": jnp.asarray(rng.standard_normal((IN, CLASSES), np.float32) * 0.5),
        "b": jnp.zeros(CLASSES, jnp.float32),
    }
    batch = (rng.standard_normal((N, IN), np.float32), (np.arange(N) % CLASSES).astype(np.int32))
    return Pipeline(params, batch, jax.random.key(0), _forward, _loss, _update, contract=CONTRACT, name="toy")


def _with_forward(pipeline, forward):
    return dataclasses.replace(pipeline, forward=forward, loss=functools.partial(_loss, forward=forward))


def _assert_named(report, stage):
    assert report.first_failure == stage, report.summary()
    statuses = [s.status for s in report.stages]
    i = STAGES.index(stage)
    assert statuses == ["passed"] * i + ["failed"] + ["not run"] * (len(STAGES) - i - 1), statuses
    assert report.why and report.stage(stage).why == report.why
    # It reports what it found; it never proposes to hide it.
    text = report.summary().lower()
    for forbidden in ("nan_to_num", "widen", "loosen", "increase the tolerance", "relax"):
        assert forbidden not in text


# ----------------------------------------------------------------------------- healthy


def test_a_healthy_pipeline_passes_every_stage():
    report = diagnose(healthy())
    assert report.ok and report.first_failure is None and report.why == "" and report.nan_origin is None
    assert [s.stage for s in report.stages] == list(STAGES)
    assert all(s.status == "passed" for s in report.stages)
    assert report.examples == 2
    assert report.tolerances["float32"] == TOLERANCES["float32"]
    assert "no key consumed twice" in report.stage("keys").why
    assert "all 10 stages passed" in report.summary()


def test_the_report_is_written_as_json_and_markdown(tmp_path):
    report = diagnose(dataclasses.replace(healthy(), update=lambda p, g: jax.tree.map(jnp.asarray, p)))
    json_path, md_path = report.write(tmp_path)
    data = json.loads(json_path.read_text())
    assert data["format"] == "stejax-diagnose/1" and data["ok"] is True
    assert [s["stage"] for s in data["stages"]] == list(STAGES)
    assert "| update | passed |" in md_path.read_text()


# ----------------------------------------------------------------------------- one planted fault per stage


def test_nan_in_the_data_is_named_at_data():
    p = healthy()
    x = p.batch[0].copy()
    x[5, 2] = np.nan  # beyond the minimal slice: the data check sees the whole batch
    report = diagnose(dataclasses.replace(p, batch=(x, p.batch[1])))
    _assert_named(report, "data")
    assert "example 5, position (2,)" in report.why and "nan" in report.why
    assert report.nan_origin is None  # no operation made it: it came with the batch


def test_labels_out_of_range_are_named_at_data():
    p = healthy()
    report = diagnose(dataclasses.replace(p, batch=(p.batch[0], np.full(N, CLASSES, np.int32))))
    _assert_named(report, "data")
    assert f"labels must be in [0, {CLASSES})" in report.why


def test_a_reused_key_is_named_at_keys():
    def forward(params, x, *, key):
        noise = 0.01 * jax.random.normal(key, x.shape)
        keep = jax.random.bernoulli(key, 0.9, x.shape)  # the same key again: correlated with the noise
        return jnp.where(keep, x + noise, jnp.zeros_like(x)) @ params["w"] + params["b"][None, :]

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "keys")
    assert "forward consumed a PRNG key twice" in report.why and "KeyReuseError" in report.why


def test_a_key_consumed_twice_through_the_ledger_is_named_at_keys():
    def forward(params, x, *, key):
        a = jax.random.normal(keys.consume(key, where="noise"), x.shape)
        b = jax.random.normal(keys.consume(key, where="more noise"), x.shape)
        return (x + 0.01 * (a + b)) @ params["w"] + params["b"][None, :]

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "keys")
    assert "first at noise, again at more noise" in report.why


def test_a_key_made_inside_forward_is_named_at_keys():
    def forward(params, x, *, key):
        # The key argument is ignored: the same dropout mask at every step.
        keep = jax.random.bernoulli(jax.random.key(0), 0.9, x.shape)
        return jnp.where(keep, x / 0.9, jnp.zeros_like(x)) @ params["w"] + params["b"][None, :]

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "keys")
    assert "forward makes its own PRNG key from constants" in report.why
    assert "keys must come from the pipeline's key" in report.why
    assert re.search(r"random_seed at .*test_diagnose\.py:\d+ \(in forward\)", report.why), report.why


def test_a_key_wrapped_from_constant_bits_in_the_loss_is_named_at_keys():
    def loss(params, batch, *, key):
        x, y = batch
        own = jax.random.wrap_key_data(jnp.zeros(2, jnp.uint32))  # constant bits, not the given key
        noise = 0.01 * jax.random.normal(own, x.shape)
        return _cross_entropy(_forward(params, x + noise, key=key), y)

    report = diagnose(dataclasses.replace(healthy(), loss=loss))
    _assert_named(report, "keys")
    assert report.why.startswith("loss makes its own PRNG key from constants")
    assert re.search(r"random_wrap at .*test_diagnose\.py:\d+ \(in loss\)", report.why), report.why


def test_a_key_closed_over_from_outside_is_named_at_keys():
    fixed = jax.random.key(7)

    def forward(params, x, *, key):
        keep = jax.random.bernoulli(fixed, 0.9, x.shape)
        return jnp.where(keep, x / 0.9, jnp.zeros_like(x)) @ params["w"] + params["b"][None, :]

    # Used by forward alone, the key is consumed once per call: no reuse to see, only its origin.
    report = diagnose(dataclasses.replace(healthy(), forward=forward))
    _assert_named(report, "keys")
    assert "a key closed over as a constant" in report.why and "test_diagnose.py" in report.why


def test_an_untyped_key_is_named_at_keys():
    report = diagnose(dataclasses.replace(healthy(), key=jax.random.PRNGKey(0)))
    _assert_named(report, "keys")
    assert "typed PRNG key" in report.why


def test_a_shape_that_breaks_the_contract_is_named_at_shapes():
    p = healthy()
    images = p.batch[0].reshape(N, 2, 2)  # not flattened: (N, 2, 2) where the contract says (N, 4)
    report = diagnose(dataclasses.replace(p, batch=(images, p.batch[1])))
    _assert_named(report, "shapes")
    assert "wants examples of shape (4,)" in report.why and "(8, 2, 2)" in report.why
    # The key check ran as far as forward got, and said so.
    assert "forward stopped with" in report.stage("keys").why


def test_logits_of_the_wrong_width_are_named_at_shapes():
    def forward(params, x, *, key):
        return _forward(params, x, key=key)[:, :2]

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "shapes")
    assert "logits must have shape (2, 3)" in report.why and "(2, 2)" in report.why


def test_a_loss_that_returns_a_python_float_is_named_at_shapes():
    def loss(params, batch, *, key):
        return float(_loss(params, batch, key=key))

    report = diagnose(dataclasses.replace(healthy(), loss=loss))
    _assert_named(report, "shapes")
    assert "loss must return a JAX or NumPy array scalar" in report.why and "got a builtins.float" in report.why
    assert "got shape ()" not in report.why


def test_a_loss_that_returns_a_vector_is_named_at_shapes():
    def loss(params, batch, *, key):
        return _loss(params, batch, key=key)[None]

    report = diagnose(dataclasses.replace(healthy(), loss=loss))
    _assert_named(report, "shapes")
    assert "loss must return a scalar array of shape (); got shape (1,)" in report.why


def test_a_nan_made_by_forward_is_named_at_forward_with_its_operation():
    def forward(params, x, *, key):
        return jnp.sqrt(_forward(params, x, key=key))  # negative logits: NaN

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "forward")
    assert report.why.startswith("logits") and "nan" in report.why.lower()
    assert re.search(r"the first NaN comes from sqrt at .*test_diagnose\.py:\d+ \(in forward\)", report.nan_origin)


def test_a_log_of_zero_in_the_loss_is_named_at_loss_with_its_operation():
    def loss(params, batch, *, key):
        x, y = batch
        logits = _forward(params, x, key=key)
        probs = jax.nn.softmax(logits)  # log(softmax) instead of log_softmax: underflows to log(0)
        return -jnp.mean(jnp.log(jnp.take_along_axis(probs, y[:, None], axis=1)))

    p = healthy()
    big = jax.tree.map(lambda a: a * 1e4, p.params)  # confident logits: the wrong class gets probability 0
    y = np.asarray(jnp.argmin(_forward(big, p.batch[0], key=jax.random.key(9)), axis=1)).astype(np.int32)
    report = diagnose(dataclasses.replace(p, params=big, loss=loss, batch=(p.batch[0], y)))
    _assert_named(report, "loss")
    assert "the loss is inf" in report.why
    assert re.search(r"the first inf comes from log at .*test_diagnose\.py:\d+ \(in loss\)", report.nan_origin)


def test_an_exploding_gradient_is_named_at_gradients():
    # A surrogate derivative that overflows float32 away from 0 (a width far too small).
    spike = stejax.surrogate(lambda z: (z > 0).astype(z.dtype), lambda z: jnp.exp(100.0 * jnp.abs(z)))

    def forward(params, x, *, key):
        z = _forward(params, x, key=key)
        return z + spike(z)

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "gradients")
    assert report.why.startswith("grads[") and "inf" in report.why and "the loss" in report.why
    assert re.search(r"the first inf comes from exp at .*test_diagnose\.py:\d+", report.nan_origin)


def test_a_finite_gradient_explosion_is_named_at_gradients():
    # Steep but finite in float32: exp(20 |z|) on logits of order 1 gives a global norm far above the bound.
    spike = stejax.surrogate(lambda z: (z > 0).astype(z.dtype), lambda z: jnp.exp(20.0 * jnp.abs(z)))

    def forward(params, x, *, key):
        z = _forward(params, x, key=key)
        return z + spike(z)

    p = _with_forward(healthy(), forward)
    report = diagnose(p)
    _assert_named(report, "gradients")
    assert report.nan_origin is None  # nothing is non-finite
    match = re.search(
        r"global norm (\S+) exceeds the bound (\S+) \(max_grad_norm 1e\+06 \* max\(1, parameter", report.why
    )
    assert match, report.why
    norm, bound = float(match.group(1)), float(match.group(2))
    assert np.isfinite(norm) and norm > bound >= 1e6
    assert "the largest leaf is grads['w']" in report.why
    # The bound is stated, not hidden: a larger one lets the same gradient pass.
    assert diagnose(p, max_grad_norm=1e30).stage("gradients").status == "passed"
    with pytest.raises(ValueError, match="max_grad_norm must be a number > 0; got 0"):
        diagnose(p, max_grad_norm=0)


def test_an_update_that_changes_a_dtype_is_named_at_update():
    def update(params, grads):
        new = _update(params, grads)
        return {**new, "b": new["b"].astype(jnp.float16)}

    report = diagnose(dataclasses.replace(healthy(), update=update))
    _assert_named(report, "update")
    assert "new params['b']: dtype float16 differs" in report.why and "float32" in report.why
    assert report.nan_origin is None


def test_a_nan_constant_is_told_apart_from_a_nan_an_operation_makes():
    def update(params, grads):
        return jax.tree.map(lambda p, g: p - g * jnp.nan, params, grads)  # a NaN typed in, not computed

    report = diagnose(dataclasses.replace(healthy(), update=update))
    _assert_named(report, "update")
    assert "the NaN enters as a constant or an input at" in report.nan_origin


def test_python_side_state_that_jit_freezes_is_named_at_jit():
    calls = [0]

    def forward(params, x, *, key):
        calls[0] += 1  # a step counter kept in Python: read once under jit, at trace time
        temperature = 1.0 + 0.5 * calls[0]
        return _forward(params, x, key=key) / temperature

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "jit")
    assert report.why.startswith("jit(forward)") and "differ from the eager result" in report.why
    assert "Python-side state" in report.why


def test_code_that_does_not_trace_is_named_at_jit():
    def update(params, grads):
        if float(jnp.sum(grads["w"])) > 1e9:  # a Python branch on a value
            return params
        return _update(params, grads)

    report = diagnose(dataclasses.replace(healthy(), update=update))
    _assert_named(report, "jit")
    assert "jit(update) raised" in report.why and "ConcretizationTypeError" in report.why


def test_a_host_callback_that_sees_the_whole_batch_is_named_at_vmap():
    def share(a):  # NumPy on the host: each value's share of the total
        return (a / np.abs(a).sum()).astype(a.dtype)

    def forward(params, x, *, key):
        z = _forward(params, x, key=key)
        # A constant to the gradient (pure callbacks have no derivative rule).
        shares = jax.pure_callback(
            share, jax.ShapeDtypeStruct(z.shape, z.dtype), jax.lax.stop_gradient(z), vmap_method="expand_dims"
        )
        return z + shares

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "vmap")
    assert "jit(vmap(forward)) replica 0" in report.why


def test_a_backward_rule_with_python_state_is_named_at_grad():
    calls = [0]

    @jax.custom_vjp
    def scale(z):
        return z

    def scale_fwd(z):
        return z, None

    def scale_bwd(_, g):
        calls[0] += 1
        return (g * float(calls[0]),)

    scale.defvjp(scale_fwd, scale_bwd)

    def forward(params, x, *, key):
        return scale(_forward(params, x, key=key))

    report = diagnose(_with_forward(healthy(), forward))
    _assert_named(report, "grad")
    assert report.why.startswith("jit(grad(loss))")


def test_examples_and_pipeline_are_checked():
    with pytest.raises(ValueError, match="examples must be an int >= 1"):
        diagnose(healthy(), examples=0)
    with pytest.raises(TypeError, match=r"expected a stejax\.diagnose\.Pipeline"):
        diagnose(object())


# ----------------------------------------------------------------------------- the reference pipeline


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from stejax.data import load_digits, split
    from stejax.train import TrainConfig, train

    digits = load_digits()
    rows = np.sort(np.random.default_rng(0).choice(len(digits), 300, replace=False))
    small = split(dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits-300"), seed=0)
    config = TrainConfig(preset="w4a4", model="mlp", hidden=(16,), dropout=0.1, batch_size=32, epochs=1, patience=None)
    out = tmp_path_factory.mktemp("run")
    train(config, splits=small, out_dir=out)
    return out, small


def test_the_reference_pipeline_of_a_run_passes(run_dir):
    out, splits = run_dir
    pipeline = pipeline_from_run(out, batch=(splits.train.x[:8], splits.train.y[:8]))
    assert pipeline.contract.shape == (64,) and "w4a4" in pipeline.name
    report = diagnose(pipeline)
    assert report.ok, report.summary()


def test_the_reference_pipeline_takes_the_digits_batch_by_default(run_dir, tmp_path):
    import json
    import shutil

    from stejax.data import DIGITS_NAME
    from stejax.train import load_run, load_splits

    out, _ = run_dir
    with pytest.raises(ValueError, match=r"trained on 'digits-300'; pass its data as batch=\(x, y\)"):
        pipeline_from_run(out)
    # The same run, recorded as trained on the full digits: its first training batch is used.
    digits_run = shutil.copytree(out, tmp_path / "run")
    config = json.loads((digits_run / "config.json").read_text())
    config["data"]["name"] = DIGITS_NAME
    (digits_run / "config.json").write_text(json.dumps(config))
    pipeline = pipeline_from_run(digits_run)
    inputs, labels = pipeline.batch
    expected = load_splits(load_run(digits_run).config).train
    assert inputs.shape == (32, 64) and np.array_equal(np.asarray(labels), expected.y[:32])


def test_the_reference_pipeline_finds_nan_data(run_dir):
    out, splits = run_dir
    x = splits.train.x[:8].astype(np.float32)
    x[0, 10] = np.nan
    report = diagnose(pipeline_from_run(out, batch=(x, splits.train.y[:8])))
    _assert_named(report, "data")


def test_load_pipeline_calls_a_factory():
    assert load_pipeline("test_diagnose:healthy").name == "toy"
    with pytest.raises(TypeError, match=r"expected a stejax\.diagnose\.Pipeline"):
        load_pipeline("test_diagnose:_cross_entropy.__name__.upper")


def _with_leaf(params, layer, name, value):
    layers = list(params["layers"])
    layers[layer] = dict(layers[layer], **{name: jnp.asarray(value, layers[layer][name].dtype)})
    return dict(params, layers=tuple(layers) if isinstance(params["layers"], tuple) else layers)


def test_a_non_positive_lsq_step_is_named_at_forward(run_dir):
    out, splits = run_dir
    pipeline = pipeline_from_run(out, batch=(splits.train.x[:8], splits.train.y[:8]))
    params = _with_leaf(pipeline.params, 1, "a_step", -0.1)
    report = diagnose(dataclasses.replace(pipeline, params=params))
    _assert_named(report, "forward")
    assert re.search(r"non-positive quantiser step.*params\['layers'\]\[1\]\['a_step'\] = -0\.1\b", report.why)


def test_an_update_that_drives_a_step_negative_is_named_at_update(run_dir):
    out, splits = run_dir
    pipeline = pipeline_from_run(out, batch=(splits.train.x[:8], splits.train.y[:8]))

    def update(params, grads):
        new = pipeline.update(params, grads)
        # A step pushed far past zero, as too large a learning rate would.
        return _with_leaf(new, 0, "w_step", new["layers"][0]["w_step"] - 10.0)

    report = diagnose(dataclasses.replace(pipeline, update=update))
    _assert_named(report, "update")
    assert re.search(r"makes a quantiser step.*non-positive: params\['layers'\]\[0\]\['w_step'\]", report.why)
