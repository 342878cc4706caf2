"""Results files: a measured table and its figures, with the command and the conditions that produced them.

Every figure on a page of the documentation comes from one results file,
``docs/results/NAME.json``, written by a documented command through
:class:`Recorder`. The file records the command, the commit, the date, the
machine (CPU, cores, jax and jaxlib) and the load average at the start and the
end of the measurement, beside the rows and the named figures; a file whose ratios
were measured in rounds records how many (``rounds``; see :meth:`Figure.ratio`). A value the
machine does not report is recorded as "not available" (a load as null), never
guessed. The commit is git's HEAD where the checkout around the results file
tracks the measured code; in a tree exported with ``git archive`` it is the
commit the archive stamped into ``stejax/_commit.py`` (``STEJAX_COMMIT``, if
set, must agree with it); otherwise it is unknown, with the reason. Pages render it
when the site is built (``docs/hooks.py`` calls :func:`render_markdown`), so a
page and its results cannot disagree:

- ``{{ results_table("NAME") }}``: the rows as a table, with the provenance line;
  ``where="batch=1,path=compiled"`` keeps the rows whose fields equal those
  values, ``columns="model,bytes_per_s"`` picks declared columns by key;
- ``{{ figure("NAME", "KEY") }}``: one figure's text, inline;
- ``{{ results_figures("NAME") }}``: every figure with its target and whether it
  was met;
- ``{{ results_source("NAME") }}``: the provenance line alone.

The README cannot be rendered by the site, so a figure there carries a marker on
the same line, ``<!-- results: NAME.KEY -->``, and the test suite checks that
the figure's text is on that line (:func:`check_markers`).

Example:
  >>> import tempfile, pathlib
  >>> from stejax.bench.results import Figure, Recorder, load_results, render_markdown
  >>> folder = pathlib.Path(tempfile.mkdtemp())
  >>> rec = Recorder("demo", command="python make_figures.py")
  >>> _ = rec.write(folder / "demo.json", rows=[{"config": "w4a4", "ratio": 1.0312}],
  ...               columns=[("config", "configuration"), ("ratio", "step / float", "{:.2f}")],
  ...               figures={"ratio": Figure(1.0312, "1.03×", target="≤ 1.05×", met=True)})
  >>> load_results(folder / "demo.json")["figures"]["ratio"]["text"]
  '1.03×'
  >>> print(render_markdown('The step costs {{ figure("demo", "ratio") }} of float.', folder))
  The step costs 1.03× of float.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT",
    "Figure",
    "Recorder",
    "check_markers",
    "check_results",
    "is_current",
    "load_results",
    "render_markdown",
    "resolve_commit",
]

FORMAT = "stejax-results/1"

_REQUIRED = ("format", "name", "command", "commit", "date", "machine", "load", "columns", "rows", "figures")
_MACHINE_REQUIRED = ("cpu", "cores", "jax", "jaxlib")
# What a record holds where the machine does not report a value (as stejax.bench._machine.NOT_AVAILABLE).
_NOT_AVAILABLE = "not available"


@dataclasses.dataclass(frozen=True)
class Figure:
    """One named figure of a results file.

    Attributes:
      value: the measured value (a number, or a string where no number fits).
      text: how every page shows it, e.g. ``"1.03×"`` or ``"98.4%"``.
      target: the target it is judged against, as text (``"≤ 1.05×"``), if any.
      met: whether the target was met; None without a target.
      note: one short sentence, if the figure needs one.
      spread: ``(minimum, median, maximum)`` of the value over repeated rounds, if it was repeated.
      bound: the target's number (``1.05`` of ``"≤ 1.05×"``), where a spread is judged against it.
      lower_is_better: whether the target is met below ``bound`` (else above it).

    A figure with a ``spread`` and a ``bound`` is met only when its whole spread is on the target's side:
    ``met=True`` for a spread that straddles the bound is refused, here and when a results file is read.
    """

    value: float | int | str | None
    text: str
    target: str | None = None
    met: bool | None = None
    note: str | None = None
    spread: tuple[float, float, float] | None = None
    bound: float | None = None
    lower_is_better: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError(f"Figure: `text` must be a non-empty string; got {self.text!r}.")
        if self.met is not None and self.target is None:
            raise ValueError(f"Figure {self.text!r}: `met` is {self.met} but there is no `target` to meet.")
        if self.bound is not None and self.target is None:
            raise ValueError(f"Figure {self.text!r}: `bound` is {self.bound} but there is no `target` it belongs to.")
        _check_spread(self.to_dict(), f"Figure {self.text!r}")

    @classmethod
    def ratio(
        cls,
        samples: Sequence[float],
        *,
        bound: float | None = None,
        lower_is_better: bool = True,
        of: str = "",
        note: str | None = None,
    ) -> Figure:
        """A ratio measured over repeated rounds: its median, its spread, and the target judged on the spread.

        The text is the median with the spread (``"0.82× (0.80–0.85×)"``); a spread that contains 1 reads
        ``"level with"`` (``"level with (0.97–1.04×)"``), since no round-to-round difference is then
        told from none. ``of`` names what it is a ratio of (``"float's time"``), appended to the text.

        Example:
          >>> Figure.ratio([0.97, 1.01, 1.04], bound=1.0).text
          'level with (0.97–1.04×)'
          >>> f = Figure.ratio([0.80, 0.82, 0.85], bound=0.9)
          >>> f.text, f.met, f.target
          ('0.82× (0.80–0.85×)', True, '≤ 0.90×')
        """
        values = sorted(float(x) for x in samples)
        if not values:
            raise ValueError("Figure.ratio: expected at least one sample; got none.")
        lo, hi = values[0], values[-1]
        mid = (
            values[len(values) // 2]
            if len(values) % 2
            else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
        )
        text = f"level with ({lo:.2f}–{hi:.2f}×)" if lo <= 1.0 <= hi else f"{mid:.2f}× ({lo:.2f}–{hi:.2f}×)"
        if of:
            text += f" {of}"
        met = None if bound is None else (hi <= bound if lower_is_better else lo >= bound)
        target = None if bound is None else f"{'≤' if lower_is_better else '≥'} {bound:.2f}×"
        return cls(
            mid,
            text,
            target=target,
            met=met,
            note=note,
            spread=(lo, mid, hi),
            bound=bound,
            lower_is_better=lower_is_better,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _check_spread(figure: Mapping[str, Any], where: str) -> None:
    """Refuse an unordered spread, and ``met`` claimed for a spread that is not wholly on the target's side."""
    spread, bound = figure.get("spread"), figure.get("bound")
    if spread is None:
        return
    if len(spread) != 3 or not spread[0] <= spread[1] <= spread[2]:
        raise ValueError(f"{where}: `spread` must be (minimum, median, maximum) in order; got {spread!r}.")
    if bound is None or figure.get("met") is not True:
        return
    lo, _, hi = spread
    lower = figure.get("lower_is_better", True)
    if (lower and hi > bound) or (not lower and lo < bound):
        raise ValueError(
            f"{where}: `met` is True, but the spread {lo:g}–{hi:g} is not wholly "
            f"{'below' if lower else 'above'} the bound {bound:g} ({figure.get('target')}); expected met=False."
        )


