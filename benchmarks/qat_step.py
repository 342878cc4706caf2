"""What a QAT training step costs beyond its arithmetic: CPU-time ratios, compiled-HLO counts, compile times.

Writes three results files (docs/results/). Every ratio is of CPU time (`stejax.bench.measure` with clock="cpu",
3 calls per sample, one process), so that a loaded, shared machine still gives readable comparisons, measured in
`--rounds` interleaved rounds after warm-up: each round times every step `--repeats` times, back to back with the
others, and gives each ratio one sample, the round's median time of one step over the round's median of the other.
A ratio is the median over rounds with its spread (`stejax.bench.results.Figure.ratio`: a spread that contains 1
reads "level with", and a target is met only when every round meets it). Each file records the load, and
`qat_step.json` the number of rounds:

* `qat_step.json`: the figures. The peers MLP (64-256-256-10, batch 64, `stejax.bench._peers.mlp_calls`): stejax
  w8a8 (LSQ) / stejax float, each as `train` takes it (`compiled_train_step`, log False), and stejax int8 (Qwix's
  scheme from the catalog) / Qwix int8; the digits CNN (`stejax.bench._peers.cnn_calls`): stejax int8 / Qwix
  int8; the default recipe's CNN (`stejax.bench._train.step_setup`, `stejax bench --suite train`): w4a4 / float.
  Beside them the one-program step (the fractions under an untaken `lax.cond`, `logged_update`) and the step with
  the fractions on every step, for what the statistics cost. The moonshot: a w8a8 step whose forward products
  run as int8 x int8 -> int32 (`stejax.quantized_matmul`) against the float step, MLPs of widths 1024 and 4096.
* `qat_step_hlo.json`: compares, selects, reductions, fusions and roundings in each compiled step
  (`jax.jit(step).lower(...).compile().as_text()`), with the derivative forms shipped (the declared comparisons)
  and, for comparison, every mask read off the forward's clip (`lo <= v <= hi` as `clip(v) == v`).
* `qat_step_compile.json`: the CPU time of compiling each way of computing the statistics, per configuration of
  the demo's recipe: one program with the fractions under a `lax.cond`; the step without them plus a
  forward-only statistics program (what `train` does); the step without them plus the step with them.

    python benchmarks/qat_step.py [--rounds 5] [--repeats 40] [--warmup 5] [--quick] [--results docs/results]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stejax.bench import measure, round_ratios
from stejax.bench._peers import _int8_step, cnn_calls, mlp_calls
from stejax.bench._train import step_setup
from stejax.bench.results import Figure, Recorder
from stejax.estimators import uniform
from stejax.estimators._core import surrogate
from stejax.model import init_params, preset
from stejax.train import compiled_train_step, logged_update, update
from stejax.train._step import step_statistics

OPS = {
    "compare": "compares",
    "select": "selects",
    "reduce": "reductions",
    "fusion": "fusions",
    "round-nearest-even": "roundings",
}


def hlo_counts(text: str) -> dict[str, int]:
    """Instructions of each kind in a compiled module's text, fused computations included."""
    return {name: len(re.findall(r"= \S+ " + re.escape(op) + r"\(", text)) for op, name in OPS.items()}


def compiled_text(program: Any) -> str:
    if isinstance(program, str):
        return program
    fn, args = program
    return fn.lower(*args).compile().as_text()


# --- the alternative derivative forms: every mask read off the forward's clip ----------------------


def _unclipped(v, clipped):
    return clipped == v


def _shared_fake_quant(x, scale, zero_point=0, *, bits, signed=True, narrow_range=False, axis=None):
    x = jnp.asarray(x)
    _, r, lo, hi = uniform._fake_quant_grid(x, scale, zero_point, bits, signed, narrow_range, axis)
    return _unclipped(r, uniform._clip(r, lo, hi)).astype(x.dtype)


