"""``stejax snn compare --quick``: the report's shape (what other tools read), and the CLI's refusals."""

import json

import pytest
from click.testing import CliRunner

from stejax.cli import main

SURROGATE_NAMES = {
    "fast_sigmoid",
    "atan",
    "sigmoid",
    "triangular",
    "boxcar",
    "superspike",
    "identity",
    "no_surrogate",
    "ann",
}
ENTRY_FIELDS = {
    "surrogate",
    "hidden_layers",
    "T",
    "test_accuracy_mean",
    "test_accuracy_std",
    "train_loss_epoch5",
    "train_loss_epoch10",
    "spike_rate",
    "step_ms_median",
}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("snn")
    result = CliRunner().invoke(main, ["snn", "compare", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text()), out, result.output


def test_quick_report_has_the_exact_shape(quick_report):
    report, out, output = quick_report
    assert set(report["summary"]) == {"fast_sigmoid_h1_t4", "ann_h1_t4"}
    for key, entry in report["summary"].items():
        assert ENTRY_FIELDS <= set(entry), key
        assert entry["surrogate"] in SURROGATE_NAMES
        assert entry["hidden_layers"] == 1 and entry["T"] == 4
        assert 0 <= entry["test_accuracy_mean"] <= 1 and entry["test_accuracy_std"] >= 0
        assert entry["train_loss_epoch5"] > entry["train_loss_epoch10"] > 0  # it trains
        assert entry["step_ms_median"] > 0
        assert entry["all_gradients_finite"] is True
        assert len(report["runs"][key]) == 2 and {r["seed"] for r in report["runs"][key]} == {0, 1}
    spiking = report["summary"]["fast_sigmoid_h1_t4"]
    assert spiking["surrogate"] == "fast_sigmoid" and len(spiking["spike_rate"]) == 1
    assert 0 < spiking["spike_rate"][0] < 1
    assert report["summary"]["ann_h1_t4"]["surrogate"] == "ann" and report["summary"]["ann_h1_t4"]["spike_rate"] is None
    assert {"jax", "device", "cpu_count"} <= set(report["environment"])
    # Above chance (10%): the smoke tier's spiking readout counts at most 4 spikes per class (T = 4) after 10
    # epochs of 16 hidden neurons, so it is far from the full tier's 97% (the ReLU network reaches 83% here).
    assert report["summary"]["fast_sigmoid_h1_t4"]["test_accuracy_mean"] > 0.25
    for name in ("accuracy_per_surrogate", "loss_curves", "spike_rate_per_layer", "raster_and_membrane"):
        assert (out / report["figures"][name]).stat().st_size > 1000
    assert (out / "report.md").read_text().startswith("# stejax snn compare")
    assert "fast_sigmoid_h1_t4" in output and "wrote" in output


def test_unknown_configuration_is_refused():
    result = CliRunner().invoke(main, ["snn", "compare", "--out", "x", "--configs", "fast_sigmoid,tanh"])
    assert result.exit_code == 2 and "unknown configuration(s) ['tanh']" in result.output
    result = CliRunner().invoke(main, ["snn", "train", "--out", "x", "--surrogate", "tanh"])
    assert result.exit_code == 2 and "'tanh' is not one of 'fast_sigmoid'" in result.output
    result = CliRunner().invoke(main, ["snn", "compare", "--out", "x", "--time-steps", "8,zero"])
    assert result.exit_code == 2 and "comma-separated positive ints" in result.output
