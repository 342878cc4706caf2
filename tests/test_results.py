"""One source of truth for figures: the committed results files, the pages that render them, the README's markers."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from stejax.bench.results import (
    Figure,
    Recorder,
    _stamped_commit,
    check_markers,
    check_results,
    is_current,
    load_results,
    render_markdown,
    resolve_commit,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
RESULTS_FILES = sorted(RESULTS.glob("*.json"))


@pytest.fixture
def folder(tmp_path):
    rec = Recorder("speed", command="python bench.py --repeats 5")
    rec.write(
        tmp_path / "speed.json",
        rows=[
            {"model": "small", "batch": 1, "bytes_per_s": 1234.56, "met": True},
            {"model": "small", "batch": 16, "bytes_per_s": 9876.5, "met": False},
        ],
        columns=[("model", "model"), ("batch", "batch"), ("bytes_per_s", "bytes/s", "{:,.0f}"), ("met", "met")],
        figures={"speedup": Figure(21.4, "21.4×", target="≥ 20×", met=True)},
    )
    return tmp_path


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)
    return done.stdout.decode().strip()


def _write(folder: Path) -> dict:
    return Recorder("speed", command="c").write(folder / "speed.json", rows=[{"a": 1}], columns=[("a", "a")])


def test_a_repository_that_does_not_track_the_measured_code_is_not_its_commit(tmp_path, monkeypatch):
    # A tree copied into an ignored folder of a checkout: the checkout's HEAD and its changes say nothing about
    # the code that ran, and a copy carries no stamp from git archive, so the commit is unknown, with the reason.
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    (tmp_path / "a.txt").write_text("changed")
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: tmp_path / "copied" / "code.py")
    monkeypatch.delenv("STEJAX_COMMIT", raising=False)
    commit = _write(tmp_path)["commit"]
    assert commit["id"] is None and commit["uncommitted_changes"] is None
    assert "git archive" in commit["reason"]


def test_stejax_commit_alone_is_not_trusted(tmp_path, monkeypatch):
    # Nothing ties a name in the environment to the code that ran: without a stamp it is recorded as unknown.
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: tmp_path / "code.py")
    monkeypatch.setenv("STEJAX_COMMIT", "0123456789abcdef")
    commit = _write(tmp_path)["commit"]
    assert commit["id"] is None and "exported" not in commit
    assert "STEJAX_COMMIT=0123456789abcdef" in commit["reason"] and "no commit stamp" in commit["reason"]
    assert not is_current({**load_results(tmp_path / "speed.json")})


def _archived_repository(tmp_path: Path) -> tuple[Path, Path, str]:
    """A tiny repository holding this repository's stamp file and .gitattributes, and its `git archive`."""
    repo, out = tmp_path / "repo", tmp_path / "out"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "_commit.py").write_text((ROOT / "src" / "stejax" / "_commit.py").read_text("utf-8"))
    (repo / ".gitattributes").write_text(
        (ROOT / ".gitattributes").read_text("utf-8").replace("src/stejax/_commit.py", "pkg/_commit.py")
    )
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = _git(repo, "rev-parse", "HEAD")
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=repo, check=True, capture_output=True)
    out.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(out, filter="data")
    return repo, out, head


def test_a_copy_with_an_older_history_names_the_commit_whose_tree_it_ran(tmp_path, monkeypatch):
    # A remote machine's copy of the working tree: its files are a later commit's, its history stops before it.
    repo, _, first = _archived_repository(tmp_path)
    copy = tmp_path / "copy"
    _git(tmp_path, "clone", "-q", str(repo), str(copy))
    for tree in (repo, copy):
        (tree / "pkg" / "__init__.py").write_text("VALUE = 2\n")
        (tree / "pkg" / "new.py").write_text("")  # untracked in the copy: it ran all the same
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "second")
    second = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: copy / "pkg" / "__init__.py")
    (copy / "results").mkdir()
    recorded = _write(copy / "results")["commit"]
    assert recorded["id"] == first[:12] and recorded["uncommitted_changes"] is True
    assert recorded["tree"] == _git(repo, "rev-parse", "HEAD^{tree}")
    resolved = resolve_commit(recorded, repo)
    assert resolved == {"id": second[:12], "uncommitted_changes": False, "tree": recorded["tree"]} | {
        "recorded_id": first[:12]
    }
    # One byte more in the copy: no commit has its tree, and the record stays as it was.
    (copy / "results" / "speed.json").unlink()
    (copy / "pkg" / "new.py").write_text("x")
    changed = _write(copy / "results")["commit"]
    assert changed["tree"] != recorded["tree"] and resolve_commit(changed, repo) == changed


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout (an exported tree is stamped)")
def test_this_repository_stamps_its_exported_trees():
    attribute = _git(ROOT, "check-attr", "export-subst", "--", "src/stejax/_commit.py")
    assert attribute.endswith("export-subst: set"), attribute
    # In the checkout the stamp is the placeholder git archive replaces: it names no commit.
    assert '"$Format:%H$"' in (ROOT / "src" / "stejax" / "_commit.py").read_text("utf-8")
    assert _stamped_commit(ROOT / "src" / "stejax") is None


