"""PTQ or QAT on the digits CNN: each form by round-to-nearest, every PTQ method, QAT from float, QAT from PTQ.

One float CNN is trained by the reference recipe (``stejax.train.train``, preset
``float``, the default CNN of 32 and 64 channels, no dropout). Every form keeps
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
steps initialised as LSQ initialises them) and ``qat from <best PTQ>`` (LSQ from
the PTQ parameters with the best validation accuracy among the methods the LSQ
model can express); both ``--qat-steps`` Adam steps at 1e-3, cosine, batch 64.
The test split is only reported, never used for a choice. A form and method the
reference model cannot train (group scales, an online rotation) is listed with
the reason instead of a number.

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

    predictions = jax.jit(jax.vmap(logits))(jnp.asarray(data[0])).argmax(-1)
    return float(jnp.mean(predictions == jnp.asarray(data[1])))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--plot", type=Path, default=Path("docs/img/ptq_vs_qat.png"))
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the float CNN")
    parser.add_argument("--qat-steps", type=int, default=300)
    parser.add_argument("--calibration-rows", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    recorder = Recorder("ptq_vs_qat", command="python benchmarks/ptq_vs_qat.py " + " ".join(argv or sys.argv[1:]))

    config = TrainConfig(preset="float", model="cnn", dropout=0.0, epochs=args.epochs, seed=args.seed)
    splits = load_splits(config)
    start = time.perf_counter()
    float_run = train(config, splits=splits)
    float_seconds = time.perf_counter() - start
    norm = float_run.normalizer
    mc = float_run.model_config

    def xy(split: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(norm.apply(split.x), np.float32), np.asarray(split.y)

    train_xy, val, test = xy(splits.train), xy(splits.val), xy(splits.test)
    draw = np.sort(np.asarray(jax.random.permutation(jax.random.key(args.seed), len(train_xy[0]))))
    calibration = train_xy[0][draw[: args.calibration_rows]]
    float_acc = _accuracy(float_run.params, test, mc, preset("float"))
    rows: list[dict[str, Any]] = []

    def row(form: str, method: str, *, val_acc=None, test_acc=None, ptq_s=None, steps=None, qat_s=None, note=None):
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
                "note": note,
            }
        )
        print(rows[-1], flush=True)

    for name, (form, group, rotation) in FORMS.items():
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
            why = "group scales" if group is not None else "an online rotation"
            reason = f"not run: the reference model's LSQ quantisers have no {why} to train"
            row(name, "qat", note=reason)
            row(name, "qat from best PTQ", note=reason)
            continue
        init = _lsq_init(float_run.params, calibration, mc, qat)
        params, seconds = _qat(init, train_xy, mc, qat, args.qat_steps, args.seed)
        row(
            name,
            "qat",
            val_acc=_accuracy(params, val, mc, qat),
            test_acc=_accuracy(params, test, mc, qat),
            steps=args.qat_steps,
            qat_s=seconds,
        )
        assert best is not None
        params, seconds = _qat(best[2], train_xy, mc, qat, args.qat_steps, args.seed)
        row(
            name,
            f"qat from {best[1]}",
            val_acc=_accuracy(params, val, mc, qat),
            test_acc=_accuracy(params, test, mc, qat),
            steps=args.qat_steps,
            qat_s=seconds,
        )

    figures = {
        "float_accuracy": Figure(100 * float_acc, f"{100 * float_acc:.1f}%", note="the float CNN's test accuracy")
    }
    for name in FORMS:
        measured = [r for r in rows if r["form"] == name and r["test_accuracy"] is not None]
        ptq = [r for r in measured if not r["method"].startswith("qat")]
        best_ptq = max(ptq, key=lambda r: r["val_accuracy"])
        key = name.replace(" ", "_")
        figures[f"{key}_best_ptq"] = Figure(
            best_ptq["gap_points"], f"{best_ptq['gap_points']:+.1f} points ({best_ptq['method']})"
        )
        qat_rows = [r for r in measured if r["method"].startswith("qat from")]
        if qat_rows:
            figures[f"{key}_qat_from_ptq"] = Figure(
                qat_rows[0]["gap_points"], f"{qat_rows[0]['gap_points']:+.1f} points"
            )
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
            ("ptq_seconds", "PTQ s", "{:.2f}"),
            ("qat_steps", "QAT steps"),
            ("qat_seconds", "QAT s", "{:.1f}"),
            ("note", "note"),
        ],
        figures=figures,
        notes=(
            f"The float CNN ({mc.channels} channels) trained {args.epochs} epochs in {float_seconds:.0f} s and scores "
            f"{100 * float_acc:.1f}% on the test split ({len(test[1])} digits; one digit is "
            f"{100 / len(test[1]):.2f} points). One seed: differences below a point or two are within the noise of "
            "one split. QAT rows start from the float weights (qat) or from the PTQ result with the best validation "
            "accuracy (qat from ...)."
        ),
    )
    _plot(rows, args.plot)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    forms = list(FORMS)
    methods = ["rtn", "gptq", "awq", "smoothquant", "qat", "qat from PTQ"]

    def gap(form: str, method: str) -> float:
        for r in rows:
            label = "qat from PTQ" if r["method"].startswith("qat from") else r["method"]
            if r["form"] == form and label == method and r["gap_points"] is not None:
                return r["gap_points"]
        return np.nan

    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        xs = np.arange(len(forms)) + (k - (len(methods) - 1) / 2) * width
        ax.bar(xs, [gap(f, method) for f in forms], width, label=method)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(forms)), forms)
    ax.set_ylabel("test accuracy - float (points)")
    ax.set_title("Digits CNN: gap to float per form and method (a missing bar: not applicable)")
    ax.legend(ncols=3, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
