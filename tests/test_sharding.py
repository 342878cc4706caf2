"""Data parallel on 8 host devices: training and every catalog estimator, sharded against one device.

XLA's device count is fixed when JAX starts, so the work (:func:`mesh_work`) runs
once, in the 8-device subprocess of ``tests/mesh_support.py``, which it shares with
``tests/test_sharding_nonfinite.py``; the tests below judge the JSON it returns. The
subprocess applies the suite's strict settings (dtype promotion "strict", rank
promotion "raise").

Stated tolerances, and why:

* Training. A data-parallel step is the one-device step with the batch mean of
  the loss and the gradient computed as per-device partial sums plus an
  all-reduce: the same float32 operations in another order, a few ulps per step.
  - From the same state (teacher forcing, every step of a 12-step run), the
    8-device step's loss agrees with the 1-device one to rtol 1e-6 and its
    parameters to atol 1e-6 (they are O(1)), for float and for QAT presets.
  - Free-running, a float model's per-step loss trajectory agrees to rtol 1e-5
    over 12 steps, and the per-epoch losses of a 2-epoch ``train`` to rtol 1e-5.
    A QAT model is left out of the free-running check on purpose: an input
    within an ulp of a rounding boundary flips level under a one-ulp difference,
    and Adam turns that into an O(learning rate) step, so free-running QAT runs
    differ after the first flip (here about 10 steps) however the reduction is
    ordered. Teacher forcing is the exact statement of "equal up to reduction
    order" for them.
  - A one-device mesh gives bit-identical losses to no mesh, and the "sharded"
    parameter layout the same as "replicated" to rtol 1e-6.
* Estimators, on a (16, k) float32 input split 8 ways along its rows: the forward
  is bitwise equal to the one-device result, eagerly and under ``jit``, and under
  ``shard_map`` bitwise equal to the estimator applied to each row block. One
  exception, by design: ``magnitude_aware_sign`` scales by a mean over the rows,
  which the split turns into a sum of partial sums, so its forward agrees to
  2 ulp (rtol 2 eps) on split rows and bitwise on split channels. The
  gradient with respect to the input is equal to rtol 1e-6 / atol 1e-7 (bitwise
  for elementwise surrogates, which the JSON records); the gradient of an
  argument every row shares (a step, a clip level, a codebook) is a sum over the
  rows, so it agrees up to that sum's order: rtol 1e-5, atol 1e-6.
* Integer products (int8 forward and backward, :func:`stejax.integer_dot_general`).
  - The product itself, rows split 8 ways, from the same operands and cotangent:
    the output and both backward products are bitwise the one-device ones. Per-token
    and per-channel scales belong to one row or column; a per-tensor scale and the
    cotangent's per-column scale are maxima over the split rows, and the sums are
    int32: both exact in any order; the stochastic rounding's noise does not depend
    on the split.
  - The LM (``w8a8_int8``), batch split 8 ways: its mean loss is the mean of its
    per-token losses to rtol 1e-6 (the order of the mean).
  - Against the one-device program on the same parameters and batch, the LM's
    losses and gradient are not equal, and not by a bug: XLA:CPU sums a row
    (RMSNorm's mean of squares, softmax) in another order in a program of 16 rows
    than in a device's program of 2, a few ulps apart (the unquantised model differs
    as much), and a value that close to an int8 rounding boundary gets a code one
    step apart: an activation's in the forward, a cotangent's in the backward (a
    weight gradient's column then moves by one step times a row of the input's
    codes). A flip moves one code by one step of its grid; quantisation moves every
    code, by up to half a step (step / sqrt(12) in rms). So with F flips among N
    codes the split moves the losses and the gradient by about sqrt(F) steps and
    quantisation by about sqrt(N / 12): the split run's per-token losses and
    gradient lie closer to the one-device ones (in norm) than quantisation puts the
    one-device ones from the unquantised model's, unless F nears N / 12 (thousands of
    codes here, while ulp-sized differences flip a few). That bound is itself small
    (quantisation moves the losses by under 1% and the gradient by under 10% of
    their norms). Over 240 draws (4 of the parameters, 60 of the batch) 108 had a
    flip, and the split's change reached 0.08 (losses) and 0.11 (gradient) of the
    bound; the test's own draw is the 0.11 one (a forward flip: loss rel 6e-6).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from mesh_support import N_DEVICES, mesh_results

ROWS = 16
STEPS = 12
PRESETS_FORCED = ("float", "w4a4", "w1a1")

STEP_LOSS_RTOL = 1e-6
STEP_PARAM_ATOL = 1e-6
FREE_LOSS_RTOL = 1e-5
GRAD_X_RTOL, GRAD_X_ATOL = 1e-6, 1e-7
GRAD_SHARED_RTOL, GRAD_SHARED_ATOL = 1e-5, 1e-6
FORWARD_RTOL = 2 * float(np.finfo(np.float32).eps)
FORWARD_ATOL = float(np.finfo(np.float32).tiny)
# Estimators whose forward reduces over the rows the mesh splits: magnitude_aware_sign
# scales by mean |x| over every axis but the channel axis (the last), so split rows
# make that mean a sum of per-device partial sums. Equal up to reduction order on
# split rows, bitwise when the channels are split instead (a column-sharded weight).
REDUCES_OVER_ROWS = ("magnitude_aware_sign",)
# Estimators whose forward reduces over the whole tensor: absmean_ternary scales by
# mean |w| over every element, so any split makes that mean a sum of per-device partial
# sums: equal up to reduction order whichever axis is split (a code can flip only at an
# exact tie, which random inputs do not hit).
REDUCES_OVER_TENSOR = ("absmean_ternary",)
# How far quantisation may move the LM's per-token losses and its gradient from the unquantised model's, relative
# to their norms (measured: at most 0.0042 and 0.036 over 240 draws): the bounds on the split's changes are small.
LOSSES_QUANTISATION_REL, GRAD_QUANTISATION_REL = 0.01, 0.1
# integer_dot_general's options checked on split rows, chosen so that every reduction over the rows is there: a
# per-tensor lhs scale (a max over every row), the cotangent's per-column scale (a max over the rows, as with the LM's
# per-token scale), the int32 sums of the weight's gradient, and stochastic rounding's noise; with groups. (The LM's
# per-token scale adds only a per-row scale, which the split cannot change.)
INTEGER_PRODUCT_CASES = {
    "tensor_grouped_stochastic": {"lhs_scale": "tensor", "group_size": 8, "rounding": "stochastic"},
}


# ----------------------------------------------------------------------------- the subprocess


def _config(preset: str, **changes):
    from stejax.train import TrainConfig

    base = dict(model="mlp", hidden=(32,), dropout=0.1, batch_size=64, epochs=2, patience=None, preset=preset)
    return TrainConfig(**{**base, **changes})


def _trajectories(out: dict) -> None:
    """Per-step losses: free-running (float) and teacher-forced (every preset in PRESETS_FORCED)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from stejax.data import Normalizer
    from stejax.model import init_params
    from stejax.train import (
        Batch,
        compiled_parallel_update,
        compiled_update,
        data_mesh,
        gather,
        load_splits,
        make_optimizer,
        param_shardings,
        place,
        shard_batch,
    )

    mesh = data_mesh(N_DEVICES)
    replicated = NamedSharding(mesh, PartitionSpec())
    for name in PRESETS_FORCED:
        # The configurations _training trains (float for 2 epochs, the QAT presets for 1): the same optimiser
        # schedule, so the 8-device step compiled here is the one train() runs (read from the run's compilation
        # cache instead of compiled again).
        config = _config(name) if name == "float" else _config(name, epochs=1)
        splits = load_splits(config)
        normalizer = Normalizer.fit(splits.train.x)
        x, y = normalizer.apply(splits.train.x), np.asarray(splits.train.y)
        mc, qc = config.model_config(splits.train), config.qat_config()
        optimizer = make_optimizer(config, 19)
        params = init_params(jax.random.key(0), mc, qc, calibration_batch=x[:256])
        state = optimizer.init(params)
        one = compiled_update(mc, qc, optimizer)
        eight = compiled_parallel_update(mc, qc, optimizer, mesh, "replicated")

        def on_mesh(params, state, batch, key, *, layout="replicated", step=eight):
            params = place(params, param_shardings(params, mesh, layout))
            state = place(state, param_shardings(state, mesh, layout))
            return step(params, state, shard_batch(batch, mesh), place(key, replicated))

        free_one, free_eight = (params, state), (params, state)
        forced = {"loss_rel": 0.0, "param_abs": 0.0}
        losses_one, losses_eight = [], []
        for i in range(STEPS):
            batch = Batch(x[64 * i : 64 * (i + 1)], y[64 * i : 64 * (i + 1)])
            key = jax.random.fold_in(jax.random.key(1), i)
            p1, s1, m1 = one(*free_one, batch, key)
            p8, _, m8 = on_mesh(*free_one, batch, key)  # teacher forcing: the 1-device state
            forced["loss_rel"] = max(forced["loss_rel"], abs(float(m8.loss) / float(m1.loss) - 1))
            diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), p1, gather(p8))
            forced["param_abs"] = max(forced["param_abs"], *jax.tree.leaves(diffs))
            losses_one.append(float(m1.loss))
            if name == "float":  # free-running is compared for float only (see the module docstring)
                p, s, m = on_mesh(*free_eight, batch, key)
                free_eight = (p, s)
                losses_eight.append(float(m.loss))
            free_one = (p1, s1)
        out["trajectory"][name] = {"one": losses_one, "eight": losses_eight, "forced": forced}


