"""Every catalog member through stejax.verify, counted: the results file behind "every declared derivative is checked".

Run from the repository root:

    .venv/bin/python benchmarks/verify_catalog.py [--results docs/results]

It runs :func:`stejax.verify.check_catalog` (what ``stejax verify --all`` runs:
the forward bit for bit, the tangent against the declared derivative, linearity,
reverse mode against forward mode, and the same under jit, vmap, grad,
jacfwd/jacrev, scan and checkpoint, in float16, bfloat16 and float32) and writes
``DIR/verify_catalog.json``: one row per member with its family and the checks
that passed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stejax.bench.results import Figure, Recorder
from stejax.estimators.catalog import CATALOG, FAMILIES
from stejax.verify import check_catalog, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"), metavar="DIR", help="where to write")
    parser.add_argument(
        "--name",
        default="verify_catalog",
        help="the results file's name (verify_catalog_tpu on a TPU)",
    )
    parser.add_argument("--report", type=Path, default=None, metavar="DIR", help="also write the verifier's report")
    options = parser.parse_args(argv)
    parser_name = "" if options.name == "verify_catalog" else f" --name {options.name}"
    recorder = Recorder(options.name, command=f"python benchmarks/verify_catalog.py{parser_name}")
    reports = check_catalog()
    if options.report is not None:
        write_report(reports, options.report)
    rows = []
    for name, report in reports.items():
        passed = sum(c.passed for c in report.checks)
        rows.append(
            {
                "estimator": name,
                "family": CATALOG[name].family,
                "checks": len(report.checks),
                "passed": passed,
                "kinds": len({c.kind for c in report.checks}),
                "ok": report.ok,
            }
        )
    members_ok = sum(r["ok"] for r in rows)
    checks = sum(r["checks"] for r in rows)
    passed = sum(r["passed"] for r in rows)
    families = len({r["family"] for r in rows})
    recorder.write(
        options.results / f"{options.name}.json",
        rows=rows,
        columns=[
            ("estimator", "estimator"),
            ("family", "family"),
            ("checks", "checks"),
            ("passed", "passed"),
            ("ok", "verified"),
        ],
        figures={
            "members": Figure(len(rows), f"{len(rows)} estimators in {families} families"),
            "members_verified": Figure(
                members_ok, f"{members_ok} of {len(rows)}", target="all", met=members_ok == len(rows)
            ),
            "checks_passed": Figure(passed, f"{passed:,} of {checks:,} checks"),
        },
        notes=f"check_catalog() with its defaults (float16, bfloat16, float32); families: {', '.join(FAMILIES)}.",
    )
    print(
        f"wrote {options.results / (options.name + '.json')}: {members_ok}/{len(rows)} members, "
        f"{passed}/{checks} checks"
    )
    return 0 if members_ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
