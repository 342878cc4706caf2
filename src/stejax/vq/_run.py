"""``stejax vq compare``'s whole run: the synthetic grid, then the digits check, judged together."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stejax.vq._compare import CompareSettings, judge_targets, run_grid
from stejax.vq._digits import digits_check

__all__ = ["compare"]


def compare(
    settings: CompareSettings | None = None,
    *,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train every variant under every set-up at every ``K`` and ``d`` on every seed (``settings`` None: the
    defaults); return the report.

    The report (a JSON-ready dict) has ``rows`` (one per set-up, variant, ``K``,
    ``d`` and seed: ``usage``, ``batch_usage``, ``perplexity``,
    ``perplexity_over_k``, ``val_mse``, ``mse_over_fsq``, ``train_mse_end``,
    ``replaced``, ``bits`` and the collapse diagnostics ``*_start`` and ``*_end``:
    ``usage``, ``z_norm`` (the encoder's mean ``||z||``), ``q_norm_used`` and
    ``q_norm_all`` (the codes' mean norm over the codes used in the validation
    epoch and over the whole codebook), ``quant_error`` (the mean ``||v - q||``
    between each quantised vector and its code) and ``cosine`` (their mean cosine);
    FSQ's rows stand in every set-up), ``summary`` (the same, mean over seeds, plus
    ``usage_std`` and ``val_mse_std``), ``targets`` (judged, met or missed),
    ``digits`` (the real-data check, when ``settings.digits``), ``data`` (the data
    cap), ``programs`` (seconds and XLA compilations of each program: ``compiles``
    while it first ran, ``compiles_again`` while it ran a second time on the same
    shapes, when ``repeat_first`` asks for it), ``compiles`` (all of them),
    ``seconds``, ``settings`` and ``setups``.

    ``workers`` programs run at once in threads (the results do not depend on it);
    with more than one, the compilations are counted for the whole run only.
    """
    settings = CompareSettings() if settings is None else settings
    t0 = time.perf_counter()
    report = run_grid(settings, workers=workers, progress=progress)
    if settings.digits:
        digits = digits_check(settings, workers=workers, progress=progress)
        report["digits"] = digits
        report["targets"] = judge_targets(report["summary"], settings, digits=digits)
    report["seconds"] = time.perf_counter() - t0
    return report
