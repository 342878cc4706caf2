"""stejax.ptq beside qwix.contrib: GPTQ, AWQ and SmoothQuant on one trained NNX MLP, the same calibration rows.

One float ``nnx`` MLP (64 -> 256 -> 256 -> 256 -> 10, ReLU) is trained on the
digits (Adam, batch 64, cosine schedule from 3e-3, ``--steps`` steps; inputs
standardised on the training split). Every one of its four linear layers is
then quantised, with no training, by each library from the same calibration
rows: ``--calibration-rows`` rows of the training split drawn by
``jax.random.key(--seed)`` (as ``stejax ptq`` draws them), given to both as
one batch.

Forms and methods:

* ``w4``: int4 weights, one scale per output channel, inputs float, by
  round-to-nearest (the floor), GPTQ and AWQ;
* ``w8a8``: int8 weights per output channel and 8-bit inputs, by
  round-to-nearest and SmoothQuant (alpha 0.5).

The grid is matched: stejax's symmetric absmax grid has the step
``max|w| / 7`` and codes in [-7, 7]; Qwix's default int4 step is
``max|w| / 7.5`` with codes in [-8, 7], so Qwix is given
``weight_calibration_method="absmax,<7.5/7>"``, which makes its step
``max|w| / 7`` (int8: ``127.5/127``). GPTQ: dampening 0.01 of the mean diagonal,
lazy blocks of 128, no act-order (Qwix has none). AWQ: 20 exponents on
``linspace(0, 1, 20)`` for both. What still differs (the page ``docs/ptq.md``
lists it): stejax gathers each layer's inputs through the layers already
quantised, Qwix from one pass over the float model; Qwix's GPTQ zeroes the
weights of inputs that are always zero; Qwix's AWQ scores an exponent by the
weight error weighted by the mean |x| per channel, stejax's by the output error
on the calibration inputs; Qwix's SmoothQuant inference provider multiplies the
smoothed float inputs by the dequantised int8 weights (its inputs are not
quantised), stejax's rounds the inputs to 8 bits with a static per-tensor scale.

Per library and method: test accuracy and its gap to float, the relative
layer-output error of the quantised weights on held-out inputs (the
validation split's inputs to each layer in the float model,
``sum ||x (W - W_q)||^2 / sum ||x W||^2``, averaged over the four layers),
and the seconds from the float model and the calibration rows to the
quantised model: one warm-up, then ``--repeats`` rounds, the two libraries
interleaved (the order alternating), the median reported.

    python benchmarks/ptq_peers.py --results docs/results
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from stejax.bench.results import Figure, Recorder
from stejax.flax import Quant, Rule
from stejax.ptq import awq, quantize_ptq, smooth

WIDTHS = (64, 256, 256, 256, 10)
BLOCK = 128
DAMP = 0.01
N_GRID = 20
ALPHA = 0.5
# A method: (form, weight bits, whether the inputs are quantised).
FORMS = {"w4": (4, False), "w8a8": (8, True)}
METHODS = (("w4", "rtn"), ("w4", "gptq"), ("w4", "awq"), ("w8a8", "rtn"), ("w8a8", "smoothquant"))
LIBRARIES = ("stejax", "qwix")
TARGETED = ("gptq", "awq")  # the methods with targets: accuracy equal or better, time at most 1.5x Qwix's


class InputScale(nnx.Variable):
    """A constant the inputs of a linear layer are multiplied by: ones, or 1/s after SmoothQuant."""


class MLP(nnx.Module):
    """ReLU MLP whose linear layer ``i`` takes its inputs times ``input_scales[i]`` (ones in the float model)."""

    def __init__(self, widths: Sequence[int], *, rngs: nnx.Rngs):
        pairs = list(itertools.pairwise(widths))
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in pairs])
        self.input_scales = nnx.List([InputScale(jnp.ones(a, jnp.float32)) for a, _ in pairs])

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, (layer, scale) in enumerate(zip(self.layers, self.input_scales, strict=True)):
            x = layer((x if i == 0 else nnx.relu(x)) * scale[...][None, :])
        return x


def layer_inputs(model: MLP, x: jax.Array) -> list[jax.Array]:
    """The inputs each linear layer of a float (or weight-rounded) MLP receives, before its input scale."""
    out = []
    for i, (layer, scale) in enumerate(zip(model.layers, model.input_scales, strict=True)):
        u = x if i == 0 else nnx.relu(x)
        out.append(u)
        x = layer(u * scale[...][None, :])
    return out


def copy(model: nnx.Module) -> Any:
    """A model with variables of its own (both libraries' NNX paths write into the model they are given)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda a: jnp.array(a, copy=True), state))


def train_float(data: tuple[np.ndarray, np.ndarray], widths: Sequence[int], steps: int, seed: int) -> MLP:
    """``steps`` Adam steps, batch 64, cosine schedule from 3e-3; initialisation and batch order from ``seed``."""
    model = MLP(widths, rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adam(optax.cosine_decay_schedule(3e-3, steps)), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss(model):
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model(x), y))

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    rng = np.random.default_rng(seed)
    x, y = data
    for _ in range(steps):
        rows = rng.choice(len(x), 64, replace=False)
        value = step(model, optimizer, jnp.asarray(x[rows]), jnp.asarray(y[rows]))
    if not np.isfinite(float(value)):
        raise FloatingPointError(f"train_float: the last loss is {float(value)}.")
    return model


# ---------------------------------------------------------------------------------------------------------------
# stejax


def stejax_rules(form: str) -> list[Rule]:
    bits, inputs = FORMS[form]
    weights = Quant("fake_quant", bits=bits, axis=-1, scale="static")
    return [Rule(weights=weights, inputs=Quant("fake_quant", bits=8, scale="static") if inputs else None)]


def stejax_quantise(model: MLP, calibration: jax.Array, form: str, method: str) -> Any:
    """stejax's PTQ of the MLP: GPTQ and RTN by rules (quantize_ptq), AWQ and SmoothQuant by layer."""
    bits, _ = FORMS[form]
    if method in ("rtn", "gptq"):
        return quantize_ptq(
            model, stejax_rules(form), [calibration], method=method, damp=DAMP, block_size=BLOCK, act_order=False
        )
    work = copy(model)
    if method == "awq":  # weight-only: the folded kernel Q(diag(s) W) / s is the quantised layer
        for i, layer in enumerate(work.layers):
            u = layer_inputs(work, calibration)[i]  # through the layers already rounded
            out = awq(layer.kernel[...], u, bits=bits, n_grid=N_GRID, name=f"layers/{i}")
            layer.kernel[...] = out.kernel / out.input_scales[:, None]
        return work
    if method == "smoothquant":  # the float product is unchanged; then RTN with 8-bit weights and inputs
        for layer, scale, u in zip(work.layers, work.input_scales, layer_inputs(work, calibration), strict=True):
            out = smooth(layer.kernel[...], u, alpha=ALPHA)
            layer.kernel[...] = out.kernel
            scale[...] = 1.0 / out.scales
        return quantize_ptq(work, stejax_rules(form), [calibration], method="rtn")
    raise ValueError(f"stejax_quantise: no method {method!r}.")


def stejax_kernels(qmodel: Any) -> list[jax.Array]:
    """The effective float kernels: what each layer multiplies its unscaled inputs by."""
    return [s[...][:, None] * layer.kernel[...] for layer, s in zip(qmodel.layers, qmodel.input_scales, strict=True)]


# ---------------------------------------------------------------------------------------------------------------
# qwix.contrib


def qwix_calibration(bits: int) -> str:
    """Qwix's absmax calibration with stejax's step ``max|w| / q_max`` (Qwix's own: ``max|w| / (q_max + 1/2)``)."""
    q_max = 2 ** (bits - 1) - 1
    return f"absmax,{(q_max + 0.5) / q_max!r}"


def qwix_rule_fields(form: str, *, matched: bool = True) -> dict[str, Any]:
    bits, inputs = FORMS[form]
    fields: dict[str, Any] = {"module_path": "layers/.*", "weight_qtype": jnp.int4 if bits == 4 else jnp.int8}
    if inputs:
        fields["act_qtype"] = jnp.int8
    if matched:
        fields["weight_calibration_method"] = qwix_calibration(bits)
    return fields