def _load_average() -> float | None:
    from stejax.bench._machine import load_average  # imports jax: only when a measurement is recorded

    return load_average()


def _load(start: float | None, end: float | None) -> dict[str, Any]:
    """The load record: a reading the machine could not give is null, with a note, never 0.0."""
    load: dict[str, Any] = {"start": start, "end": end}
    if start is None or end is None:
        load["note"] = _NOT_AVAILABLE
    return load


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _measured_code() -> Path:
    """A file of the stejax that is running: the code a results file measures."""
    return Path(__file__).resolve().parents[1] / "__init__.py"


# The stamp as it stands in a checkout: `git archive` replaces it with the commit (see .gitattributes).
_UNSTAMPED = "$Format:" + "%H$"
_STAMP = re.compile(r'^COMMIT\s*=\s*"([^"]*)"', flags=re.M)


def _stamped_commit(package: Path) -> str | None:
    """The full commit id that ``git archive`` wrote into ``package/_commit.py``; None where it wrote none.

    None for a checkout (the placeholder is unsubstituted), for a copy of a working tree, and where the file
    is missing or holds anything but a commit id.
    """
    try:
        found = _STAMP.search((package / "_commit.py").read_text("utf-8"))
    except OSError:
        return None
    value = found.group(1).strip().lower() if found else ""
    return value if re.fullmatch(r"[0-9a-f]{40}", value) else None


