"""Run the benchmark suites and write their report."""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stejax.bench._estimators import estimators_suite
from stejax.bench._inference import inference_suite
from stejax.bench._machine import machine_info, versions
from stejax.bench._peers import peers_suite
from stejax.bench._report import FORMAT, write_report
from stejax.bench._train import train_suite

__all__ = ["PROTOCOL", "SUITES", "BenchSettings", "run_bench"]

SUITES: tuple[str, ...] = ("estimators", "train", "inference", "peers", "onnx", "lm-decode", "train-step")

PROTOCOL = (
    "every variant is called `warmup` times first, untimed (the first call compiles; compilations are "
    "counted per variant from jax.monitoring's backend-compile events, and their time is reported apart); "
    "then `rounds` rounds of `repeats` passes, each pass calling every variant of a group once, in an order "
    "rotated by one per pass, each call timed with time.perf_counter around the call and "
    "jax.block_until_ready on its result; compilations during the timed rounds are counted too (0 expected). "
    "The estimators and onnx suites time all their groups in each round, one group after another; the other "
    "suites take their `rounds` x `repeats` passes one group at a time. Statistics per variant: min, p50, p90, "
    "p99, max (NumPy linear percentiles) and mean, in milliseconds. Comparisons are the ratios of two variants "
    "timed in the same pass, in one process: p50 with p10 and p90; beside them, one ratio per round (the "
    "round's median times), whose median and spread a results file's figure gives."
)


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """How much to measure.

    Attributes:
      repeats: timed passes per group in each round (default 6; quick 5).
      warmup: untimed calls per variant first, >= 1 (default 3; quick 1).
      quick: small models and inputs, for a check that everything runs.
      estimator_size: input values per estimator call (default 2**18; quick 2**12).
      rounds: interleaved rounds, each giving every ratio one sample (default 5; quick 1).
    """

    repeats: int = 6
    warmup: int = 3
    quick: bool = False
    estimator_size: int = 2**18
    rounds: int = 5

    @classmethod
    def make(
        cls, *, quick: bool = False, repeats: int | None = None, warmup: int | None = None, rounds: int | None = None
    ) -> BenchSettings:
        """The defaults for ``quick`` or full runs, with ``repeats``, ``warmup`` and ``rounds`` overriding them."""
        base = cls(repeats=5, warmup=1, quick=True, estimator_size=2**12, rounds=1) if quick else cls()
        return dataclasses.replace(
            base,
            repeats=base.repeats if repeats is None else repeats,
            warmup=base.warmup if warmup is None else warmup,
            rounds=base.rounds if rounds is None else rounds,
        )

    def __post_init__(self):
        for name in ("repeats", "warmup", "estimator_size", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BenchSettings: {name} must be an int >= 1; got {value!r}.")


def run_bench(
    suites: Sequence[str] = ("all",),
    *,
    out_dir: str | os.PathLike | None,
    settings: BenchSettings | None = None,
    estimators: Sequence[str] | None = None,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    plots: bool = True,
    widths: Sequence[int] | None = None,
    results_dir: str | os.PathLike | None = None,
    figures_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Run benchmark suites in one process and write ``bench.json``, ``bench.md`` and ``bench.png``.

    A suite that raises is recorded with status ``"error"`` and its message, and
    the others still run; a suite whose optional packages are missing (peers) is
    ``"skipped"`` with a note.

    Args:
      suites: names from :data:`SUITES`, or ``"all"``.
      out_dir: the output folder (created); None writes nothing.
      settings: :class:`BenchSettings` (default: the full defaults).
      estimators: only these catalog estimators in the estimators suite.
      on_event: called with ``{"event": "suite", "suite": name}`` before each suite.
      plots: draw ``bench.png``.
      widths: the LM widths of the train-step suite (None: its defaults for the device).
      results_dir: also write the project's results files here: ``onnx.json``, ``lm_decode.json`` and
        ``train_step.json`` (``train_step_<backend>.json`` off a TPU), from full runs of those suites only
        (None: none is written; the documentation's are in ``docs/results``).
      figures_dir: also draw the lm-decode suite's plot ``lm_decode.png`` here (None: not drawn).

    Returns:
      The report (the content of ``bench.json``).

    Raises:
      ValueError: an unknown suite.
    """
    settings = BenchSettings() if settings is None else settings
    names = _resolve(suites)
    if estimators is not None:
        from stejax.estimators.catalog import CATALOG

        unknown = [n for n in estimators if n not in CATALOG]
        if unknown:
            raise ValueError(f"bench: no estimator named {unknown[0]!r}; known: {', '.join(CATALOG)}.")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": {"suites": names, **dataclasses.asdict(settings)},
        "protocol": PROTOCOL,
        "machine": machine_info(),
        "versions": versions(),
        "wall_seconds": 0.0,
        "suites": {},
    }
    n, w, quick = settings.rounds, settings.warmup, settings.quick
    # The suites that give their figures one ratio per round take the rounds; the others, every pass in one.
    per_round, r = settings.repeats, settings.rounds * settings.repeats
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "estimators": lambda: estimators_suite(
            repeats=per_round, warmup=w, size=settings.estimator_size, names=estimators, rounds=n
        ),
        "train": lambda: train_suite(repeats=r, warmup=w, quick=quick),
        "inference": lambda: inference_suite(repeats=r, warmup=w, quick=quick),
        "peers": lambda: peers_suite(repeats=r, warmup=w, quick=quick),
        "onnx": lambda: _onnx_suite(repeats=per_round, warmup=w, quick=quick, results_dir=results_dir, rounds=n),
        "lm-decode": lambda: _lm_decode_suite(
            repeats=r,
            warmup=w,
            quick=quick,
            results_dir=results_dir,
            image=None if figures_dir is None else Path(figures_dir) / "lm_decode.png",
        ),
        "train-step": lambda: _train_step_suite(
            repeats=r, warmup=w, quick=quick, widths=widths, results_dir=results_dir
        ),
    }
    for name in names:
        if on_event is not None:
            on_event({"event": "suite", "suite": name})
        t0 = time.perf_counter()
        try:
            result = runners[name]()
        except Exception as error:  # one broken suite does not hide the others' results
            result = {"status": "error", "note": f"{type(error).__name__}: {error}", "groups": []}
        result = {"status": "ok", "note": "", "notes": [], **result, "seconds": time.perf_counter() - t0}
        report["suites"][name] = result
    report["wall_seconds"] = time.perf_counter() - started
    if out_dir is not None:
        write_report(report, Path(out_dir), plots=plots)
    return report


def _onnx_suite(**kwargs: Any) -> dict[str, Any]:
    from stejax.bench._onnx import onnx_suite  # onnx and onnxruntime are the extra stejax[onnx]

    return onnx_suite(**kwargs)


def _lm_decode_suite(**kwargs: Any) -> dict[str, Any]:
    from stejax.bench._lm_decode import lm_decode_suite  # imports the LM (the flax and train extras)

    return lm_decode_suite(**kwargs)


def _train_step_suite(**kwargs: Any) -> dict[str, Any]:
    from stejax.bench._train_step import train_step_suite  # imports the LM (the flax and train extras)

    return train_step_suite(**kwargs)


def _resolve(suites: Sequence[str]) -> list[str]:
    if isinstance(suites, str):
        suites = [suites]
    unknown = [s for s in suites if s not in (*SUITES, "all")]
    if unknown or not suites:
        raise ValueError(f"bench: unknown suite {unknown[0] if unknown else None!r}; choose from {[*SUITES, 'all']}.")
    if "all" in suites:
        return list(SUITES)
    return list(dict.fromkeys(suites))
