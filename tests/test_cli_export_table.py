"""`stejax export`'s table of the files on disk says what the weights file holds: float32 for a float run."""

from click.testing import CliRunner

from artifact_runs import run_dir
from stejax.cli import main


def _export(run, out) -> str:
    # A wide console, so that rich keeps each table row on one line.
    result = CliRunner(env={"COLUMNS": "250"}).invoke(main, ["export", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if "weights.safetensors" in line and "│" in line]
    return " ".join(line.split("│")[3].split())


def test_a_float_run_is_not_called_integer_weights(tmp_path):
    assert _export(run_dir("float"), tmp_path / "f") == "the float32 weights (a float run: nothing is quantised)"
    assert _export(run_dir("w2a2"), tmp_path / "q").startswith("the integer weights and scales")
