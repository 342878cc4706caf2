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
    "group_record",
    "measure",
    "measure_rounds",
    "ratio_stats",
    "round_ratios",
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
    rounds: int = 1,
) -> dict[str, dict[str, Any]]:
    """Time zero-argument calls side by side, after warm-up, each call waited for.

    1. Warm-up: each call runs ``warmup`` times (>= 1), untimed; the first
       compiles. The compilations are counted per call.
    2. Timed: ``rounds`` rounds of ``repeats`` passes; each pass runs every call
       ``calls_per_sample`` times in a row, in an order rotated by one each pass
       (no call always first, on cold caches, or last), timed around the calls
       with ``clock`` and ``jax.block_until_ready`` on each result; a sample is
       that time divided by ``calls_per_sample``. Compilations are counted per
       call here too: anything but 0 means the timing includes a compile.

    ``clock="cpu"`` (``time.process_time``: this process's CPU time, all its
    threads) leaves out the time the process waits descheduled, so that ratios
    measured on a shared, loaded machine stay readable; it counts the work of
    every thread XLA runs, so it is not a latency.

    Args:
      calls: ``{name: call}``; a call returns arrays (or a PyTree of them).
      repeats: timed passes per round, >= 1.
      warmup: untimed calls of each first, >= 1.
      clock: ``"wall"`` (``time.perf_counter``, the default) or ``"cpu"``.
      calls_per_sample: calls timed together for one sample, >= 1.
      rounds: rounds, >= 1 (see :func:`measure_rounds`; :func:`round_ratios` gives one ratio per round).

    Returns:
      ``{name: {"seconds": [...], "rounds": [[...], ...], "stats_ms": summarize(...), "compiles_warmup",
      "compiles_timed", "compile_seconds"}}``: ``seconds`` every sample in the order taken, ``rounds`` the
      same samples round by round.
    """
    return measure_rounds(
        {"": calls}, repeats=repeats, warmup=warmup, clock=clock, calls_per_sample=calls_per_sample, rounds=rounds
    )[""]


def _count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"measure: {name} must be an int >= 1; got {value!r}.")


