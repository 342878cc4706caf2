r"""The ``train-step`` suite: one LM training step per width and variant, float, bfloat16, fake-quant, int8, Qwix.

One :class:`stejax.lm.Transformer` per width (llama layout, rotary, SwiGLU,
:data:`DEPTH` blocks, head width 128 or less, MLP hidden :math:`\approx 8d/3`
in multiples of 128), one jitted step each (``jax.value_and_grad`` of the mean
cross-entropy, then ``optax.adamw``), with every variant sharing one set of
parameter arrays and, where the parameter trees agree, one optimiser state (so
a 2048-wide model and its Adam state are held once, not once per variant):

* ``float32``: the float model;
* ``bfloat16``: the same float32 parameters cast to bfloat16 inside the loss
  (bfloat16 products and activations, float32 master weights and Adam);
* ``stejax fake-quant``: ``quantize_lm(model, "w8a8")``, float products of the
  fake-quantised operands;
* ``stejax int8 forward``: ``w8a8`` with ``product="int8-forward"``;
* ``stejax int8 fwd+bwd``: ``w8a8_int8``, int8 forward and backward products;
* ``qwix int8``: Qwix's QAT, ``QtRule(weight_qtype=int8, act_qtype=int8,
  act_batch_axes=(0, 1))`` on the same sites;
* ``qwix QT``: the same rule with ``bwd_qtype=int8`` (Qwix's int8 backward
  products).

Quantised sites: the block linears (q, k, v, o, gate, up, down), as
:data:`stejax.lm._configs.SITES`; the embedding, the head and the attention
products stay float in every variant. Each step is compiled once, ahead of
time, with the persistent compilation cache off (its compile time is recorded), and its compiled HLO is searched for
int8 products (``s8`` operands of a ``dot`` or ``convolution``): the count
proves which products ran in integers. The steps are then timed side by side
by :func:`stejax.bench.compare` (interleaved rounds, medians; ratios per
round).

The results file, written with ``stejax bench --results DIR`` (the documentation's
are in ``docs/results``), is ``train_step.json`` on a TPU, ``train_step_cpu.json``
on a CPU (``train_step_<backend>.json`` elsewhere). A run that measures some widths
keeps the file's rows of the others when the file was measured on the same device,
so each width can run in its own process.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp

from stejax._compile_cache import persistent_cache_off
from stejax.bench._measure import compare, standard_promotion

__all__ = ["DEPTH", "VARIANTS", "model_config", "step_function", "train_step_suite", "variant_models"]

DEPTH = 4
VARIANTS = (
    "float32",
    "bfloat16",
    "stejax fake-quant",
    "stejax int8 forward",
    "stejax int8 fwd+bwd",
    "qwix int8",
    "qwix QT",
)
TPU_WIDTHS = (512, 1024, 2048)
CPU_WIDTHS = (64, 128)
# Tokens per step: batch x context.
TPU_SHAPE = (16, 512)
CPU_SHAPE = (4, 64)
TARGETS = {  # the int8 fwd+bwd step against float32, and against Qwix's QT mode, at each width (TPU)
    1024: (0.85, 0.85),
    2048: (0.65, 0.70),
}

COLUMNS = [
    ("width", "width"),
    ("params_m", "params (M)", "{:.1f}"),
    ("variant", "variant"),
    ("step_ms", "step ms (p50)", "{:.2f}"),
    ("vs_float32", "÷ float32", "{:.3f}"),
    ("vs_bfloat16", "÷ bfloat16", "{:.3f}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("int8_dots", "int8 dots (HLO)"),
]


def model_config(width: int, context: int) -> Any:
    """The suite's architecture at ``width``: llama layout, :data:`DEPTH` blocks, head width <= 128."""
    from stejax.lm import LMConfig

    heads = max(1, width // 128)
    hidden = max(128, round(8 * width / 3 / 128) * 128)
    return LMConfig(context=context, width=width, depth=DEPTH, heads=heads, hidden=hidden, norms="llama")


def int8_dot_count(hlo_text: str) -> int:
    """How many ``dot`` or ``convolution`` instructions of a compiled HLO text multiply two ``s8`` operands.

    Operand types are read from the operands' definitions in the same computation (compiled HLO prints
    operands by name), or from the operand list where it carries them.

    Example:
      >>> text = '''%f (p0: s8[8,16], p1: s8[16,4]) -> s32[8,4] {
      ...   %p0 = s8[8,16]{1,0} parameter(0)
      ...   %p1 = s8[16,4]{1,0} parameter(1)
      ...   ROOT %d = s32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
      ... }'''
      >>> int8_dot_count(text)
      1
    """
    count = 0
    for block in re.split(r"\n(?=\S)", hlo_text):  # one computation per unindented header
        types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", block))
        for operands in re.findall(r"= \w+\[[^\]]*\]\S* (?:dot|convolution)\(([^)]*)\)", block):
            named = re.findall(r"(?:(\w+)\[[^\]]*\]\S* )?%([\w.\-]+)", operands)
            kinds = [given or types.get(name) for given, name in named]
            if len(kinds) == 2 and all(k == "s8" for k in kinds):
                count += 1
    return count


def _qwix(model: Any, backward: bool) -> Any:
    import qwix

    from stejax.lm._configs import SITES

    extra = {"bwd_qtype": jnp.int8} if backward else {}
    rule = qwix.QtRule(module_path=SITES, weight_qtype=jnp.int8, act_qtype=jnp.int8, act_batch_axes=(0, 1), **extra)
    with standard_promotion():
        return qwix.quantize_model(model, qwix.QtProvider([rule]), jnp.zeros((1, 8), jnp.uint8))


def variant_models(float_model: Any, variants: Sequence[str]) -> dict[str, Any]:
    """The model of each variant (a name of :data:`VARIANTS`), all sharing ``float_model``'s parameter values."""
    from stejax.lm import lm_quant, quantize_lm

    build = {
        "float32": lambda: float_model,
        "bfloat16": lambda: float_model,
        "stejax fake-quant": lambda: quantize_lm(float_model, "w8a8"),
        "stejax int8 forward": lambda: quantize_lm(float_model, lm_quant("w8a8", product="int8-forward")),
        "stejax int8 fwd+bwd": lambda: quantize_lm(float_model, "w8a8_int8"),
        "qwix int8": lambda: _qwix(float_model, backward=False),
        "qwix QT": lambda: _qwix(float_model, backward=True),
    }
    return {v: build[v]() for v in variants}


def step_function(model: Any, label: str) -> tuple[Any, Any, Any]:
    """(step, params, optimizer) of one variant: ``step(params, opt_state, x, y) -> (params, opt_state, loss)``.

    The step is ``jax.value_and_grad`` of the mean cross-entropy, then ``optax.adamw(1e-3)``; for
    ``"bfloat16"`` the float32 parameters are cast to bfloat16 inside the loss.
    """
    import optax
    from flax import nnx

    optimizer = optax.adamw(1e-3)
    graphdef, params, rest = cast(tuple[Any, Any, Any], nnx.split(model, nnx.Param, ...))
    half = label == "bfloat16"

    def loss_fn(params, x, y):
        if half:
            params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        logits = nnx.merge(graphdef, params, rest)(x)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y))

    def step(params, opt_state, x, y):
        with standard_promotion():
            value, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

    return step, params, optimizer