def test_git_archive_stamps_the_tree_and_the_results_file_records_that_commit(tmp_path, monkeypatch):
    repo, out, head = _archived_repository(tmp_path)
    assert _stamped_commit(repo / "pkg") is None  # the unsubstituted placeholder: not exported
    assert head in (out / "pkg" / "_commit.py").read_text("utf-8")
    assert _stamped_commit(out / "pkg") == head
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: out / "pkg" / "__init__.py")
    monkeypatch.delenv("STEJAX_COMMIT", raising=False)
    expected = {"id": head[:12], "uncommitted_changes": False, "exported": True}
    assert _write(out / "results")["commit"] == expected
    monkeypatch.setenv("STEJAX_COMMIT", head[:7].upper())  # a short id that agrees
    assert _write(out / "results")["commit"] == expected
    # An exported tree inside an ignored folder of a checkout: the stamp, not the checkout's HEAD.
    (repo / ".gitignore").write_text("out/\n")
    nested = repo / "out"
    out.rename(nested)
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: nested / "pkg" / "__init__.py")
    assert _write(nested / "results")["commit"] == expected


def test_a_stejax_commit_that_disagrees_with_the_stamp_is_refused(tmp_path, monkeypatch):
    _, out, head = _archived_repository(tmp_path)
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: out / "pkg" / "__init__.py")
    monkeypatch.setenv("STEJAX_COMMIT", "0123456789ab")
    with pytest.raises(ValueError, match=rf"STEJAX_COMMIT=0123456789ab disagrees .*{head}"):
        _write(out / "results")
    assert not (out / "results" / "speed.json").exists()


def test_a_load_or_cpu_the_machine_does_not_report_is_recorded_as_not_available(tmp_path, monkeypatch):
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: tmp_path / "code.py")
    monkeypatch.setattr("stejax.bench._machine.load_average", lambda: None)
    monkeypatch.setattr("stejax.bench._machine.cpu_model", lambda: "not available")
    doc = _write(tmp_path)
    assert doc["load"] == {"start": None, "end": None, "note": "not available"}
    assert doc["machine"]["cpu"] == "not available"
    # What the machine cannot report is recorded, not missing: such a file is still current.
    current = {**doc, "commit": {"id": "abc1234def56", "uncommitted_changes": False}}
    assert is_current(current)
    (tmp_path / "speed.json").write_text(json.dumps(current), "utf-8")
    line = render_markdown('{{ results_source("speed") }}', tmp_path)
    assert "CPU model not available" in line and "load average" not in line


def test_a_written_file_records_its_command_commit_date_machine_and_load(folder):
    doc = load_results(folder / "speed.json")
    assert doc["command"] == "python bench.py --repeats 5"
    assert {"id", "uncommitted_changes"} <= set(doc["commit"])
    assert doc["date"][:4].isdigit()
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["jax"]
    assert set(doc["load"]) == {"start", "end"}


def test_tables_filter_rows_pick_columns_and_say_where_they_come_from(folder):
    text = render_markdown('{{ results_table("speed", where="batch=16", columns="model,bytes_per_s") }}', folder)
    assert "| model | bytes/s |" in text
    assert "| small | 9,876 |" in text and "1,235" not in text
    assert "`python bench.py --repeats 5`" in text and "cores" in text
    figures = render_markdown('{{ results_figures("speed") }}', folder)
    assert "| speedup | 21.4× | ≥ 20× | met |" in figures


