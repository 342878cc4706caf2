"""Time each catalog estimator's forward and gradient against two hand-written forms.

Run from the repository root:

    .venv/bin/python benchmarks/estimators.py [--size 1000000] [--repeats 30] [--only NAME] [--json PATH]

For every catalog estimator it times, jitted, on a float32 input of ``--size``
values (rows of the entry's ``example_shape``, or of code dimension 4 for a
rank-1 entry without one) and a fixed random float32 cotangent ``w``:

* ours: ``jax.value_and_grad(lambda x: jnp.sum(fn(x, *args, **params) * w))``;
* stop_gradient: the same loss written with ``jax.lax.stop_gradient``, in the
  simplest form that gives the same gradient: ``x + sg(f(x) - x)`` when the
  declared derivative is 1 everywhere, ``clip(x, -c, c) + sg(f(x) - clip(x, -c, c))``
  when it is ``1[|x| <= c]``, and otherwise
  ``sg(f(x)) + (x - sg(x)) * sg(d(x))`` from the entry's forward and derivative.
  The form is detected from the declared derivative on the benchmark input,
  on 4x that input and on it scaled past the entry's outermost kink, and is
  printed per estimator. An entry with a tangent
  map ``T`` (a non-diagonal Jacobian) uses ``sg(f(x)) + T(x - sg(x))``, with
  ``T`` evaluated at ``sg(x)``;
* fused: no autodiff, one jitted function returning
  ``(sum(forward(x) * w), derivative(x) * w)``, the least work that gives the
  same value and gradient. Entries with a tangent map have no such form (their
  gradient is the transpose of ``T``, which needs autodiff) and show n/a.

Each variant is compiled and run once before timing; the timed calls alternate
between the variants in rotating order, round after round, and every call waits
with ``block_until_ready``. The targets the project states are ours <= 0.90 x
stop_gradient and ours <= 1.10 x fused (medians of the per-round ratios); the
table says for each estimator whether they are met.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.table import Table

from stejax.estimators.catalog import CATALOG

TARGET_VS_STOP_GRADIENT = 0.90
TARGET_VS_FUSED = 1.10
VARIANTS = ("ours", "stop_gradient", "fused")


@dataclass
class Stats:
    median_ms: float
    min_ms: float
    p90_ms: float


@dataclass
class Result:
    name: str
    family: str
    shape: tuple[int, ...]
    form: str
    stats: dict[str, Stats]
    ratio_vs_stop_gradient: float
    ratio_vs_fused: float | None  # None: no fused form (a tangent map)
    meets_stop_gradient_target: bool
    meets_fused_target: bool | None
    max_grad_diff: dict[str, float] = field(default_factory=dict)  # max |grad - ours' grad| per variant
    max_abs_grad: float = 0.0  # max |ours' grad|, the scale for max_grad_diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="input values per call")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds per estimator")
    parser.add_argument("--only", action="append", default=None, metavar="NAME", help="only this estimator")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    options = parser.parse_args(argv)
    console = Console()

    names = options.only or list(CATALOG)
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        for n in unknown:
            close = difflib.get_close_matches(n, list(CATALOG), n=3, cutoff=0.5)
            console.print(f"no estimator named {n!r}; did you mean: {', '.join(close) or 'none close'}?")
        return 2

    machine = machine_info()
    console.print(machine_table(machine))
    results, skipped = [], []
    for name in names:
        entry = CATALOG[name]
        reason = skip_reason(entry)
        if reason:
            skipped.append({"name": name, "reason": reason})
            continue
        with console.status(f"timing {name}"):
            results.append(benchmark(entry, options.size, options.repeats))
    console.print(results_table(results, options))
    for s in skipped:
        console.print(f"skipped {s['name']}: {s['reason']}")
    if options.json:
        payload = {
            "machine": machine,
            "config": {"size": options.size, "repeats": options.repeats, "dtype": "float32"},
            "targets": {"ours/stop_gradient": TARGET_VS_STOP_GRADIENT, "ours/fused": TARGET_VS_FUSED},
            "results": [asdict(r) for r in results],
            "skipped": skipped,
        }
        with open(options.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        console.print(f"wrote {options.json}")
    return 0


def skip_reason(entry) -> str:
    if 0 not in entry.diff_argnums:
        return "its first argument carries no gradient"
    return ""


def input_shape(entry, params: dict[str, Any], size: int) -> tuple[int, ...]:
    """About ``size`` values in a valid shape: a leading batch axis before the row shape."""
    if entry.example_shape is not None:
        base = tuple(int(n) for n in entry.example_shape(**params))
        tail = base[1:] if len(base) > entry.input_rank else base
    else:
        tail = (4,) * entry.input_rank
    return (max(1, size // math.prod(tail)), *tail)


def benchmark(entry, size: int, repeats: int) -> Result:
    params = entry.default_params()
    rng = np.random.default_rng(0)
    shape = input_shape(entry, params, size)
    x = jnp.asarray(rng.standard_normal(shape, np.float32))
    args = tuple(jnp.asarray(a) for a in entry.example_args(rng, shape, np.float32, params))
    key = jax.random.key(0)
    bind = dict(params)

    def call(fn, x, args, key):
        return fn(x, *args, **bind, key=key) if entry.random else fn(x, *args, **bind)

    def partial_x(x, args, key):
        d = call(entry.derivative, x, args, key)
        d = d[entry.diff_argnums.index(0)] if isinstance(d, tuple) else d
        return jnp.broadcast_to(jnp.asarray(d, x.dtype), x.shape)

    out = jax.eval_shape(lambda x: call(entry.fn, x, args, key), x)
    if out.shape != x.shape:
        raise ValueError(f"{entry.name}: output shape {out.shape} differs from input shape {x.shape}")
    w = jnp.asarray(rng.standard_normal(shape, np.float32))

    if entry.derivative is not None:
        form, stop_gradient_forward = stop_gradient_form(entry, x, args, key, call, partial_x)
    else:
        form, stop_gradient_forward = tangent_form(entry, bind)

    def ours_loss(x, w, args, key):
        return jnp.sum(call(entry.fn, x, args, key) * w)

    def stop_gradient_loss(x, w, args, key):
        return jnp.sum(stop_gradient_forward(x, args, key) * w)

    def fused(x, w, args, key):
        y = call(entry.forward, x, args, key)
        return jnp.sum(y * w), partial_x(x, args, key) * w

    fns = {
        "ours": jax.jit(jax.value_and_grad(ours_loss)),
        "stop_gradient": jax.jit(jax.value_and_grad(stop_gradient_loss)),
    }
    if entry.derivative is not None:
        fns["fused"] = jax.jit(fused)
    inputs = (x, w, args, key)
    outputs = {k: jax.block_until_ready(f(*inputs)) for k, f in fns.items()}  # compile and run once
    grad_ours = np.asarray(outputs["ours"][1])
    max_grad_diff = {k: float(np.max(np.abs(np.asarray(outputs[k][1]) - grad_ours))) for k in fns}
    del max_grad_diff["ours"]

    names = tuple(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        # Rotating order: no variant always runs first (cold caches) or last.
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            start = time.perf_counter()
            jax.block_until_ready(fns[k](*inputs))
            times[k].append(time.perf_counter() - start)

    t = {k: np.asarray(v) for k, v in times.items()}
    vs_sg = float(np.median(t["ours"] / t["stop_gradient"]))
    vs_fused = float(np.median(t["ours"] / t["fused"])) if "fused" in t else None
    return Result(
        name=entry.name,
        family=entry.family,
        shape=shape,
        form=form,
        stats={k: stats(v) for k, v in t.items()},
        ratio_vs_stop_gradient=vs_sg,
        ratio_vs_fused=vs_fused,
        meets_stop_gradient_target=vs_sg <= TARGET_VS_STOP_GRADIENT,
        meets_fused_target=None if vs_fused is None else vs_fused <= TARGET_VS_FUSED,
        max_grad_diff=max_grad_diff,
        max_abs_grad=float(np.max(np.abs(grad_ours))),
    )


def stop_gradient_form(entry, x, args, key, call, partial_x):
    """The simplest stop_gradient form with the entry's derivative, and its name.

    The derivative is probed on x, 4x and x scaled past the entry's outermost
    kink, so that a clip outside the benchmark input's range is still seen.
    """
    sg = jax.lax.stop_gradient
    kinks = [abs(float(b)) for b in entry.boundaries(**entry.default_params()) if math.isfinite(float(b))]
    scales = (1.0, 4.0, max([4.0, *kinks]))
    inputs = [x * jnp.asarray(c, x.dtype) for c in scales]
    probes = [np.asarray(partial_x(p, args, key)) for p in inputs]
    magnitudes = [np.abs(np.asarray(p)) for p in inputs]

    if all(np.all(d == 1) for d in probes):

        def identity(x, args, key):
            return x + sg(call(entry.forward, x, args, key) - x)

        return "x + sg(f(x) - x)", identity

    if all(np.all((d == 0) | (d == 1)) for d in probes):
        for c in sorted({abs(float(b)) for b in entry.boundaries(**entry.default_params())} | {1.0}):
            if c > 0 and all(np.array_equal(d == 1, m <= c) for d, m in zip(probes, magnitudes, strict=True)):

                def hardtanh(x, args, key, c=c):
                    clipped = jnp.clip(x, -c, c)
                    return clipped + sg(call(entry.forward, x, args, key) - clipped)

                return f"clip(x, ±{c:g}) + sg(f(x) - clip(x, ±{c:g}))", hardtanh

    def general(x, args, key):
        return sg(call(entry.forward, x, args, key)) + (x - sg(x)) * sg(partial_x(x, args, key))

    return "sg(f(x)) + (x - sg(x)) * sg(d(x))", general


def tangent_form(entry, bind):
    """``sg(f(x)) + T(x - sg(x))``: the value f(x), the gradient T's transpose applied to w."""
    sg = jax.lax.stop_gradient

    def with_tangent_map(x, args, key):
        primals = (sg(x), *args)
        tangents = tuple(x - sg(x) if i == 0 else jnp.zeros_like(primals[i]) for i in entry.diff_argnums)
        extra = {"key": key} if entry.random else {}
        t = entry.tangent(*primals, tangents=tangents, **bind, **extra)
        return sg(entry.forward(*primals, **bind, **extra)) + t

    return "sg(f(x)) + T(x - sg(x))", with_tangent_map