def _training(out: dict, tmp: Path) -> None:
    import jax

    from stejax.train import data_mesh, train

    def summary(result):
        return {
            "train_loss": [h["train_loss"] for h in result.history],
            "val_loss": [h["val_loss"] for h in result.history],
            "test_accuracy": result.test_accuracy,
            "devices": result.devices,
            "param_sharding": result.param_sharding,
            "params": [np.asarray(leaf).tolist() for leaf in jax.tree.leaves(result.params)],
            "params_on": sorted({str(leaf.sharding.device_set) for leaf in jax.tree.leaves(result.params)}),
        }

    float_config, qat_config = _config("float"), _config("w4a4", epochs=1)
    mesh = data_mesh(N_DEVICES)
    out["train"] = {
        "float_none": summary(train(float_config)),
        "float_mesh1": summary(train(float_config, mesh=data_mesh(1))),
        "float_mesh8": summary(train(float_config, mesh=mesh, out_dir=tmp / "run8")),
        "w4a4_replicated": summary(train(qat_config, mesh=mesh)),
        "w4a4_sharded": summary(train(qat_config, mesh=mesh, param_sharding="sharded")),
    }
    out["run_dir"] = json.loads((tmp / "run8" / "report.json").read_text())
    errors = {}
    for name, call in {
        "batch": lambda: train(_config("float", batch_size=60), mesh=mesh),
        "debug_keys": lambda: train(float_config, mesh=mesh, debug_keys=2),
        "layout": lambda: train(float_config, mesh=mesh, param_sharding="columns"),
        "too_many": lambda: data_mesh(N_DEVICES + 1),
    }.items():
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as error:
            errors[name] = f"{type(error).__name__}: {error}"
    out["errors"] = errors


