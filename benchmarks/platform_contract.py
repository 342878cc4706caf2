"""The platform contract measured: the results file behind the "Running on TPU and GPU" table.

Run from the repository root, on the machine to measure:

    python benchmarks/platform_contract.py [--results DIR]

It runs :func:`stejax.verify.measure_platform` on JAX's default device (each elementwise function against XLA on
CPU in float32, bfloat16 and float16, how subnormal inputs are read, a float32 product at the default precision
and at "highest") and writes ``DIR/platform_<backend>.json``: one row per dtype and function with the measured and
the declared ulps. ``--from-suite FILE`` writes the same file from the measurement that ``make test-device
DEVICE_SUITE_ARGS="--results DIR"`` records in its results file, with that run's commit, date, machine and load.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

from stejax.bench.results import Figure, Recorder
from stejax.verify import measure_platform, platform_contract

_MEASURED = "Measured against XLA:CPU in the same process: "


def _from_suite(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    notes = doc.get("notes", "")
    if _MEASURED not in notes:
        raise ValueError(f"{path}: its notes hold no platform measurement (expected {_MEASURED!r}).")
    measured = ast.literal_eval(notes.split(_MEASURED, 1)[1].rstrip().rstrip("."))
    if "elementwise_ulps" in measured:  # the same measurement under its earlier key
        measured["function_ulps"] = measured.pop("elementwise_ulps")
    return measured, {k: doc[k] for k in ("commit", "date", "machine", "load")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    parser.add_argument("--from-suite", type=Path, default=None, metavar="FILE", help="a device suite results file")
    options = parser.parse_args(argv)
    if options.from_suite is not None:
        measured, conditions = _from_suite(options.from_suite)
        command = f"python benchmarks/platform_contract.py --from-suite {options.from_suite}"
    else:
        measured, conditions = measure_platform(), {}
        command = "python benchmarks/platform_contract.py"
    backend = measured["platform"]
    contract = platform_contract(backend)
    recorder = Recorder(f"platform_{backend}", command=command)
    declared = contract.function_ulps or {}
    rows = [
        {
            "dtype": dtype,
            "function": function,
            "measured_ulps": ulps,
            "declared_ulps": declared.get(dtype, {}).get(function),
            "within": ulps <= declared.get(dtype, {}).get(function, -1),
        }
        for dtype, row in measured["function_ulps"].items()
        for function, ulps in row.items()
    ]
    flushed = measured["subnormal_inputs_read_as_zero"]
    errors = measured["matmul_relative_error"]
    path = options.results / f"platform_{backend}.json"
    recorder.write(
        path,
        rows=rows,
        columns=[
            ("dtype", "dtype"),
            ("function", "function"),
            ("measured_ulps", "ulps from XLA:CPU"),
            ("declared_ulps", "contract"),
        ],
        figures={
            "subnormal_inputs": Figure(
                ", ".join(flushed) or "none",
                ", ".join(flushed) or "none",
                target=", ".join(contract.subnormal_inputs_read_as_zero) or "none",
                met=set(flushed) == set(contract.subnormal_inputs_read_as_zero),
            ),
            "matmul_default": Figure(
                errors["default"],
                f"{errors['default']:.1e}",
                target=f"≤ {contract.matmul_relative_error:g}",
                met=errors["default"] <= contract.matmul_relative_error,
            ),
            "matmul_highest": Figure(
                errors["highest"], f"{errors['highest']:.1e}", target="≤ 1e-05", met=errors["highest"] <= 1e-5
            ),
            "within": Figure(sum(r["within"] for r in rows), f"{sum(r['within'] for r in rows)} of {len(rows)}"),
        },
        notes=(
            f"{measured['device_kind']} ({backend}) against XLA:CPU in the same process, 4,096 seeded inputs in "
            "[-8, 8] per dtype; ulps are the result's own, so the largest counts come near a function's zero "
            "(log near 1, tanh near 0). matmul: a 256x512 by 512x128 float32 product against float64, relative "
            "to the largest |entry|."
        ),
        **conditions,
    )
    print(f"wrote {path}: {sum(r['within'] for r in rows)} of {len(rows)} within the contract")
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