def qwix_quantise(model: MLP, calibration: jax.Array, form: str, method: str, *, matched: bool = True) -> Any:
    """qwix.contrib's PTQ of the MLP, as its tests run it on an NNX model: calibrate, quantise the params, update."""
    import qwix
    from qwix._src.utils import flax_util
    from qwix.contrib import awq as qwix_awq
    from qwix.contrib import gptq as qwix_gptq
    from qwix.contrib import smooth_quant

    fields = qwix_rule_fields(form, matched=matched)
    if method == "rtn":
        return qwix.quantize_model(copy(model), qwix.PtqProvider([qwix.QuantizationRule(**fields)]), calibration)
    kinds: dict[str, tuple[Any, Any, Any, Callable[..., Any], dict[str, Any]]] = {
        "gptq": (
            qwix_gptq.GptqRule,
            qwix_gptq.GptqCalibrationProvider,
            qwix.PtqProvider,
            qwix_gptq.quantize_params,
            {"gptq_block_size": BLOCK, "gptq_damping_factor": DAMP},
        ),
        "awq": (
            qwix_awq.AwqRule,
            qwix_awq.AwqCalibrationProvider,
            qwix_awq.AwqInferenceProvider,
            qwix_awq.quantize_params,
            {"n_grid": N_GRID},
        ),
        "smoothquant": (
            smooth_quant.SqRule,
            smooth_quant.SqCalibrationProvider,
            smooth_quant.SqInferenceProvider,
            smooth_quant.quantize_params,
            {},
        ),
    }
    rule_type, calibration_provider, inference_provider, quantize_params, options = kinds[method]
    extra = {"alpha": ALPHA} if method == "smoothquant" else {"n_grid": N_GRID} if method == "awq" else {}
    rules = [rule_type(**fields, **extra)]
    calibrating = qwix.quantize_model(copy(model), calibration_provider(rules), calibration)
    calibrating(calibration)
    params = nnx.to_pure_dict(nnx.state(calibrating, nnx.Param))
    stats = nnx.to_pure_dict(
        nnx.state(calibrating, flax_util.QuantStat),
        extract_fn=lambda v: v if isinstance(v, flax_util.QuantStat) else v.get_value(),
    )
    abstract = qwix.quantize_model(copy(model), qwix.PtqProvider([qwix.QuantizationRule(**fields)]), calibration)
    quantised = quantize_params(params, abstract, stats, **options)
    out = abstract if method == "gptq" else qwix.quantize_model(copy(model), inference_provider(rules), calibration)
    if method != "awq":
        nnx.update(out, quantised)
        return out
    for i, layer in enumerate(out.layers):
        # quantize_params gives an NNX model's AWQ kernels as plain dicts, which nnx.update cannot put in place of
        # the WithAux kernels; rebuilt as the WithAwqScale that AwqInferenceProvider reads.
        kernel = quantised["layers"][i]["kernel"]
        layer.kernel = qwix_awq.WithAwqScale(
            array=type(layer.kernel.array)(
                qvalue=nnx.Param(kernel["array"]["qvalue"]),
                scale=nnx.Param(kernel["array"]["scale"]),
                zero_point=None,
                qtype=layer.kernel.array.qtype,
            ),
            awq_scale=nnx.Param(kernel["awq_scale"]),
            contracting_axis=0,
            how=layer.kernel.how,
        )
        layer.bias[...] = quantised["layers"][i]["bias"]
    return out


def _unboxed(kernel: Any) -> Any:
    # SqInferenceProvider leaves the kernel an nnx.Param and nnx.update puts the WithSqScale inside it.
    return kernel.get_value() if isinstance(kernel, nnx.Variable) else kernel


def qwix_kernels(qmodel: Any) -> list[jax.Array]:
    """The effective float kernels of a qwix.contrib model: dequantised, AWQ's scales divided out, SQ's folded in."""
    from qwix._src.core import qarray
    from qwix.contrib import awq as qwix_awq
    from qwix.contrib import smooth_quant

    def value(tree: Any) -> Any:
        return jax.tree.map(
            lambda v: v.get_value() if isinstance(v, nnx.Variable) else v,
            tree,
            is_leaf=lambda v: isinstance(v, nnx.Variable),
        )

    out = []
    for layer in qmodel.layers:
        kernel = _unboxed(layer.kernel)
        w = qarray.dequantize(value(kernel.array))
        if isinstance(kernel, qwix_awq.WithAwqScale):
            w = w / value(kernel.awq_scale)[:, None]
        elif isinstance(kernel, smooth_quant.WithSqScale):
            w = w * value(kernel.inv_sq_scale)[:, None]
        out.append(w)
    return out


