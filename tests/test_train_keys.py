"""The key discipline of stejax.train: eager steps under the key ledger (train's debug mode, the CLI's --debug-keys).

These tests run steps op by op, and an eager step compiles each operation of the
step for its shapes once per process (seconds, far more than the step itself).
They share one recipe (test_train.py's tiny w4a4 MLP, batches of 32) and are kept
in one module, with a module-scoped run, so that they run in one process and
compile those operations once.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import stejax.train._loop as loop_module
from stejax import keys
from stejax.cli import main
from stejax.train import compiled_update, forward, load_run, make_optimizer, train, update
from stejax.train._compare import NUMERICAL_TOLERANCES
from test_train import TINY, _batch, _model, _splits

LOGIT_TOL = NUMERICAL_TOLERANCES["jit_vs_eager_logits"]
LOSS_TOL = NUMERICAL_TOLERANCES["jit_vs_eager_loss"]


@pytest.fixture(scope="module")
def debug_run():
    """The tiny w4a4 recipe trained with its first two steps checked by the key ledger."""
    return train(dataclasses.replace(TINY, preset="w4a4"), splits=_splits(), debug_keys=2)


def test_debug_keys_proves_each_key_is_consumed_once(debug_run):
    check = debug_run.key_check
    assert check is not None and check.steps == 2
    # Every key made is consumed exactly once, except the one carried forward.
    assert check.unused == ("train: run -> run, step 2",)
    # 2 (seed) + 1 (init's split) * 2 layers + 2 (epoch shuffle) + 2 steps * (2 + 32 examples) at least.
    assert check.keys_recorded >= 2 + 2 + 2 + 2 * 34


def test_eager_and_compiled_steps_agree(debug_run):
    # One training step (dropout on, the same key), op by op and compiled. The eager
    # step runs as train's debug mode runs it (the same shapes, so the two share per-op
    # compiles), and the ledger sees the step consume its key once, by one split per example.
    mc, qc, params = _model("mlp", "w4a4")
    batch = _batch(32)
    opt = make_optimizer(TINY, 8)
    state, key = opt.init(params), jax.random.key(3)
    with keys.checked() as ledger, jax.disable_jit():
        eager = update(params, state, batch, key, model_config=mc, qat_config=qc, optimizer=opt)
    assert len(ledger) == 1 + 32 and ledger.unused() == ()
    compiled = compiled_update(mc, qc, opt)(params, state, batch, key)
    np.testing.assert_allclose(compiled[2].loss, eager[2].loss, **LOSS_TOL)
    for a, b in zip(jax.tree.leaves(compiled[0]), jax.tree.leaves(eager[0]), strict=True):
        np.testing.assert_allclose(a, b, **LOGIT_TOL)


def test_without_dropout_the_loop_makes_no_step_keys():
    config = dataclasses.replace(TINY, dropout=0.0)
    check = train(config, splits=_splits(), debug_keys=1).key_check
    assert check.unused == ("train: run -> run, epoch 1 shuffle",)


def test_reusing_a_key_in_forward_is_caught():
    mc, qc, params = _model("mlp", "float")
    key = jax.random.key(5)
    x = _batch(32).x  # the batch size of the other eager tests: the same per-op compiles
    with keys.checked(jax_check=False):
        forward(params, x, model_config=mc, qat_config=qc, key=key, train=True)
        with pytest.raises(keys.KeyReuseError, match="consumed twice"):
            forward(params, x, model_config=mc, qat_config=qc, key=key, train=True)


def test_cli_train_writes_a_run_directory(tmp_path, monkeypatch, debug_run):
    # The CLI loads the full digits; here it gets the 400-example subset instead.
    monkeypatch.setattr(loop_module, "load_splits", lambda config: _splits())
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(dataclasses.replace(TINY, preset="w4a4", epochs=5).to_dict()))
    out = tmp_path / "run"
    args = ["train", "--config", str(config), "--epochs", "2", "--out", str(out), "--debug-keys"]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "debug-keys: 2 step(s)" in result.output and "none consumed twice" in result.output
    assert "test accuracy" in result.output and str(out.resolve()) in result.output
    run = load_run(out)
    assert run.config.preset == "w4a4" and run.config.epochs == 2 and len(run.metrics) == 2
    assert run.report["key_check"]["steps"] == 2
    # The same recipe as the library's debug run, and the same result.
    assert run.report["test_accuracy"] == debug_run.test_accuracy
