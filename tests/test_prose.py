"""The product speaks of the product: no development history in the README, the docs, docstrings or CLI help.

History belongs in CHANGELOG.md, in user terms. The texts searched here must not narrate how the code came
to be: no "session", "issue 12", "the issue asks", "engineers", "previous run", "since fixed", "(first
version)", temporary-folder paths, commit ids or dates as provenance, nor a machine's load written into a
sentence (a measurement's machine, load and date live in its results file, docs/results/NAME.json, and the
pages render them). Each pattern is narrow, and the allowed phrases below are exact, so that a legitimate
use (onnxruntime's ``InferenceSession``, an HTTP session) is not caught.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "stejax"

# (name, pattern): case-insensitive, searched line by line.
PROCESS_WORDS = [
    ("session", r"\bsessions?\b"),
    ("issue number", r"\bissues?\s*#?\d+"),
    ("the issue", r"\b(?:the|this|that|an?|our)\s+issue\b(?!\s+(?:with|of)\b)"),
    ("engineers", r"\bengineers?\b"),
    ("previous run", r"\bprevious (?:run|session|code|measurement)s?\b"),
    ("since fixed", r"\b(?:since fixed|fixed since|now fixed)\b"),
    ("first version", r"\(first version\)|\bin the first version\b"),
    ("before/after this change", r"\b(?:before|after|since) (?:this|that|the) change\b"),
    ("temporary path", r"(?<![\w.])/tmp/"),
    ("load in prose", r"\bload averages?\s+(?:of\s+|between\s+|about\s+|at\s+)?\d|\bat (?:a )?load (?:average )?\d"),
    ("commit as provenance", r"\b(?:commit|tree of)\s+[0-9a-f]{7,40}\b"),
    ("date", r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?::\d\d)? UTC\b"),
    ("moonshot", r"\bmoonshots?\b"),
    ("as before", r"\bas before\b"),
    ("a decision", r"\bA decision:"),
    ("tried and not kept", r"\btried and not kept\b|\bnot adopted\b"),
    ("the machine's load in prose", r"\bon a (?:busy|loaded) machine\b|\bon a machine this loaded\b"),
    ("shared cores", r"\b(?:\d+|two) shared cores\b"),
    ("uncommitted changes", r"\bwith uncommitted changes\b"),
    ("tripped over", r"\btripped over\b"),
]
# Private names have no place in the user's documentation (README, docs/ and the built site): a reader cannot use
# them, and they change without notice. CONTRIBUTING.md, for developers, may name them.
PRIVATE_NAME = re.compile(r"\bstejax(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*|(?<![\w.])_signer_of\b")
# A commit id: 7 to 40 hex digits with at least one digit and one letter (so "decade" and "1234567" pass).
COMMIT = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])")
# Exact phrases that contain a pattern legitimately; removed from a line before it is searched.
ALLOWED = (
    "InferenceSession",
    "inference session",
    "onnxruntime session",
    "ONNX Runtime session",
    "`session`",
    "session(",
    "HTTP session",
    "requests.Session",
    "httpx session",
)
_PATTERNS = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in PROCESS_WORDS]
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def find_process_words(text: str, *, prose_only_commits: bool = True) -> list[tuple[int, str, str]]:
    """``(line, what, the line)`` for every process word in ``text``; commit ids only outside code blocks."""
    hits = []
    fence: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        opened = _FENCE.match(line)
        if opened and fence is None:
            fence = opened.group(1)
        elif opened and fence is not None and opened.group(1).startswith(fence[0] * len(fence)):
            fence = None
        searched = line
        for phrase in ALLOWED:
            searched = re.sub(re.escape(phrase), "", searched, flags=re.IGNORECASE)
        for name, pattern in _PATTERNS:
            if pattern.search(searched):
                hits.append((number, name, line.strip()))
        if (fence is None or not prose_only_commits) and COMMIT.search(searched):
            hits.append((number, "commit id", line.strip()))
    return hits


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docstrings() -> Iterator[tuple[str, int, str]]:
    """``(file, line, docstring)`` of every module, class and function under src/stejax."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node, clean=False)
                if text:
                    line = node.body[0].lineno if node.body else 1
                    yield path.relative_to(ROOT).as_posix(), line, text


def cli_help_texts() -> Iterator[tuple[str, str]]:
    """``(command path, text)`` for every command's help and every option's help in the click application."""
    from stejax.cli import main

    def walk(command: click.Command, path: str) -> Iterator[tuple[str, str]]:
        for text in (command.help, command.short_help, command.epilog):
            if text:
                yield path, text
        for param in command.params:
            if isinstance(param, click.Option) and param.help:
                yield f"{path} {param.opts[0]}", param.help
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{path} {name}")

    yield from walk(main, "stejax")