def _steps(models: dict[str, Any], x: jax.Array, y: jax.Array) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A compiled step per variant (one shared optimiser state where the trees agree), and per-variant facts."""
    calls: dict[str, Any] = {}
    facts: dict[str, dict[str, Any]] = {}
    states: list[tuple[Any, Any]] = []  # (tree structure, optimiser state) shared by variants
    for label, model in models.items():
        step, params, optimizer = step_function(model, label)
        structure = jax.tree.structure(params)
        state = next((s for t, s in states if t == structure), None)
        if state is None:
            state = optimizer.init(params)
            states.append((structure, state))
        start = time.perf_counter()
        try:
            # A real compilation each time (its time is a figure), and no cache entry to compress and write.
            with standard_promotion(), persistent_cache_off():
                compiled = jax.jit(step).trace(params, state, x, y).lower().compile()
        except jax.errors.JaxRuntimeError as error:  # e.g. RESOURCE_EXHAUSTED: the step does not fit the device
            facts[label] = {"compile_s": None, "int8_dots": None, "error": " ".join(str(error).split())[:300]}
            continue
        seconds = time.perf_counter() - start
        facts[label] = {"compile_s": seconds, "int8_dots": int8_dot_count(compiled.as_text())}
        calls[label] = lambda c=compiled, p=params, s=state: c(p, s, x, y)
    return calls, facts


def results_path(results_dir: str | Path) -> Path:
    """``train_step.json`` on a TPU, ``train_step_cpu.json`` on a CPU, ``train_step_<backend>.json`` elsewhere."""
    backend = jax.default_backend()
    return Path(results_dir) / ("train_step.json" if backend == "tpu" else f"train_step_{backend}.json")


def _figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from stejax.bench.results import Figure

    by = {(r["width"], r["variant"]): r for r in rows}
    tpu = jax.default_backend() == "tpu"
    out: dict[str, Figure] = {}
    for width in sorted({r["width"] for r in rows}):
        mine = by.get((width, "stejax int8 fwd+bwd"))
        if mine is None:
            continue
        target = TARGETS.get(width) if tpu else None
        vs_float = mine.get("vs_float32")
        if vs_float is not None:
            out[f"int8_vs_float32_w{width}"] = Figure(
                vs_float,
                f"{vs_float:.3f}×",
                target=None if target is None else f"≤ {target[0]}×",
                met=None if target is None else vs_float <= target[0],
            )
        vs_qt = mine.get("vs_qwix_qt")
        if vs_qt is not None:
            out[f"int8_vs_qwix_qt_w{width}"] = Figure(
                vs_qt,
                f"{vs_qt:.3f}×",
                target=None if target is None else f"≤ {target[1]}×",
                met=None if target is None else vs_qt <= target[1],
            )
    return out


def train_step_suite(
    *,
    repeats: int,
    warmup: int,
    quick: bool,
    widths: Sequence[int] | None = None,
    variants: Sequence[str] = VARIANTS,
    results_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run the suite; return its part of ``bench.json`` (``groups``, ``rows``, ``figures``).

    ``widths``: default 512, 1024, 2048 on a TPU, 64 and 128 on a CPU (``quick``:
    32, with 2 blocks, 2 x 32 tokens). Qwix's variants are left out (with a note)
    when Qwix is not installed. Writes the results file (see the module's
    docstring) into ``results_dir`` when it is given (not with ``quick``).
    """
    from flax import nnx

    from stejax.bench.results import Recorder
    from stejax.lm import Transformer

    tpu = jax.default_backend() == "tpu"
    if widths is None:
        widths = (32,) if quick else (TPU_WIDTHS if tpu else CPU_WIDTHS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"train_step_suite: unknown variant {unknown[0]!r}; expected among {list(VARIANTS)}.")
    notes: list[str] = []
    try:
        import qwix  # noqa: F401
    except ImportError:
        variants = [v for v in variants if not v.startswith("qwix")]
        notes.append("Qwix is not installed (pip install 'stejax[peers]'): its variants were left out.")
    batch, context = (2, 32) if quick else (TPU_SHAPE if tpu else CPU_SHAPE)
    flags = " ".join(f"--width {w}" for w in widths)
    command = (
        f"stejax bench --suite train-step {flags} --repeats {repeats} --warmup {warmup} --out bench-out "
        "--results docs/results"
    )
    name = "train_step" if results_dir is None else results_path(results_dir).stem  # the file's name, per device
    recorder = Recorder(name, command=command)
    groups: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for width in widths:
        config = model_config(width, context)
        if quick:
            config = config.replace(depth=2)
        tokens = jax.random.randint(jax.random.key(0), (batch, context + 1), 0, 256).astype(jnp.uint8)
        x, y = tokens[:, :-1], tokens[:, 1:].astype(jnp.int32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            float_model = Transformer(config, rngs=nnx.Rngs(params=0))
            params_m = sum(p.size for p in jax.tree.leaves(nnx.state(float_model, nnx.Param))) / 1e6
            calls, facts = _steps(variant_models(float_model, variants), x, y)
        notes += sorted(
            {f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught}
        )
        bases = [b for b in ("float32", "bfloat16") if b in calls]
        ratios: list[tuple[str, str]] = [(v, b) for b in bases for v in calls if v != b]
        if "qwix QT" in calls and "stejax int8 fwd+bwd" in calls:
            ratios.append(("stejax int8 fwd+bwd", "qwix QT"))
        group = compare(
            f"LM training step, width {width}",
            calls,
            repeats=repeats,
            warmup=warmup,
            ratios=ratios,
            info={
                "model": config.to_dict(),
                "params_m": params_m,
                "tokens": [batch, context],
                "optimizer": "optax.adamw(1e-3)",
                "facts": facts,
            },
        )
        groups.append(group)
        for v, fact in facts.items():
            if "error" in fact:
                notes.append(f"width {width}, {v}: not measured: {fact['error']}")
                rows.append(
                    {
                        "width": width,
                        "params_m": round(params_m, 2),
                        "tokens": batch * context,
                        "variant": v,
                        "step_ms": None,
                        "vs_float32": None,
                        "vs_bfloat16": None,
                        "vs_qwix_qt": None,
                        "compile_s": None,
                        "int8_dots": None,
                        "error": fact["error"],
                    }
                )
        for v in calls:
            ratio = group["ratios"]
            rows.append(
                {
                    "width": width,
                    "params_m": round(params_m, 2),
                    "tokens": batch * context,
                    "variant": v,
                    "step_ms": group["variants"][v]["stats_ms"]["p50_ms"],
                    "vs_float32": ratio.get(f"{v}/float32", {}).get("p50", 1.0 if v == "float32" else None),
                    "vs_bfloat16": ratio.get(f"{v}/bfloat16", {}).get("p50", 1.0 if v == "bfloat16" else None),
                    "vs_qwix_qt": ratio.get(f"{v}/qwix QT", {}).get("p50"),
                    "compile_s": round(facts[v]["compile_s"], 2),
                    "int8_dots": facts[v]["int8_dots"],
                }
            )
        del calls, float_model  # free this width's arrays before the next
        if results_dir is not None and not quick:
            _write(recorder, results_dir, rows)
    return {
        "groups": groups,
        "rows": rows,
        "figures": {k: f.to_dict() for k, f in _figures(rows).items()},
        "notes": notes,
    }


def _write(recorder: Any, results_dir: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write the rows, keeping the file's rows of other widths when it was measured on this device."""
    from stejax.bench._machine import machine_info

    path = results_path(results_dir)
    kept: list[dict[str, Any]] = []
    device = machine_info()["device"]
    if path.is_file():
        old = json.loads(path.read_text("utf-8"))
        if old.get("machine", {}).get("device") == device:
            widths = {r["width"] for r in rows}
            kept = [r for r in old.get("rows", []) if r.get("width") not in widths]
    merged = sorted([*kept, *rows], key=lambda r: (r["width"], VARIANTS.index(r["variant"])))
    recorder.write(
        path,
        rows=merged,
        columns=COLUMNS,
        figures=_figures(merged),
        notes=(
            "One jitted training step (forward, backward, optax.adamw) of stejax.lm.Transformer "
            f"({DEPTH} blocks, llama layout), median of interleaved rounds; ratios are medians of per-round ratios "
            "measured in the same process. int8 dots: dot or convolution instructions with int8 operands in the "
            "compiled step. Widths measured in separate processes share only the device."
        ),
    )