def _shared_lsq(x, step, *, bits, signed=True, grad_scale=None, axis=None):
    x = jnp.asarray(x)
    qn, qp = uniform.lsq_levels(bits, signed)
    _, _, v = uniform._lsq_grid(x, step, 0, axis)
    g = jnp.asarray(uniform._lsq_grad_scale(grad_scale, x, step, qp), v.dtype)
    c = uniform._clip(v, -qn, qp)
    outside = jnp.where(v < -qn, -qn * g, jnp.where(v > qp, qp * g, 0))
    d_step = jnp.where(_unclipped(v, c), (jnp.round(c) - c) * g, outside)
    return _unclipped(v, c).astype(x.dtype), d_step.astype(x.dtype)


SHARED_FORMS = {
    "_fake_quant": surrogate(uniform._fake_quant_forward, _shared_fake_quant, name="fake_quant"),
    "_lsq": surrogate(uniform._lsq_forward, _shared_lsq, name="lsq", diff_argnums=(0, 1)),
}


@contextlib.contextmanager
def shared_forms():
    saved = {name: getattr(uniform, name) for name in SHARED_FORMS}
    try:
        for name, fn in SHARED_FORMS.items():
            setattr(uniform, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(uniform, name, fn)


# --- set-ups ---------------------------------------------------------------------------------------


def cnn_recipe_calls(quick: bool, programs: dict[str, Any]) -> dict[str, Any]:
    """The default recipe's CNN step (the train suite's), as train takes it, and the one-program step."""
    _, model_config, batch, optimizer = step_setup(quick=quick)
    key = jax.random.key(7)
    calls = {}
    for name in ("float", "w4a4", "w8a8"):
        qc = preset(name)
        params = init_params(jax.random.key(0), model_config, qc)
        state = optimizer.init(params)
        step = compiled_train_step(model_config, qc, optimizer)
        calls[f"CNN {name}"] = lambda step=step, p=params, s=state: step(p, s, batch, key, False)
        programs[f"CNN {name}"] = (step.update, (params, state, batch, key))
        if name == "w4a4":
            kw = dict(model_config=model_config, qat_config=qc, optimizer=optimizer)
            cond = jax.jit(functools.partial(logged_update, **kw))
            calls["CNN w4a4 (one program, lax.cond)"] = lambda f=cond, p=params, s=state: f(p, s, batch, key, False)
            programs["CNN w4a4 (one program, lax.cond)"] = (cond, (params, state, batch, key, False))
            with shared_forms():
                shared = jax.jit(functools.partial(update, statistics=False, **kw))
                programs["CNN w4a4, masks as clip(v) == v"] = compiled_text((shared, (params, state, batch, key)))
    return calls


def float_step(optimizer):
    """The float MLP step of `_int8_step`'s form: the same layers, products in float32."""

    def loss(params, x, y):
        h = x
        for i, layer in enumerate(params["layers"]):
            h = h @ layer["w"] + layer["b"][None, :]
            if i < len(params["layers"]) - 1:
                h = jax.nn.relu(h)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(h, y))

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step)


def moonshot_calls(width: int, batch: int) -> dict[str, Any]:
    """MLP 64 -> width -> width -> 10: float, int8 fake-quant and int8 with integer forward products."""
    sizes = (64, width, width, 10)
    keys = jax.random.split(jax.random.key(width), len(sizes) + 1)
    params = {
        "layers": [
            {"w": jax.random.normal(k, (a, b)) * (1 / np.sqrt(a)), "b": jnp.zeros(b)}
            for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=False)
        ]
    }
    x = jax.random.normal(keys[-2], (batch, sizes[0]))
    y = jax.random.randint(keys[-1], (batch,), 0, sizes[-1])
    optimizer = optax.adam(1e-3)
    state = optimizer.init(params)
    steps = {
        "float": float_step(optimizer),
        "int8 fake-quant": _int8_step(optimizer),
        "int8 products": _int8_step(optimizer, integer_products=True),
    }
    return {f"width {width} {name}": (lambda f=f: f(params, state, x, y)) for name, f in steps.items()}