def _estimator_case(entry):
    import jax
    import jax.numpy as jnp

    params = entry.default_params()
    width = entry.example_shape(**params)[-1] if entry.example_shape else 4
    shape = (ROWS, width)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2.0).astype(np.float32)
    args = tuple(np.asarray(a) for a in entry.example_args(rng, shape, np.float32, params))
    bind = dict(params)
    if entry.random:
        bind["key"] = jax.random.key(7)
    fn = functools.partial(entry.fn, **bind)
    # The output's shape, traced without running (an eager call would compile each operation for one device).
    w = rng.standard_normal(jax.eval_shape(fn, jnp.asarray(x), *args).shape).astype(np.float32)
    return fn, x, args, w


def _bitwise(a, b) -> bool:
    from helpers import assert_bitwise_equal

    try:
        assert_bitwise_equal(np.asarray(a), np.asarray(b))
        return True
    except AssertionError:
        return False


def _worst(got, expected, rtol: float, atol: float) -> float:
    """The largest |got - expected| / (atol + rtol |expected|): at most 1 passes."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(got - expected) / (atol + rtol * np.abs(expected)), initial=0.0))


def _grad_report(got, expected) -> dict:
    shared = [_worst(g, e, GRAD_SHARED_RTOL, GRAD_SHARED_ATOL) for g, e in zip(got[1:], expected[1:])]
    return {
        "x_bitwise": _bitwise(got[0], expected[0]),
        "x_worst": _worst(got[0], expected[0], GRAD_X_RTOL, GRAD_X_ATOL),
        "shared_worst": max(shared, default=0.0),
    }


def _estimator_result(entry, mesh) -> dict:
    """One catalog entry on split rows (jit, eager, shard_map) against one device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    fn, x, args, w = _estimator_case(entry)
    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    # The cotangent w is the first argument, so the estimator's arguments start at 1.
    argnums = tuple(i + 1 for i in entry.diff_argnums)

    def loss(w, x, *args):
        return jnp.sum(fn(x, *args) * w)

    grad = jax.jit(jax.grad(loss, argnums=argnums))
    y_one = jax.jit(fn)(jnp.asarray(x), *args)
    g_one = grad(jnp.asarray(w), jnp.asarray(x), *args)
    # Split rows, shared arguments replicated.
    ws, xs, args_s = jax.device_put(w, rows), jax.device_put(x, rows), tuple(jax.device_put(a, whole) for a in args)
    y_jit, y_eager = jax.jit(fn)(xs, *args_s), fn(xs, *args_s)
    g_shard = grad(ws, xs, *args_s)
    # shard_map: each device runs the estimator on its own row block.
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=(P("data"), *(P() for _ in args)), out_specs=P("data"))
    y_map = jax.jit(mapped)(xs, *args_s)
    g_map = jax.jit(jax.grad(lambda w, x, *a: jnp.sum(mapped(x, *a) * w), argnums=argnums))(ws, xs, *args_s)
    # Its reference: the estimator on each block on one device; shared gradients summed over blocks.
    blocks = np.split(np.arange(ROWS), N_DEVICES)
    y_blocks = np.concatenate([np.asarray(jax.jit(fn)(jnp.asarray(x[b]), *args)) for b in blocks])
    per_block = [grad(jnp.asarray(w[b]), jnp.asarray(x[b]), *args) for b in blocks]
    g_blocks = [np.concatenate([np.asarray(g[0]) for g in per_block])] + [
        np.sum([np.asarray(g[k]) for g in per_block], axis=0) for k in range(1, len(argnums))
    ]
    return {
        # atol: the smallest normal float32, so that 0 against 0 counts as equal (not 0/0).
        "forward_worst": max(_worst(y, y_one, FORWARD_RTOL, FORWARD_ATOL) for y in (y_jit, y_eager)),
        "forward_jit_bitwise": _bitwise(y_jit, y_one),
        "forward_eager_bitwise": _bitwise(y_eager, y_one),
        "output_sharded": str(y_jit.sharding.spec),
        "grad": _grad_report(g_shard, g_one),
        "shard_map_forward_bitwise": _bitwise(y_map, y_blocks),
        "shard_map_grad": _grad_report(g_map, g_blocks),
    }