def quantised_layers(float_model: MLP, kernels: Sequence[jax.Array]) -> list[str]:
    """The paths of the linear layers whose effective kernel is not the float kernel."""
    return [
        f"layers/{i}"
        for i, (layer, w) in enumerate(zip(float_model.layers, kernels, strict=True))
        if not bool(jnp.array_equal(layer.kernel[...], w))
    ]


# ---------------------------------------------------------------------------------------------------------------
# measurement


def accuracy(model: Any, data: tuple[np.ndarray, np.ndarray]) -> float:
    logits = model(jnp.asarray(data[0]))
    return float(jnp.mean(jnp.argmax(logits, axis=-1) == jnp.asarray(data[1])))


def layer_errors(float_model: MLP, kernels: Sequence[jax.Array], held_out: jax.Array) -> list[float]:
    """Per layer, ``sum ||x (W - W_q)||^2 / sum ||x W||^2`` over the float model's inputs to it on ``held_out``."""
    out = []
    for layer, u, w_q in zip(float_model.layers, layer_inputs(float_model, held_out), kernels, strict=True):
        w = layer.kernel[...]
        hi = jax.lax.Precision.HIGHEST
        d = jnp.matmul(u, w - w_q, precision=hi)
        y = jnp.matmul(u, w, precision=hi)
        out.append(float(jnp.sum(d * d) / jnp.sum(y * y)))
    return out


QUANTISE = {"stejax": stejax_quantise, "qwix": qwix_quantise}
KERNELS = {"stejax": stejax_kernels, "qwix": qwix_kernels}


def timed(library: str, model: MLP, calibration: jax.Array, form: str, method: str) -> tuple[Any, float]:
    start = time.perf_counter()
    qmodel = QUANTISE[library](model, calibration, form, method)
    jax.block_until_ready(nnx.state(qmodel))
    seconds = time.perf_counter() - start
    print(f"  {form} {method} {library}: {seconds:.3f} s", flush=True)
    return qmodel, seconds