def compile_costs(presets: tuple[str, ...]) -> list[dict[str, Any]]:
    """CPU seconds to lower and compile each program of each way to compute the statistics."""
    _, model_config, batch, optimizer = step_setup(quick=False)
    key = jax.random.key(1)
    rows = []
    for name in presets:
        qc = preset(name)
        params = init_params(jax.random.key(0), model_config, qc)
        state = optimizer.init(params)
        kw = dict(model_config=model_config, qat_config=qc)
        programs = {
            "cond": (
                jax.jit(functools.partial(logged_update, optimizer=optimizer, **kw)),
                (params, state, batch, key, False),
            ),
            "bare": (
                jax.jit(functools.partial(update, optimizer=optimizer, statistics=False, **kw)),
                (params, state, batch, key),
            ),
            "statistics": (jax.jit(functools.partial(step_statistics, **kw)), (params, batch, key)),
            "full": (
                jax.jit(functools.partial(update, optimizer=optimizer, statistics=True, **kw)),
                (params, state, batch, key),
            ),
        }
        seconds = {}
        for label, (fn, args) in programs.items():
            start = time.process_time()
            fn.lower(*args).compile()
            seconds[label] = time.process_time() - start
        rows.append(
            {
                "preset": name,
                "one_program_cond": seconds["cond"],
                "step_plus_statistics_program": seconds["bare"] + seconds["statistics"],
                "step_plus_step_with_statistics": seconds["bare"] + seconds["full"],
                "step_alone": seconds["bare"],
                "statistics_program": seconds["statistics"],
            }
        )
    return rows


# The ratios of qat_step.json: key -> (numerator, denominator, target bound or None).
PAIRS: dict[str, tuple[str, str, float | None]] = {
    "mlp_w8a8_vs_float": ("stejax w8a8", "stejax float", 1.15),
    "mlp_int8_vs_qwix": ("stejax int8", "qwix int8", 1.00),
    "cnn_int8_vs_qwix": ("CNN int8 stejax int8", "CNN int8 qwix int8", 1.00),
    "cnn_w4a4_vs_float": ("CNN w4a4", "CNN float", 1.10),  # the digits comparison's own bar
    "mlp_int8_products_vs_qwix": ("stejax int8 (integer products)", "qwix int8", None),
    "cnn_w8a8_vs_float": ("CNN w8a8", "CNN float", None),
    "mlp_cond_vs_step": ("stejax w8a8 (one program, lax.cond)", "stejax w8a8", None),
    "mlp_statistics_every_step_vs_step": ("stejax w8a8 (with statistics)", "stejax w8a8", None),
    "cnn_cond_vs_step": ("CNN w4a4 (one program, lax.cond)", "CNN w4a4", None),
    "mlp_cond_w8a8_vs_float": ("stejax w8a8 (one program, lax.cond)", "stejax float", None),
    "cnn_cond_w4a4_vs_float": ("CNN w4a4 (one program, lax.cond)", "CNN float", None),
    "mlp_qwix_vs_flax": ("qwix int8", "flax float", None),
    "cnn_qwix_vs_flax": ("CNN int8 qwix int8", "CNN int8 flax float", None),
}

# The moonshot's widths, with the timed calls of each step per round (full, quick).
MOONSHOT = ((1024, (8, 2)), (4096, (2, 1)))