def _estimators(out: dict) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from stejax.estimators.catalog import CATALOG
    from stejax.train import data_mesh

    mesh = data_mesh(N_DEVICES)
    results = {entry.name: _estimator_result(entry, mesh) for entry in CATALOG.values()}
    # Channels split instead of rows, for the estimators that reduce over rows.
    columns = NamedSharding(mesh, P(None, "data"))
    for name in REDUCES_OVER_ROWS:
        x = np.random.default_rng(1).standard_normal((ROWS, 2 * N_DEVICES)).astype(np.float32)
        fn = functools.partial(CATALOG[name].fn, **CATALOG[name].default_params())
        y_one = jax.jit(fn)(jnp.asarray(x))
        xs = jax.device_put(x, columns)
        results[name]["columns_forward_bitwise"] = _bitwise(jax.jit(fn)(xs), y_one) and _bitwise(fn(xs), y_one)
    out["estimators"] = results


def mesh_work(out: dict) -> None:
    """The work on 8 devices, run by ``tests/mesh_support.py``'s subprocess; fills ``out`` for the tests."""
    import tempfile

    out["trajectory"] = {}
    _estimators(out)
    _trajectories(out)
    _integer_products(out)
    with tempfile.TemporaryDirectory() as tmp:
        _training(out, Path(tmp))


