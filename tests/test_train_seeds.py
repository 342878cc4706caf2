"""train_seeds: several seeds of one recipe as one program, equal run for run to train().

Tolerance: the same float32 operations as train() in a different program (vmapped
over runs, the batch gathered on the device), so XLA may fuse and reduce in another
order; parameters agree to atol 1e-5, and the selections (best epoch, test
accuracy) agree exactly on these tiny, short runs. (Over many epochs a quantised run
can turn a one-ulp difference into a flipped rounding and a different trajectory.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax.train._seeds as seeds_module
from stejax.data import load_digits, split
from stejax.train import NonFiniteError, TrainConfig, load_run, train, train_seeds

TINY = TrainConfig(model="mlp", hidden=(16,), dropout=0.1, batch_size=32, epochs=2, patience=None, preset="w4a4")


@functools.cache
def _digits():
    digits = load_digits()
    rows = np.sort(np.random.default_rng(0).choice(len(digits), 400, replace=False))
    return dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits-400")


def _runs(base: TrainConfig, seeds=(0, 1)):
    configs = [dataclasses.replace(base, seed=s, data_seed=s) for s in seeds]
    return configs, [split(_digits(), seed=s) for s in seeds]


@functools.cache
def _train(config: TrainConfig):
    """train() of one run on its own split, shared by the tests that compare against it."""
    return train(config, splits=split(_digits(), seed=config.data_seed))


@pytest.mark.parametrize("vmap_runs", [True, False])
def test_each_run_equals_train_of_that_seed(vmap_runs, tmp_path):
    configs, splits = _runs(TINY)
    results = train_seeds(configs, splits=splits, vmap_runs=vmap_runs, out_dirs=[tmp_path / "a", tmp_path / "b"])
    for config, got in zip(configs, results, strict=True):
        want = _train(config)
        for a, b in zip(jax.tree.leaves(want.params), jax.tree.leaves(got.params), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert got.config == config and got.best_epoch == want.best_epoch
        assert got.test_accuracy == want.test_accuracy and got.n_test == want.n_test
        assert [r["val_accuracy"] for r in got.history] == [r["val_accuracy"] for r in want.history]
        np.testing.assert_allclose(
            [r["train_loss"] for r in got.history], [r["train_loss"] for r in want.history], rtol=1e-5
        )
        assert got.history[-1]["zero_grad_fraction"] == pytest.approx(want.history[-1]["zero_grad_fraction"])
    assert load_run(tmp_path / "b").config.seed == 1 and len(load_run(tmp_path / "b").metrics) == 2


def test_the_conv_model_is_not_vmapped_by_default_and_still_matches():
    base = dataclasses.replace(TINY, model="cnn", channels=(4, 6), epochs=1)
    configs, splits = _runs(base, seeds=(0,))
    (got,) = train_seeds(configs, splits=splits)
    want = _train(configs[0])
    for a, b in zip(jax.tree.leaves(want.params), jax.tree.leaves(got.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_early_stopping_is_per_run():
    # Patience 1 over 6 epochs: each run stops at its own first non-improving epoch. Float, because a
    # quantised run turns a one-ulp difference of the two programs into a flipped rounding after a few epochs.
    base = dataclasses.replace(TINY, epochs=6, patience=1, learning_rate=3e-2, preset="float")
    configs, splits = _runs(base, seeds=(0, 5))  # seed 5 stops at epoch 5, seed 0 runs all 6
    results = train_seeds(configs, splits=splits)
    for config, got in zip(configs, results, strict=True):
        want = _train(config)
        assert len(got.history) == len(want.history) and got.stopped_early == want.stopped_early
        assert got.best_epoch == want.best_epoch and got.test_accuracy == want.test_accuracy
    assert len({len(r.history) for r in results}) > 1, "pick a recipe where the runs stop at different epochs"


def test_a_non_finite_step_is_named_after_a_replay(monkeypatch):
    real_init = seeds_module.init_params

    def poisoned(key, *args, **kwargs):
        params = real_init(key, *args, **kwargs)
        layers = list(params["layers"])
        layers[1] = dict(layers[1], w=layers[1]["w"].at[0, 0].set(jnp.nan))
        return {"layers": tuple(layers)}

    monkeypatch.setattr(seeds_module, "init_params", poisoned)
    configs, splits = _runs(TINY)
    with pytest.raises(
        NonFiniteError, match=r"parameter at step 1 \(run 0, epoch 1, batch 1\).*\['layers'\]\[1\]\['w'\]"
    ):
        train_seeds(configs, splits=splits)


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([], "needs at least one TrainConfig"),
        ([TINY, dataclasses.replace(TINY, seed=1, hidden=(8,))], r"differs from configs\[0\] in \['hidden'\]"),
        ([TINY, TINY], r"its own \(seed, data_seed\)"),
        (["w4a4"], r"configs\[0\] must be a TrainConfig"),
    ],
)
def test_bad_configs_are_refused(configs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        train_seeds(configs, splits=[])


def test_splits_of_different_sizes_are_refused():
    configs, splits = _runs(TINY)
    other = split(_digits(), seed=1, val_fraction=0.2)
    with pytest.raises(ValueError, match="must have the same"):
        train_seeds(configs, splits=[splits[0], other])
