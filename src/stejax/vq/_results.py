"""The comparison's results file (``docs/results/vq_compare.json``): the summary rows and the judged targets."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

__all__ = ["record", "record_digits"]

COLUMNS: list[tuple[str, str] | tuple[str, str, str]] = [
    ("setup", "set-up"),
    ("variant", "variant"),
    ("codebook_size", "K"),
    ("code_dim", "d"),
    ("usage", "usage", "{:.3f}"),
    ("batch_usage", "per-batch usage", "{:.4f}"),
    ("perplexity_over_k", "perplexity / K", "{:.3f}"),
    ("val_mse", "val MSE", "{:.4f}"),
    ("mse_over_fsq", "MSE / FSQ", "{:.2f}"),
    ("usage_std", "usage sd", "{:.3f}"),
    ("val_mse_std", "MSE sd", "{:.4f}"),
    # The collapse diagnostics on the validation epoch, before and after training.
    ("usage_start", "usage at start", "{:.3f}"),
    ("z_norm_start", "‖z‖ start", "{:.2f}"),
    ("z_norm_end", "‖z‖ end", "{:.2f}"),
    ("q_norm_used_start", "‖q‖ used, start", "{:.3f}"),
    ("q_norm_used_end", "‖q‖ used, end", "{:.2f}"),
    ("q_norm_all_start", "‖q‖ all, start", "{:.3f}"),
    ("q_norm_all_end", "‖q‖ all, end", "{:.2f}"),
    ("quant_error_start", "‖z − q‖ start", "{:.2f}"),
    ("quant_error_end", "‖z − q‖ end", "{:.2f}"),
    ("cosine_start", "cos(z, q) start", "{:.2f}"),
    ("cosine_end", "cos(z, q) end", "{:.2f}"),
]

DIGITS_COLUMNS: list[tuple[str, str] | tuple[str, str, str]] = [
    ("variant", "variant"),
    ("codebook_size", "K"),
    ("code_dim", "d"),
    ("usage", "usage", "{:.3f}"),
    ("perplexity_over_k", "perplexity / K", "{:.3f}"),
    ("val_mse", "test MSE", "{:.4f}"),
    ("val_mse_std", "MSE sd", "{:.4f}"),
    ("mse_over_fsq", "MSE / FSQ", "{:.2f}"),
]

# How each target reads as a figure: the value's format.
_FORMATS = {"usage": "{:.3f}", "ratio": "{:.2f}×", "gap": "{:+.3f}"}


def _text(key: str, value: float) -> str:
    if key.startswith(("best_vs_fsq", "ste_worse_than_fsq")) or key == "control":
        return _FORMATS["ratio"].format(value)
    if key.startswith("digits_vs_fsq") or key == "rotation_mse":
        return _FORMATS["ratio"].format(value)
    if key in ("k64_rotation_noninferior", "rotation_lifts", "rotation_noninferior"):
        return _FORMATS["gap"].format(value)
    return _FORMATS["usage"].format(value)


def record(
    report: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    command: str,
    name: str = "vq_compare",
    **provenance: Any,
) -> Path:
    """Write the results file of a :func:`stejax.vq.compare` report with :class:`stejax.bench.results.Recorder`.

    Rows: the summary (one per variant, ``K`` and ``d``, means over seeds; the
    per-seed rows stay in the run's ``report.json``). Figures: every judged target
    (its value, the target in words, met or missed) and the speed run's figures
    when the report has them (``seconds``, ``compiles``). ``provenance`` goes to
    :meth:`~stejax.bench.results.Recorder.write` (``date``, ``load`` of a run merged later).
    """
    from stejax.bench.results import Figure, Recorder

    rec = Recorder(name, command=command)
    figures = {}
    for t in report["targets"]:
        if not t["key"].startswith("digits_"):  # those go to the digits check's own file (record_digits)
            figures[t["key"]] = Figure(t["value"], _text(t["key"], t["value"]), target=t["name"], met=t["passed"])
    fsq = [e for e in report["summary"] if e["variant"] == "fsq"]
    if fsq:  # how many bits FSQ's codes carry at the largest K: the entropy of its code histogram
        top = max(fsq, key=lambda e: e["codebook_size"])
        bits = math.log2(top["perplexity"])
        figures["fsq_code_entropy"] = Figure(
            round(bits, 3),
            f"{bits:.2f} of {math.log2(top['codebook_size']):.0f} bits",
            note=f"K = {top['codebook_size']}",
        )
    figures["programs"] = Figure(len(report["programs"]), str(len(report["programs"])))
    figures["compiles"] = Figure(report["compiles"], str(report["compiles"]))
    wall = report.get("wall_seconds", report["seconds"])
    figures["wall_seconds"] = Figure(round(wall, 1), f"{wall:.0f} s")
    data = report["data"]
    figures["val_tokens"] = Figure(data["val_distinct_tokens"], f"{data['val_distinct_tokens']:,}")
    figures["train_tokens"] = Figure(data["train_distinct_tokens"], f"{data['train_distinct_tokens']:,}")
    rows = [{k: e.get(k) for k, *_ in COLUMNS} | {"seeds": e["seeds"]} for e in report["summary"]]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rec.write(out, rows=rows, columns=COLUMNS, figures=figures, notes=_notes(report), **provenance)
    return out


def record_digits(
    report: dict[str, Any], path: str | os.PathLike[str], *, command: str, name: str = "vq_digits", **provenance: Any
) -> Path:
    """Write the digits check's results file (``docs/results/vq_digits.json``): its summary and its two targets."""
    from stejax.bench.results import Figure, Recorder

    digits = report["digits"]
    rec = Recorder(name, command=command)
    figures = {}
    for t in report["targets"]:
        if t["key"].startswith("digits_"):
            figures[t["key"]] = Figure(t["value"], _text(t["key"], t["value"]), target=t["name"], met=t["passed"])
    figures["test_tokens"] = Figure(digits["data"]["test_tokens"], f"{digits['data']['test_tokens']:,}")
    figures["steps"] = Figure(digits["steps"], f"{digits['steps']:,}")
    rows = [{k: e.get(k) for k, *_ in DIGITS_COLUMNS} | {"seeds": e["seeds"]} for e in digits["summary"]]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    notes = (
        f"Means over seeds {', '.join(map(str, report['settings']['seeds']))}; {digits['steps']} Adam steps of "
        f"64 images (16 tokens each); usage, perplexity and MSE over the {digits['data']['test_images']} test "
        f"images ({digits['data']['test_tokens']} tokens); the reference set-up."
    )
    rec.write(out, rows=rows, columns=DIGITS_COLUMNS, figures=figures, notes=notes, **provenance)
    return out


def _notes(report: dict[str, Any]) -> str:
    s = report["settings"]
    return (
        f"Means over seeds {', '.join(map(str, s['seeds']))}; {s['steps']} Adam steps of batch {s['batch_size']} "
        f"(lr {s['learning_rate']:g}), set-ups {', '.join(s['setups'])}, one token per vector of "
        f"{report['data']['source']}; validation epoch of {s['val_size']} vectors. FSQ has no codebook: "
        f"one run per K and d, shown in every set-up."
    )
