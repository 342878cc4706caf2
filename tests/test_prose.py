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
]
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
    hits = find_process_words(page.read_text("utf-8"))
    assert not hits, "\n".join(f"{page.relative_to(ROOT)}:{n}: {what}: {line[:160]}" for n, what, line in hits)


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
