"""What `--help` shows: short descriptions that are never cut, one metavar per kind of value, the shared
options' bounds, what `--quick` does in each command, and the defaults a new user meets first (`stejax list`,
`stejax bench`)."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

import stejax.cli.bench
from stejax.cli import main
from stejax.estimators.catalog import CATALOG


def _walk(command: click.Command, path: str = "") -> list[tuple[str, click.Command]]:
    found = [(path, command)] if path else []
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            found += _walk(sub, f"{path} {name}".strip())
    return found


COMMANDS = dict(_walk(main))
GROUPS = {"": main, **{path: c for path, c in COMMANDS.items() if isinstance(c, click.Group)}}


# In an 80-column terminal click formats help 78 columns wide (it keeps 2 free).
WIDTH = 78


def _ctx(path: str) -> click.Context:
    command = GROUPS.get(path) or COMMANDS[path]
    return click.Context(command, info_name=path.split()[-1] if path else "stejax", terminal_width=WIDTH)


def _rows(help_text: str, first_section: str) -> list[str]:
    """The lines of the command listing: from ``first_section`` on, the indented non-empty lines."""
    listing = help_text[help_text.index(first_section) :]
    return [line for line in listing.splitlines() if line.startswith("  ") and line.strip()]


@pytest.mark.parametrize("group_path", sorted(GROUPS))
def test_every_command_is_listed_on_one_line_and_never_cut(group_path):
    # `stejax --help` and every group's --help list each command with its short description: click cuts a
    # long first sentence with "..." and wraps a long explicit short help. Neither may happen at 80 columns.
    group = GROUPS[group_path]
    result = CliRunner().invoke(main, [*group_path.split(), "--help"], terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    rows = _rows(result.output, "Estimators:" if group is main else "Commands:")
    assert "..." not in "\n".join(rows), f"stejax {group_path} --help cuts a description:\n{result.output}"
    # one line per command: each row starts with a command's name (a wrapped description's next line would not)
    firsts = [row.split()[0] for row in rows]
    assert firsts == [n for n in firsts if n in group.commands], f"stejax {group_path} wraps:\n{result.output}"
    assert set(firsts) == {n for n, c in group.commands.items() if not c.hidden}


def test_artifact_help_names_every_subcommand():
    result = CliRunner().invoke(main, ["artifact", "--help"], terminal_width=WIDTH)
    description = result.output.split("Options:")[0]
    for name, command in main.commands["artifact"].commands.items():
        assert f"`{name}" in description, f"stejax artifact --help does not describe {name}"
        if isinstance(command, click.Group):
            for sub in command.commands:
                assert f"`{name} {sub}`" in description, f"stejax artifact --help does not describe {name} {sub}"


def _metavars(path: str) -> list[tuple[click.Parameter, str]]:
    ctx, out = _ctx(path), []
    for param in COMMANDS[path].params:
        if getattr(param, "hidden", False):
            continue
        if isinstance(param, click.Argument):
            out.append((param, param.make_metavar(ctx)))
        else:
            record = param.get_help_record(ctx)
            if record:
                out.append((param, record[0]))
    return out


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_a_directory_is_always_DIR(path):
    for param, shown in _metavars(path):
        assert "DIRECTORY" not in shown, f"stejax {path} {shown}: a directory is spelt DIR"
        if isinstance(param, click.Option) and isinstance(param.type, click.Path) and not param.type.file_okay:
            assert shown.endswith(" DIR"), f"stejax {path} {shown}: a directory option's metavar is DIR"


@pytest.mark.parametrize("flag", ["--warmup", "--repeats"])
def test_warmup_and_repeats_have_one_minimum(flag):
    bounds = {
        path: (option.type.min, option.type.min_open)
        for path, command in COMMANDS.items()
        for option in command.params
        if isinstance(option, click.Option) and flag in option.opts and not option.hidden
    }
    assert len(bounds) >= 3, bounds  # bench, compare, snn compare at least
    assert set(bounds.values()) == {(1, False)}, bounds


def test_a_warmup_of_zero_is_refused_everywhere(tmp_path):
    for args in (["bench", "--suite", "estimators"], ["compare"], ["snn", "compare"]):
        result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x"), "--warmup", "0"])
        assert result.exit_code == 2 and "0 is not in the range x>=1" in result.output, (args, result.output)


def test_quick_says_what_it_does_in_each_command():
    helps = {
        path: option.help or ""
        for path, command in COMMANDS.items()
        for option in command.params
        if isinstance(option, click.Option) and "--quick" in option.opts
    }
    assert {"bench", "lm compare", "snn compare", "vq compare"} <= set(helps), sorted(helps)
    for path, text in helps.items():
        # the settings it changes, in numbers: seeds, steps, sizes, rounds
        assert re.search(r"\d", text), f"stejax {path} --quick: say what it changes ({text!r})"
        assert "smoke-test tier" not in text, f"stejax {path} --quick: {text!r}"
    assert len(set(helps.values())) == len(helps)  # each command says its own


def test_lm_compare_quick_help_matches_the_quick_settings():
    from stejax.lm import QUICK

    (option,) = [p for p in COMMANDS["lm compare"].params if "--quick" in getattr(p, "opts", ())]
    assert f"{len(QUICK.seeds)} seed" in option.help
    assert f"{QUICK.float_steps} float steps" in option.help and f"{QUICK.finetune_steps} fine-tuning" in option.help


# ----------------------------------------------------------------------------------------------- stejax list


def test_list_is_one_line_per_estimator_cut_to_a_terminal():
    result = CliRunner(env={"COLUMNS": "80", "FORCE_COLOR": "1"}).invoke(main, ["list"])  # as in a terminal
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(CATALOG)
    for line, (name, entry) in zip(lines, CATALOG.items(), strict=True):
        assert line.split()[:2] == [name, entry.family], line
        assert len(line) <= 80, line
    assert "Round to the nearest integer, ties to even" in result.output
    assert any(line.endswith("…") for line in lines)


def test_list_piped_keeps_every_sentence_whole():
    from stejax.render import first_paragraph, plain_roles

    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["list"])  # not a terminal: a pipe or a file
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(CATALOG) and not any("…" in line for line in lines)
    for line, entry in zip(lines, CATALOG.values(), strict=True):
        first = plain_roles(first_paragraph(entry.fn)).split(". ")[0].rstrip(".") + "."
        assert line.endswith(first), line
    assert max(len(line) for line in lines) > 80


def test_list_long_keeps_the_math_table():
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["list", "--long"])
    assert result.exit_code == 0, result.output
    assert "forward" in result.output and "reference" in result.output and "┃" in result.output
    assert len(result.output.splitlines()) > 2 * len(CATALOG)


# ----------------------------------------------------------------------------------------------- stejax bench


def test_bench_by_default_runs_the_suites_whose_extras_are_installed(monkeypatch, tmp_path):
    import stejax.bench

    ran = []

    def run_bench(suites, **kwargs):
        ran.append(tuple(suites))
        return {"suites": {}, "wall_seconds": 0.0}

    monkeypatch.setattr(stejax.bench, "run_bench", run_bench)
    # What `pip install 'stejax[cli]'` gives: jax, click, rich, matplotlib; no optax, flax, qwix or onnx.
    have = {"click", "rich", "matplotlib"}
    monkeypatch.setattr(
        stejax.cli.bench,
        "_missing_extra",
        lambda suite: (
            None if set(stejax.cli.bench._SUITE_NEEDS[suite][1]) <= have else stejax.cli.bench._SUITE_NEEDS[suite][0]
        ),
    )
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert ran == [("estimators",)]
    output = " ".join(result.output.split())
    for suite, extra in [("train", "train"), ("inference", "train"), ("peers", "peers"), ("onnx", "onnx")]:
        assert f"not run: the {suite} suite, which needs pip install 'stejax[{extra}]'." in output, output
    assert "not run: the lm-decode suite, which needs pip install 'stejax[flax]'." in output


_ONLY_CLI = """
import importlib.abc, importlib.util, sys

