"""MkDocs hooks for the stejax site (``mkdocs.yml`` loads this file by path).

Figures: every page's results calls (``{{ results_table("NAME") }}``, ``{{ figure("NAME", "KEY") }}``,
``{{ results_figures("NAME") }}``, ``{{ results_source("NAME") }}``) are rendered from ``docs/results/NAME.json``
by :func:`stejax.bench.results.render_markdown` before the page is converted; a missing file, row or
figure stops the build.

Math: the site renders math with MathJax, and a site that must build and be read offline cannot take it from a CDN:
after each build this copies MathJax 3 (its ``tex-mml-chtml`` bundle, fonts and the components it loads on
demand) from the installed ``django-static-mathjax`` package (the ``docs`` extra) into ``site/assets/mathjax``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

# What tex-mml-chtml.js loads by itself: TeX extensions, the CHTML fonts, the menu and accessibility parts.
_BUNDLE = "tex-mml-chtml.js"
_COMPONENTS = ("input", "output", "ui", "a11y", "sre", "adaptors")
TARGET = Path("assets", "mathjax")


def mathjax_source() -> Path:
    """The ``es5`` folder of the installed MathJax copy; a clear error if the docs extra is missing."""
    try:
        import mathjax  # django-static-mathjax's package
    except ModuleNotFoundError as error:
        raise RuntimeError(
            "the site needs MathJax from the docs extra: pip install -c requirements/constraints.txt -e '.[docs]'"
        ) from error
    source = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (source / _BUNDLE).is_file():
        raise RuntimeError(f"expected MathJax's {_BUNDLE} in {source}; got no such file (django-static-mathjax 3.2?)")
    return source


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    from stejax.bench.results import render_markdown

    try:
        return render_markdown(markdown, Path(config["docs_dir"]) / "results")
    except (OSError, ValueError) as error:
        raise PluginError(f"{page.file.src_uri}: {error}") from error


def on_post_build(config: Any, **kwargs: Any) -> None:
    source = mathjax_source()
    target = Path(config["site_dir"]) / TARGET
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / _BUNDLE, target / _BUNDLE)
    shutil.copy2(source.parent / "LICENSE", target / "LICENSE")
    for component in _COMPONENTS:
        shutil.copytree(source / component, target / component, dirs_exist_ok=True)
