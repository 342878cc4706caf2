"""One CLI vocabulary: every command of the click application, walked.

Every visible option has help text and every choice lists its values; the spellings that used to
mean different things in different commands are gone from --help; each old spelling still works for
one release, says so on stderr, names the new spelling and is hidden.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import stejax.cli.snn
import stejax.cli.training
from stejax.cli import main

# Old spelling -> new spelling, by command (a spelling in capitals is a positional argument).
RENAMES = {
    ("compare", "--timing-repeats"): "--repeats",
    ("export", "OUT"): "--out",
    ("diagnose", "--run"): "RUN",
    ("serve", "--artifact"): "ARTIFACT",
    ("lm export", "OUT"): "--out",
    ("lm sample", "--artifact"): "ARTIFACT",
    ("snn train", "--steps"): "--time-steps",
    ("snn compare", "--steps"): "--time-steps",
    ("vq compare", "--variants"): "--configs",
    ("export", "--trust-key"): "--public-key",
    ("serve", "--trust-key"): "--public-key",
    ("artifact sign", "--chain"): "--certificate-chain",
}
# Spellings that no command shows any more, whatever the command.
RETIRED = {"--timing-repeats", "--run", "--artifact", "--trust-key", "--chain"}
# One thing, one spelling: a trusted public key is --public-key (as OpenSSF model signing spells it) and a
# chain of certificates --certificate-chain, in every command that takes one.
SPELLINGS = {"public_keys": "--public-key", "chain": "--certificate-chain", "roots": "--certificate-chain"}
COMPARISONS = ("compare", "lm compare", "snn compare", "vq compare")


def _walk(command: click.Command, path: str = "") -> list[tuple[str, click.Command]]:
    found = [(path, command)] if path else []
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            found += _walk(sub, f"{path} {name}".strip())
    return found


COMMANDS = dict(_walk(main))


def _ctx(path: str) -> click.Context:
    return click.Context(COMMANDS[path], info_name=path.split()[-1])


def _visible_options(path: str) -> list[click.Option]:
    return [p for p in COMMANDS[path].params if isinstance(p, click.Option) and not p.hidden]


def _option(path: str, flag: str) -> click.Option:
    (option,) = [p for p in _visible_options(path) if flag in p.opts]
    return option


def test_the_root_options_explain_themselves():
    for option in main.params:
        if isinstance(option, click.Option) and not option.hidden:
            assert (option.help or "").strip(), f"stejax {option.opts[0]} has no help text"


def test_the_walk_finds_every_command():
    assert {"list", "verify", "train", "compare", "demo", "serve", "diagnose", "bench", "export"} <= set(COMMANDS)
    assert {"lm train", "lm sample", "lm export", "snn compare", "vq compare", "artifact trust add"} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_and_option_explains_itself(path):
    command = COMMANDS[path]
    assert (command.help or "").strip(), f"stejax {path} has no description"
    for option in _visible_options(path):
        assert (option.help or "").strip(), f"stejax {path} {option.opts[0]} has no help text"
        assert "see `compare`" not in option.help and "(see compare)" not in option.help


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_choice_lists_its_values(path):
    ctx = _ctx(path)
    for param in COMMANDS[path].params:
        if isinstance(param.type, click.Choice) and not getattr(param, "hidden", False):
            assert param.type.choices, f"stejax {path} {param.name}: a choice of nothing"
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            shown = " ".join(record) if record else param.make_metavar(ctx)
            missing = [c for c in param.type.choices if str(c) not in shown]
            assert not missing, f"stejax {path} {param.name}: --help does not list {missing}"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_no_inconsistent_spelling_is_shown(path):
    for option in _visible_options(path):
        for flag in option.opts + option.secondary_opts:
            assert flag not in RETIRED, f"stejax {path} {flag}: retired, see RENAMES"
            assert (path, flag) not in RENAMES, f"stejax {path} {flag} is now {RENAMES[path, flag]}"
        if "--config" in option.opts:  # --config is always a JSON file ...
            assert isinstance(option.type, click.Path) and not option.type.dir_okay, f"stejax {path} --config"
        if "--preset" in option.opts:  # ... and --preset always a name
            assert isinstance(option.type, click.Choice), f"stejax {path} --preset"
        if "--steps" in option.opts:  # training steps; spiking time steps are --time-steps
            assert not path.startswith("snn"), f"stejax {path} --steps"
        if "--out" in option.opts:  # never the working directory by default
            assert option.default is None or Path(str(option.default)) != Path("."), f"stejax {path} --out"
        if "--repeats" in option.opts or "--warmup" in option.opts or "--workers" in option.opts:
            assert isinstance(option.type, click.IntRange), f"stejax {path} {option.opts[0]}"


def test_one_parameter_has_one_spelling_in_every_command():
    # A parameter of the same name means the same thing wherever it appears; it must be spelled the same.
    spelled: dict[str, dict[str, str]] = {}
    for path in COMMANDS:
        for option in _visible_options(path):
            spelled.setdefault(str(option.name), {})[path] = max(option.opts, key=len)
    for name, by_command in spelled.items():
        assert len(set(by_command.values())) == 1, f"{name} is spelled differently: {by_command}"
        if name in SPELLINGS:
            assert set(by_command.values()) == {SPELLINGS[name]}, (name, by_command)
    assert {"export", "serve", "artifact verify"} <= set(spelled["public_keys"])
    assert {"artifact sign"} <= set(spelled["chain"]) and {"artifact verify"} <= set(spelled["roots"])


@pytest.mark.parametrize("path", [p for p in COMPARISONS if p in COMMANDS])
def test_every_comparison_takes_workers_with_one_default(path):
    assert _option(path, "--workers").default == 1
    assert _option("demo", "--workers").default == 2  # the demo keeps its two processes


def test_runs_and_artifacts_are_positional():
    for path, name in [
        ("export", "run_dir"),
        ("diagnose", "run_dir"),
        ("serve", "artifact_dir"),
        ("artifact verify", "artifact_dir"),
        ("regress record", "artifact_dir"),
        ("lm sample", "artifact_dir"),
        ("lm export", "run"),
    ]:
        (param,) = [p for p in COMMANDS[path].params if p.name == name]
        assert isinstance(param, click.Argument), (path, name)


def test_what_a_command_writes_is_out():
    # An export writes to --out, as every other command does; no visible argument names what is written.
    for path in COMMANDS:
        for param in COMMANDS[path].params:
            if isinstance(param, click.Argument) and param.get_usage_pieces(_ctx(path)):
                assert param.name not in ("out", "out_dir"), path
    assert {"--out"} <= set(_option("export", "--out").opts) and _option("lm export", "--out").metavar == "PATH"


def test_help_groups_the_commands_by_task():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    sections = ["Estimators:", "Training:", "Artifacts and serving:", "Measurement:", "Examples:"]
    at = [result.output.index(title) for title in sections]
    assert at == sorted(at)
    assert "Other commands:" not in result.output  # every command has its section
    blocks = dict(zip(sections, [result.output[i:j] for i, j in zip(at, [*at[1:], None])], strict=True))
    assert all(f"  {name} " in blocks["Estimators:"] for name in ("list", "show", "verify"))
    assert all(f"  {name} " in blocks["Artifacts and serving:"] for name in ("export", "artifact", "regress", "serve"))
    assert all(f"  {name} " in blocks["Examples:"] for name in ("demo", "lm", "snn", "vq"))


# ------------------------------------------------------------------------------------------ deprecations


def _deprecated(path: str) -> dict[str, click.Parameter]:
    """The old spellings of ``path``: an option's flag, or an old positional argument's metavar."""
    return {
        p.opts[0] if isinstance(p, click.Option) else str(p.metavar): p
        for p in COMMANDS[path].params
        if p.name and p.name.startswith("_deprecated_")
    }


def test_every_old_spelling_is_in_the_table_hidden_and_points_at_its_new_spelling():
    found = {(path, flag) for path in COMMANDS for flag in _deprecated(path)}
    assert found == set(RENAMES)
    for (path, flag), new in RENAMES.items():
        old = _deprecated(path)[flag]
        assert old.hidden if isinstance(old, click.Option) else not old.get_usage_pieces(_ctx(path)), (path, flag)
        help_text = CliRunner().invoke(main, [*path.split(), "--help"]).output
        assert f"{flag} " not in help_text and f"{flag}\n" not in help_text, (path, flag)
        assert new in help_text, (path, new)


def _both(old_args, new_args, **runner_kwargs):
    """Run the old and the new spelling; the same outcome, and a deprecation line for the old one only."""
    runner = CliRunner(**runner_kwargs)
    old, new = runner.invoke(main, old_args), runner.invoke(main, new_args)
    assert old.exit_code == new.exit_code, (old.output, new.output)
    assert "Deprecated" not in new.stderr
    (line,) = [x for x in old.stderr.splitlines() if x.startswith("Deprecated")]
    assert old.stderr.replace(line + "\n", "") == new.stderr
    assert old.stdout == new.stdout
    return line, new


def test_compare_timing_repeats(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(stejax.cli.training, "_run_compare", lambda console, out, **kwargs: calls.append(kwargs))
    line, new = _both(
        ["compare", "--out", str(tmp_path), "--timing-repeats", "7"],
        ["compare", "--out", str(tmp_path), "--repeats", "7"],
    )
    assert new.exit_code == 0 and calls[0] == calls[1] and calls[0]["repeats"] == 7
    assert line == (
        "Deprecated: stejax compare --timing-repeats is now --repeats; the old spelling stops working in the next "
        "release."
    )


def test_diagnose_run(tmp_path):
    line, new = _both(["diagnose", "--run", str(tmp_path)], ["diagnose", str(tmp_path)])
    assert new.exit_code == 2  # an empty directory is no run: the same refusal either way
    assert line.startswith("Deprecated: stejax diagnose --run is now the argument RUN (stejax diagnose RUN)")


def test_serve_artifact(tmp_path):
    # A bad --buckets is refused after ARTIFACT was taken: the directory reached the command.
    line, new = _both(
        ["serve", "--artifact", str(tmp_path), "--buckets", "1,x"], ["serve", str(tmp_path), "--buckets", "1,x"]
    )
    assert new.exit_code == 2 and "expected comma-separated ints" in new.output
    assert "now the argument ARTIFACT" in line


def test_lm_sample_artifact(tmp_path):
    line, new = _both(
        ["lm", "sample", "--artifact", str(tmp_path), "--prompt", "x"], ["lm", "sample", str(tmp_path), "--prompt", "x"]
    )
    assert new.exit_code != 0 and "now the argument ARTIFACT" in line


@pytest.mark.parametrize("path", ["export", "lm export"])
def test_export_out(path, tmp_path):
    run, out = tmp_path / "run", tmp_path / "exists"
    run.mkdir(), out.mkdir()
    args = [*path.split(), str(run)]
    line, new = _both([*args, str(out)], [*args, "--out", str(out)])
    if path == "lm export":  # refused after --out was taken: the path reached the command
        assert new.exit_code == 2 and "exists; artifacts are never overwritten" in new.output
    else:
        assert new.exit_code == 1 and "exists; artifacts are never overwritten" in new.output
    assert line == (
        f"Deprecated: stejax {path} OUT as an argument is now --out OUT; the old spelling stops working in the next "
        "release."
    )
    both = CliRunner().invoke(main, [*args, str(out), "--out", str(out)])
    assert both.exit_code == 2 and "OUT is the old spelling of --out; give --out only." in both.output


def test_lm_train_takes_no_config():
    # lm train names its configuration --preset; --config is a JSON file wherever it exists (stejax train).
    result = CliRunner().invoke(main, ["lm", "train", "--out", "never-written", "--config", "w4a8"])
    assert result.exit_code == 2 and "No such option '--config'" in result.output, result.output
    assert not Path("never-written").exists()


def test_snn_time_steps(monkeypatch, tmp_path):
    tiers = []

    def run(tier, out, console, workers=1):
        tiers.append(tier)
        (out / "report.json").write_text('{"summary": {}}', encoding="utf-8")

    monkeypatch.setattr(stejax.cli.snn, "_run", run)
    line, new = _both(
        ["snn", "train", "--out", str(tmp_path), "--steps", "6"],
        ["snn", "train", "--out", str(tmp_path), "--time-steps", "6"],
    )
    assert new.exit_code == 0 and tiers[0] == tiers[1] and tiers[0].steps == (6,)
    assert "stejax snn train --steps is now --time-steps" in line
    line, new = _both(
        ["snn", "compare", "--out", "x", "--steps", "8,zero"],
        ["snn", "compare", "--out", "x", "--time-steps", "8,zero"],
    )
    assert new.exit_code == 2 and "--time-steps" in new.output and "comma-separated positive ints" in new.output


def test_old_and_new_spelling_together_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["compare", "--out", str(tmp_path), "--repeats", "3", "--timing-repeats", "3"])
    assert (
        result.exit_code == 2
        and "--timing-repeats is the old spelling of --repeats; give --repeats only" in result.output
    )
    result = CliRunner().invoke(main, ["diagnose", str(tmp_path), "--run", str(tmp_path)])
    assert result.exit_code == 2 and "--run is the old spelling of RUN; give RUN only" in result.output


def test_a_positional_argument_is_still_required(tmp_path):
    result = CliRunner().invoke(main, ["lm", "sample", "--prompt", "x"])
    assert result.exit_code == 2 and "Missing argument 'ARTIFACT'" in result.output
    for path in ("export", "lm export"):
        result = CliRunner().invoke(main, [*path.split(), str(tmp_path)])
        assert result.exit_code == 2 and "Missing option '--out'" in result.output, (path, result.output)


def test_snn_compare_passes_workers_to_the_comparison(monkeypatch, tmp_path):
    import stejax.snn

    seen = []

    def compare(tier, *, out_dir, on_event, workers):
        seen.append(workers)
        return {"targets": []}

    monkeypatch.setattr(stejax.snn, "compare", compare)
    result = CliRunner().invoke(main, ["snn", "compare", "--quick", "--out", str(tmp_path), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert seen == [2]


def test_snn_compare_refuses_a_bad_worker_count(tmp_path):
    from stejax.snn import QUICK, compare

    with pytest.raises(ValueError, match=r"workers must be a positive int .*; got 0"):
        compare(QUICK, out_dir=tmp_path, workers=0)


def test_the_cli_reference_is_generated_from_the_app():
    # docs/cli.md holds no hand-written option: mkdocs-click renders the click application itself, so the
    # page cannot drift from --help. Every command gets its section; no old spelling appears.
    from mkdocs_click._extension import replace_command_docs

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "::: mkdocs-click\n    :module: stejax.cli\n    :command: main\n    :prog_name: stejax\n" in page
    mkdocs = (root / "mkdocs.yml").read_text(encoding="utf-8")
    assert "  - mkdocs-click\n" in mkdocs and "cli.md" in mkdocs
    lines = list(replace_command_docs(module="stejax.cli", command="main", prog_name="stejax", depth=1))
    text = "\n".join(lines)
    assert all(f"\nstejax {path} [OPTIONS]" in text for path in COMMANDS)  # each command's usage line
    for (path, flag), _ in RENAMES.items():
        usage = f"stejax {path} [OPTIONS]"
        assert usage in text
        section = text[text.index(usage) :].split("\n#", 1)[0]
        assert f"  {flag} " not in section, (path, flag)


def test_vq_compare_variants(tmp_path):
    # vq compare names its configurations --configs, as every comparison does. An unknown name is refused
    # after the old spelling's value reached --configs.
    line, new = _both(
        ["vq", "compare", "--out", str(tmp_path), "--variants", "nope"],
        ["vq", "compare", "--out", str(tmp_path), "--configs", "nope"],
    )
    assert new.exit_code == 2 and "--configs" in new.output and "nope" in new.output
    assert line.startswith("Deprecated: stejax vq compare --variants is now --configs;")


@pytest.mark.parametrize("path", [p for p in COMPARISONS if p in COMMANDS])
def test_every_comparison_names_its_configurations_configs(path):
    assert _option(path, "--configs").metavar == "NAME,..."


def test_trust_key_is_public_key(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("not read: the command refuses first", encoding="utf-8")
    # serve: a bad --buckets is refused after the key reached --public-key.
    line, new = _both(
        ["serve", str(tmp_path), "--trust-key", str(key), "--buckets", "1,x"],
        ["serve", str(tmp_path), "--public-key", str(key), "--buckets", "1,x"],
    )
    assert new.exit_code == 2 and "expected comma-separated ints" in new.output
    assert line.startswith("Deprecated: stejax serve --trust-key is now --public-key;")
    # export: a key without --format onnx is refused, naming the new spelling.
    run = tmp_path / "run"
    run.mkdir()
    line, new = _both(
        ["export", str(run), "--out", str(tmp_path / "art"), "--trust-key", str(key)],
        ["export", str(run), "--out", str(tmp_path / "art"), "--public-key", str(key)],
    )
    assert new.exit_code == 2 and "--float, --public-key and --conv go with --format onnx" in new.output
    assert line.startswith("Deprecated: stejax export --trust-key is now --public-key;")


def test_artifact_sign_chain_is_certificate_chain(tmp_path):
    pem = tmp_path / "x.pem"
    pem.write_text("not read: the command refuses first", encoding="utf-8")
    line, new = _both(
        ["artifact", "sign", str(tmp_path), "--key", str(pem), "--chain", str(pem)],
        ["artifact", "sign", str(tmp_path), "--key", str(pem), "--certificate-chain", str(pem)],
    )
    assert new.exit_code == 2 and "--certificate-chain needs --certificate" in new.output
    assert line.startswith("Deprecated: stejax artifact sign --chain is now --certificate-chain;")