@pytest.mark.parametrize("page", [p for p in pages() if p.exists()], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_speak_of_the_product(page):
    text = page.read_text("utf-8")
    hits = find_process_words(text)
    if page.name != "CONTRIBUTING.md":
        lines = enumerate(text.split("\n"), start=1)
        hits += [(n, "private name", line.strip()) for n, line in lines if PRIVATE_NAME.search(line)]
    assert not hits, "\n".join(f"{page.relative_to(ROOT)}:{n}: {what}: {line[:160]}" for n, what, line in hits)


SITE = ROOT / "site"
# A rendered results table's provenance line names its command, commit, date, machine and load, on purpose.
_PROVENANCE = re.compile(r"^(?:Measured by|An older measurement, by) ")


class _Text(HTMLParser):
    """The text of a built page's article, one line per block, without code blocks, scripts or styles."""

    _SKIPPED = ("pre", "script", "style")
    _BLOCKS = ("p", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "div", "br", "small", "td", "th")

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = [""]
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIPPED:
            self._skipping += 1
        elif tag in self._BLOCKS:
            self.lines.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._BLOCKS:
            self.lines.append("")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.lines[-1] += data.replace("\n", " ")


def site_text(html: str) -> str:
    """The readable text of one built page: its article (the theme's navigation is left out), a block a line."""
    article = re.search(r"<article\b.*?</article>", html, flags=re.S)
    parser = _Text()
    parser.feed(article.group(0) if article else html)
    return "\n".join(" ".join(line.split()) for line in parser.lines if line.strip())


def built_pages() -> list[Path]:
    return sorted(SITE.rglob("*.html")) if (SITE / "index.html").is_file() else []


def test_the_built_site_speaks_of_the_product():
    # `make test` builds the site (mkdocs build --strict) before the tests: this reads what a visitor reads, with
    # the results tables, the generated CLI and API reference and the changelog rendered in.
    if not built_pages():
        pytest.skip("no built site in site/: `make docs` builds it (`make test` does, before the tests)")
    hits = []
    for page in built_pages():
        for number, line in enumerate(site_text(page.read_text("utf-8")).split("\n"), start=1):
            if _PROVENANCE.match(line):
                continue
            found = [what for _, what, _ in find_process_words(line)]
            # The API reference renders docstrings, whose private names test_docstrings_... does not police.
            if PRIVATE_NAME.search(line) and page.parent.name != "api":
                found.append("private name")
            hits += [f"{page.relative_to(SITE)}: text line {number}: {what}: {line[:160]}" for what in found]
    assert not hits, "\n".join(hits)


def test_site_text_keeps_prose_and_drops_code_and_navigation():
    html = (
        "<nav><p>Moonshot in the menu</p></nav><article><h1>Title</h1><p>One <em>line</em>\nof prose.</p>"
        "<pre><code>x = 'a1b2c3d4e5'</code></pre><table><tr><td>cell</td></tr></table></article>"
    )
    assert site_text(html) == "Title\nOne line of prose.\ncell"


def test_docstrings_speak_of_the_product():
    hits = [
        f"{path}:{line + n - 1}: {what}: {text[:160]}"
        for path, line, doc in docstrings()
        for n, what, text in find_process_words(doc, prose_only_commits=False)
    ]
    assert not hits, "\n".join(hits)


def test_cli_help_speaks_of_the_product():
    hits = [
        f"{path}: {what}: {text[:160]}" for path, doc in cli_help_texts() for _, what, text in find_process_words(doc)
    ]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize(
    "text",
    [
        "Measured in the previous session at load 17.",
        "As issue 12 asks, the step is faster.",
        "The issue asks for a quiet machine.",
        "Five engineers shared the machine.",
        "the previous run gave 1.3",
        "a bug, since fixed",
        "the API (first version)",
        "python x.py --out /tmp/run",
        "measured at commit 3087169",
        "under a load average of 18",
        "re-run at 16:18 UTC on 2026-12-03",
        "9% less than before this change",
        "The moonshot: a step faster than float.",
        "Tried and not kept: unrolling the loop.",
        "The mask was not adopted.",
        "A decision: the verifier lays inputs out as a batch.",
        "On a busy machine that second core is not free.",
        "On a machine this loaded, the ratios move.",
        "hours a seed on 2 shared cores",
        "commit 3087169 with uncommitted changes",
        "The registry checks no signature, as before.",
        "What a new user tripped over: a scale of zero.",
    ],
)
def test_process_words_are_caught(text):
    assert find_process_words(text), text


@pytest.mark.parametrize(
    "text",
    [
        "`onnxruntime.InferenceSession(path)` runs the exported graph.",
        "ONNX Runtime sessions on the CPU; :func:`session` opens a file, `session(path)` too.",
        "An HTTP session with keep-alive.",
        "The recorder writes the load average at the start and the end.",
        "A decade of 1234567 values; the sha256 is stored.",
        "The issue with per-tensor scales is an outlier.",
        "Read `/work/data/tmp/x` or `site/tmp/`.",
        "jax.jit(f).lower(x).compile()",
    ],
)
def test_legitimate_words_pass(text):
    assert find_process_words(text) == [], text


@pytest.mark.parametrize(
    ("text", "private"),
    [
        ("from stejax.lm._packing import pack", True),
        ("told so by `stejax.bench._peers_rules.qwix_per_tensor_provider`", True),
        ("`_signer_of` picks the verifier", True),
        ("`stejax.lm.decode` and `stejax.flax.quantize_model`", False),
        ("jax._src is JAX's own", False),
    ],
)
def test_private_names_are_caught(text, private):
    assert bool(PRIVATE_NAME.search(text)) is private, text


def test_the_changelog_has_one_unreleased_section():
    # Until a release, every change is in one section, in user terms (the site renders it as the changelog page).
    sections = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text("utf-8"), flags=re.M)
    assert sections == ["Unreleased"], sections