def step_calls(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every step the ratios of PAIRS compare, untimed: ``(calls, programs)``, programs for the HLO counts."""
    programs: dict[str, Any] = {}
    calls, _, _, _, _ = mlp_calls(quick=quick, programs=programs)
    # The one-program step (the fractions under an untaken lax.cond), as train took it before.
    from stejax.train import TrainConfig, load_splits, make_optimizer

    config = TrainConfig(model="mlp", dropout=0.0, **({"hidden": (16,), "batch_size": 32} if quick else {}))
    splits = load_splits(config)
    mc, qc = config.model_config(splits.train), preset("w8a8")
    optimizer = make_optimizer(config, len(splits.train) // config.batch_size)
    cond = jax.jit(functools.partial(logged_update, model_config=mc, qat_config=qc, optimizer=optimizer))
    p, s, batch, _ = programs["stejax w8a8"][1]
    calls["stejax w8a8 (one program, lax.cond)"] = lambda: cond(p, s, batch, None, False)
    programs["stejax w8a8 (one program, lax.cond)"] = (cond, (p, s, batch, None, False))
    with shared_forms():
        kw = dict(model_config=mc, qat_config=qc, optimizer=optimizer, statistics=False)
        shared = jax.jit(functools.partial(update, **kw))
        programs["stejax w8a8, masks as clip(v) == v"] = compiled_text((shared, (p, s, batch, None)))
        int8 = _int8_step(optimizer)
        int8_args = programs["stejax int8"][1]
        programs["stejax int8, masks as clip(v) == v"] = compiled_text((int8, int8_args))
    cnn_programs: dict[str, Any] = {}
    cnn, _, _, _ = cnn_calls(quick=quick, programs=cnn_programs)
    calls.update({f"CNN int8 {name}": call for name, call in cnn.items()})
    programs.update({f"CNN int8 {name}": program for name, program in cnn_programs.items()})
    calls.update(cnn_recipe_calls(quick, programs))
    return calls, programs


def ratio_row(label: str, samples: list[float], numerator_ms: float, denominator_ms: float, figure: Any) -> dict:
    """One row of qat_step.json: the median over rounds, its spread, each round's sample and the times."""
    return {
        "ratio": label,
        "median": float(np.median(samples)),
        "min": min(samples),
        "max": max(samples),
        "rounds": samples,
        "text": figure.text,
        "numerator_ms": numerator_ms,
        "denominator_ms": denominator_ms,
        "target": figure.target or "",
        "met": figure.met,
    }


def ratio_table(measured: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Figure]]:
    """The rows of PAIRS from one measurement in rounds, and the figures of those with a target."""
    rows, figures = [], {}
    for key, (a, b, bound) in PAIRS.items():
        samples = round_ratios(measured, a, b)
        figure = Figure.ratio(samples, bound=bound)
        a_ms, b_ms = measured[a]["stats_ms"]["p50_ms"], measured[b]["stats_ms"]["p50_ms"]
        rows.append(ratio_row(f"{a} / {b}", samples, a_ms, b_ms, figure))
        if bound is not None:
            figures[key] = figure
    return rows, figures


