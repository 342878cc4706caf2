"""How every stejax benchmark measures: warm-up and compilation first, then interleaved, synchronised rounds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

__all__ = [
    "COMPILE_EVENT",
    "CompileCounter",
    "compare",
    "measure",
    "ratio_stats",
    "standard_promotion",
    "summarize",
]

# The jax.monitoring event recorded once per XLA compilation (its duration in seconds).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

STAT_KEYS = ("n", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")


def summarize(seconds: Sequence[float]) -> dict[str, float]:
    """The latency distribution of ``seconds`` in milliseconds.

    Percentiles use NumPy's default (linear interpolation between the order
    statistics): for ``n`` samples the ``q``-th percentile sits at rank
    ``q / 100 * (n - 1)``.

    Args:
      seconds: one duration per call, at least one, each finite and >= 0.

    Returns:
      ``{"n", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"}``
      (``n`` an int, the rest floats).

    Raises:
      ValueError: no samples, or a negative or non-finite one.

    Example:
      >>> from stejax.bench import summarize
      >>> s = summarize([k / 1000 for k in range(1, 101)])  # 1 ms .. 100 ms
      >>> s["min_ms"], s["p50_ms"], round(s["p90_ms"], 6), round(s["p99_ms"], 6), s["max_ms"]
      (1.0, 50.5, 90.1, 99.01, 100.0)
    """
    a = np.asarray(seconds, np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError("summarize: needs at least one duration; got none.")
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"summarize: durations must be finite and >= 0; got {a[~np.isfinite(a) | (a < 0)][0]}.")
    ms = a * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {
        "n": int(a.size),
        "min_ms": float(ms.min()),
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def ratio_stats(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """The per-round ratios ``numerator[r] / denominator[r]`` of interleaved runs, summarised.

    Each round timed both calls back to back, so each ratio compares the two under
    the same conditions of the machine; the median of the ratios is the comparison.

    Returns:
      ``{"n", "p10", "p50", "p90"}``.
    """
    num, den = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    if num.shape != den.shape or num.size == 0:
        raise ValueError(f"ratio_stats: needs two equal, non-empty series; got {num.shape} and {den.shape}.")
    r = num / den
    p10, p50, p90 = np.percentile(r, [10, 50, 90])
    return {"n": int(r.size), "p10": float(p10), "p50": float(p50), "p90": float(p90)}


class CompileCounter:
    """Counts XLA compilations (``jax.monitoring`` events) while it is active.

    Attributes:
      count: the number of compilations seen.
      seconds: their total backend compile time.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from stejax.bench import CompileCounter
      >>> f = jax.jit(lambda x: x * 3)
      >>> x = jnp.ones(7)
      >>> with CompileCounter() as first:
      ...     _ = f(x).block_until_ready()
      >>> with CompileCounter() as second:
      ...     _ = f(x).block_until_ready()
      >>> first.count >= 1, second.count
      (True, 0)
    """

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0

    def _listen(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == COMPILE_EVENT:
            self.count += 1
            self.seconds += float(duration_secs)

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(
    calls: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int,
    clock: str = "wall",
    calls_per_sample: int = 1,
) -> dict[str, dict[str, Any]]:
    """Time zero-argument calls side by side, after warm-up, each call waited for.

    1. Warm-up: each call runs ``warmup`` times (>= 1), untimed; the first
       compiles. The compilations are counted per call.
    2. Timed: ``repeats`` rounds; each round runs every call ``calls_per_sample``
       times in a row, in an order rotated by one each round (no call always
       first, on cold caches, or last), timed around the calls with ``clock``
       and ``jax.block_until_ready`` on each result; a sample is that time
       divided by ``calls_per_sample``. Compilations are counted per call here
       too: anything but 0 means the timing includes a compile.

    ``clock="cpu"`` (``time.process_time``: this process's CPU time, all its
    threads) leaves out the time the process waits descheduled, so that ratios
    measured on a shared, loaded machine stay readable; it counts the work of
    every thread XLA runs, so it is not a latency.

    Args:
      calls: ``{name: call}``; a call returns arrays (or a PyTree of them).
      repeats: timed rounds, >= 1.
      warmup: untimed calls of each first, >= 1.
      clock: ``"wall"`` (``time.perf_counter``, the default) or ``"cpu"``.
      calls_per_sample: calls timed together for one sample, >= 1.

    Returns:
      ``{name: {"seconds": [...], "stats_ms": summarize(...), "compiles_warmup",
      "compiles_timed", "compile_seconds"}}``, ``seconds`` in round order.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"measure: repeats must be an int >= 1; got {repeats!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"measure: warmup must be an int >= 1 (the first call compiles); got {warmup!r}.")
    if clock not in CLOCKS:
        raise ValueError(f"measure: clock must be one of {sorted(CLOCKS)}; got {clock!r}.")
    if isinstance(calls_per_sample, bool) or not isinstance(calls_per_sample, int) or calls_per_sample < 1:
        raise ValueError(f"measure: calls_per_sample must be an int >= 1; got {calls_per_sample!r}.")
    now = CLOCKS[clock]
    names = list(calls)
    if not names:
        raise ValueError("measure: needs at least one call.")
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        with CompileCounter() as counter:
            for _ in range(warmup):
                jax.block_until_ready(calls[name]())
        out[name] = {"seconds": [], "compiles_warmup": counter.count, "compile_seconds": counter.seconds}
        out[name]["compiles_timed"] = 0
    with CompileCounter() as counter:
        for r in range(repeats):
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                before = counter.count
                start = now()
                for _ in range(calls_per_sample):
                    jax.block_until_ready(calls[name]())
                out[name]["seconds"].append((now() - start) / calls_per_sample)
                out[name]["compiles_timed"] += counter.count - before
    for name in names:
        out[name]["stats_ms"] = summarize(out[name]["seconds"])
    return out


def compare(
    name: str,
    calls: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int,
    baseline: str | None = None,
    ratios: Sequence[tuple[str, str]] | None = None,
    info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`measure` one group of calls, and compare them as per-round ratios.

    Args:
      name: the group's name.
      calls, repeats, warmup: as for :func:`measure`.
      baseline: the variant the others are divided by (``"variant/baseline"``).
      ratios: instead, the ``(numerator, denominator)`` pairs to report.
      info: facts about the group for the report.

    Returns:
      A group record: ``{"name", "baseline", "variants": {variant: {"stats_ms",
      "compiles_warmup", "compiles_timed", "compile_seconds"}}, "ratios":
      {"a/b": ratio_stats}, "info"}``.
    """
    measured = measure(calls, repeats=repeats, warmup=warmup)
    if ratios is None:
        ratios = [] if baseline is None else [(v, baseline) for v in measured if v != baseline]
    out = {}
    for a, b in ratios:
        if a not in measured or b not in measured:
            raise ValueError(f"compare: ratio {a}/{b} names a variant not among {list(measured)}.")
        out[f"{a}/{b}"] = ratio_stats(measured[a]["seconds"], measured[b]["seconds"])
    variants = {v: {k: x for k, x in m.items() if k != "seconds"} for v, m in measured.items()}
    return {"name": name, "baseline": baseline, "variants": variants, "ratios": out, "info": dict(info or {})}


@contextlib.contextmanager
def standard_promotion() -> Iterator[None]:
    """JAX's standard dtype and rank promotion, for third-party code (Flax, Qwix) written for it."""
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield
