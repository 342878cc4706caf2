"""`stejax train` shows its progress per epoch: the epoch, the training loss and the validation accuracy."""

import json
import re

from click.testing import CliRunner

from stejax.cli import main


def test_train_prints_one_line_per_epoch_when_there_is_no_bar(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--preset", "w4a4", "--model", "mlp", "--epochs", "2", "--out", str(out)]
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = re.findall(r"w4a4 epoch (\d+)/2 loss (\d+\.\d{4}) val (\d+\.\d)%", result.output)
    assert [int(e) for e, _, _ in lines] == [1, 2], result.output
    # The numbers are the run's own, as metrics.jsonl records them.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for (_, loss, val), record in zip(lines, records, strict=True):
        assert float(loss) == round(record["train_loss"], 4)
        assert float(val) == round(100 * record["val_accuracy"], 1)