def moonshot_table(*, rounds: int, quick: bool) -> tuple[list[dict[str, Any]], dict[str, Figure]]:
    """int8 x int8 -> int32 forward products against float, at each width of MOONSHOT, in rounds."""
    rows, figures = [], {}
    for width, (full, small) in MOONSHOT:
        batch_size = 256
        moon = measure(
            moonshot_calls(width, batch_size), repeats=small if quick else full, warmup=2, clock="cpu", rounds=rounds
        )
        for name in ("int8 products", "int8 fake-quant"):
            a, b = f"width {width} {name}", f"width {width} float"
            samples = round_ratios(moon, a, b)
            figure = Figure.ratio(samples, bound=1.0 if name == "int8 products" else None)
            label = f"MLP 64-{width}-{width}-10, batch {batch_size}: w8a8 {name} / float"
            a_ms, b_ms = moon[a]["stats_ms"]["p50_ms"], moon[b]["stats_ms"]["p50_ms"]
            rows.append(ratio_row(label, samples, a_ms, b_ms, figure))
            if name == "int8 products":
                figures[f"int8_products_w8a8_vs_float_{width}"] = figure
    return rows, figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, one ratio sample each (default 5)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=40,
        help="timed samples (3 calls each) of every step per round (default 40; the int8-product MLPs: "
        + ", ".join(f"{full} at width {width}" for width, (full, _) in MOONSHOT)
        + ")",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls of each first (default 5)")
    parser.add_argument("--quick", action="store_true", help="small models and few calls (a smoke run)")
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="where the results files go")
    args = parser.parse_args(argv)
    command = f"python benchmarks/qat_step.py --rounds {args.rounds} --repeats {args.repeats} --warmup {args.warmup}"
    command += " --quick" if args.quick else ""

    # --- compile cost of the statistics (first: a quiet process, nothing compiled yet) ---
    compile_rec = Recorder("qat_step_compile", command=command)
    compile_rows = compile_costs(("w4a4",) if args.quick else ("w8a8", "w4a4", "w2a2", "w1a32"))
    totals = {k: sum(r[k] for r in compile_rows) for k in compile_rows[0] if k != "preset"}
    compile_rows.append({"preset": "total", **totals})
    compile_rec.write(
        args.results / "qat_step_compile.json",
        rows=compile_rows,
        columns=[
            ("preset", "configuration (default CNN recipe)"),
            ("one_program_cond", "one program, lax.cond (s)", "{:.2f}"),
            ("step_plus_statistics_program", "step + statistics program (s)", "{:.2f}"),
            ("step_plus_step_with_statistics", "step + step with statistics (s)", "{:.2f}"),
            ("step_alone", "step alone (s)", "{:.2f}"),
        ],
        notes="CPU seconds (process time) to lower and compile, in one process, per configuration. The step alone "
        "is also what a comparison compiles for its timing of a configuration trained in another worker.",
    )

    rec = Recorder("qat_step", command=command)
    calls, programs = step_calls(args.quick)
    rows_hlo = [{"program": name, **hlo_counts(compiled_text(program))} for name, program in programs.items()]
    measured = measure(
        calls, repeats=args.repeats, warmup=args.warmup, clock="cpu", calls_per_sample=3, rounds=args.rounds
    )
    rows, figures = ratio_table(measured)
    # --- the moonshot: int8 x int8 -> int32 forward products against float, at widths 1024 and 4096 ---
    moon_rows, moon_figures = moonshot_table(rounds=args.rounds, quick=args.quick)
    rows += moon_rows
    figures.update(moon_figures)

    rec.write(
        args.results / "qat_step.json",
        rows=rows,
        columns=[
            ("ratio", "ratio (CPU time)"),
            ("text", "median (min–max) over rounds"),
            ("numerator_ms", "numerator (ms)", "{:.3f}"),
            ("denominator_ms", "denominator (ms)", "{:.3f}"),
            ("target", "target"),
        ],
        figures=figures,
        notes=f"Ratios of CPU time per call, one per round ({args.rounds} interleaved rounds of {args.repeats} "
        f"samples of 3 calls of each step, after {args.warmup} warm-up calls; the int8-product rows: "
        + ", ".join(f"{small if args.quick else full} calls at width {width}" for width, (full, small) in MOONSHOT)
        + " per round). stejax float, w8a8 and the CNN presets are the step train takes on every batch but an "
        "epoch's last.",
        rounds=args.rounds,
    )
    hlo_rec = Recorder("qat_step_hlo", command=command)
    hlo_rec.write(
        args.results / "qat_step_hlo.json",
        rows=rows_hlo,
        columns=[("program", "compiled step"), *((name, name) for name in OPS.values())],
        notes="Instructions in each compiled step's HLO text, fused computations included. 'masks as clip(v) == v': "
        "the uniform quantisers' derivatives with every mask read off the forward's clip, for comparison; the "
        "estimators declare the masks as comparisons (the other rows).",
    )
    for row in rows:
        print(f"{row['ratio']:75s} {row['text']}")
    for row in rows_hlo:
        print(f"{row['program']:50s}", " ".join(f"{k}={v}" for k, v in row.items() if k != "program"))


if __name__ == "__main__":
    main()