def _commit(cwd: Path) -> dict[str, Any]:
    head = _git("rev-parse", "--short=12", "HEAD", cwd=cwd)
    # The repository around the results file describes the measured code only if it tracks that code: a tree
    # exported with `git archive` (run on a machine without the repository, or in an ignored folder of one) and
    # an installed package are not its files.
    code = _measured_code()
    if head is not None and _git("ls-files", "--error-unmatch", str(code), cwd=cwd) is None:
        head = None
    if head is None:
        return _exported_commit(code.parent)
    top = _git("rev-parse", "--show-toplevel", cwd=cwd)
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    if top is None or status is None:
        return {"id": head, "uncommitted_changes": None}
    # Each line is "XY PATH" (the status letters, then the path; "OLD -> NEW" for a rename).
    paths = [line.split(None, 1)[1].split(" -> ")[-1] for line in status.splitlines() if line.strip()]
    changed = [Path(top, path).resolve() for path in paths]
    # Results files beside this one (a script that writes several) are measurements, not changes to the code.
    changed = [path for path in changed if not (path.parent == cwd.resolve() and path.suffix == ".json")]
    if not changed:
        return {"id": head, "uncommitted_changes": False}
    # What did run: the git tree of every file git does not ignore, as it stood. A commit with that tree made
    # elsewhere is the measured code (`resolve_commit`), whatever the copy's own history says.
    tree = _working_tree(Path(top))
    return {"id": head, "uncommitted_changes": True, **({} if tree is None else {"tree": tree})}


