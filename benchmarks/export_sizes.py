"""What integer export stores, per QAT preset: the weights' bytes against float32, and parity with fake-quant.

Run from the repository root:

    .venv/bin/python benchmarks/export_sizes.py [--presets w8a8,w4a4,w2a2,w1a1] [--seed 0] [--results docs/results]

For each preset it trains the default digits CNN recipe (what ``stejax train --preset P --seed 0`` runs),
exports the run as ``stejax export`` does, and records the test accuracy, how the hidden layer is stored
and its bytes against float32, all the weights' bytes, the predicted and actual weight-file size, and on
how many test digits the exported model predicts the same class as the fake-quantised one. It writes
``DIR/export_sizes.json``, which docs/artifacts.md renders. The first and last layers stay at 8 bits in
the presets, so the hidden layer's ratio is the one that shows the packing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

from stejax.bench.results import Figure, Recorder
from stejax.export import export_run
from stejax.train import TrainConfig, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="w8a8,w4a4,w2a2,w1a1", help="comma-separated QAT presets")
    parser.add_argument("--seed", type=int, default=0, help="the training seed (and split)")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    options = parser.parse_args(argv)
    presets = [p.strip() for p in options.presets.split(",") if p.strip()]
    recorder = Recorder(
        "export_sizes",
        command=f"python benchmarks/export_sizes.py --presets {','.join(presets)} --seed {options.seed}",
    )
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="stejax-export-sizes-") as tmp:
        for name in presets:
            run_dir = Path(tmp) / name
            trained = train(TrainConfig(preset=name, seed=options.seed), out_dir=run_dir)
            result = export_run(run_dir)
            size, parity = result.size, result.parity
            hidden = size.layers[len(size.layers) // 2]
            ratio = Fraction(hidden.weight_bytes, hidden.float32_bytes).limit_denominator(64)
            rows.append(
                {
                    "preset": name,
                    "test_accuracy": 100 * trained.test_accuracy,
                    "hidden_as": hidden.container,
                    "hidden_vs_float32": f"{ratio.numerator}/{ratio.denominator}",
                    "weights_bytes": sum(layer.weight_bytes for layer in size.layers),
                    "float32_bytes": sum(layer.float32_bytes for layer in size.layers),
                    "file_bytes": size.actual_file_bytes,
                    "file_predicted": size.predicted_file_bytes == size.actual_file_bytes,
                    "same_class": f"{parity.same_class}/{parity.n_examples}",
                    "max_abs_diff": parity.max_abs_diff,
                }
            )
            print(rows[-1], flush=True)
            figures[f"{name}_hidden_ratio"] = Figure(float(ratio), f"{ratio.numerator}/{ratio.denominator}")
            figures[f"{name}_parity"] = Figure(
                parity.same_class / parity.n_examples, f"{parity.same_class} of {parity.n_examples}"
            )
    recorder.write(
        options.results / "export_sizes.json",
        rows=rows,
        columns=[
            ("preset", "preset"),
            ("test_accuracy", "test accuracy %", "{:.2f}"),
            ("hidden_as", "hidden layer stored as"),
            ("hidden_vs_float32", "hidden bytes vs float32"),
            ("weights_bytes", "all weights, bytes", "{:,}"),
            ("float32_bytes", "float32, bytes", "{:,}"),
            ("file_bytes", "weight file, bytes", "{:,}"),
            ("file_predicted", "predicted = actual"),
            ("same_class", "same class as fake-quant"),
        ],
        figures=figures,
        notes=f"The default digits CNN recipe, seed {options.seed}; first and last layers at 8 bits in every preset.",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