def _integer_product_cases(mesh) -> dict:
    """integer_dot_general forward and both backward products, rows split 8 ways, against one device."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from stejax import integer_dot_general

    rng = np.random.default_rng(2)
    # The LM's form: (batch, time, in) x (in, out), contracting "in"; the mesh splits the batch.
    x = rng.standard_normal((ROWS, 16, 32)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    cotangent = rng.standard_normal((ROWS, 16, 64)).astype(np.float32)
    dims = (((2,), (0,)), ((), ()))

    @jax.jit
    def products(x, w, cotangent, key):  # every case in one program: one compilation per device count
        out = {}
        for name, options in INTEGER_PRODUCT_CASES.items():
            bind = {**options, "key": key if options.get("rounding") == "stochastic" else None}
            y, vjp = jax.vjp(functools.partial(integer_dot_general, dimension_numbers=dims, **bind), x, w)
            out[name] = (y, *vjp(cotangent))
        return out

    rows, whole = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])), NamedSharding(mesh, PartitionSpec())
    key = jax.random.key(3)
    one = products(x, w, cotangent, key)
    eight = products(*jax.device_put((x, w, cotangent, key), (rows, whole, rows, whole)))
    return {
        name: {
            **{part: _bitwise(a, b) for part, a, b in zip(("y", "x_bar", "w_bar"), eight[name], one[name])},
            "y_sharding": str(eight[name][0].sharding.spec),
        }
        for name in INTEGER_PRODUCT_CASES
    }


def _integer_products(out: dict) -> None:
    """The LM with int8 products forward and backward (w8a8_int8), batch split 8 ways, against one device."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from stejax.lm import LMConfig, Transformer, quantize_lm
    from stejax.train import data_mesh

    mesh = data_mesh(N_DEVICES)
    config = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama")
    # Its parameters drawn by numpy (norm scales 1, weights N(0, 1/fan_in)): no op-by-op initialisation to compile.
    graphdef, shapes, rest = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))), nnx.Param, ...)
    draw = np.random.default_rng(1)

    def initial(s):
        return np.ones(s.shape, s.dtype) if s.ndim == 1 else draw.normal(0, s.shape[0] ** -0.5, s.shape).astype(s.dtype)

    float_model = nnx.merge(graphdef, jax.tree.map(initial, shapes), rest)
    tokens = np.random.default_rng(0).integers(0, 256, (ROWS, config.context + 1)).astype(np.uint8)

    def programs(model):
        """The parameters and a jitted (mean loss, per-token losses, gradient)."""
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def per_token(p, tokens):
            logits = nnx.merge(graphdef, p, rest)(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:].astype(jnp.int32))

        def mean(p, tokens):
            each = per_token(p, tokens)
            return each.mean(), each

        def loss_and_grad(p, tokens):
            (loss, each), grad = jax.value_and_grad(mean, has_aux=True)(p, tokens)
            return loss, each, grad

        return params, jax.jit(loss_and_grad)

    params, loss_and_grad = programs(quantize_lm(float_model, "w8a8_int8"))
    _, one_each, one_grad = loss_and_grad(params, tokens)
    split = jax.device_put(tokens, NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])))
    on_mesh = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    eight_loss, eight_each, eight_grad = loss_and_grad(on_mesh, split)
    # The unquantised model: how far quantisation moves the per-token losses and the gradient.
    float_params, float_loss_and_grad = programs(float_model)
    _, float_each, float_grad = float_loss_and_grad(float_params, tokens)

    def flat(tree):
        return np.concatenate([np.ravel(np.asarray(leaf, np.float64)) for leaf in jax.tree.leaves(tree)])

    each1, each8, each_float = (np.asarray(e, np.float64) for e in (one_each, eight_each, float_each))
    g1, g8, g_float = flat(one_grad), flat(eight_grad), flat(float_grad)
    out["integer_products"] = {
        "shards": len(split.sharding.device_set),
        "products": _integer_product_cases(mesh),
        "mean_rel": abs(float(eight_loss) / float(np.mean(each8)) - 1),
        "loss_rel": abs(float(np.mean(each8)) / float(np.mean(each1)) - 1),
        "losses_split": float(np.linalg.norm(each8 - each1)),
        "losses_quantisation": float(np.linalg.norm(each1 - each_float)),
        "grad_split": float(np.linalg.norm(g8 - g1)),
        "grad_quantisation": float(np.linalg.norm(g1 - g_float)),
        "grad_norm": float(np.linalg.norm(g1)),
        "losses_norm": float(np.linalg.norm(each1)),
    }


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def results() -> dict:
    return mesh_results("test_sharding")


