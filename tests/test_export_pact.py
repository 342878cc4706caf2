"""PACT inputs through training, integer export, parity and the artifact.

The clip level becomes the integer path's input scale: the exported ``a_step`` is
PACT's own step alpha * fl(1/(2^b - 1)), and the integer codes
round(clip(u * (1/s), 0, 2^b - 1)) equal PACT's round(clip(u, 0, alpha) * (1/s)).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from artifact_runs import TINY, splits
from stejax.artifacts import gate, load_artifact, save_artifact
from stejax.export import InputFormat, export_run
from stejax.export._model import input_codes
from stejax.model import QATConfig
from stejax.model._quantize import pact_step
from stejax.regress import record
from stejax.train import load_run, train

from helpers import assert_bitwise_equal

W4 = {"method": "lsq", "bits": 4}
EDGE = {"weights": {"method": "lsq", "bits": 8}, "activations": {"method": "lsq", "bits": 8}}
QAT = QATConfig.from_dict(
    {"name": "w4pact4", "hidden": {"weights": W4, "activations": {"method": "pact", "bits": 4}}, "first": EDGE}
)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_integer_codes_times_the_step_are_pact_bit_for_bit(bits):
    rng = np.random.default_rng(bits)
    alphas = np.exp(rng.uniform(-6, 6, 200)).astype(np.float32)
    for alpha in alphas:
        step = pact_step(jnp.float32(alpha), bits)
        n = 2**bits - 1
        # Below 0, every grid point and tie, just around alpha, and far above it.
        units = np.concatenate([[-1.0, -0.0, 0.0], np.arange(0, n + 1, 0.5), rng.uniform(0, n + 3, 64)])
        u = np.concatenate([(units * np.float32(step)).astype(np.float32), [alpha, np.nextafter(alpha, 0), 1e30]])
        u = jnp.asarray(np.abs(u).astype(np.float32))  # the input of a PACT layer comes out of a ReLU
        _, codes = input_codes(InputFormat("pact", bits), u, step)
        expected = stejax.pact(u, jnp.float32(alpha), bits=bits)
        got = codes * step
        same = (np.asarray(got) == np.asarray(expected)) & (np.asarray(codes) >= 0) & (np.asarray(codes) <= n)
        assert same.all(), (alpha, np.asarray(u)[~same], np.asarray(got)[~same], np.asarray(expected)[~same])


def test_input_format_refuses_a_signed_pact():
    with pytest.raises(ValueError, match=r"pact inputs are unsigned \(a clipped ReLU\); got signed=True"):
        InputFormat("pact", 4, signed=True)


@pytest.fixture(scope="module")
def pact_run(tmp_path_factory):
    config = dataclasses.replace(TINY, preset=QAT.name, qat=QAT, epochs=1)
    out = tmp_path_factory.mktemp("pact") / "run"
    train(config, splits=splits(), out_dir=out)
    return out


def test_training_moves_the_clip_levels(pact_run):
    from stejax.model import init_params

    run = load_run(pact_run)
    assert run.config.qat_config() == QAT
    start = init_params(jax.random.key(0), run.model_config, QAT)
    for i in (1, 2):
        trained = float(run.params["layers"][i]["a_alpha"])
        assert np.isfinite(trained) and trained > 0
        assert trained != float(start["layers"][i]["a_alpha"]), (i, trained)


def test_export_parity_and_artifact(pact_run, tmp_path):
    run = load_run(pact_run)
    result = export_run(pact_run, splits=splits())
    report = result.parity
    assert report.passed, report.summary()
    assert report.same_class == report.n_examples == len(splits().test)
    assert all(layer.input_codes > 0 and layer.code_mismatches == 0 for layer in report.layers)
    model = result.model
    assert [layer.inputs.method for layer in model.layers] == ["lsq", "pact", "pact"]
    assert [layer.integer for layer in model.layers] == [True, True, True]
    for i in (1, 2):
        # The exported step is PACT's, computed from the trained clip level.
        assert_bitwise_equal(
            np.asarray(model.weights["layers"][i]["a_step"]),
            np.asarray(pact_step(run.params["layers"][i]["a_alpha"], 4)),
            context=f"layer {i}",
        )
        assert "PACT input step" in model.tensors()[f"layers/{i}/a_step"][2]
    save_artifact(result, tmp_path / "art")
    loaded = load_artifact(tmp_path / "art")
    assert [layer.inputs for layer in loaded.model.layers] == [layer.inputs for layer in model.layers]
    record(tmp_path / "art")
    report = gate(tmp_path / "art", estimator_dtypes=("float32",))
    assert report.passed, report.summary()
    assert [c.name for c in report.checks if c.name.startswith("estimator")] == ["estimator[lsq]", "estimator[pact]"]
