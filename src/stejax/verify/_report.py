"""The verifier's results as plain data: checks, reports, their JSON and Markdown."""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import json
import os
import platform
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from stejax.verify._platform import platform_contract

__all__ = ["CatalogReport", "Check", "Report", "environment", "write_report"]

JSON_NAME = "verify-report.json"
MARKDOWN_NAME = "verify-report.md"


@dataclasses.dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
      name: the check and its context, e.g. ``"tangent[bfloat16]"`` or
        ``"forward_bitwise[float32; bits=2]"``.
      passed: whether it held. A check that crashed did not pass.
      detail: what was compared and, on failure, where it went wrong.
      dtype: the dtype's name, or ``None`` for checks not tied to one.
    """

    name: str
    passed: bool
    detail: str
    dtype: str | None = None

    @property
    def kind(self) -> str:
        """The check without its context: ``"tangent"`` for ``"tangent[bfloat16]"``."""
        return self.name.split("[", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Report:
    """All checks of one function.

    Attributes:
      subject: what was checked (the function's or the estimator's name).
      checks: the checks, in the order they ran.
      environment: platform, device kind, jax and jaxlib versions, the x64
        flag, the dtypes and the tolerances used per dtype, the seed.
      notes: what the checks cannot prove, in words (a reference that is the
        function itself); shown in the summary and the Markdown.
    """

    subject: str
    checks: tuple[Check, ...]
    environment: Mapping[str, Any]
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "checks", tuple(self.checks))
        object.__setattr__(self, "environment", _frozen(self.environment))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def ok(self) -> bool:
        """Whether every check passed (and there was at least one)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def __getitem__(self, name: str) -> Check:
        """The check called ``name``; a KeyError lists the names."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"{self.subject}: no check named {name!r}; checks: {', '.join(self.names())}.")

    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks)

    def summary(self) -> str:
        """One line: the subject, passed or failed, and the failing checks."""
        notes = "".join(f"; note: {n}" for n in self.notes)
        if self.ok:
            return f"{self.subject}: all {len(self.checks)} checks passed{notes}"
        names = ", ".join(c.name for c in self.failures)
        return f"{self.subject}: {len(self.failures)} of {len(self.checks)} checks failed ({names}){notes}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            "notes": list(self.notes),
            "environment": _thawed(self.environment),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_markdown(self) -> str:
        lines = [f"# stejax verify: {self.subject}", "", _verdict(self.ok, self.summary()), ""]
        lines += [f"**Note**: {n}." for n in self.notes] + ([""] if self.notes else [])
        lines += _checks_table(self.checks)
        lines += ["", *_environment_section(self.environment)]
        return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class CatalogReport(Mapping[str, Report]):
    """One report per catalog estimator, readable as a mapping from name to :class:`Report`."""

    reports: tuple[Report, ...]
    environment: Mapping[str, Any]

    def __post_init__(self):
        object.__setattr__(self, "reports", tuple(self.reports))
        object.__setattr__(self, "environment", _frozen(self.environment))

    def __getitem__(self, name: str) -> Report:
        for r in self.reports:
            if r.subject == name:
                return r
        raise KeyError(f"no report for {name!r}; estimators: {', '.join(self)}.")

    def __iter__(self) -> Iterator[str]:
        return (r.subject for r in self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    @property
    def ok(self) -> bool:
        return bool(self.reports) and all(r.ok for r in self.reports)

    @property
    def failures(self) -> tuple[Report, ...]:
        return tuple(r for r in self.reports if not r.ok)

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.reports)} estimators passed"
        names = ", ".join(r.subject for r in self.failures)
        return f"{len(self.failures)} of {len(self.reports)} estimators failed ({names})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "estimators": {r.subject: {k: v for k, v in r.to_dict().items() if k != "subject"} for r in self.reports},
            "environment": _thawed(self.environment),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_markdown(self) -> str:
        lines = ["# stejax verify: the catalog", "", _verdict(self.ok, self.summary()), ""]
        lines += ["| estimator | result | checks | failed |", "|---|---|---|---|"]
        for r in self.reports:
            failed = ", ".join(f"`{c.name}`" for c in r.failures) or "-"
            lines.append(f"| `{r.subject}` | {'pass' if r.ok else 'FAIL'} | {len(r.checks)} | {failed} |")
        for r in self.failures:
            lines += ["", f"## {r.subject}", ""]
            lines += _checks_table(r.failures)
        lines += ["", *_environment_section(self.environment)]
        return "\n".join(lines) + "\n"


def write_report(report: Report | CatalogReport, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``verify-report.json`` and ``verify-report.md`` into ``directory`` (created if needed).

    Returns:
      The paths of the JSON and the Markdown file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / JSON_NAME, directory / MARKDOWN_NAME
    json_path.write_text(report.to_json() + "\n", encoding="utf-8")
    md_path.write_text(report.to_markdown(), encoding="utf-8")
    return json_path, md_path


def environment(dtypes: Sequence[Any], tolerances: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """Where the checks ran and under which tolerances."""
    import jaxlib

    devices = jax.devices()
    try:
        stejax_version = importlib.metadata.version("stejax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        stejax_version = "unknown"
    env = {
        "platform": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "none",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        # Read through `values` (the same holders as the attributes jax adds to Config at
        # run time, which its class does not declare).
        "x64": bool(jax.config.values["jax_enable_x64"]),
        "dtype_promotion": str(jax.config.values["jax_numpy_dtype_promotion"]),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "stejax": stejax_version,
        "dtypes": [np.dtype(d).name for d in dtypes],
        "tolerances": dict(tolerances),
        "platform_contract": platform_contract().to_dict(),
    }
    env.update(extra)
    return env


def _verdict(ok: bool, summary: str) -> str:
    return f"**{'PASS' if ok else 'FAIL'}**: {summary}."


def _checks_table(checks: Sequence[Check]) -> list[str]:
    lines = ["| check | result | detail |", "|---|---|---|"]
    for c in checks:
        result = "pass" if c.passed else "FAIL"
        lines.append(f"| `{c.name}` | {result} | {_cell(c.detail)} |")
    return lines


def _environment_section(env: Mapping[str, Any]) -> list[str]:
    lines = ["## Environment", "", "| key | value |", "|---|---|"]
    for key, value in env.items():
        if key == "tolerances":
            continue
        text = value if isinstance(value, str) else json.dumps(_thawed(value))
        lines.append(f"| {key} | {_cell(text if len(text) <= 300 else text[:297] + '...')} |")
    tolerances = env.get("tolerances", {})
    if tolerances:
        lines += ["", "### Tolerances", "", "| dtype | eps | tiny | tangent | sums | tangent maps |"]
        lines.append("|---|---|---|---|---|---|")
        for name, t in tolerances.items():
            lines.append(
                f"| {name} | {t['eps']:.3g} | {t['tiny']:.3g} | {_cell(t['tangent'])} | "
                f"{_cell(t['sum'])} | {_cell(t['tangent_map'])} |"
            )
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def _frozen(value: Any) -> Any:
    """A read-only deep copy: mappings become MappingProxyType, lists tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return copy.deepcopy(value)


def _thawed(value: Any) -> Any:
    """Plain JSON-ready data from :func:`_frozen` data."""
    if isinstance(value, Mapping):
        return {str(k): _thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value