def _catalog_names() -> list[str]:
    from stejax.estimators.catalog import CATALOG

    return list(CATALOG)


def test_the_subprocess_has_eight_devices(results):
    assert results["device_count"] == N_DEVICES


@pytest.mark.parametrize("name", PRESETS_FORCED)
def test_each_step_on_eight_devices_equals_the_one_device_step(results, name):
    forced = results["trajectory"][name]["forced"]
    assert forced["loss_rel"] <= STEP_LOSS_RTOL, forced
    assert forced["param_abs"] <= STEP_PARAM_ATOL, forced


def test_the_free_running_float_trajectory_matches(results):
    run = results["trajectory"]["float"]
    np.testing.assert_allclose(run["eight"], run["one"], rtol=FREE_LOSS_RTOL, atol=0)
    assert len(run["one"]) == STEPS


def test_train_on_eight_devices_matches_one_device(results):
    runs = results["train"]
    one, eight = runs["float_none"], runs["float_mesh8"]
    for field in ("train_loss", "val_loss"):
        np.testing.assert_allclose(eight[field], one[field], rtol=FREE_LOSS_RTOL, atol=0, err_msg=field)
    assert eight["test_accuracy"] == one["test_accuracy"]
    for a, b in zip(eight["params"], one["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4)
    assert (eight["devices"], eight["param_sharding"], one["devices"]) == (N_DEVICES, "replicated", 1)
    # The returned parameters are ordinary one-device arrays, as without a mesh.
    assert eight["params_on"] == one["params_on"] and "," not in eight["params_on"][0]


def test_integer_products_on_eight_devices_are_bitwise_the_one_device_products(results):
    cases = results["integer_products"]["products"]
    assert set(cases) == set(INTEGER_PRODUCT_CASES)
    for name, case in cases.items():
        assert case == {"y": True, "x_bar": True, "w_bar": True, "y_sharding": "P('data',)"}, (name, case)


def test_integer_products_on_eight_devices_give_the_one_device_loss(results):
    run = results["integer_products"]
    assert run["shards"] == N_DEVICES
    assert run["mean_rel"] <= STEP_LOSS_RTOL, run
    # Per token, closer to the one-device losses than quantisation moves them (module docstring), a small bound.
    assert run["losses_split"] <= run["losses_quantisation"] <= LOSSES_QUANTISATION_REL * run["losses_norm"], run


def test_integer_products_on_eight_devices_give_the_one_device_gradient_up_to_flipped_codes(results):
    # Closer to the one-device gradient than quantisation moves it (module docstring), a small bound.
    run = results["integer_products"]
    assert run["grad_split"] <= run["grad_quantisation"] <= GRAD_QUANTISATION_REL * run["grad_norm"], run


def test_a_one_device_mesh_is_bitwise_the_plain_run(results):
    runs = results["train"]
    assert runs["float_mesh1"]["train_loss"] == runs["float_none"]["train_loss"]
    assert runs["float_mesh1"]["params"] == runs["float_none"]["params"]


def test_sharded_parameters_match_replicated_ones(results):
    runs = results["train"]
    replicated, sharded = runs["w4a4_replicated"], runs["w4a4_sharded"]
    np.testing.assert_allclose(sharded["train_loss"], replicated["train_loss"], rtol=STEP_LOSS_RTOL, atol=0)
    assert sharded["param_sharding"] == "sharded"
    for a, b in zip(sharded["params"], replicated["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=STEP_PARAM_ATOL)


def test_the_run_directory_records_the_devices(results):
    report = results["run_dir"]
    assert (report["devices"], report["processes"], report["param_sharding"]) == (N_DEVICES, 1, "replicated")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("batch", "batch_size 60 does not split evenly over the 8 devices"),
        ("debug_keys", "debug_keys runs the first steps eagerly on one device"),
        ("layout", "param_sharding must be one of ['replicated', 'sharded']; got 'columns'"),
        ("too_many", "asked for 9 device(s); 8 available"),
    ],
)
def test_unusable_meshes_are_refused(results, case, message):
    assert results["errors"][case] is not None and message in results["errors"][case]


@pytest.mark.parametrize("name", _catalog_names())
def test_estimator_forward_is_bitwise_on_sharded_inputs(results, name):
    r = results["estimators"][name]
    assert r["output_sharded"] == "P('data',)", r
    if name in REDUCES_OVER_ROWS:
        assert r["forward_worst"] <= 1.0 and r["columns_forward_bitwise"], r
    elif name in REDUCES_OVER_TENSOR:
        assert r["forward_worst"] <= 1.0, r
    else:
        assert r["forward_jit_bitwise"] and r["forward_eager_bitwise"], r
    assert r["shard_map_forward_bitwise"], r


@pytest.mark.parametrize("name", _catalog_names())
def test_estimator_gradient_on_sharded_inputs(results, name):
    r = results["estimators"][name]
    for where in ("grad", "shard_map_grad"):
        assert r[where]["x_worst"] <= 1.0, (where, r)
        assert r[where]["shared_worst"] <= 1.0, (where, r)


def test_elementwise_estimators_have_bitwise_input_gradients(results):
    from stejax.estimators.catalog import CATALOG

    elementwise = [e.name for e in CATALOG.values() if e.derivative is not None and e.name not in REDUCES_OVER_ROWS]
    assert all(results["estimators"][n]["grad"]["x_bitwise"] for n in elementwise), {
        n: results["estimators"][n]["grad"] for n in elementwise
    }


def test_cli_asks_for_more_devices_than_there_are(tmp_path):
    from click.testing import CliRunner

    from stejax.cli import main as cli

    args = ["train", "--preset", "float", "--devices", "64", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "xla_force_host_platform_device_count" in result.output, result.output
    result = CliRunner().invoke(cli, ["train", "--preset", "float", "--shard-params", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--shard-params needs a mesh" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--num-processes and --process-id missing"),
        (["--num-processes", "2"], "--process-id missing"),
        (["--process-id", "0"], "--num-processes missing"),
        (["--num-processes", "2", "--process-id", "2"], "--process-id must be in 0..1 for --num-processes 2; got 2"),
    ],
)
def test_cli_checks_the_coordinator_flags_before_initialising(tmp_path, monkeypatch, extra, message):
    import jax
    from click.testing import CliRunner

    from stejax.cli import main as cli

    def never(**kwargs):
        raise AssertionError(f"jax.distributed.initialize called with {kwargs}")

    monkeypatch.setattr(jax.distributed, "initialize", never)
    args = ["train", "--preset", "float", "--coordinator", "127.0.0.1:1234", *extra, "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    result = CliRunner().invoke(cli, ["train", "--preset", "float", "--coordinator", "127.0.0.1", "--out", "r"])
    assert result.exit_code == 2 and "expected HOST:PORT" in " ".join(result.output.split()), result.output