def _working_tree(top: Path) -> str | None:
    """The tree id of the files git does not ignore under ``top``, staged in a scratch index (not the real one)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch, "index"))}
        try:
            for args in (["add", "--all", "--", "."], ["write-tree"]):
                done = subprocess.run(
                    ["git", *args], cwd=top, env=env, capture_output=True, text=True, timeout=60, check=False
                )
                if done.returncode != 0:
                    return None
        except (OSError, subprocess.SubprocessError):
            return None
    return done.stdout.strip() or None


def resolve_commit(commit: dict[str, Any], cwd: Path, *, search: int = 200) -> dict[str, Any]:
    """``commit`` as recorded, or the commit here whose tree is the one that ran.

    A copy of a working tree (a remote machine's, whose own history may be older) records ``uncommitted_changes``
    and the git tree of its files (``tree``). When one of the last ``search`` commits of this repository has that
    very tree, the measured code is that commit, byte for byte: it is returned as committed, with the tree kept
    and the copy's own ``HEAD`` as ``recorded_id``. Otherwise ``commit`` is returned unchanged.
    """
    tree = commit.get("tree")
    if not commit.get("uncommitted_changes") or not tree:
        return dict(commit)
    log = _git("log", f"-{search}", "--format=%H %T", cwd=cwd)
    for line in (log or "").splitlines():
        sha, commit_tree = line.split()
        if commit_tree == tree:
            return {"id": sha[:12], "uncommitted_changes": False, "tree": tree, "recorded_id": commit.get("id")}
    return dict(commit)


def _exported_commit(package: Path) -> dict[str, Any]:
    """The commit of code outside a checkout: the one ``git archive`` stamped into it, or unknown, with why.

    STEJAX_COMMIT, where set, must agree with the stamp (either may be the shorter). Alone it is not
    trusted: nothing ties a name in the environment to the code that ran.
    """
    stamped = _stamped_commit(package)
    claimed = os.environ.get("STEJAX_COMMIT", "").strip().lower()
    if stamped is not None:
        if claimed and not (stamped.startswith(claimed) or claimed.startswith(stamped)):
            raise ValueError(
                f"STEJAX_COMMIT={claimed} disagrees with the commit stamped into the measured tree by git archive, "
                f"{stamped} ({package / '_commit.py'}); expected the same commit or STEJAX_COMMIT unset."
            )
        return {"id": stamped[:12], "uncommitted_changes": False, "exported": True}
    if claimed:
        reason = (
            f"STEJAX_COMMIT={claimed} is set, but the measured tree carries no commit stamp from git archive "
            "(not exported with git archive, or copied from a working tree), so nothing confirms it"
        )
    else:
        reason = "the measured code is neither in a git checkout that tracks it nor a tree exported with git archive"
    return {"id": None, "uncommitted_changes": None, "reason": reason}


def _machine() -> dict[str, Any]:
    from stejax.bench._machine import machine_info, versions  # imports jax: only when a file is written

    info = machine_info()
    found = versions()
    return {
        "cpu": info["cpu"],
        "cores": info["cores"],
        "cores_usable": info["cores_usable"],
        "device": info["device"],
        "memory_gib": info["memory_gib"],
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "jax": found.get("jax"),
        "jaxlib": found.get("jaxlib"),
        "versions": found,
    }


class Recorder:
    """Notes when and under what load a measurement starts; :meth:`write` saves its results file.

    Args:
      name: the results file's name (``docs/results/NAME.json``).
      command: the command that reproduces the measurement, as a reader types it.
    """

    def __init__(self, name: str, *, command: str):
        if not re.fullmatch(r"[a-z0-9_][a-z0-9_\-]*", name):
            raise ValueError(f"Recorder: `name` must be lower-case letters, digits, '_' or '-'; got {name!r}.")
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"Recorder {name!r}: `command` must say how to reproduce the figures; got {command!r}.")
        self.name = name
        self.command = command
        self.started = datetime.datetime.now(datetime.UTC)
        self.load_start = _load_average()

    def write(
        self,
        path: str | os.PathLike,
        *,
        rows: Sequence[Mapping[str, Any]],
        columns: Sequence[tuple[str, str] | tuple[str, str, str]],
        figures: Mapping[str, Figure] | None = None,
        notes: str | None = None,
        commit: Mapping[str, Any] | None = None,
        date: str | None = None,
        machine: Mapping[str, Any] | None = None,
        load: Mapping[str, Any] | None = None,
        rounds: int | None = None,
    ) -> dict[str, Any]:
        """Write the results file (atomically) and return its content.

        Args:
          path: where to write, usually ``docs/results/<name>.json``.
          rows: the measured rows, JSON-ready.
          columns: ``(key, title)`` or ``(key, title, format)`` for the table a page shows; ``format`` is
            a :meth:`str.format` spec such as ``"{:.3f}"``.
          figures: the named figures that pages cite.
          notes: one paragraph on how to read the rows, if needed.
          commit, date, machine, load: the conditions, when the measurement was taken earlier than the
            file is written (a transcription): otherwise they are read now.
          rounds: the number of interleaved rounds the ratios were measured in, each giving one sample per
            ratio (recorded as ``rounds``; none for a file measured otherwise).
        """
        figures = dict(figures or {})
        for key, value in figures.items():
            if not isinstance(value, Figure):
                raise TypeError(f"Recorder {self.name!r}: figure {key!r} must be a Figure; got {type(value).__name__}.")
        target = Path(path)
        doc: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "command": self.command,
            "commit": dict(commit) if commit is not None else _commit(target.resolve().parent),
            "date": date if date is not None else self.started.isoformat(timespec="seconds"),
            "machine": dict(machine) if machine is not None else _machine(),
            "load": dict(load) if load is not None else _load(self.load_start, _load_average()),
            "columns": [_column(c, self.name) for c in columns],
            "rows": [dict(r) for r in rows],
            "figures": {k: v.to_dict() for k, v in figures.items()},
        }
        if notes:
            doc["notes"] = notes
        if rounds is not None:
            doc["rounds"] = rounds
        check_results(doc, where=str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=_json_default) + "\n", "utf-8")
        os.replace(temporary, target)
        return doc


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # NumPy and JAX scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _column(column: Sequence[str], name: str) -> dict[str, str]:
    if not 2 <= len(column) <= 3 or not all(isinstance(c, str) for c in column):
        raise ValueError(f"Recorder {name!r}: a column is (key, title) or (key, title, format); got {column!r}.")
    out = {"key": column[0], "title": column[1]}
    if len(column) == 3:
        out["format"] = column[2]
    return out


def check_results(doc: Mapping[str, Any], *, where: str = "results") -> None:
    """Raise ValueError naming what a results file lacks: command, commit, date, machine, load, rows, figures."""
    missing = [key for key in _REQUIRED if key not in doc]
    if missing:
        raise ValueError(f"{where}: a results file needs {', '.join(_REQUIRED)}; missing {', '.join(missing)}.")
    if doc["format"] != FORMAT:
        raise ValueError(f"{where}: expected format {FORMAT!r}; got {doc['format']!r}.")
    if not isinstance(doc["command"], str) or not doc["command"].strip():
        raise ValueError(f"{where}: `command` must name the command that wrote it; got {doc['command']!r}.")
    machine = doc["machine"]
    lacking = [key for key in _MACHINE_REQUIRED if not isinstance(machine, Mapping) or machine.get(key) in (None, "")]
    if lacking:
        raise ValueError(f"{where}: `machine` needs {', '.join(_MACHINE_REQUIRED)}; missing {', '.join(lacking)}.")
    for figure_key, figure in doc["figures"].items():
        if not isinstance(figure, Mapping) or not isinstance(figure.get("text"), str) or not figure["text"]:
            raise ValueError(f"{where}: figure {figure_key!r} needs a non-empty `text`; got {figure!r}.")
        _check_spread(figure, f"{where}: figure {figure_key!r}")
    rounds = doc.get("rounds")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
        raise ValueError(f"{where}: `rounds` must be an int >= 1 where recorded; got {rounds!r}.")
    keys = [c.get("key") for c in doc["columns"]]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: column keys must be unique; got {keys}.")


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check one results file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist; expected the file its command writes.")
    doc = json.loads(path.read_text("utf-8"))
    check_results(doc, where=str(path))
    return doc


# --- rendering -------------------------------------------------------------------------------------------

_CALL = re.compile(r"\{\{\s*(results_table|figure|results_figures|results_source)\((.*?)\)\s*\}\}")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_MARKER = re.compile(r"<!--\s*results:\s*([a-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*-->")


def _format(value: Any, spec: str | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if spec:
        try:
            return spec.format(value)
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(_format(v, None) for v in value)
    return str(value).replace("|", "\\|")


def _source_line(doc: Mapping[str, Any]) -> str:
    commit = doc["commit"] or {}
    commit_text = commit.get("id") or "unknown commit"
    if commit.get("uncommitted_changes"):
        commit_text += " plus local changes"
    machine = doc["machine"]
    load = doc["load"] or {}
    load_text = "–".join(f"{v:g}" for v in (load.get("start"), load.get("end")) if isinstance(v, int | float))
    cpu = "CPU model not available" if machine["cpu"] == _NOT_AVAILABLE else machine["cpu"]
    parts = [
        f"`{doc['command']}`",
        f"commit {commit_text}",
        str(doc["date"])[:10],
        f"{cpu}, {machine['cores']} cores, jax {machine['jax']}",
    ]
    device = str(machine.get("device") or "")
    if device and not device.startswith("cpu"):
        parts[-1] = f"{device.split(': ', 1)[-1]} ({machine['cores']} host cores, jax {machine['jax']})"
    if load_text:
        parts.append(f"load average {load_text}")
    if doc.get("rounds"):
        parts.append(f"{doc['rounds']} round{'' if doc['rounds'] == 1 else 's'}")
    # A file that is not current says so (see `is_current`): the reader weighs an older figure accordingly.
    lead = "Measured by " if is_current(doc) else "An older measurement, by "
    return "<small>" + lead + " · ".join(parts) + ".</small>"


def is_current(doc: Mapping[str, Any]) -> bool:
    """Whether a results file was measured at a committed tree with the CPU model and the load recorded.

    A CPU model or a load that the machine does not report at all is recorded as "not available" and counts
    as recorded; one left out ("not recorded") does not. A file that is not current carries ``older``: one
    sentence saying what it lacks. Pages render its provenance line as an older measurement, and the README
    marks each of its figures "older".
    """
    commit = doc.get("commit") or {}
    machine = doc.get("machine") or {}
    load = doc.get("load") or {}
    load_recorded = load.get("note") == _NOT_AVAILABLE or all(
        isinstance(load.get(k), int | float) for k in ("start", "end")
    )
    return (
        not doc.get("older")
        and bool(commit.get("id"))
        and commit.get("uncommitted_changes") is False
        and "not recorded" not in str(machine.get("cpu", "not recorded"))
        and load_recorded
    )


def _table(doc: Mapping[str, Any], where: str | None = None, columns: str | None = None) -> str:
    declared = list(doc["columns"])
    if columns is not None:
        wanted = [c.strip() for c in columns.split(",") if c.strip()]
        by_key = {c["key"]: c for c in declared}
        unknown = [c for c in wanted if c not in by_key]
        if unknown:
            raise ValueError(f"results {doc['name']!r}: no column {unknown}; declared {list(by_key)}.")
        declared = [by_key[c] for c in wanted]
    rows = list(doc["rows"])
    if where:
        for condition in where.split(","):
            key, sep, value = condition.partition("=")
            if not sep:
                raise ValueError(f"results {doc['name']!r}: `where` takes key=value pairs; got {condition!r}.")
            rows = [r for r in rows if _format(r.get(key.strip()), None) == value.strip()]
        if not rows:
            raise ValueError(f"results {doc['name']!r}: no row has {where!r}.")
    lines = [
        "| " + " | ".join(c["title"] for c in declared) + " |",
        "|" + "|".join("---" for _ in declared) + "|",
    ]
    lines += ["| " + " | ".join(_format(r.get(c["key"]), c.get("format")) for c in declared) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + _source_line(doc) + "\n"


def _figures(doc: Mapping[str, Any]) -> str:
    lines = ["| figure | value | target | met |", "|---|---|---|---|"]
    for key, fig in doc["figures"].items():
        met = {True: "met", False: "**missed**", None: ""}[fig.get("met")]
        lines.append(f"| {key.replace('_', ' ')} | {fig['text']} | {fig.get('target') or ''} | {met} |")
    return "\n".join(lines) + "\n\n" + _source_line(doc) + "\n"


def _figure(doc: Mapping[str, Any], key: str) -> str:
    if key not in doc["figures"]:
        raise ValueError(f"results {doc['name']!r}: no figure {key!r}; it has {sorted(doc['figures'])}.")
    return str(doc["figures"][key]["text"])


def _call(name: str, arguments: str, results_dir: Path, cache: dict[str, dict[str, Any]]) -> str:
    try:
        parsed = ast.parse(f"f({arguments})", mode="eval").body
        assert isinstance(parsed, ast.Call)
        args = [ast.literal_eval(a) for a in parsed.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in parsed.keywords if k.arg}
    except (SyntaxError, ValueError, AssertionError) as error:
        raise ValueError(f"cannot read the arguments of {name}({arguments}): {error}") from error
    if not args or not isinstance(args[0], str):
        raise ValueError(f"{name}({arguments}): the first argument must be a results file's name.")
    results = args[0]
    if results not in cache:
        cache[results] = load_results(results_dir / f"{results}.json")
    doc = cache[results]
    if name == "results_table":
        return _table(doc, **kwargs)
    if name == "results_figures":
        return _figures(doc)
    if name == "results_source":
        return _source_line(doc)
    if len(args) != 2:
        raise ValueError(f"figure({arguments}): expected figure(NAME, KEY).")
    return _figure(doc, args[1])


def render_markdown(text: str, results_dir: str | os.PathLike) -> str:
    """Replace every results call outside code blocks in ``text`` by what it renders from ``results_dir``.

    Raises ValueError or FileNotFoundError naming the call that cannot be rendered (a missing file, row
    or figure), so that a strict site build fails.
    """
    results_dir = Path(results_dir)
    cache: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and opened and opened.group(1).startswith(fence[0] * len(fence)):
            fence = None
        elif fence is None:
            line = _CALL.sub(lambda m: _call(m.group(1), m.group(2), results_dir, cache), line)
        out.append(line)
    return "\n".join(out)


def check_markers(text: str, results_dir: str | os.PathLike) -> list[str]:
    """The problems with ``<!-- results: NAME.KEY -->`` markers in ``text`` (empty when every figure agrees).

    Each marker must name an existing results file and figure, and the figure's text must appear on the
    marker's line.
    """
    problems = []
    cache: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        for match in _MARKER.finditer(line):
            name, key = match.groups()
            try:
                if name not in cache:
                    cache[name] = load_results(Path(results_dir) / f"{name}.json")
                expected = _figure(cache[name], key)
            except (OSError, ValueError) as error:
                problems.append(f"line {number}: {error}")
                continue
            if expected not in line[: match.start()]:
                problems.append(f"line {number}: expected {expected!r} (results {name}.{key}) before the marker.")
    return problems