def test_figures_render_inline_but_not_inside_code_blocks(folder):
    page = 'It is {{ figure("speed", "speedup") }} faster.\n```text\n{{ figure("speed", "speedup") }}\n```\n'
    rendered = render_markdown(page, folder)
    assert rendered.startswith("It is 21.4× faster.")
    assert '```text\n{{ figure("speed", "speedup") }}\n```' in rendered


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('{{ figure("nothing", "x") }}', "does not exist"),
        ('{{ figure("speed", "slowdown") }}', "no figure 'slowdown'"),
        ('{{ results_table("speed", columns="model,latency") }}', "no column"),
        ('{{ results_table("speed", where="batch=3") }}', "no row has"),
        ('{{ results_table("speed", where="batch") }}', "key=value"),
    ],
)
def test_a_call_that_cannot_be_rendered_names_what_is_missing(folder, call, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        render_markdown(call, folder)


def test_a_results_file_without_command_or_machine_is_refused(folder):
    doc = json.loads((folder / "speed.json").read_text())
    for broken in ({**doc, "command": ""}, {k: v for k, v in doc.items() if k != "machine"}):
        with pytest.raises(ValueError, match=r"command|machine"):
            check_results(broken)
    with pytest.raises(ValueError, match="machine"):
        check_results({**doc, "machine": {**doc["machine"], "cpu": None}})
    with pytest.raises(ValueError, match="command"):
        Recorder("speed", command=" ")
    with pytest.raises(ValueError, match="target"):
        Figure(1.0, "1.0×", met=True)


def test_markers_catch_a_figure_that_differs_from_its_file(folder):
    assert check_markers("| speed-up | **21.4×** <!-- results: speed.speedup --> |", folder) == []
    problems = check_markers("| speed-up | **20.9×** <!-- results: speed.speedup --> |", folder)
    assert problems and "expected '21.4×'" in problems[0]
    assert "no figure" in check_markers("x <!-- results: speed.other -->", folder)[0]
    assert "does not exist" in check_markers("x <!-- results: gone.speedup -->", folder)[0]


@pytest.mark.parametrize("path", RESULTS_FILES, ids=lambda p: p.name)
def test_every_committed_results_file_records_its_command_and_machine(path):
    doc = load_results(path)
    assert doc["name"] == path.stem, f"{path}: its name field says {doc['name']!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_page_renders_from_files_that_exist(page):
    render_markdown(page.read_text("utf-8"), RESULTS)


def test_the_readme_figures_equal_their_results_files():
    readme = (ROOT / "README.md").read_text("utf-8")
    assert check_markers(readme, RESULTS) == []
    glance = re.search(r"^## Results at a glance\n(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert glance, "README.md needs a '## Results at a glance' section"
    rows = [line for line in glance.group(1).splitlines() if line.startswith("|") and not line.startswith("|--")]
    figure_rows = rows[1:]  # below the header
    assert 1 <= len(figure_rows) <= 6, f"expected 1 to 6 figures at a glance; got {len(figure_rows)}"
    unmarked = [row for row in figure_rows if "<!-- results:" not in row]
    assert not unmarked, f"every figure at a glance must name its results file: {unmarked}"


def _readme_citations() -> dict[str, list[str]]:
    """Each results file the README cites, with the README lines that cite it."""
    cited: dict[str, list[str]] = {}
    for line in (ROOT / "README.md").read_text("utf-8").splitlines():
        for name in re.findall(r"<!--\s*results:\s*([a-z0-9_\-]+)\.", line):
            cited.setdefault(name, []).append(line)
    return cited


@pytest.mark.parametrize("path", RESULTS_FILES, ids=lambda p: p.name)
def test_every_results_file_is_current_or_says_it_is_older(path):
    # Current: measured at a committed tree, with the CPU model and the load recorded. Otherwise the file says
    # why it is older, and the pages render its provenance line as an older measurement.
    doc = load_results(path)
    if is_current(doc):
        assert "older" not in doc
        return
    older = doc.get("older")
    assert isinstance(older, str) and older.strip(), (
        f"{path.name}: not current (run its command in a clean checkout of a commit, see benchmarks/README.md), "
        "and no `older` sentence saying why"
    )
    commit = str((doc["commit"] or {}).get("id") or "")
    assert commit and commit[:7] in older, f"{path.name}: `older` must name the commit that measured it"
    assert "An older measurement" in render_markdown(f'{{{{ results_source("{path.stem}") }}}}', RESULTS)


@pytest.mark.parametrize("name", sorted(_readme_citations()))
def test_every_results_file_the_readme_cites_is_current_or_marked_older_there(name):
    doc = load_results(RESULTS / f"{name}.json")
    machine, load = doc["machine"], doc["load"]
    if is_current(doc):
        assert doc["commit"]["uncommitted_changes"] is False and doc["commit"]["id"]
        assert "not recorded" not in machine["cpu"]
        assert isinstance(load["start"], int | float) and isinstance(load["end"], int | float)
        return
    unmarked = [line for line in _readme_citations()[name] if "older" not in line]
    assert not unmarked, f"README cites {name}.json, an older measurement, without saying so: {unmarked}"


def test_is_current_needs_a_committed_tree_a_cpu_model_and_the_load(folder):
    doc = load_results(folder / "speed.json")
    current = {**doc, "commit": {"id": "abc1234def56", "uncommitted_changes": False}}
    assert is_current(current)
    assert not is_current({**current, "commit": {"id": "abc1234def56", "uncommitted_changes": True}})
    assert not is_current({**current, "machine": {**doc["machine"], "cpu": "x86-64 (model not recorded)"}})
    assert not is_current({**current, "load": {"start": None, "end": None, "note": "not recorded"}})
    assert not is_current({**current, "older": "re-measured elsewhere"})
    changed = {**current, "commit": {"id": "abc1234def56", "uncommitted_changes": True}}
    (folder / "speed.json").write_text(json.dumps(changed), "utf-8")
    line = render_markdown('{{ results_source("speed") }}', folder)
    assert "An older measurement" in line and "commit abc1234def56 plus local changes" in line


def test_the_glance_table_shows_each_figure_beside_its_target_met_or_missed():
    readme = (ROOT / "README.md").read_text("utf-8")
    glance = re.search(r"^## Results at a glance\n(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert glance
    rows = [line for line in glance.group(1).splitlines() if line.startswith("|") and not line.startswith("|--")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[:3] == ["what", "figure", "target"], header
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        targets, verdicts = [t.strip() for t in cells[2].split(";")], [v.strip() for v in cells[3].split(";")]
        markers = re.findall(r"<!--\s*results:\s*([a-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*-->", cells[1])
        assert len(verdicts) == len(markers) and len(targets) in (1, len(markers)), row
        for i, (name, key) in enumerate(markers):
            figure = load_results(RESULTS / f"{name}.json")["figures"][key]
            assert figure["target"] and figure["met"] is not None, f"{name}.{key} has no target: show it without one"
            target = targets[i if len(targets) > 1 else 0]
            assert figure["target"].replace(" ", "") == target.replace(" ", ""), (name, key, figure["target"], target)
            assert verdicts[i].strip("*") == ("met" if figure["met"] else "missed"), (name, key, verdicts[i])


def test_a_results_file_written_beside_another_still_records_a_committed_tree(tmp_path, monkeypatch):
    # A script that writes two files measured one tree: the first file is not a change to the code.
    monkeypatch.setattr("stejax.bench.results._measured_code", lambda: tmp_path / "code.py")

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    table = {"rows": [{"x": 1}], "columns": [("x", "x")]}
    first = Recorder("a", command="python measure.py").write(tmp_path / "results" / "a.json", **table)
    second = Recorder("b", command="python measure.py").write(tmp_path / "results" / "b.json", **table)
    assert first["commit"]["uncommitted_changes"] is False and second["commit"]["uncommitted_changes"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    third = Recorder("b", command="python measure.py").write(tmp_path / "results" / "b.json", **table)
    assert third["commit"]["uncommitted_changes"] is True


@pytest.mark.parametrize(
    ("loadavg", "expected"),
    [
        ("1.52 1.00 0.50 2/345 6789\n", 1.52),
        ("0.00 0.01 0.05 1/120 42\n", 0.0),  # an idle machine: a reading of zero
        ("0.00 0.00 0.00 0/0 0\n", None),  # no task counted, not even the reader: not a kernel's reading
        ("garbled\n", None),
    ],
)
def test_the_load_is_read_or_not_available_never_a_made_up_zero(tmp_path, monkeypatch, loadavg, expected):
    from stejax.bench import _machine

    (tmp_path / "loadavg").write_text(loadavg)
    monkeypatch.setattr(_machine, "_LOADAVG", str(tmp_path / "loadavg"))
    assert _machine.load_average() == expected
    assert _machine.machine_info()["load_average_1m"] == expected


def test_without_proc_loadavg_the_load_comes_from_getloadavg_or_is_not_available(tmp_path, monkeypatch):
    from stejax.bench import _machine

    monkeypatch.setattr(_machine, "_LOADAVG", str(tmp_path / "missing"))
    monkeypatch.setattr(_machine.os, "getloadavg", lambda: (0.734, 0.5, 0.25))
    assert _machine.load_average() == 0.73

    def unreadable():
        raise OSError("no load average")

    monkeypatch.setattr(_machine.os, "getloadavg", unreadable)
    assert _machine.load_average() is None


@pytest.mark.parametrize(
    ("cpuinfo", "processor", "lscpu", "expected"),
    [
        (
            "processor\t: 0\nmodel name\t: AMD EPYC 7B12\n\nprocessor\t: 1\nmodel name\t: other\n",
            "",
            "",
            "AMD EPYC 7B12",
        ),
        (
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: unknown\n",
            "",
            "",
            "AuthenticAMD family 25 model 1",
        ),
        ("processor\t: 0\n", "unknown", "AMD EPYC 9B14", "AMD EPYC 9B14"),
        ("processor\t: 0\n", "x86_64", "", "x86_64"),
        (None, "unknown", "", "not available"),
    ],
)
def test_the_host_cpu_is_what_the_machine_reports_or_not_available(
    tmp_path, monkeypatch, cpuinfo, processor, lscpu, expected
):
    from stejax.bench import _machine

    if cpuinfo is not None:
        (tmp_path / "cpuinfo").write_text(cpuinfo)
    monkeypatch.setattr(_machine, "_CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(_machine.platform, "processor", lambda: processor)
    monkeypatch.setattr(_machine, "_lscpu_model", lambda: lscpu)
    assert _machine.cpu_model() == expected
    assert _machine.machine_info()["cpu"] == expected


def test_a_ratio_whose_spread_contains_one_reads_level_with():
    level = Figure.ratio([1.03, 0.96, 1.01, 0.99, 1.05], bound=1.0)
    assert level.text == "level with (0.96–1.05×)" and level.spread == (0.96, 1.01, 1.05)
    assert level.met is False  # the slowest round is above the bound
    faster = Figure.ratio([0.84, 0.80, 0.82, 0.85], bound=0.9, of="float's time")
    assert (faster.text, faster.value, faster.met) == ("0.83× (0.80–0.85×) float's time", 0.83, True)
    higher = Figure.ratio([1.9, 2.1, 2.0], bound=2.0, lower_is_better=False)
    assert (higher.target, higher.met) == ("≥ 2.00×", False)  # one round below the bound
    with pytest.raises(ValueError, match="at least one sample"):
        Figure.ratio([])


def test_the_writer_and_the_reader_refuse_a_target_met_by_a_straddling_spread(tmp_path):
    with pytest.raises(ValueError, match=r"spread 0.97–1.04 is not wholly below the bound 1"):
        Figure(1.0, "1.00×", target="≤ 1.00×", met=True, spread=(0.97, 1.0, 1.04), bound=1.0)
    with pytest.raises(ValueError, match="in order"):
        Figure(1.0, "1.00×", spread=(1.1, 1.0, 1.04))
    with pytest.raises(ValueError, match="no `target`"):
        Figure(1.0, "1.00×", bound=1.0)
    ok = Figure(0.9, "0.90×", target="≤ 1.00×", met=True, spread=(0.85, 0.9, 0.95), bound=1.0)
    Recorder("speed", command="c").write(
        tmp_path / "speed.json", rows=[{"a": 1}], columns=[("a", "a")], figures={"r": ok}
    )
    doc = json.loads((tmp_path / "speed.json").read_text("utf-8"))
    assert doc["figures"]["r"]["spread"] == [0.85, 0.9, 0.95]
    doc["figures"]["r"]["spread"] = [0.85, 0.9, 1.02]  # edited by hand: the spread now straddles the bound
    (tmp_path / "speed.json").write_text(json.dumps(doc), "utf-8")
    with pytest.raises(ValueError, match="figure 'r': `met` is True"):
        load_results(tmp_path / "speed.json")
