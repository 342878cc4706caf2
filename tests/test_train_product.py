"""Integer products in the reference pipeline: TrainConfig(product=...) and `stejax train --product`.

Tiny on purpose: a 400-example subset of the digits, a 16-unit MLP or a 4/6-channel CNN, two epochs.
The integer layers quantise with their own absmax scales (per example or patch, per output channel),
so their logits differ from the float model's by the int8 rounding alone: about 1% relative.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.cli.training import _PRODUCTS
from stejax.data import Normalizer, Splits
from stejax.export import export_run
from stejax.model import init_params, param_spec, preset
from stejax.train import PRODUCTS, IntegerProducts, TrainConfig, forward, load_run, make_optimizer, train, update

from helpers import digits_400

TINY = TrainConfig(
    preset="w8a8",
    model="mlp",
    hidden=(16,),
    channels=(4, 6),
    dropout=0.1,
    batch_size=32,
    epochs=2,
    patience=None,
    schedule="constant",
)


def _splits() -> Splits:
    return digits_400()


@functools.cache
def _train_losses(product: str) -> tuple[float, ...]:
    result = train(dataclasses.replace(TINY, product=product), splits=_splits())
    return (*(r["train_loss"] for r in result.history), result.test_loss)


def _runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


# ----------------------------------------------------------------------------- the configuration


def test_the_cli_offers_the_library_s_products():
    assert _PRODUCTS == PRODUCTS == ("fake-quant", "int8-forward", "int8")
    assert TrainConfig().product == "fake-quant"


def test_an_integer_product_drops_the_lsq_steps_of_its_layers():
    qat = dataclasses.replace(TINY, product="int8").qat_config()
    assert isinstance(qat, IntegerProducts) and qat.product == "int8" and qat.source == preset("w8a8")
    mc = TINY.model_config(_splits().train)
    assert list(param_spec(mc, qat)) == ["layers/0/w", "layers/0/b", "layers/1/w", "layers/1/b"]
    assert "int8 products" in qat.describe() and "w8a8" in qat.describe()
    assert TINY.qat_config() == preset("w8a8")  # fake-quant: the preset itself


def test_the_product_round_trips_through_the_config_file(tmp_path):
    config = dataclasses.replace(TINY, product="int8-forward")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert TrainConfig.from_file(path) == config
    assert TrainConfig.from_dict({k: v for k, v in config.to_dict().items() if k != "product"}).product == "fake-quant"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"product": "int4"}, r"product must be one of \['fake-quant', 'int8-forward', 'int8'\]; got 'int4'"),
        ({"preset": "w4a4", "product": "int8"}, r"'w4a4' has hidden layers with weights 4-bit lsq"),
        ({"preset": "w1a1", "product": "int8"}, r"'w1a1' has hidden layers with weights 1-bit sign"),
        ({"preset": "w4a4_no_ste", "product": "int8"}, r"first layer with weights 8-bit round_no_ste"),
        ({"preset": "float", "product": "int8-forward"}, r"'float' quantises no layer"),
    ],
)
def test_a_configuration_an_integer_product_cannot_run_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **change)


def test_an_integer_configuration_is_not_a_qat_field():
    qat = dataclasses.replace(TINY, product="int8").qat_config()
    with pytest.raises(ValueError, match=r"qat must be a fake-quant configuration; got 'mine' with int8 products"):
        TrainConfig(qat=dataclasses.replace(qat, name="mine"), preset="mine")


# ----------------------------------------------------------------------------- the forward pass and the step


@pytest.mark.parametrize(("model", "training"), [("mlp", False), ("cnn", True)], ids=["mlp-eval", "cnn-dropout"])
def test_integer_logits_are_the_float_model_s_up_to_int8_rounding(model, training):
    # The integer layers carry a float layer's parameters: the float model on the same parameters (and the
    # same dropout masks) is the reference, and int8 rounding moves the logits by about 1%. A wrong patch
    # layout or other dropout masks would move them by order 100%.
    config = dataclasses.replace(TINY, model=model, product="int8")
    mc, qat = config.model_config(_splits().train), config.qat_config()
    params = init_params(jax.random.key(0), mc, qat)
    x = Normalizer.fit(_splits().train.x).apply(_splits().train.x[:16])
    kw = {"key": jax.random.key(1), "train": True} if training else {}
    logits = jax.jit(forward, static_argnames=("model_config", "qat_config", "train"))
    got = logits(params, x, model_config=mc, qat_config=qat, **kw)
    want = logits(params, x, model_config=mc, qat_config=preset("float"), **kw)
    error = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert 0 < error < 0.03, error


def _int8_dots(jaxpr) -> int:
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and all(v.aval.dtype == jnp.int8 for v in eqn.invars):
            count += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _int8_dots(sub)
    return count


@pytest.mark.parametrize(("product", "dots"), [("fake-quant", 0), ("int8-forward", 2), ("int8", 6)])
def test_the_step_multiplies_in_int8_as_the_product_kind_says(product, dots):
    # Two layers: the forward products, plus both backward products of each layer for "int8".
    config = dataclasses.replace(TINY, product=product)
    mc, qat = config.model_config(_splits().train), config.qat_config()
    params = init_params(jax.random.key(0), mc, qat)
    optimizer = make_optimizer(config, 8)
    x = Normalizer.fit(_splits().train.x).apply(_splits().train.x[:32])
    batch = (x, np.asarray(_splits().train.y[:32]))
    step = functools.partial(update, model_config=mc, qat_config=qat, optimizer=optimizer)
    jaxpr = jax.make_jaxpr(step)(params, optimizer.init(params), batch, jax.random.key(2))
    assert _int8_dots(jaxpr.jaxpr) == dots


def test_training_with_int8_products_follows_fake_quant():
    # The same seed, data and initial weights; the grids differ (absmax against LSQ) and so do the products.
    fake, integer = _train_losses("fake-quant"), _train_losses("int8")
    assert all(math.isfinite(v) for v in integer)
    assert integer[1] < integer[0] < math.log(10) + 1  # it learns
    for a, b in zip(integer, fake, strict=True):
        assert abs(a - b) <= 0.05 * b, (integer, fake)


# ----------------------------------------------------------------------------- the command line


def test_train_help_describes_the_product():
    result = _runner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--product [fake-quant|int8-forward|int8]" in text
    assert "int8-forward: int8 x int8 -> int32 forward products, float straight-through gradient" in text
    assert "they take w8a8" in text


def test_train_with_int8_products_records_the_product(tmp_path):
    config_file = tmp_path / "tiny.json"
    config_file.write_text(json.dumps({"preset": "w8a8", "model": "mlp", "hidden": [16], "epochs": 1}))
    out = tmp_path / "run"
    result = _runner().invoke(main, ["train", "--config", str(config_file), "--product", "int8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "int8 products" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["product"] == "int8" and math.isfinite(report["test_loss"])
    assert json.loads((out / "config.json").read_text())["train_config"]["product"] == "int8"
    run = load_run(out)
    assert isinstance(run.qat_config, IntegerProducts) and run.qat_config.product == "int8"
    assert "w_step" not in run.params["layers"][0]
    with pytest.raises(ValueError, match=r"was trained with int8 products.*takes runs with fake-quant products"):
        export_run(out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--preset", "w4a4", "--product", "int8"],
            r"Invalid value for --product: .*'w4a4' has hidden layers with weights 4-bit lsq \(per tensor\), "
            r"activations 4-bit lsq\. Use preset w8a8 with product 'int8', or product 'fake-quant' for 'w4a4'\.",
        ),
        (
            ["--preset", "float", "--product", "int8-forward"],
            r"Invalid value for --product: .*'float' quantises no layer",
        ),
        (["--preset", "w8a8", "--product", "int16"], r"'int16' is not one of 'fake-quant', 'int8-forward', 'int8'"),
    ],
)
def test_train_refuses_a_product_its_configuration_cannot_use(tmp_path, args, message):
    result = _runner().invoke(main, ["train", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert _matches(message, result.output), result.output
    assert not (tmp_path / "run").exists()


def test_a_config_file_s_product_is_checked_against_its_preset(tmp_path):
    config_file = tmp_path / "bad.json"
    config_file.write_text(json.dumps({"preset": "w2a2", "product": "int8"}))
    result = _runner().invoke(main, ["train", "--config", str(config_file), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert _matches(r"Invalid value for --config: .*'w2a2' has hidden layers with weights 2-bit lsq", result.output)


def _matches(pattern: str, output: str) -> bool:
    import re

    return re.search(pattern, " ".join(output.split())) is not None


def test_fake_quant_stays_the_default(tmp_path):
    config_file = tmp_path / "tiny.json"
    config_file.write_text(json.dumps({"preset": "float", "model": "mlp", "hidden": [8], "epochs": 1}))
    out = tmp_path / "run"
    result = _runner().invoke(main, ["train", "--config", str(config_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "products" not in result.output
    assert json.loads(Path(out / "report.json").read_text())["product"] == "fake-quant"
    assert json.loads(Path(out / "config.json").read_text())["train_config"]["product"] == "fake-quant"