# What `pip install 'stejax[cli]'` leaves out: every other extra's modules.
BLOCKED = {"optax", "sklearn", "safetensors", "scipy", "flax", "qwix", "spyx", "onnx", "onnxruntime", "gguf"}


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Block())
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.partition(".")[0] in BLOCKED else find_spec(name, *a)
from stejax.cli import main

main(["--no-compile-cache", "bench", "--quick", "--estimator", "round_ste", "--repeats", "2", "--out", sys.argv[1]])
"""


def test_bench_by_default_runs_with_only_the_cli_extra(tmp_path):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "only_cli.py"
    script.write_text(_ONLY_CLI, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not run: the train suite, which needs pip install 'stejax[train]'." in done.stdout
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert list(report["suites"]) == ["estimators"] and report["suites"]["estimators"]["status"] == "ok"


def test_bench_suite_all_still_runs_every_suite(monkeypatch, tmp_path):
    import stejax.bench

    ran = []
    monkeypatch.setattr(
        stejax.bench, "run_bench", lambda suites, **kw: ran.append(tuple(suites)) or {"suites": {}, "wall_seconds": 0}
    )
    result = CliRunner().invoke(main, ["bench", "--suite", "all", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ran == [("all",)] and "not run" not in result.output


def test_the_suite_needs_name_real_extras_and_modules():
    import tomllib
    from pathlib import Path

    from stejax._extras import EXTRA_OF
    from stejax.bench import SUITES

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(SUITES) <= set(stejax.cli.bench._SUITE_NEEDS)  # every suite says what it needs
    for suite, (extra, modules) in stejax.cli.bench._SUITE_NEEDS.items():
        assert extra in extras, suite
        for module in modules:  # each module comes with the extra named (or one it includes)
            assert module in ("onnx", "onnxruntime") or EXTRA_OF[module] in (extra, "train", "flax", "cli"), module
