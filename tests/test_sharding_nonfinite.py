"""The non-finite guard of ``stejax.train`` on a mesh of 8 host devices.

On a mesh the guard reads each step's finite flag from sharded metrics and, when
it is False, recomputes the failing step on one device from host copies (the
gathered parameters when they are sharded) to name the first non-finite leaf.
XLA's device count is fixed when JAX starts, so the cases (:func:`mesh_work`) run
in the one 8-device subprocess of ``tests/mesh_support.py``, after
``tests/test_sharding.py``'s work; the tests judge the JSON it returns. The
configuration is that module's one-epoch w4a4 run, so the subprocess reuses its
compiled steps instead of compiling its own.
"""

from __future__ import annotations

import pytest

from mesh_support import N_DEVICES, mesh_results

# ----------------------------------------------------------------------------- the subprocess


def _nan_at(params, layer: int, leaf: str):
    import jax.numpy as jnp

    layers = list(params["layers"])
    value = layers[layer][leaf]
    layers[layer] = dict(layers[layer], **{leaf: value.at[(0,) * value.ndim].set(jnp.nan)})
    return {"layers": tuple(layers)}


def _caught(call) -> dict:
    from stejax.train import NonFiniteError

    try:
        result = call()
    except NonFiniteError as error:
        return {"raised": True, "step": error.step, "part": error.part, "path": error.path, "message": str(error)}
    return {"raised": False, "epochs": len(result.history)}


def mesh_work(out: dict) -> None:
    """The poisoned runs on 8 devices, run by ``tests/mesh_support.py``'s subprocess; fills ``out``."""
    from stejax.train import TrainConfig, data_mesh, load_splits, train
    from stejax.train import _loop as loop

    # test_sharding's one-epoch w4a4 configuration (its _config("w4a4", epochs=1)): the same compiled steps.
    config = TrainConfig(model="mlp", hidden=(32,), dropout=0.1, batch_size=64, epochs=1, patience=None, preset="w4a4")
    splits = load_splits(config)
    mesh = data_mesh(N_DEVICES)

    # A NaN in a parameter from the start: the first step meets it, replicated and sharded.
    real_init = loop.init_params
    loop.init_params = lambda *a, **k: _nan_at(real_init(*a, **k), 1, "w")
    try:
        for layout in ("replicated", "sharded"):
            out[f"init_{layout}"] = _caught(
                lambda layout=layout: train(config, splits=splits, mesh=mesh, param_sharding=layout)
            )
    finally:
        loop.init_params = real_init

    # The third step returns a NaN bias: the fourth step meets it (the guard names that step).
    real_update = loop.compiled_parallel_update
    calls: list[int] = []

    def poisoning(*args, **kwargs):
        step = real_update(*args, **kwargs)

        def wrapped(params, opt_state, batch, key):
            calls.append(1)
            params, opt_state, metrics = step(params, opt_state, batch, key)
            return (_nan_at(params, 0, "b") if len(calls) == 3 else params), opt_state, metrics

        return wrapped

    loop.compiled_parallel_update = poisoning
    try:
        out["mid_run"] = _caught(lambda: train(config, splits=splits, mesh=mesh, param_sharding="sharded"))
    finally:
        loop.compiled_parallel_update = real_update

    # The same data and configuration, nothing poisoned: the run ends normally on the mesh.
    out["clean"] = _caught(lambda: train(config, splits=splits, mesh=mesh))


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def results() -> dict:
    return mesh_results("test_sharding_nonfinite")


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_a_non_finite_parameter_on_a_mesh_stops_at_step_1_naming_the_leaf(results, layout):
    got = results[f"init_{layout}"]
    assert got["raised"], got
    assert (got["step"], got["part"], got["path"]) == (1, "parameter", "['layers'][1]['w']"), got
    assert "non-finite parameter at step 1 (epoch 1, batch 1)" in got["message"], got["message"]


def test_a_nan_appearing_mid_run_on_a_mesh_names_the_step_that_met_it(results):
    got = results["mid_run"]
    assert got["raised"], got
    assert (got["step"], got["part"], got["path"]) == (4, "parameter", "['layers'][0]['b']"), got
    assert "layers/0/b" in got["message"], got["message"]


def test_the_same_run_without_poison_finishes(results):
    # The guard fires on NaN, not on the mesh itself.
    assert results["clean"] == {"raised": False, "epochs": 1}
