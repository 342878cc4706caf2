"""Write docs/estimators.md and docs/img/NAME.png from the catalog.

Run from the repository root after the catalog changes:

    .venv/bin/python docs/generate.py [--out docs] [--only NAME ...] [--page-only]

Everything in the page comes from ``stejax.estimators.catalog.CATALOG`` (each
entry's math, kinks, parameters, extra arrays and reference), from the first
paragraph of each estimator's docstring and from one runnable example per family
(``stejax.render.FAMILY_EXAMPLES``, run by ``tests/test_docs.py``), rendered by
``stejax.render`` (which ``stejax show`` uses too); the pictures come from
``stejax.plot.plot_estimator``. The page is not edited by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stejax.estimators.catalog import CATALOG
from stejax.plot import plot_estimator
from stejax.render import IMAGES, render_page

PAGE = "estimators.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="the docs folder")
    parser.add_argument("--only", action="append", default=None, metavar="NAME", help="only this estimator")
    parser.add_argument("--page-only", action="store_true", help="write the page, not the pictures")
    options = parser.parse_args(argv)
    unknown = [n for n in options.only or () if n not in CATALOG]
    if unknown:
        print(f"unknown estimator(s): {', '.join(unknown)}; known: {', '.join(CATALOG)}", file=sys.stderr)
        return 2
    entries = [CATALOG[n] for n in options.only] if options.only else list(CATALOG.values())

    images = options.out / IMAGES
    images.mkdir(parents=True, exist_ok=True)
    for entry in () if options.page_only else entries:
        plot_estimator(entry, images / f"{entry.name}.png")
    if not options.only and not options.page_only:
        # An estimator that left the catalog leaves no picture behind.
        for stale in sorted(set(images.glob("*.png")) - {images / f"{e.name}.png" for e in entries}):
            stale.unlink()
    page = options.out / PAGE
    page.write_text(render_page(entries), encoding="utf-8")
    pictures = 0 if options.page_only else len(entries)
    print(f"wrote {page} and {pictures} picture(s) in {images}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