def compare(
    model: MLP, calibration: jax.Array, form: str, method: str, *, repeats: int
) -> dict[str, tuple[Any, list[float]]]:
    """Both libraries' quantised models and their timed seconds: one warm-up each, then interleaved rounds."""
    models: dict[str, Any] = {}
    seconds: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for lib in LIBRARIES:  # warm-up: compilation and first-call costs
        models[lib], _ = timed(lib, model, calibration, form, method)
    for r in range(repeats):
        for lib in LIBRARIES if r % 2 == 0 else LIBRARIES[::-1]:
            models[lib], s = timed(lib, model, calibration, form, method)
            seconds[lib].append(s)
    return {lib: (models[lib], seconds[lib]) for lib in LIBRARIES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--steps", type=int, default=2000, help="Adam steps of the float MLP")
    parser.add_argument("--calibration-rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per library, after one warm-up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    recorder = Recorder("ptq_peers", command="python benchmarks/ptq_peers.py " + " ".join(argv or sys.argv[1:]))
    warnings.simplefilter("ignore")  # Flax warns while Qwix intercepts its modules
    import qwix

    from stejax.data import Normalizer, load_digits, split

    splits = split(load_digits(), seed=args.seed)
    norm = Normalizer.fit(splits.train.x)

    def xy(part: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(norm.apply(part.x), np.float32), np.asarray(part.y)

    train, val, test = xy(splits.train), xy(splits.val), xy(splits.test)
    start = time.perf_counter()
    model = train_float(train, WIDTHS, args.steps, args.seed)
    train_seconds = time.perf_counter() - start
    draw = np.sort(np.asarray(jax.random.permutation(jax.random.key(args.seed), len(train[0]))))
    calibration = jnp.asarray(train[0][draw[: args.calibration_rows]])
    held_out = jnp.asarray(val[0])
    float_acc = accuracy(model, test)
    print(f"float: test {100 * float_acc:.2f}% after {train_seconds:.0f} s", flush=True)

    rows: list[dict[str, Any]] = []
    for form, method in METHODS:
        measured = compare(model, calibration, form, method, repeats=args.repeats)
        kernels = {lib: KERNELS[lib](measured[lib][0]) for lib in LIBRARIES}
        layers = {lib: quantised_layers(model, kernels[lib]) for lib in LIBRARIES}
        medians = {lib: statistics.median(measured[lib][1]) for lib in LIBRARIES}
        for lib in LIBRARIES:
            qmodel, seconds = measured[lib]
            acc = accuracy(qmodel, test)
            errors = layer_errors(model, kernels[lib], held_out)
            note = None
            if lib == "qwix" and method == "smoothquant":
                note = "inputs not quantised: SqInferenceProvider multiplies float inputs by the int8 weights"
            rows.append(
                {
                    "form": form,
                    "method": method,
                    "library": lib,
                    "test_accuracy": 100 * acc,
                    "gap_points": 100 * (acc - float_acc),
                    "layer_error": statistics.mean(errors),
                    "layer_errors": errors,
                    "seconds": medians[lib],
                    "seconds_all": seconds,
                    "ratio": medians["stejax"] / medians["qwix"] if lib == "stejax" else None,
                    "layers": layers[lib],
                    "note": note,
                }
            )
            print({k: v for k, v in rows[-1].items() if k not in ("layer_errors", "seconds_all")}, flush=True)

    def row(form: str, method: str, lib: str) -> dict[str, Any]:
        return next(r for r in rows if (r["form"], r["method"], r["library"]) == (form, method, lib))

    figures: dict[str, Figure] = {
        "float_accuracy": Figure(100 * float_acc, f"{100 * float_acc:.1f}%", note="the float MLP's test accuracy"),
    }
    for form, method in METHODS:
        s, q = row(form, method, "stejax"), row(form, method, "qwix")
        key = f"{form}_{method}"
        diff = s["test_accuracy"] - q["test_accuracy"]
        judged = method in TARGETED
        figures[f"{key}_accuracy"] = Figure(
            diff,
            f"{diff:+.2f} points (stejax {s['test_accuracy']:.2f}%, Qwix {q['test_accuracy']:.2f}%)",
            target="stejax ≥ Qwix − 0.2 points" if judged else None,
            met=bool(diff >= -0.2) if judged else None,
        )
        figures[f"{key}_time"] = Figure(
            s["ratio"],
            f"{s['ratio']:.2f}× ({s['seconds']:.3f} s against {q['seconds']:.3f} s)",
            target="≤ 1.5× Qwix's" if judged else None,
            met=bool(s["ratio"] <= 1.5) if judged else None,
        )
    figures["same_layers"] = Figure(
        str(all(r["layers"] == row(r["form"], r["method"], "qwix")["layers"] for r in rows)),
        "both libraries quantise the same four linear layers"
        if all(r["layers"] == row(r["form"], r["method"], "qwix")["layers"] for r in rows)
        else "the libraries quantise different layers",
    )
    args.results.mkdir(parents=True, exist_ok=True)
    recorder.write(
        args.results / "ptq_peers.json",
        rows=rows,
        columns=[
            ("form", "form"),
            ("method", "method"),
            ("library", "library"),
            ("test_accuracy", "test %", "{:.2f}"),
            ("gap_points", "gap to float (points)", "{:+.2f}"),
            ("layer_error", "layer-output error", "{:.2e}"),
            ("seconds", "quantisation s (median)", "{:.3f}"),
            ("ratio", "stejax / Qwix time", "{:.2f}×"),
            ("note", "note"),
        ],
        figures=figures,
        notes=(
            f"The float MLP {'-'.join(map(str, WIDTHS))} ({args.steps} Adam steps, {train_seconds:.0f} s) scores "
            f"{100 * float_acc:.2f}% on the test split ({len(test[1])} digits; one digit is "
            f"{100 / len(test[1]):.2f} points). Calibration: {args.calibration_rows} training rows, one batch, seed "
            f"{args.seed}, the same for both. The layer-output error is the mean over the four layers of "
            "sum ||x (W - W_q)||^2 / sum ||x W||^2 on the validation split's inputs to each layer in the float model "
            "(weights only: input rounding is not in it). Seconds: from the float model and the calibration rows to "
            f"the quantised model, median of {args.repeats} rounds after one warm-up, the libraries interleaved; "
            f"stejax compiles its per-layer work with jit, Qwix {qwix.__version__} runs eagerly."
        ),
    )


if __name__ == "__main__":
    main()
