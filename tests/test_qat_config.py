"""Any QAT configuration, not only the presets: QATConfig as JSON, and TrainConfig.qat."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.model import PRESETS, QATConfig, preset
from stejax.train import TrainConfig

W3A3 = {
    "name": "w3a3",
    "hidden": {
        "weights": {"method": "lsq", "bits": 3, "granularity": "channel"},
        "activations": {"method": "lsq", "bits": 3},
    },
    "first": {"weights": {"method": "lsq", "bits": 8}, "activations": {"method": "lsq", "bits": 8}},
    "last": None,
}


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_round_trips_through_its_dict(name):
    q = preset(name)
    assert QATConfig.from_dict(json.loads(json.dumps(q.to_dict()))) == q


def test_a_configuration_beyond_the_presets():
    q = QATConfig.from_dict(W3A3)
    assert q.name == "w3a3"
    assert q.layer(1, 3).weights.bits == 3 and q.layer(1, 3).weights.granularity == "channel"
    assert q.layer(0, 3).weights.bits == 8
    assert q.layer(2, 3) == q.hidden  # last: null means "as hidden"


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"hidden": {"weights": {"method": "lsq", "bits": 3, "gran": "channel"}}}, ValueError, "unknown key 'gran'"),
        ({"hidden": {"weights": {"method": "lsq"}}}, ValueError, "hidden.weights needs 'bits'"),
        ({"hidden": {"weights": {"method": "pact", "bits": 3}}}, ValueError, "pact quantises activations"),
        ({"hidden": {"weights": {"method": "sign", "bits": 2}}}, ValueError, "needs bits=1"),
        ({"name": ""}, ValueError, "non-empty 'name'"),
        ({"hidden": [1, 2]}, TypeError, "hidden must be a mapping"),
    ],
)
def test_a_bad_configuration_names_where(change, error, match):
    with pytest.raises(error, match=match):
        QATConfig.from_dict({**W3A3, **change})


def test_train_config_takes_qat_and_names_itself_after_it():
    config = TrainConfig.from_dict({"qat": W3A3, "model": "mlp"})
    assert config.preset == "w3a3"
    assert config.qat_config() == QATConfig.from_dict(W3A3)
    again = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config


def test_train_config_refusals():
    with pytest.raises(ValueError, match="Any other QAT configuration is given as qat"):
        TrainConfig.from_dict({"preset": "w3a3"})
    with pytest.raises(ValueError, match="preset names it and must be 'w3a3'"):
        TrainConfig.from_dict({"preset": "w4a4", "qat": W3A3})
    with pytest.raises(ValueError, match="named 'w4a4' like a preset but differs"):
        TrainConfig.from_dict({"qat": {**W3A3, "name": "w4a4"}})
    # A preset written out in full is that preset.
    assert TrainConfig.from_dict({"qat": preset("w4a4").to_dict()}).qat_config() == preset("w4a4")


def test_stejax_train_runs_a_configuration_from_a_file(tmp_path):
    config = tmp_path / "w3a3.json"
    config.write_text(json.dumps({"qat": W3A3, "model": "mlp", "hidden": [16], "epochs": 1}), encoding="utf-8")
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))["train_config"]
    assert saved["preset"] == "w3a3"
    assert QATConfig.from_dict(saved["qat"]) == QATConfig.from_dict(W3A3)