def stats(seconds: np.ndarray) -> Stats:
    ms = seconds * 1e3
    return Stats(
        median_ms=float(np.median(ms)), min_ms=float(np.min(ms)), p90_ms=float(np.percentile(ms, 90))
    )


def machine_info() -> dict[str, Any]:
    import jaxlib

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = jax.devices()[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "device": f"{device.platform}: {device.device_kind}",
        "devices": jax.device_count(),
    }


def machine_table(machine: dict[str, Any]) -> Table:
    table = Table(title="machine", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in machine.items():
        table.add_row(k, str(v))
    return table


def results_table(results: list[Result], options) -> Table:
    table = Table(
        title=f"forward + gradient, float32, {options.size:,} values, {options.repeats} interleaved rounds; "
        "ms as median [min-p90]"
    )
    targets = f"met? (sg <= {TARGET_VS_STOP_GRADIENT}, fused <= {TARGET_VS_FUSED})"
    columns = ("estimator", "stop_gradient form", *VARIANTS, "ours/sg", "ours/fused", targets, "max |Δgrad|")
    for column in columns:
        table.add_column(column, overflow="fold")
    for r in results:
        cells = [
            f"{r.stats[k].median_ms:.3f} [{r.stats[k].min_ms:.3f}-{r.stats[k].p90_ms:.3f}]"
            if k in r.stats
            else "n/a"
            for k in VARIANTS
        ]
        met = f"sg {_yes_no(r.meets_stop_gradient_target)}, fused {_yes_no(r.meets_fused_target)}"
        vs_fused = "n/a" if r.ratio_vs_fused is None else f"{r.ratio_vs_fused:.3f}"
        grad_diff = f"{max(r.max_grad_diff.values()):.1e}"
        table.add_row(r.name, r.form, *cells, f"{r.ratio_vs_stop_gradient:.3f}", vs_fused, met, grad_diff)
    return table


def _yes_no(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "NO")


if __name__ == "__main__":
    sys.exit(main())