def measure_rounds(
    groups: Mapping[str, Mapping[str, Callable[[], Any]]],
    *,
    rounds: int,
    repeats: int,
    warmup: int,
    clock: str = "wall",
    calls_per_sample: int = 1,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Time several groups of calls in interleaved rounds: every group once per round, after one warm-up.

    Every call of every group is warmed up first (``warmup`` untimed calls each). Then each of ``rounds``
    rounds times every group in turn (the groups' order rotated by one each round), and a group's turn is
    ``repeats`` passes over its calls, as :func:`measure` takes them: the variants a ratio compares are timed
    back to back in every round, and a change of load between rounds reaches every group, not one. Each round
    gives each ratio one sample (:func:`round_ratios`), so the rounds' spread shows how far the machine moved
    the comparison.

    Args:
      groups: ``{group: {name: call}}``.
      rounds, repeats, warmup, clock, calls_per_sample: as for :func:`measure`, each >= 1.

    Returns:
      ``{group: measure's record for that group}``, with ``rounds`` holding each round's samples.

    Example:
      >>> import jax.numpy as jnp
      >>> from stejax.bench import measure_rounds, round_ratios
      >>> x = jnp.ones(1000)
      >>> calls = {"sum": lambda: jnp.sum(x), "max": lambda: jnp.max(x)}
      >>> out = measure_rounds({"g": calls}, rounds=3, repeats=4, warmup=1)
      >>> [len(r) for r in out["g"]["sum"]["rounds"]], len(round_ratios(out["g"], "sum", "max"))
      ([4, 4, 4], 3)
    """
    _count(rounds, "rounds")
    _count(repeats, "repeats")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"measure: warmup must be an int >= 1 (the first call compiles); got {warmup!r}.")
    if clock not in CLOCKS:
        raise ValueError(f"measure: clock must be one of {sorted(CLOCKS)}; got {clock!r}.")
    _count(calls_per_sample, "calls_per_sample")
    now = CLOCKS[clock]
    order = list(groups)
    if not order or not all(groups[g] for g in order):
        raise ValueError("measure: needs at least one call.")
    out: dict[str, dict[str, dict[str, Any]]] = {g: {} for g in order}
    for g in order:
        for name, call in groups[g].items():
            with CompileCounter() as counter:
                for _ in range(warmup):
                    jax.block_until_ready(call())
            out[g][name] = {
                "seconds": [],
                "rounds": [],
                "compiles_warmup": counter.count,
                "compile_seconds": counter.seconds,
                "compiles_timed": 0,
            }
    with CompileCounter() as counter:
        for r in range(rounds):
            for k in range(len(order)):
                g = order[(r + k) % len(order)]
                names = list(groups[g])
                for record in out[g].values():
                    record["rounds"].append([])
                for p in range(repeats):
                    for j in range(len(names)):
                        # Rotated by one each pass, continuing across rounds (one round of n passes is n passes).
                        name = names[(r * repeats + p + j) % len(names)]
                        before = counter.count
                        start = now()
                        for _ in range(calls_per_sample):
                            jax.block_until_ready(groups[g][name]())
                        sample = (now() - start) / calls_per_sample
                        record = out[g][name]
                        record["seconds"].append(sample)
                        record["rounds"][-1].append(sample)
                        record["compiles_timed"] += counter.count - before
    for g in order:
        for record in out[g].values():
            record["stats_ms"] = summarize(record["seconds"])
    return out


def round_ratios(measured: Mapping[str, Mapping[str, Any]], numerator: str, denominator: str) -> list[float]:
    """One ratio per round: the median of ``numerator``'s samples in that round over ``denominator``'s.

    Args:
      measured: one group's record from :func:`measure` or :func:`measure_rounds`.

    Example:
      >>> round_ratios({"a": {"rounds": [[2.0, 4.0, 3.0], [6.0]]}, "b": {"rounds": [[1.0, 2.0, 9.0], [3.0]]}}, "a", "b")
      [1.5, 2.0]
    """
    for name in (numerator, denominator):
        if name not in measured:
            raise ValueError(f"round_ratios: no variant {name!r}; measured {list(measured)}.")
    num, den = measured[numerator]["rounds"], measured[denominator]["rounds"]
    if len(num) != len(den) or not num:
        raise ValueError(f"round_ratios: needs the same rounds on both sides; got {len(num)} and {len(den)}.")
    return [float(np.median(a) / np.median(b)) for a, b in zip(num, den, strict=True)]


def group_record(
    name: str,
    measured: Mapping[str, Mapping[str, Any]],
    *,
    baseline: str | None = None,
    ratios: Sequence[tuple[str, str]] | None = None,
    info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one measured group (see :func:`compare`), its ratios per sample and per round."""
    if ratios is None:
        ratios = [] if baseline is None else [(v, baseline) for v in measured if v != baseline]
    out = {}
    for a, b in ratios:
        if a not in measured or b not in measured:
            raise ValueError(f"compare: ratio {a}/{b} names a variant not among {list(measured)}.")
        out[f"{a}/{b}"] = {
            **ratio_stats(measured[a]["seconds"], measured[b]["seconds"]),
            "rounds": round_ratios(measured, a, b),
        }
    variants = {v: {k: x for k, x in m.items() if k not in ("seconds", "rounds")} for v, m in measured.items()}
    return {"name": name, "baseline": baseline, "variants": variants, "ratios": out, "info": dict(info or {})}


def compare(
    name: str,
    calls: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int,
    baseline: str | None = None,
    ratios: Sequence[tuple[str, str]] | None = None,
    info: Mapping[str, Any] | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """:func:`measure` one group of calls, and compare them as per-sample and per-round ratios.

    Args:
      name: the group's name.
      calls, repeats, warmup, rounds: as for :func:`measure`.
      baseline: the variant the others are divided by (``"variant/baseline"``).
      ratios: instead, the ``(numerator, denominator)`` pairs to report.
      info: facts about the group for the report.

    Returns:
      A group record: ``{"name", "baseline", "variants": {variant: {"stats_ms",
      "compiles_warmup", "compiles_timed", "compile_seconds"}}, "ratios":
      {"a/b": {**ratio_stats, "rounds": round_ratios}}, "info"}``.
    """
    measured = measure(calls, repeats=repeats, warmup=warmup, rounds=rounds)
    return group_record(name, measured, baseline=baseline, ratios=ratios, info=info)


@contextlib.contextmanager
def standard_promotion() -> Iterator[None]:
    """JAX's standard dtype and rank promotion, for third-party code (Flax, Qwix) written for it."""
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield
