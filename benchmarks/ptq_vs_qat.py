"""PTQ or QAT on the digits CNN: each form by round-to-nearest, every PTQ method, QAT from float, QAT from PTQ.

Each seed (``--seeds``, five by default) trains its own float CNN by the
reference recipe (``stejax.train.train``, preset ``float``, the default CNN of
32 and 64 channels, no dropout), draws its own calibration rows and runs its
own QAT; the data split is the same for every seed. Every form keeps
the first and last layers at 8 bits (weights per output channel, inputs per
tensor), as the QAT presets do, and quantises the middle convolution (18,432 of
the model's 28,810 weights) as the form says:

* ``w4 g32``: int4 weights, one scale per group of 32 input features of the
  flattened kernel, inputs float;
* ``w4``: int4 weights per output channel, inputs float;
* ``w4a8``, ``w8a8``: weights per output channel, inputs per tensor;
* ``w4a4 rot``: w4a4 with the convolution's input channels rotated by a
  Hadamard matrix (online, before the input quantiser, on the signed 4-bit
  grid), its kernel by the transpose; the first and last layers are those of
  the same method at w8a8 (the last one calibrated without the rotation);
  rows without rotation are given beside it;
* ``ternary``: weights in {-1, 0, 1} times a scale per output channel, 8-bit
  inputs. Its QAT rows train LSQ's signed 2-bit grid, {-2, -1, 0, 1} times the
  step: one level more than ternary.

Methods: ``rtn``, ``gptq``, ``awq``, ``smoothquant`` (forms with quantised
inputs), all by :func:`stejax.ptq.quantize_params` (the per-channel forms) or by
the per-layer functions of :mod:`stejax.ptq` (groups, rotation), 512
calibration rows of the training split; ``qat`` (LSQ, from the float weights,
steps initialised as LSQ initialises them) and ``qat from best PTQ`` (LSQ from
the PTQ parameters with the best validation accuracy among the methods the LSQ
model can express, chosen per seed); both ``--qat-steps`` Adam steps at 1e-3,
cosine, batch 64. A form and method the reference model cannot train (group
scales, an online rotation) is listed with the reason instead of a number.

A row is one form and method over the seeds: the mean validation and test
accuracy, the mean gap to float (each seed's gap to its own float CNN), the
smallest and largest gap, the mean seconds, and the per-seed values. The
``<form>_best_ptq`` figures name the PTQ method with the best mean validation
accuracy. The test split is only reported, never used for a choice.

    python benchmarks/ptq_vs_qat.py --results docs/results --plot docs/img/ptq_vs_qat.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stejax.bench.results import Figure, Recorder
from stejax.estimators.calibration import mse_scale
from stejax.estimators.uniform import lsq_levels
from stejax.model import ConvConfig, preset
from stejax.model._forward import _linear
from stejax.model._spec import architecture
from stejax.ptq import awq, form_config, gptq, hadamard, layer_rows, quantize_params, round_to_nearest
from stejax.ptq._reference import _inputs
from stejax.train import TrainConfig, compiled_update, evaluate, load_splits, train

FORMS = {  # name -> (quantize_params form, group, rotation)
    "w4 g32": ("w4a32", 32, False),
    "w4": ("w4a32", None, False),
    "w4a8": ("w4a8", None, False),
    "w8a8": ("w8a8", None, False),
    "w4a4": ("w4a4", None, False),
    "w4a4 rot": ("w4a4", None, True),
    "ternary": ("w2a8", None, False),
}
MIDDLE = 1  # the layer the forms quantise below 8 bits


def _accuracy(params: Any, data: tuple[np.ndarray, np.ndarray], mc: ConvConfig, qat: Any) -> float:
    return evaluate(params, data[0], data[1], model_config=mc, qat_config=qat)[1]


def _lsq_init(float_params: Any, calibration: np.ndarray, mc: ConvConfig, qat: Any) -> Any:
    """LSQ's own initialisation on the float weights: steps 2<|v|>/sqrt(Q_P) (per output channel for weights)."""
    layers = architecture(mc)
    out = []
    for i, p in enumerate(float_params["layers"]):
        lq = qat.layer(i, len(layers))
        q: dict[str, jax.Array] = {"w": p["w"], "b": p["b"]}
        _, qp = lsq_levels(lq.weights.bits, True)
        mean_w = jnp.mean(jnp.abs(p["w"].reshape(-1, p["w"].shape[-1])), axis=0)
        q["w_step"] = 2 * mean_w / np.sqrt(qp)
        if lq.activations is not None:
            u = _inputs(float_params, jnp.asarray(calibration), model_config=mc, qat_config=preset("float"), index=i)
            _, qp = lsq_levels(lq.activations.bits, i == 0)
            q["a_step"] = jnp.asarray(2 * jnp.mean(jnp.abs(u)) / np.sqrt(qp), jnp.float32)
        out.append(q)
    return {"layers": tuple(out)}


def _qat(params: Any, train_xy: tuple[np.ndarray, np.ndarray], mc: ConvConfig, qat: Any, steps: int, seed: int):
    """``steps`` Adam steps of LSQ QAT from ``params``; returns the parameters and the seconds."""
    optimizer = optax.adam(optax.cosine_decay_schedule(1e-3, steps))
    step = compiled_update(mc, qat, optimizer, statistics=False)
    state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    x, y = train_xy
    start = time.perf_counter()
    for _ in range(steps):
        rows = rng.choice(len(x), 64, replace=False)
        params, state, _ = step(params, state, (jnp.asarray(x[rows]), jnp.asarray(y[rows])), None)
    jax.block_until_ready(params)
    return params, time.perf_counter() - start


def _grouped(float_params: Any, calibration: np.ndarray, mc: ConvConfig, method: str, group: int) -> Any:
    """Weight-only PTQ with group scales on the middle layer (8-bit per channel elsewhere); float inputs."""
    layers = architecture(mc)
    out = []
    work = float_params
    for i, layer in enumerate(layers):
        p = work["layers"][i]
        w2d = p["w"].reshape(-1, layer.out_channels)
        bits, g = (4, group) if i == MIDDLE else (8, None)
        u = _inputs(work, jnp.asarray(calibration), model_config=mc, qat_config=preset("float"), index=i)
        rows = layer_rows(layer, u)
        if method == "gptq":
            kernel = gptq(w2d, rows, bits=bits, group=g, name=f"layer {i}").kernel
        elif method == "awq" and i > 0:
            result = awq(w2d, rows, bits=bits, group=g, mean_abs=_tied_mean_abs(rows, layers[i - 1].out_channels))
            kernel = result.kernel / result.input_scales[:, None]  # folded back: x (diag(s) W_q / s) = the same product
        else:
            kernel = round_to_nearest(w2d, bits=bits, group=g).kernel
        out.append({"w": kernel.reshape(layer.w_shape), "b": p["b"]})
        work = {"layers": (*out, *float_params["layers"][i + 1 :])}
    return {"layers": tuple(out)}


def _tied_mean_abs(rows: jax.Array, channels: int) -> jax.Array:
    mean = jnp.mean(jnp.reshape(jnp.mean(jnp.abs(rows), axis=0), (-1, channels)), axis=0)
    return jnp.tile(mean, rows.shape[1] // channels)


def _rotated(float_params: Any, calibration: np.ndarray, mc: ConvConfig, method: str) -> tuple[Any, jax.Array]:
    """w4a4 with the middle layer's input channels rotated: parameters (kernel rotated) and the rotation."""
    layers = architecture(mc)
    c = layers[MIDDLE].w_shape[2]
    r_rows = hadamard(layers[MIDDLE].w_shape[0] * layers[MIDDLE].w_shape[1] * c, block=c)
    base = quantize_params(float_params, calibration, model_config=mc, form="w8a8", method=method)
    out = list(base.params["layers"])
    current = {"layers": tuple(out)}
    u = _inputs(current, jnp.asarray(calibration), model_config=mc, qat_config=form_config("w8a8"), index=MIDDLE)
    rows = layer_rows(layers[MIDDLE], u) @ r_rows
    w2d = r_rows.T @ float_params["layers"][MIDDLE]["w"].reshape(-1, layers[MIDDLE].out_channels)
    q = gptq(w2d, rows, bits=4, name="layer 1") if method == "gptq" else round_to_nearest(w2d, bits=4)
    rotated_u = jnp.reshape(u, (-1, c)) @ hadamard(c)
    out[MIDDLE] = {
        "w": q.kernel.reshape(layers[MIDDLE].w_shape),
        "b": float_params["layers"][MIDDLE]["b"],
        "w_step": q.scales[0],
        "a_step": jnp.asarray(mse_scale(rotated_u.reshape(-1), bits=4, signed=True), jnp.float32),
    }
    return {"layers": tuple(out)}, hadamard(c)


def _rotated_accuracy(params: Any, rotation: jax.Array, data: tuple[np.ndarray, np.ndarray], mc: ConvConfig) -> float:
    """The accuracy of w4a4 with the middle layer's inputs rotated online (signed 4-bit grid after rotation)."""
    from stejax.model._quantize import quantize_input, quantize_weights

    qat = form_config("w4a4")
    layers = architecture(mc)

    def logits(x: jax.Array) -> jax.Array:
        z = x
        for i, (layer, p) in enumerate(zip(layers, params["layers"], strict=True)):
            lq = qat.layer(i, len(layers))
            u = jnp.reshape(z if i == 0 else jax.nn.relu(z), layer.in_shape)
            if i == MIDDLE:
                u = u @ rotation
            a, _ = quantize_input(u, p["a_step"], lq.activations, signed=i in (0, MIDDLE))
            w, _ = quantize_weights(p["w"], p["w_step"], lq.weights)
            z = _linear(layer, a, w) + jnp.reshape(p["b"], (1,) * (len(layer.in_shape) - 1) + (-1,))
        return z

    predictions = np.asarray(jax.jit(jax.vmap(logits))(jnp.asarray(data[0])).argmax(-1))
    return int(np.sum(predictions == data[1])) / len(data[1])  # a count, as evaluate() gives it


def run_seed(
    seed: int, *, epochs: int, qat_steps: int, calibration_rows: int, forms: list[str] | None = None
) -> dict[str, Any]:
    """One seed: its own float CNN, calibration draw and QAT runs; the rows of every form and method.

    Returns ``{"seed", "float_accuracy" (%), "float_seconds", "channels", "test_digits", "rows"}``; a row holds
    ``form``, ``method``, ``val_accuracy`` and ``test_accuracy`` (%), ``gap_points`` (test, against this seed's
    float CNN), ``ptq_seconds``, ``qat_steps``, ``qat_seconds``, ``note``, and for ``qat from best PTQ``
    ``started_from``: the PTQ method chosen on validation.
    """
    config = TrainConfig(preset="float", model="cnn", dropout=0.0, epochs=epochs, seed=seed)
    splits = load_splits(config)
    start = time.perf_counter()
    float_run = train(config, splits=splits)
    float_seconds = time.perf_counter() - start
    norm = float_run.normalizer
    mc = float_run.model_config

    def xy(split: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(norm.apply(split.x), np.float32), np.asarray(split.y)

    train_xy, val, test = xy(splits.train), xy(splits.val), xy(splits.test)
    draw = np.sort(np.asarray(jax.random.permutation(jax.random.key(seed), len(train_xy[0]))))
    calibration = train_xy[0][draw[:calibration_rows]]
    float_acc = _accuracy(float_run.params, test, mc, preset("float"))
    rows: list[dict[str, Any]] = []

    def row(form: str, method: str, *, val_acc=None, test_acc=None, ptq_s=None, steps=None, qat_s=None, **extra):
        gap = None if test_acc is None else 100 * (test_acc - float_acc)
        rows.append(
            {
                "form": form,
                "method": method,
                "val_accuracy": None if val_acc is None else 100 * val_acc,
                "test_accuracy": None if test_acc is None else 100 * test_acc,
                "gap_points": gap,
                "ptq_seconds": ptq_s,
                "qat_steps": steps,
                "qat_seconds": qat_s,
                "note": None,
                **extra,
            }
        )
        print(f"seed {seed}:", rows[-1], flush=True)

    for name in forms or list(FORMS):
        form, group, rotation = FORMS[name]
        qat = form_config(form)
        float_qat = preset("float")
        methods = ["rtn", "gptq", "awq"] + (["smoothquant"] if qat.hidden.activations is not None else [])
        best: tuple[float, str, Any] | None = None
        for method in methods:
            if rotation and method in ("awq", "smoothquant"):
                continue
            start = time.perf_counter()
            if group is not None:
                params = jax.block_until_ready(_grouped(float_run.params, calibration, mc, method, group))
                seconds = time.perf_counter() - start
                v, t = _accuracy(params, val, mc, float_qat), _accuracy(params, test, mc, float_qat)
            elif rotation:
                params, r = _rotated(float_run.params, calibration, mc, method)
                jax.block_until_ready(params)
                seconds = time.perf_counter() - start
                v, t = _rotated_accuracy(params, r, val, mc), _rotated_accuracy(params, r, test, mc)
            else:
                out = quantize_params(float_run.params, calibration, model_config=mc, form=form, method=method)
                params = jax.block_until_ready(out.params)
                seconds = time.perf_counter() - start
                v, t = _accuracy(params, val, mc, qat), _accuracy(params, test, mc, qat)
                if best is None or v > best[0]:
                    best = (v, method, params)
            row(name, method, val_acc=v, test_acc=t, ptq_s=seconds)
        if group is not None or rotation:
            why = "group scales" if group is not None else "online rotation"
            reason = f"not run: the reference model's LSQ quantisers have no {why} to train"
            row(name, "qat", note=reason)
            row(name, BEST_START, note=reason)
            continue
        init = _lsq_init(float_run.params, calibration, mc, qat)
        params, seconds = _qat(init, train_xy, mc, qat, qat_steps, seed)
        v, t = _accuracy(params, val, mc, qat), _accuracy(params, test, mc, qat)
        row(name, "qat", val_acc=v, test_acc=t, steps=qat_steps, qat_s=seconds)
        assert best is not None
        params, seconds = _qat(best[2], train_xy, mc, qat, qat_steps, seed)
        v, t = _accuracy(params, val, mc, qat), _accuracy(params, test, mc, qat)
        row(name, BEST_START, val_acc=v, test_acc=t, steps=qat_steps, qat_s=seconds, started_from=best[1])
    return {
        "seed": seed,
        "float_accuracy": 100 * float_acc,
        "float_seconds": float_seconds,
        "channels": mc.channels,
        "test_digits": len(test[1]),
        "rows": rows,
    }


BEST_START = "qat from best PTQ"  # LSQ from the PTQ result with the best validation accuracy, chosen per seed


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per form and method over the seeds of ``runs`` (as :func:`run_seed` returns them).

    Means of validation and test accuracy, of the gap to float (each seed's gap to its own float CNN) and of the
    seconds; the smallest and largest gap; the number of seeds; and ``per_seed``, the seeds with each one's
    validation and test accuracy and gap (and, for ``qat from best PTQ``, the PTQ method it started from).
    """
    out = []
    for first in runs[0]["rows"]:
        form, method = first["form"], first["method"]
        each = [next(r for r in run["rows"] if r["form"] == form and r["method"] == method) for run in runs]
        measured = [(run["seed"], r) for run, r in zip(runs, each, strict=True) if r["gap_points"] is not None]
        gaps = [r["gap_points"] for _, r in measured]
        row: dict[str, Any] = {
            "form": form,
            "method": method,
            "seeds": len(measured) or None,
            "val_accuracy": _mean([r["val_accuracy"] for _, r in measured]),
            "test_accuracy": _mean([r["test_accuracy"] for _, r in measured]),
            "gap_points": _mean(gaps),
            "gap_min": min(gaps) if gaps else None,
            "gap_max": max(gaps) if gaps else None,
            "ptq_seconds": _mean([r["ptq_seconds"] for _, r in measured if r["ptq_seconds"] is not None]),
            "qat_steps": first["qat_steps"],
            "qat_seconds": _mean([r["qat_seconds"] for _, r in measured if r["qat_seconds"] is not None]),
            "note": first["note"],
        }
        if measured:
            row["per_seed"] = {
                "seed": [seed for seed, _ in measured],
                "val_accuracy": [r["val_accuracy"] for _, r in measured],
                "test_accuracy": [r["test_accuracy"] for _, r in measured],
                "gap_points": gaps,
            }
        if method == BEST_START and measured:
            started = [r["started_from"] for _, r in measured]
            row["per_seed"]["started_from"] = started
            counts = {m: started.count(m) for m in dict.fromkeys(started)}
            row["note"] = "from " + ", ".join(f"{m} ({k} of {len(started)})" for m, k in counts.items())
        out.append(row)
    return out


def best_ptq(rows: list[dict[str, Any]], form: str) -> dict[str, Any]:
    """The PTQ row of ``form`` with the best mean validation accuracy (ties: the first in method order)."""
    ptq = [r for r in rows if r["form"] == form and r["seeds"] and not r["method"].startswith("qat")]
    return max(ptq, key=lambda r: r["val_accuracy"])


def _signed(points: float) -> str:
    text = f"{points:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text.replace("-", "\N{MINUS SIGN}")


def _gap_text(row: dict[str, Any], method: str | None = None) -> str:
    spread = f"{_signed(row['gap_min'])} to {_signed(row['gap_max'])}, {row['seeds']} seeds"
    return f"{_signed(row['gap_points'])} points ({spread}{'; ' + method if method else ''})"


def figures(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Figure]:
    """The named figures: the float accuracy, and per form the best PTQ method's gap and every method's gap.

    Keys: ``seeds``, ``float_accuracy``; ``<form>_best_ptq`` (the PTQ method with the best mean validation
    accuracy, named in the text); ``<form>_qat_from_ptq``; and ``<form>_<method>`` for every measured method
    (``w4a8_rtn``, ``ternary_qat``). Each value is the mean over seeds; the text gives the range over seeds.
    """
    accuracy = [run["float_accuracy"] for run in runs]
    mean = float(np.mean(accuracy))
    out = {
        "seeds": Figure(len(runs), f"{len(runs)} seeds", note="seeds " + ", ".join(str(r["seed"]) for r in runs)),
        "float_accuracy": Figure(
            mean,
            f"{mean:.1f}% ({min(accuracy):.1f}–{max(accuracy):.1f}%, {len(runs)} seeds)",
            note="the float CNN's test accuracy, mean over seeds",
        ),
    }
    forms = list(dict.fromkeys(r["form"] for r in rows))
    for form in forms:
        key = form.replace(" ", "_")
        best = best_ptq(rows, form)
        out[f"{key}_best_ptq"] = Figure(best["gap_points"], _gap_text(best, best["method"]))
        for r in rows:
            if r["form"] != form or not r["seeds"]:
                continue
            method = "qat_from_ptq" if r["method"] == BEST_START else r["method"]
            out[f"{key}_{method}"] = Figure(r["gap_points"], _gap_text(r))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--plot", type=Path, default=Path("docs/img/ptq_vs_qat.png"))
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the float CNN")
    parser.add_argument("--qat-steps", type=int, default=300)
    parser.add_argument("--calibration-rows", type=int, default=512)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--forms", nargs="+", choices=list(FORMS), default=list(FORMS), help="default: every form")
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct; got {args.seeds}")
    recorder = Recorder("ptq_vs_qat", command="python benchmarks/ptq_vs_qat.py " + " ".join(argv or sys.argv[1:]))

    runs = []
    for seed in args.seeds:
        start = time.perf_counter()
        runs.append(
            run_seed(
                seed,
                epochs=args.epochs,
                qat_steps=args.qat_steps,
                calibration_rows=args.calibration_rows,
                forms=args.forms,
            )
        )
        print(f"seed {seed} done in {time.perf_counter() - start:.0f} s", flush=True)
    rows = aggregate(runs)
    digits = runs[0]["test_digits"]
    float_seconds = np.mean([run["float_seconds"] for run in runs])
    args.results.mkdir(parents=True, exist_ok=True)
    recorder.write(
        args.results / "ptq_vs_qat.json",
        rows=rows,
        columns=[
            ("form", "form"),
            ("method", "method"),
            ("val_accuracy", "validation %", "{:.1f}"),
            ("test_accuracy", "test %", "{:.1f}"),
            ("gap_points", "gap to float (points)", "{:+.1f}"),
            ("gap_min", "smallest gap", "{:+.1f}"),
            ("gap_max", "largest gap", "{:+.1f}"),
            ("seeds", "seeds"),
            ("ptq_seconds", "PTQ s", "{:.2f}"),
            ("qat_steps", "QAT steps"),
            ("qat_seconds", "QAT s", "{:.1f}"),
            ("note", "note"),
        ],
        figures=figures(rows, runs),
        notes=(
            f"{len(runs)} seeds ({', '.join(str(s) for s in args.seeds)}). Each seed trains its own float CNN "
            f"({runs[0]['channels']} channels, {args.epochs} epochs, {float_seconds:.0f} s on average), draws its "
            f"own {args.calibration_rows} calibration rows and runs its own QAT. The data split is the same for "
            f"every seed, so the test split is the same {digits} digits throughout (one digit is "
            f"{100 / digits:.2f} points) and the spread over seeds comes from training, calibration and QAT, not "
            "from the split. Accuracies, gaps and seconds are means over seeds; each seed's gap is taken against "
            "its own float CNN, and the smallest and largest gap over seeds stand beside the mean. qat from best "
            "PTQ starts each seed's QAT from that seed's PTQ result with the best validation accuracy (the note "
            "counts which); the best PTQ figures name the method with the best mean validation accuracy. "
            "Validation made every choice; the test split chose nothing."
        ),
    )
    _plot(rows, args.plot)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    forms = list(dict.fromkeys(r["form"] for r in rows))
    methods = ["rtn", "gptq", "awq", "smoothquant", "qat", BEST_START]
    by_key = {(r["form"], r["method"]): r for r in rows if r["seeds"]}
    seeds = max(r["seeds"] for r in by_key.values())

    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        xs = np.arange(len(forms)) + (k - (len(methods) - 1) / 2) * width
        found = [by_key.get((f, method)) for f in forms]
        mean = np.array([np.nan if r is None else r["gap_points"] for r in found])
        low = np.array([np.nan if r is None else r["gap_points"] - r["gap_min"] for r in found])
        high = np.array([np.nan if r is None else r["gap_max"] - r["gap_points"] for r in found])
        ax.bar(xs, mean, width, yerr=np.stack([low, high]), capsize=2, error_kw={"linewidth": 0.8}, label=method)
    ax.axhline(0, color="black", linewidth=0.8)
    # Linear within a point of float, logarithmic beyond: a collapsed method does not flatten the rest.
    ax.set_yscale("symlog", linthresh=1, linscale=2)
    low = min(-1.0, *(r["gap_min"] for r in by_key.values()))
    high = max(1.0, *(r["gap_max"] for r in by_key.values()))
    ticks = [t for t in (-100, -30, -10, -3, -1, -0.5, 0, 0.5, 1, 3, 10) if 1.3 * low <= t <= 1.3 * high]
    ax.set_yticks(ticks, [f"{t:+g}" if t else "0" for t in ticks])
    ax.set_ylim(1.3 * low, 1.3 * high)
    ax.grid(axis="y", linewidth=0.3)
    ax.set_xticks(np.arange(len(forms)), forms)
    ax.set_ylabel("test accuracy - float (points)\nlinear within ±1, logarithmic beyond")
    ax.set_title(
        f"Digits CNN: mean gap to float over {seeds} seeds; error bars from the smallest to the largest gap\n"
        "(a missing bar: not applicable)",
        fontsize=10,
    )
    ax.legend(ncols=6, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
