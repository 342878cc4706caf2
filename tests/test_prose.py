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
        ("from stejax.lowbit._packing import pack", True),
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


# --- one answer per question: pages that state a measured result state the same one -----------------------

EXPLANATIONS = sorted((ROOT / "docs" / "explanation").glob("*.md"))


def _sentences(text: str) -> list[str]:
    """The sentences of a Markdown text outside code blocks, each on one line (a paragraph's lines joined)."""
    prose, fence = [], None
    for line in text.split("\n"):
        opened = _FENCE.match(line)
        if opened and fence is None:
            fence = opened.group(1)
        elif opened and fence is not None and opened.group(1).startswith(fence[0] * len(fence)):
            fence = None
        elif fence is None:
            prose.append(line)
    paragraphs = re.split(r"\n\s*\n|\n(?=\s*[-*|#] )", "\n".join(prose))
    return [s.strip() for p in paragraphs for s in re.split(r"(?<=[.;:!?])\s+", " ".join(p.split())) if s.strip()]


# A sentence that calls the integer training step slower or faster than float, on a TPU, must name the width:
# it is slower at width 512 and faster at 1024 and 2048 (docs/results/train_step.json).
_INTEGER_STEP = re.compile(r"\b(?:integer|int8) (?:training )?(?:step|products?)\b", re.IGNORECASE)
_SPEED = re.compile(r"\b(?:slower|faster)\b", re.IGNORECASE)
_WIDTH = re.compile(r"\bwidths? (?:of )?\d|\bat \d{3,4}\b|\bwidth 512\b|_w\d+\b", re.IGNORECASE)


def unqualified_integer_step_speed(text: str) -> list[str]:
    """Sentences that say the integer training step is slower or faster than float without naming a width."""
    return [
        s
        for s in _sentences(text)
        if _INTEGER_STEP.search(s)
        and _SPEED.search(s)
        and re.search(r"\bfloat\b", s)
        and re.search(r"\btrain", s, re.IGNORECASE)
        and not _WIDTH.search(s)
        and not re.search(r"\b(?:CPU|XLA:CPU|MLP)\b", s)
    ]


@pytest.mark.parametrize(
    "path", [ROOT / "CHANGELOG.md", ROOT / "README.md", *EXPLANATIONS], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_the_integer_training_step_speed_is_stated_with_its_width(path):
    hits = unqualified_integer_step_speed(path.read_text("utf-8"))
    assert not hits, f"{path.name}: name the width (slower than float at 512, faster at 1024 and 2048): {hits}"


def test_the_faq_answers_the_training_speed_question_from_the_results_file():
    faq = (ROOT / "docs" / "explanation" / "faq.md").read_text("utf-8")
    answer = re.search(r"^## Does stejax make training faster\?\n(.*?)(?=^## )", faq, flags=re.M | re.S)
    assert answer, "faq.md needs its 'Does stejax make training faster?' answer"
    for key in ("int8_vs_float32_w512", "int8_vs_float32_w1024", "int8_vs_float32_w2048", "int8_vs_qwix_qt_w1024"):
        assert f'figure("train_step", "{key}")' in answer.group(1), f"the answer must cite train_step.{key}"
    assert not re.search(r"\bintegers? kernels? on TPU\b", faq), "stejax's integer products run on a TPU too"


@pytest.mark.parametrize(
    ("text", "caught"),
    [
        ("The integer training step is slower than the float one there, so fake-quant products stay the default.", 1),
        ("On a TPU the int8 training step is faster than float.", 1),
        ("The integer training step is faster than float at widths 1024 and 2048 and slower at width 512.", 0),
        ("On a CPU the integer training products are slower than float.", 0),
        ("- It takes 0.837× the float32 step at width 1024; the integer step trains slower than float at 512.", 0),
    ],
)
def test_unqualified_integer_step_speeds_are_caught(text, caught):
    assert len(unqualified_integer_step_speed(text)) == caught, text


def test_the_stop_gradient_page_says_where_the_exact_form_is_cheaper():
    page = (ROOT / "docs" / "explanation" / "stop-gradient.md").read_text("utf-8")
    assert 'figure("estimators", "median_vs_stop_gradient")' in page  # the CPU
    assert 'figure("estimators_tpu", "median_vs_stop_gradient")' in page  # the TPU, where the two are level
    assert not re.search(r"exact form is also the cheaper one[:.]", page), "say where: on a CPU, not on a TPU"


# Release notes say what a user gets, not how a figure or a behaviour moved between versions of the code.
_MOVEMENT = re.compile(
    r"\b(?:up|down) from \d|\(before,|\bnow (?:takes|runs|decodes|trains|compiles)\b|\bno longer divides\b",
    re.IGNORECASE,
)


def test_the_changelog_says_what_a_user_gets_not_how_figures_moved():
    lines = (ROOT / "CHANGELOG.md").read_text("utf-8").split("\n")
    hits = [f"CHANGELOG.md:{n}: {m.group(0)!r}" for n, line in enumerate(lines, 1) for m in _MOVEMENT.finditer(line)]
    assert not hits, "\n".join(hits)


def test_no_earlier_releases_while_the_changelog_has_one():
    sections = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text("utf-8"), flags=re.M)
    if len(sections) > 1:
        pytest.skip("the changelog has more than one release")
    earlier = re.compile(r"\b(?:earlier|previous|older|past|prior) (?:releases?|versions? of stejax)\b", re.I)
    hits = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for page in pages()
        if page.exists()
        for n, line in enumerate(page.read_text("utf-8").split("\n"), start=1)
        if earlier.search(line)
    ]
    hits += [f"{path}:{line}" for path, line, doc in docstrings() if earlier.search(doc)]
    assert not hits, "the first release has no earlier releases:\n" + "\n".join(hits)


def test_the_home_page_lists_every_how_to_guide():
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    guides = re.search(r"^  - How-to guides:\n(.*?)(?=^  - )", nav, flags=re.M | re.S)
    assert guides, "mkdocs.yml needs its How-to guides section"
    pages_listed = re.findall(r":\s*([\w/-]+\.md)\s*$", guides.group(1), flags=re.M)
    home = (ROOT / "docs" / "index.md").read_text("utf-8")
    missing = [page for page in pages_listed if f"]({page})" not in home]
    assert not missing, f"docs/index.md's how-to list leaves out {missing}"
