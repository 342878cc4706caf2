"""The language model at the sizes users train: float and low-bit runs from scratch on the wheel corpus.

Run part by part on an accelerator (each part one training run; several parts fit in one command under a
time limit), logging one JSON line per finished run, then merge the logs into the results file and its plot:

    make corpus                                                         # .corpus/bytes, from pinned wheels
    python benchmarks/lm_scale.py run --corpus .corpus/bytes --log lm_scale.jsonl --part 25M-float-s0
    python benchmarks/lm_scale.py references --corpus .corpus/bytes --log lm_scale.jsonl
    python benchmarks/lm_scale.py merge --log lm_scale.jsonl --results docs/results --plot docs/img/lm_scale.png

Every run trains :func:`stejax.lm.lm_size`'s architecture from scratch on the training split (the same
windows for every configuration of a seed), chooses nothing on the test split, and is scored at the end on the
first ``--test-bytes`` (2 MiB) of the test split; the references (byte n-grams, zlib, xz) are computed on the
same scored bytes. Learning rates come from the ``sweep-*`` parts, scored on the validation split only. A run
records its bytes trained, wall time on the device, the median step, and the weight bytes of its deployed form.

A ``ptq-SIZE-sSEED`` part quantises the float run ``SIZE-float-sSEED`` after training (it loads that part's final
parameters from ``--checkpoints``, or trains and logs that part first): every form of :data:`stejax.lm.PTQ_FORMS`
(int4 weights per group of 32 and per channel, w4a8, w8a8, ternary) by round-to-nearest, GPTQ
(:func:`stejax.ptq.quantize_ptq`), AWQ and, for the forms with quantised inputs, SmoothQuant (their scales
folded into the norms by :func:`stejax.lm.smooth_lm`, then round-to-nearest), calibrated on 128 windows of the
training split drawn by the seed, the method of each form chosen on the first MiB of the validation split, every
result scored on the test bytes; then QAT continues the chosen w4a8 and ternary results as the w4a8 and w1.58a8
configurations for a quarter of the bytes at their chosen rates. The merge gives GPTQ int4's gap to float and the
share of the PTQ gap QAT closes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Training: 32 windows of 256 bytes a step; the runs see at least 50 MB (6,104 steps).
BATCH = 32
BYTES = 50_000_000
TEST_BYTES = 2 << 20

# Peak learning rates before a sweep: a run takes the best rate of the sweep parts of its size and configuration
# in the log (scored on the validation split); w8a8 and w4a8, which are not swept, take float's.
# The sweep ran at 25M with an untied head; the named sizes tie it since (a 0.5% change of parameters).
LEARNING_RATES = {"float": 1e-3, "w8a8": 1e-3, "w4a8": 1e-3, "w1.58a8": 3e-3}


def chosen_rate(logged: dict[str, dict[str, Any]], size: str, config: str) -> tuple[float, str]:
    """The peak rate of a grid run: the sweep's best on validation (its own configuration's, else float's)."""
    for swept in (config, "float"):
        rows = [r for r in logged.values() if r.get("sweep") and r["size"] == size and r["config"] == swept]
        if rows:
            best = min(rows, key=lambda r: r["bpb"])
            return best["learning_rate"], f"sweep of {swept} ({len(rows)} rates, validation)"
    return LEARNING_RATES[config], "default (no sweep logged)"


# Bits a weight of the quantised linears takes in the deployed form (the codes; scales are counted apart).
_CODE_BITS = {"w8a8": 8, "w4a8": 4, "w1.58a8": 2}


def _part(name: str) -> dict[str, Any]:
    """A part's settings from its name: ``SIZE-CONFIG[-warm]-sSEED``, ``sweep-SIZE-CONFIG-lrRATE``, ``ptq-SIZE-sN``."""
    fields = name.split("-")
    if fields[0] == "ptq":
        _, size, seed = fields
        return {
            "part": name,
            "size": size,
            "config": "ptq",
            "seed": int(seed.removeprefix("s")),
            "float_part": f"{size}-float-{seed}",
            "bytes": BYTES // 4,  # of QAT from the best PTQ result, per configuration
            "warm": False,
            "sweep": False,
            "ptq": True,
        }
    if fields[0] == "sweep":
        _, size, config, rate = name.split("-", 3)  # the rate may hold a "-" (lr1e-3)
        return {
            "part": name,
            "size": size,
            "config": config,
            "seed": 100,
            "learning_rate": float(rate.removeprefix("lr")),
            "bytes": BYTES // 4,
            "warm": False,
            "sweep": True,
        }
    size, config, *rest = fields
    warm = rest[:1] == ["warm"]
    seed = int(rest[-1].removeprefix("s"))
    return {
        "part": name,
        "size": size,
        "config": config,
        "seed": seed,
        "learning_rate": LEARNING_RATES[config],
        "bytes": BYTES,
        "warm": warm,
        "sweep": False,
    }


def _recipe(config: str) -> dict[str, Any]:
    # Ternary: BitNet b1.58's two stages, no weight decay from the midpoint on.
    return {"two_stage": True, "stage_two_weight_decay": 0.0} if config == "w1.58a8" else {}


def deployed_bytes(model_config: Any, config: str, dtype_bytes: int = 2) -> int:
    """Weight bytes of the deployed form: the quantised linears' codes and scales, the rest in ``dtype_bytes``.

    Scales: int8 one float32 per output channel; int4 one float16 per group of 32; ternary one float32 per
    tensor. The embedding, the head and the norms stay in bfloat16 (``dtype_bytes=2``) or float32 (4).
    """
    from stejax.lm import parameter_count

    d, h, depth = model_config.width, model_config.hidden, model_config.depth
    linears = [(d, d)] * 4 + [(d, h), (d, h), (h, d)]  # (inputs, outputs): q, k, v, o, gate, up, down
    linear_weights = depth * sum(i * o for i, o in linears)
    rest = parameter_count(model_config) - linear_weights
    if config == "float":
        return parameter_count(model_config) * dtype_bytes
    codes = linear_weights * _CODE_BITS[config] // 8
    if config == "w8a8":
        scales = depth * sum(4 * o for _, o in linears)
    elif config == "w4a8":
        scales = depth * sum(2 * o * (i // 32) for i, o in linears)
    else:
        scales = depth * 4 * len(linears)
    return codes + scales + rest * dtype_bytes


def _settings(config: str, n: int, rate: float, precision: str, checkpoint: bool = False) -> Any:
    from stejax.lm import TrainSettings

    return TrainSettings(
        steps=n,
        batch_size=BATCH,
        learning_rate=rate,
        warmup=max(1, n // 20),
        eval_every=max(1, n // 10),
        eval_windows=256,
        compute_dtype=precision,
        checkpoint_every=max(1, n // 10) if checkpoint else None,
        **_recipe(config),
    )


def _quantised(model: Any, config: str, product: str) -> Any:
    from stejax.lm import lm_quant, quantize_lm

    cfg = lm_quant(config)
    if product != "fake-quant" and config in ("w8a8", "w1.58a8"):
        cfg = cfg.with_product(product)
    return quantize_lm(model, cfg)


def _train_one(
    part: dict[str, Any],
    corpus: Any,
    product: str,
    precision: str,
    export: Path | None = None,
    checkpoints: Path | None = None,
) -> dict[str, Any]:
    import jax
    import numpy as np
    from flax import nnx

    from stejax import keys
    from stejax.lm import Transformer, bits_per_byte, lm_quant, lm_size, parameter_count, train_lm

    model_config = lm_size(part["size"])
    step_bytes = BATCH * model_config.context
    steps = math.ceil(part["bytes"] / step_bytes)
    k_init, k_train = keys.split(jax.random.key(part["seed"]), where="lm_scale")
    init_seed = int(jax.random.randint(keys.consume(k_init, where="init"), (), 0, 2**31 - 1))
    model: nnx.Module = Transformer(model_config, rngs=nnx.Rngs(params=init_seed))

    def settings(config: str, n: int, rate: float, checkpoint: bool = False) -> Any:
        return _settings(config, n, rate, precision, checkpoint)

    def quantised(model: Any, config: str) -> Any:
        return _quantised(model, config, product)

    started = _Started()
    train, validation = corpus.data["train"], corpus.data["validation"]
    history: list[dict[str, float]] = []
    step_ms: list[float] = []
    tic = time.perf_counter()
    if part["warm"]:
        # A float warm-up for the first 20% of the bytes, then the quantised run on the rest.
        first = steps // 5
        k_float, k_quant = keys.split(k_train, where="warm start")
        result = train_lm(model, train, validation, settings("float", first, part["float_rate"]), key=k_float)
        history += [dict(r, stage="float") for r in result.history]
        step_ms += list(result.step_ms)
        model = quantised(result.model, part["config"])
        result = train_lm(
            model, train, validation, settings(part["config"], steps - first, part["learning_rate"]), key=k_quant
        )
    elif checkpoints is not None:
        # Checkpointed every tenth of the run: a part stopped at a command's time limit continues where its last
        # checkpoint left it (the same parameters as without the stop). The history is the run's metrics.jsonl,
        # the seconds are summed over the commands, the step time is the last command's median.
        if part["config"] != "float":
            model = quantised(model, part["config"])
        out = checkpoints / part["part"]
        spent_file = out / "seconds_before.json"
        before = json.loads(spent_file.read_text())["seconds"] if spent_file.exists() else 0.0
        resumed = (out / "checkpoints").exists()
        result = train_lm(
            model,
            train,
            validation,
            settings(part["config"], steps, part["learning_rate"], checkpoint=True),
            key=k_train,
            out_dir=out,
            resume=True,
        )
        history += [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
        step_ms += list(result.step_ms)
        tic -= before
        part = {**part, "resumed": resumed}
    else:
        if part["config"] != "float":
            model = quantised(model, part["config"])
        result = train_lm(model, train, validation, settings(part["config"], steps, part["learning_rate"]), key=k_train)
    if checkpoints is None or part["warm"]:
        history += list(result.history)
        step_ms += list(result.step_ms)
    seconds = time.perf_counter() - tic
    artifact = None
    if export is not None and part["config"] != "float" and not part["sweep"]:
        # The packed artifact (codes and scales as trained): small enough to carry to llama.cpp's machine.
        from stejax.lm._export import export_lm

        artifact = export_lm(result.model, lm_quant(part["config"]), export / part["part"], extra={"part": part})
    scored = np.asarray(corpus.data["test" if not part["sweep"] else "validation"][:TEST_BYTES])
    return {
        **part,
        "params": parameter_count(model_config),
        "model": model_config.to_dict(),
        "product": product if part["config"] in ("w8a8", "w1.58a8") else "fake-quant",
        "precision": precision,
        "steps": steps,
        "batch": BATCH,
        "train_bytes": steps * step_bytes,
        "train_seconds": seconds,
        "step_ms_median": float(np.median(step_ms)) if step_ms else float("nan"),
        "val_bpb": history[-1]["val_bpb"],
        "score_split": "validation" if part["sweep"] else "test",
        "scored_bytes": int(scored.size),
        "bpb": bits_per_byte(result.model, scored, batch_size=64),
        "deployed_bytes": deployed_bytes(model_config, part["config"]),
        "deployed_bytes_float32": deployed_bytes(model_config, part["config"], 4)
        if part["config"] == "float"
        else None,
        "history": history,
        "device": str(jax.devices()[0].device_kind),
        "corpus_sha256": dict(corpus.sha256),
        "conditions": _conditions(started),
        "artifact": None if artifact is None else str(artifact),
    }


# PTQ of the float run: calibration windows drawn from the training split; each form's method chosen on the
# first VAL_BYTES of the validation split; QAT continues the chosen result of these forms as their configurations.
CALIBRATION_WINDOWS = 128
VAL_BYTES = 1 << 20
# rtn and gptq round the float model; awq and smoothquant first fold their channel scales into its norms
# (stejax.lm.smooth_lm, on the first SMOOTH_WINDOWS calibration windows) and then round it to the nearest
# (SmoothQuant only for the forms with quantised inputs, what it is for).
PTQ_METHODS = ("rtn", "gptq", "awq", "smoothquant")
SMOOTH_WINDOWS = 16
QAT_FROM_PTQ = ("w4a8", "w1.58a8")


def _float_model(
    part: dict[str, Any], corpus: Any, product: str, precision: str, checkpoints: Path, log: str | None
) -> Any:
    """The float run of a PTQ part: its final parameters where a float part left them, else that part trained now.

    A float part run with ``--checkpoints`` writes ``params.safetensors`` at its end; a PTQ part on the same
    machine loads it and trains nothing. Without it the float part runs here (continuing from its checkpoints, if a
    stopped command left some) and its line is logged as the float part's own, unless the log has it already.
    """
    from flax import nnx

    from stejax.lm import Transformer, lm_size, load_checkpoint

    final = checkpoints / part["float_part"] / "params.safetensors"
    if not final.exists():
        float_part = {
            **_part(part["float_part"]),
            "learning_rate": part["float_rate"],
            "float_rate": part["float_rate"],
        }
        float_part["rate_from"] = part["float_rate_from"]
        record = _train_one(float_part, corpus, product, precision, None, checkpoints)
        if log is not None and not already_run(_logged(log), float_part):
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    template = Transformer(lm_size(part["size"]), rngs=nnx.Rngs(params=0))
    return load_checkpoint(template, final)


def _ptq_one(
    part: dict[str, Any],
    corpus: Any,
    product: str,
    precision: str,
    checkpoints: Path,
    log: str | None = None,
) -> dict[str, Any]:
    """Every PTQ form by every method on the float run, the best of each on validation, and QAT from the best.

    Calibration: ``CALIBRATION_WINDOWS`` windows of the training split at starts drawn by the part's seed (one
    batch). Choice: the method of least bits per byte on the first ``VAL_BYTES`` of the validation split. Score:
    the test bytes of every part. QAT: the chosen result of each of ``QAT_FROM_PTQ``, its kernels quantised as
    that configuration (:func:`stejax.lm.quantize_lm`), trained ``part["bytes"]`` bytes at the configuration's
    chosen rate.
    """
    import jax
    import numpy as np
    from flax import nnx

    from stejax import keys
    from stejax.lm import PTQ_FORMS, bits_per_byte, lm_size, ptq_rules, quantised_paths, smooth_lm, train_lm
    from stejax.lm._lowbit import module_at
    from stejax.ptq import quantize_ptq

    started = _Started()
    t0 = tic = time.perf_counter()
    model = _float_model(part, corpus, product, precision, checkpoints, log)
    load_seconds = time.perf_counter() - tic
    model_config = lm_size(part["size"])
    context = model_config.context
    train, validation = corpus.data["train"], corpus.data["validation"]
    k_calibration, k_qat = keys.split(jax.random.key(part["seed"]), where="lm_scale ptq")
    starts = np.asarray(
        jax.random.randint(
            keys.consume(k_calibration, where="calibration windows"),
            (CALIBRATION_WINDOWS,),
            0,
            np.asarray(train).size - context,
        )
    )
    windows = np.stack([np.asarray(train[i : i + context]) for i in np.sort(starts)])
    batches = [jax.numpy.asarray(windows, jax.numpy.uint8)]
    val = np.asarray(validation[:VAL_BYTES])
    scored = np.asarray(corpus.data["test"][:TEST_BYTES])
    float_scores = {
        "val_bpb": bits_per_byte(model, val, batch_size=64),
        "bpb": bits_per_byte(model, scored, batch_size=64),
    }
    forms: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    bases: dict[str, Any] = {}  # the float model each form's chosen result was rounded from
    for form in PTQ_FORMS:
        bits, group, input_bits = PTQ_FORMS[form]
        results: dict[str, Any] = {}
        best = None
        for method in PTQ_METHODS:
            if method == "smoothquant" and input_bits is None:
                continue
            tic = time.perf_counter()
            base = model
            if method in ("awq", "smoothquant"):
                base, _ = smooth_lm(model, batches[0][:SMOOTH_WINDOWS], method=method, bits=bits, group_size=group)
            qmodel = quantize_ptq(base, ptq_rules(form), batches, method="gptq" if method == "gptq" else "rtn")
            jax.block_until_ready(jax.tree.leaves(qmodel))
            seconds = time.perf_counter() - tic
            results[method] = {
                "seconds": seconds,
                "val_bpb": bits_per_byte(qmodel, val, batch_size=64),
                "bpb": bits_per_byte(qmodel, scored, batch_size=64),
            }
            if best is None or results[method]["val_bpb"] < results[best]["val_bpb"]:
                best, chosen[form], bases[form] = method, qmodel, base
        forms[form] = {"methods": results, "best": best}
    qat: dict[str, Any] = {}
    step_bytes = BATCH * context
    steps = math.ceil(part["bytes"] / step_bytes)
    for config in QAT_FROM_PTQ:
        k_qat, key = keys.split(k_qat, where=f"QAT from PTQ, {config}")
        # The chosen PTQ kernels in the float model, quantised as the QAT configuration quantises it.
        start = nnx.clone(bases[config])
        for path in quantised_paths(start):
            module_at(start, path).kernel[...] = module_at(chosen[config], path).kernel[...]
        tic = time.perf_counter()
        result = train_lm(
            _quantised(start, config, product),
            train,
            validation,
            _settings(config, steps, part["learning_rate"][config], precision),
            key=key,
        )
        qat[config] = {
            "from": forms[config]["best"],
            "learning_rate": part["learning_rate"][config],
            "steps": steps,
            "train_bytes": steps * step_bytes,
            "seconds": time.perf_counter() - tic,
            "step_ms_median": float(np.median(result.step_ms)) if result.step_ms else float("nan"),
            "val_bpb": bits_per_byte(result.model, val, batch_size=64),
            "bpb": bits_per_byte(result.model, scored, batch_size=64),
            "history": list(result.history),
        }
    return {
        **part,
        "model": model_config.to_dict(),
        "product": product,
        "precision": precision,
        "calibration": {"split": "train", "windows": CALIBRATION_WINDOWS, "bytes": int(windows.size)},
        "val_bytes": int(val.size),
        "score_split": "test",
        "scored_bytes": int(scored.size),
        "float": {**float_scores, "load_seconds": load_seconds},
        "forms": forms,
        "qat": qat,
        "seconds": time.perf_counter() - t0,
        "device": str(jax.devices()[0].device_kind),
        "corpus_sha256": dict(corpus.sha256),
        "conditions": _conditions(started),
    }


class _Started:
    """When and under what load a run starts."""

    def __init__(self) -> None:
        import datetime

        from stejax.bench._machine import load_average

        self.date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.load = load_average()


def _conditions(started: _Started) -> dict[str, Any]:
    """The commit, date, machine and load of a run, as the results file records them."""
    from stejax.bench._machine import load_average
    from stejax.bench.results import _commit, _machine

    here = Path(__file__).resolve().parent
    load: dict[str, Any] = {"start": started.load, "end": load_average()}
    if load["start"] is None or load["end"] is None:
        load["note"] = "not available"
    return {"commit": _commit(here), "date": started.date, "machine": _machine(), "load": load}


def already_run(logged: dict[str, dict[str, Any]], part: dict[str, Any]) -> bool:
    """Whether ``part`` is in the log at the rate it takes now.

    A logged run at another rate (a sweep logged since chose a new one) runs again; its new line supersedes the old
    one in the merge, and the log keeps both.
    """
    record = logged.get(part["part"])
    return record is not None and record["learning_rate"] == part["learning_rate"]


def run(args: argparse.Namespace) -> None:
    from stejax.lm import build_corpus

    corpus = build_corpus(args.corpus)
    done = _logged(args.log)
    for name in args.part:
        part = _part(name)
        if part.get("ptq"):
            logged = _logged(args.log)
            part["learning_rate"] = {c: chosen_rate(logged, part["size"], c)[0] for c in QAT_FROM_PTQ}
            part["rate_from"] = {c: chosen_rate(logged, part["size"], c)[1] for c in QAT_FROM_PTQ}
            part["float_rate"], part["float_rate_from"] = chosen_rate(logged, part["size"], "float")
        elif not part["sweep"]:
            part["learning_rate"], part["rate_from"] = chosen_rate(_logged(args.log), part["size"], part["config"])
            part["float_rate"] = chosen_rate(_logged(args.log), part["size"], "float")[0]
        if already_run(done, part):
            print(f"{name}: in {args.log} already", flush=True)
            continue
        try:
            if part.get("ptq"):
                # The float run's parameters come from its part's folder: a temporary one without --checkpoints.
                checkpoints = args.checkpoints or Path(tempfile.mkdtemp(prefix="lm_scale_"))
                record = _ptq_one(part, corpus, args.product, args.precision, checkpoints, args.log)
            else:
                record = _train_one(part, corpus, args.product, args.precision, args.export, args.checkpoints)
        except KeyboardInterrupt:
            if args.checkpoints is not None:
                _keep_seconds(args.checkpoints / name)
            raise
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if part.get("ptq"):
            print(f"{name}: {_ptq_summary(record)}", flush=True)
            continue
        print(
            f"{name}: {record['bpb']:.4f} bpb on {record['scored_bytes']} {record['score_split']} bytes, "
            f"{record['train_seconds']:.0f} s, step {record['step_ms_median']:.1f} ms",
            flush=True,
        )


def _ptq_summary(record: dict[str, Any]) -> str:
    """A PTQ line in words: float, each form's chosen method, QAT from it, and the part's seconds."""
    parts = [f"float {record['float']['bpb']:.4f}"]
    for form, r in record["forms"].items():
        parts.append(f"{form} {r['best']} {r['methods'][r['best']]['bpb']:.4f}")
    parts += [f"QAT {c} {r['bpb']:.4f}" for c, r in record["qat"].items()]
    return ", ".join(parts) + f" bpb on {record['scored_bytes']} test bytes, {record['seconds']:.0f} s"


def _keep_seconds(out: Path) -> None:
    """Add the stopped command's training seconds (its metrics' last evaluation) to the part's running total."""
    metrics, spent = out / "metrics.jsonl", out / "seconds_before.json"
    if not metrics.exists():
        return
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    before = json.loads(spent.read_text())["seconds"] if spent.exists() else 0.0
    # Only the evaluations this command made carry its own clock; the earlier ones were counted before.
    counted = json.loads(spent.read_text()).get("step", 0) if spent.exists() else 0
    mine = [r for r in lines if r["step"] > counted]
    if mine:
        spent.write_text(json.dumps({"seconds": before + mine[-1]["seconds"], "step": mine[-1]["step"]}))


def _machine_line() -> str:
    from stejax.bench.results import _machine

    machine = _machine()
    return f"{machine['cpu']}, {machine['cores']} cores"


def references(args: argparse.Namespace) -> None:
    import numpy as np

    from stejax.lm import build_corpus
    from stejax.lm import references as compute

    corpus = build_corpus(args.corpus)
    train = np.asarray(corpus.data["train"])
    scored = np.asarray(corpus.data["test"][:TEST_BYTES])
    tic = time.perf_counter()
    out = compute(train, np.asarray(corpus.data["validation"]), scored, orders=(2, 3, 4, 5), context_bytes=8 << 20)
    record = {
        "part": "references",
        "references": out,
        "scored_bytes": int(scored.size),
        "seconds": time.perf_counter() - tic,
        "corpus_sha256": dict(corpus.sha256),
        "machine": _machine_line(),
    }
    with open(args.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v["bpb"] for k, v in out.items()}), flush=True)


def llamacpp(args: argparse.Namespace) -> None:
    """Each artifact as GGUF in llama.cpp against stejax's forward of the same artifact, window by window."""
    import tempfile

    import numpy as np
    from flax import nnx

    from stejax.lm import build_corpus, export_gguf, llamacpp_logits, load_llama
    from stejax.lm._export import load_lm_artifact

    corpus = build_corpus(args.corpus)
    forward = nnx.jit(lambda model, x: model(x))
    for path in args.artifact:
        artifact = load_lm_artifact(path)
        context = artifact.manifest["model"]["context"]
        text = np.asarray(corpus.data["test"][: args.windows * context + 1])
        windows = [text[w * context : (w + 1) * context + 1] for w in range(args.windows)]
        with tempfile.TemporaryDirectory() as tmp:
            gguf = export_gguf(path, Path(tmp) / "model.gguf")
            llm = load_llama(Path(tmp) / "model.gguf", context=context, logits_all=True)
            agree = total = 0
            bits = {"stejax": 0.0, "llama.cpp": 0.0}
            worst = 0.0
            for window in windows:
                ours = np.asarray(forward(artifact.model, window[None, :-1]))[0]
                theirs = llamacpp_logits(llm, bytes(window[:-1]))
                target = window[1:].astype(np.int64)
                agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
                total += target.size
                worst = max(worst, float(np.abs(ours - theirs).max()))
                for name, logits in (("stejax", ours), ("llama.cpp", theirs)):
                    shifted = logits - logits.max(-1, keepdims=True)
                    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
                    bits[name] += float(-logp[np.arange(target.size), target].sum() / np.log(2))
        record = {
            "part": f"llamacpp-{Path(path).name}",
            "artifact": str(path),
            "architecture": gguf.architecture,
            "types": sorted(set(gguf.types.values())),
            "gguf_bytes": gguf.bytes,
            "scored_bytes": total,
            "top1_agreement": agree / total,
            "bpb_stejax": bits["stejax"] / total,
            "bpb_llamacpp": bits["llama.cpp"] / total,
            "max_abs_logit_difference": worst,
            "corpus_sha256": dict(corpus.sha256),
            "machine": _machine_line(),
        }
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "corpus_sha256"}), flush=True)


def decode_check(args: argparse.Namespace) -> None:
    """Each artifact decoded greedily from test prompts by :func:`stejax.lm.decode`, resident in low bits, against
    the per-byte loop of the artifact's exported integer forward; with the decode rate where it ran."""
    import jax
    import numpy as np

    from stejax.lm import build_corpus, decode, generate, load_lowbit

    corpus = build_corpus(args.corpus)
    test = np.asarray(corpus.data["test"])
    # Prompts: the bytes after the first newlines of the test split, each 64 bytes long.
    starts = [int(i) + 1 for i in np.flatnonzero(test[: 1 << 20] == ord("\n"))[::997][: args.prompts]]
    prompts = [bytes(test[i : i + 64]) for i in starts]
    key = jax.random.key(0)
    for path in args.artifact:
        loaded = load_lowbit(path, ternary=args.ternary, implementation=args.implementation)
        with jax.debug_key_reuse(False):
            loops = [generate(loaded.reference, p, tokens=args.tokens, key=key, temperature=0).tokens for p in prompts]
        # The same weights in bfloat16 (the exported forward's dequantised kernels): the rate to beat. Each model
        # compiles on its first call; then the two alternate, and each rate is the median of its repeats.
        bf16 = _in_bfloat16(loaded.reference)
        runs: dict[str, list[Any]] = {"lowbit": [], "bfloat16": []}
        for _ in range(1 + args.repeats):
            for name, model in (("lowbit", loaded.model), ("bfloat16", bf16)):
                runs[name].append(decode(model, prompts, tokens=args.tokens, key=key, temperature=0))
        got = runs["lowbit"][-1]
        rate = {name: float(np.median([d.new_bytes / d.seconds for d in done[1:]])) for name, done in runs.items()}
        same = sum(a == b for a, b in zip(got.texts, loops, strict=True))
        first = [
            next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
            for a, b in zip(got.texts, loops, strict=True)
        ]
        record = {
            "part": f"decode-{Path(path).name}",
            "artifact": str(path),
            "ternary": args.ternary,
            "implementation": args.implementation or "automatic",
            "device": str(jax.devices()[0].device_kind),
            "prompts": len(prompts),
            "tokens": args.tokens,
            "rows_identical": same,
            "first_difference": first,
            "bytes_per_s": rate["lowbit"],
            "bytes_per_s_bfloat16": rate["bfloat16"],
            "repeats": args.repeats,
            "compiles": got.compiles,
            "corpus_sha256": dict(corpus.sha256),
            "machine": _machine_line(),
        }
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "corpus_sha256"}), flush=True)


def _in_bfloat16(model: Any) -> Any:
    """``model`` with every floating parameter cast to bfloat16 (the float model a low-bit one is timed against)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    return nnx.merge(graphdef, cast)


def _logged(paths: str | list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in [paths] if isinstance(paths, str) else paths:
        if Path(path).exists():
            for line in Path(path).read_text("utf-8").splitlines():
                if line.strip():
                    record = json.loads(line)
                    # A run of an untied-head architecture (before the named sizes tied it) keeps its own key.
                    untied = "model" in record and not record["model"]["tied"]
                    out[record["part"] + (" (untied head)" if untied else "")] = record
    return out


def _deployed_float(runs: list[dict[str, Any]], size: str) -> float:
    """The deployed weight bytes (bfloat16) of the float runs of ``size``."""
    return statistics.mean(r["deployed_bytes"] for r in runs if r["size"] == size and r["config"] == "float")


def _slug(text: str) -> str:
    """A figure key's part: ``"25M (untied head)"`` -> ``"25M_untied_head"``."""
    return re.sub(r"\W+", "_", text).strip("_")


def merge(args: argparse.Namespace) -> None:
    import statistics

    from stejax.bench.results import Figure, Recorder

    logged = _logged(args.log)
    for r in logged.values():
        # Runs of a size are compared with float runs of the same architecture (the head tied or its own).
        if "model" in r:
            r["size"] = r["size"] if r["model"]["tied"] else f"{r['size']} (untied head)"
    refs = logged.pop("references", None)
    parity = {k: logged.pop(k) for k in [k for k in logged if k.startswith("llamacpp-")]}
    decoded = {k: logged.pop(k) for k in [k for k in logged if k.startswith("decode-")]}
    ptq = {k: logged.pop(k) for k in [k for k in logged if logged[k].get("ptq")]}
    if not args.conditions:
        # Grid runs that carry no conditions of their own were measured at an older tree (their conditions file
        # describes them): without that file they stay in the log and out of the results. The rate sweep stays in.
        for k in [k for k, r in logged.items() if not r["sweep"] and "conditions" not in r]:
            logged.pop(k)
    if refs is None:
        sys.exit("merge: the logs hold no references part; run `lm_scale.py references` first.")
    shas = {json.dumps(r["corpus_sha256"], sort_keys=True) for r in [*logged.values(), *ptq.values(), refs]}
    if len(shas) != 1:
        sys.exit(f"merge: the logged runs read {len(shas)} different corpora (split sha256s); expected one.")
    xz = refs["references"]["xz"]["bpb"]
    runs = [r for r in logged.values() if not r["sweep"]]
    floats: dict[str, list[float]] = {}
    for r in runs:
        if r["config"] == "float":
            floats.setdefault(r["size"], []).append(r["bpb"])
    rows = []
    order = sorted(
        logged,
        key=lambda k: (
            logged[k]["sweep"],
            logged[k]["size"],
            logged[k]["config"],
            logged[k]["warm"],
            logged[k]["seed"],
        ),
    )
    for key in order:
        r = logged[key]
        base = statistics.mean(floats[r["size"]]) if r["size"] in floats and not r["sweep"] else None
        rows.append(
            {
                "key": key,
                "part": r["part"],
                "size": r["size"],
                "config": r["config"] + (" (float warm-up)" if r["warm"] else ""),
                "seed": r["seed"],
                "learning_rate": r["learning_rate"],
                "split": r["score_split"],
                "bpb": r["bpb"],
                "gap": None if base is None else r["bpb"] / base - 1,
                "vs_xz": r["bpb"] / xz,
                "train_mb": r["train_bytes"] / 1e6,
                "minutes": r["train_seconds"] / 60,
                "step_ms": r["step_ms_median"],
                "deployed_mb": r["deployed_bytes"] / 1e6,
                "product": r["product"],
                "precision": r["precision"],
                "device": r["device"],
            }
        )
    figures: dict[str, Figure] = {}
    for size, values in floats.items():
        mean = statistics.mean(values)
        figures[f"float_{_slug(size)}_bpb"] = Figure(mean, f"{mean:.3f}", note=f"{len(values)} seed(s)")
        figures[f"float_{_slug(size)}_vs_xz"] = Figure(
            mean / xz, f"{mean / xz:.2f}× xz", target="≤ 0.70× xz", met=mean / xz <= 0.70
        )
    targets = {("25M", "w1.58a8"): 0.025, ("100M", "w1.58a8"): 0.02, ("25M", "w8a8"): 0.005, ("25M", "w4a8"): 0.015}
    for size in floats:
        for config in ("w8a8", "w4a8", "w1.58a8"):
            bound = targets.get((size.split()[0], config))
            values = [r["bpb"] for r in runs if r["size"] == size and r["config"] == config and not r["warm"]]
            if not values:
                continue
            gap = statistics.mean(values) / statistics.mean(floats[size]) - 1
            unswept = any(
                r["size"] == size and r["config"] == "float" and r.get("rate_from", "").startswith("default")
                for r in runs
            )
            figures[f"{_slug(config)}_{_slug(size)}_gap"] = Figure(
                gap,
                f"{100 * gap:+.2f}%",
                target=None if bound is None else f"≤ +{100 * bound:g}%",
                met=None if bound is None else gap <= bound,
                note=f"{len(values)} seed(s)" + (f"; float's rate not swept at {size}" if unswept else ""),
            )
            warm = [r["bpb"] for r in runs if r["size"] == size and r["config"] == config and r["warm"]]
            if warm:
                gap = statistics.mean(warm) / statistics.mean(floats[size]) - 1
                figures[f"{_slug(config)}_{_slug(size)}_warm_gap"] = Figure(
                    gap, f"{100 * gap:+.2f}%", note=f"float for the first 20% of the bytes; {len(warm)} seed(s)"
                )
    # At about half the weight bytes: ternary 100M (2-bit codes) against the bfloat16 25M float model. It beats it
    # only below every float seed: a mean inside the seeds' spread is level.
    small = floats.get("25M")
    big = [r for r in runs if r["size"] == "100M" and r["config"] == "w1.58a8" and not r["warm"]]
    if small and big:
        ratio = statistics.mean(r["bpb"] for r in big) / statistics.mean(small) - 1
        mb = (statistics.mean(r["deployed_bytes"] for r in big) / 1e6, _deployed_float(runs, "25M") / 1e6)
        figures["w1_58a8_100M_vs_float_25M"] = Figure(
            ratio,
            f"{100 * ratio:+.2f}%",
            target="below every float 25M seed",
            met=max(r["bpb"] for r in big) < min(small),
            note=f"{mb[0]:.1f} MB of ternary weights against {mb[1]:.1f} MB in bfloat16; {len(big)} seed(s) "
            f"against {len(small)} (float 25M {min(small):.4f} to {max(small):.4f})",
        )
    # The sweep's best ternary against its best float, on the validation split and a quarter of the bytes.
    sweeps = [r for r in logged.values() if r["sweep"]]
    for size in sorted({r["size"] for r in sweeps}):
        best = {
            c: min((r["bpb"] for r in sweeps if r["size"] == size and r["config"] == c), default=None)
            for c in ("float", "w1.58a8")
        }
        if best["float"] is not None and best["w1.58a8"] is not None:
            gap = best["w1.58a8"] / best["float"] - 1
            figures[f"w1_58a8_{_slug(size)}_sweep_gap"] = Figure(
                gap, f"{100 * gap:+.1f}%", note="best rate of each, validation split, a quarter of the bytes"
            )
    for name, ref in refs["references"].items():
        figures[f"ref_{_slug(name)}"] = Figure(ref["bpb"], f"{ref['bpb']:.3f}")
    # The quantised step against the float step of the same size, both measured in the same grid (medians).
    for size in floats:
        float_ms = statistics.median(r["step_ms_median"] for r in runs if r["size"] == size and r["config"] == "float")
        for config in ("w8a8", "w1.58a8"):
            steps = [r["step_ms_median"] for r in runs if r["size"] == size and r["config"] == config]
            if steps:
                ratio = statistics.median(steps) / float_ms
                bound = 1.0 if size.startswith("25M") else 0.85
                figures[f"{_slug(config)}_{_slug(size)}_step"] = Figure(
                    ratio,
                    f"{ratio:.2f}×",
                    target=f"≤ {bound:.2f}×",
                    met=ratio <= bound,
                    note="int8 products forward and backward, bfloat16 elsewhere, against the bfloat16 float step",
                )
    figures |= _ptq_figures(ptq)
    for name, r in decoded.items():
        figures[f"{_slug(name)}_rows"] = Figure(
            r["rows_identical"] / r["prompts"],
            f"{r['rows_identical']} of {r['prompts']}",
            target="every row",
            met=r["rows_identical"] == r["prompts"],
            note=f"greedy {r['tokens']} bytes, {r['ternary']} codes resident, against the per-byte loop",
        )
        if "bytes_per_s_bfloat16" in r:
            ratio = r["bytes_per_s"] / r["bytes_per_s_bfloat16"]
            figures[f"{_slug(name)}_vs_bfloat16"] = Figure(
                ratio,
                f"{ratio:.2f}×",
                note=f"bytes a second against the same weights in bfloat16, on {r['device']} ({r['implementation']} "
                f"products, {r['ternary']} codes, {r['prompts']} rows; medians of {r['repeats']})",
            )
    for name, r in parity.items():
        agreement, ratio = r["top1_agreement"], r["bpb_llamacpp"] / r["bpb_stejax"] - 1
        figures[f"{_slug(name)}_top1"] = Figure(
            agreement, f"{100 * agreement:.1f}%", target="≥ 99%", met=agreement >= 0.99, note=r["architecture"]
        )
        figures[f"{_slug(name)}_bpb"] = Figure(
            ratio, f"{100 * ratio:+.2f}%", target="within ±1%", met=abs(ratio) <= 0.01, note="llama.cpp against stejax"
        )
    recorder = Recorder("lm_scale", command="python benchmarks/lm_scale.py run|references|merge (see its docstring)")
    Path(args.results).mkdir(parents=True, exist_ok=True)
    # The conditions are the runs' (where they trained), not the merging machine's.
    # A run on a copy of the working tree names the commit whose tree it ran, where this repository has it.
    from stejax.bench.results import resolve_commit

    here = Path(__file__).resolve().parent
    for r in logged.values():
        if "conditions" in r:
            r["conditions"] = {**r["conditions"], "commit": resolve_commit(r["conditions"]["commit"], here)}
    conditions = sorted((r["conditions"] for r in runs if "conditions" in r), key=lambda c: c["date"])
    # The file names the newest run's commit; a grid measured over several commits keeps each row's in the file
    # (not in the page's table) and says with --older what changed between them.
    first = conditions[-1] if conditions else None
    if args.conditions:
        first = json.loads(Path(args.conditions).read_text("utf-8"))
    commits = {c["commit"]["id"] for c in conditions}
    if len(commits) > 1 and not args.older:
        sys.exit(
            f"merge: the runs were measured at {len(commits)} commits ({', '.join(sorted(commits))}); "
            "say what differs between them with --older, or merge the logs of one commit."
        )
    for row in rows:
        run = logged[row["key"]]
        row["commit"] = run["conditions"]["commit"]["id"][:7] if "conditions" in run else None
        del row["key"]
    recorder.write(
        Path(args.results) / "lm_scale.json",
        **({} if first is None else {k: first[k] for k in ("commit", "date", "machine", "load")}),
        rows=rows,
        columns=[
            ("size", "size"),
            ("config", "configuration"),
            ("seed", "seed"),
            ("learning_rate", "peak rate", "{:g}"),
            ("split", "scored on"),
            ("bpb", "bits per byte", "{:.4f}"),
            ("gap", "vs float", "{:+.2%}"),
            ("vs_xz", "vs xz", "{:.2f}×"),
            ("train_mb", "MB trained", "{:.1f}"),
            ("minutes", "minutes", "{:.1f}"),
            ("step_ms", "step ms", "{:.1f}"),
            ("deployed_mb", "weights MB", "{:.1f}"),
        ],
        figures=figures,
        notes=(
            f"Scored on the first {refs['scored_bytes']:,} bytes of the test split (sweep rows: of the validation "
            "split); references on the same bytes. Gaps are against the mean of the same size's float seeds. "
            "Every run and the references read one corpus, built where each ran from the pinned wheels, split "
            "sha256 "
            + ", ".join(f"{split} {sha[:12]}" for split, sha in refs["corpus_sha256"].items())
            + f" (references computed on {refs.get('machine', 'the merging machine')})."
            + ("" if not args.note else " " + args.note)
        ),
    )
    older = args.older or (first or {}).get("older")
    if first is not None and first["commit"].get("uncommitted_changes") and not older:
        sys.exit("merge: the runs' tree had uncommitted changes; say what they were with --older.")
    if older:
        # Not measured at a committed tree: the file says so, and pages mark its figures older.
        path = Path(args.results) / "lm_scale.json"
        doc = json.loads(path.read_text("utf-8"))
        doc["older"] = older
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {Path(args.results) / 'lm_scale.json'} ({len(rows)} rows)")
    if args.plot:
        print(f"wrote {plot(runs, refs, Path(args.plot))}")


def _ptq_figures(ptq: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """PTQ against float, and QAT from the best PTQ result, per size (means over the seeds' PTQ parts).

    Gaps are against each part's own float run scored on the same test bytes. The closed fraction is
    ``(gap of the best PTQ method - gap after QAT) / gap of the best PTQ method``, the best chosen on validation.
    """
    import statistics

    from stejax.bench.results import Figure

    figures: dict[str, Any] = {}
    for size in sorted({r["size"] for r in ptq.values()}):
        parts = [r for r in ptq.values() if r["size"] == size]
        n = f"{len(parts)} seed(s)"

        def gap(bpb: float, r: dict[str, Any]) -> float:
            return bpb / r["float"]["bpb"] - 1

        gptq = statistics.mean(gap(r["forms"]["w4-g32"]["methods"]["gptq"]["bpb"], r) for r in parts)
        figures[f"ptq_gptq_w4_g32_{_slug(size)}_gap"] = Figure(
            gptq, f"{100 * gptq:+.2f}%", target="≤ +1.5%", met=gptq <= 0.015, note=f"int4 weights per group of 32; {n}"
        )
        for form in parts[0]["forms"]:
            best = statistics.mean(gap(r["forms"][form]["methods"][r["forms"][form]["best"]]["bpb"], r) for r in parts)
            methods = "/".join(sorted({r["forms"][form]["best"] for r in parts}))
            figures[f"ptq_{_slug(form)}_{_slug(size)}_gap"] = Figure(
                best, f"{100 * best:+.2f}%", note=f"best PTQ method on validation ({methods}); {n}"
            )
        for config in parts[0]["qat"]:
            ptq_gap = statistics.mean(
                gap(r["forms"][config]["methods"][r["forms"][config]["best"]]["bpb"], r) for r in parts
            )
            qat_gap = statistics.mean(gap(r["qat"][config]["bpb"], r) for r in parts)
            closed = (ptq_gap - qat_gap) / ptq_gap
            mb = statistics.mean(r["qat"][config]["train_bytes"] for r in parts) / 1e6
            figures[f"qat_from_ptq_{_slug(config)}_{_slug(size)}_closed"] = Figure(
                closed,
                f"{100 * closed:.0f}%",
                target="≥ 50%",
                met=closed >= 0.5,
                note=f"best PTQ gap {100 * ptq_gap:+.2f}%, {100 * qat_gap:+.2f}% after {mb:.1f} MB of QAT; {n}",
            )
    return figures


def plot(runs: list[dict[str, Any]], refs: dict[str, Any], out: Path) -> Path:
    """Test bits per byte against the deployed weight bytes: one point per run and form, a marker per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colours = {"float32": "tab:blue", "bfloat16": "tab:cyan", "w8a8": "tab:green", "w4a8": "tab:orange"}
    colours |= {"w1.58a8": "tab:red", "w1.58a8 (float warm-up)": "tab:purple"}
    markers = {"25M": "o", "100M": "s", "350M": "^"}
    seen: set[str] = set()
    for r in runs:
        if r["config"] == "float":
            points = [("float32", r["deployed_bytes_float32"]), ("bfloat16", r["deployed_bytes"])]
        else:
            points = [(r["config"] + (" (float warm-up)" if r["warm"] else ""), r["deployed_bytes"])]
        for form, size in points:
            label = f"{form} {r['size']}"
            ax.scatter(
                size / 1e6,
                r["bpb"],
                color=colours.get(form, "tab:gray"),
                marker=markers.get(r["size"].split()[0], "x"),
                label=None if label in seen else label,
            )
            seen.add(label)
    xz = refs["references"]["xz"]["bpb"]
    ax.axhline(xz, color="gray", linestyle=":", label=f"xz on the same bytes ({xz:.2f})")
    ax.set_xscale("log")
    ax.set_xlabel("deployed weight bytes (MB)")
    ax.set_ylabel(f"test bits per byte ({refs['scored_bytes'] / 2**20:.0f} MiB of the test split)")
    ax.set_title("stejax LM: quality against weight bytes, trained from scratch")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train and score parts, one JSON line each")
    p_run.add_argument("--corpus", required=True, help="a corpus folder (make corpus) or a directory of text")
    p_run.add_argument("--log", required=True)
    p_run.add_argument("--part", action="append", required=True)
    p_run.add_argument("--product", default="int8", choices=("fake-quant", "int8-forward", "int8"))
    p_run.add_argument("--precision", default="bfloat16", choices=("float32", "bfloat16"))
    p_run.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="checkpoint each part here every tenth of its run, and continue a stopped part from its last one",
    )
    p_run.add_argument(
        "--export", type=Path, default=None, help="write each quantised run's packed artifact in this folder"
    )
    p_cpp = sub.add_parser("llamacpp", help="an exported run in llama.cpp against stejax, on the test bytes")
    p_cpp.add_argument("--corpus", required=True)
    p_cpp.add_argument("--log", required=True)
    p_cpp.add_argument("--artifact", type=Path, action="append", required=True, help="a folder `run --export` wrote")
    p_cpp.add_argument("--windows", type=int, default=32, help="test windows of the model's context scored")
    p_dec = sub.add_parser("decode", help="greedy decoding of each artifact, resident in low bits, against the loop")
    p_dec.add_argument("--corpus", required=True)
    p_dec.add_argument("--log", required=True)
    p_dec.add_argument("--artifact", type=Path, action="append", required=True, help="a folder `run --export` wrote")
    p_dec.add_argument("--prompts", type=int, default=4, help="prompts of 64 test bytes")
    p_dec.add_argument("--tokens", type=int, default=128, help="bytes decoded after each prompt")
    p_dec.add_argument("--ternary", default="2bit", choices=("int8", "2bit"), help="ternary codes resident as")
    p_dec.add_argument("--implementation", default=None, choices=("xla", "pallas"), help="default: the automatic one")
    p_dec.add_argument("--repeats", type=int, default=5, help="timed decodes of each model after its compiling one")
    p_ref = sub.add_parser("references", help="n-gram and compressor references on the scored bytes")
    p_ref.add_argument("--corpus", required=True)
    p_ref.add_argument("--log", required=True)
    p_merge = sub.add_parser("merge", help="write RESULTS/lm_scale.json from the logs")
    p_merge.add_argument("--log", action="append", required=True)
    p_merge.add_argument("--results", required=True)
    p_merge.add_argument(
        "--older", default=None, help="why the runs' tree is not a commit (required when it had local changes)"
    )
    p_merge.add_argument("--note", default=None, help="a sentence added to the results file's notes")
    p_merge.add_argument("--plot", default=None, help="also write the plot here (docs/img/lm_scale.png)")
    p_merge.add_argument(
        "--conditions", default=None, help="a JSON file of the runs' commit, date, machine and load (older logs)"
    )
    args = parser.parse_args(argv)
    commands = {"run": run, "references": references, "merge": merge, "llamacpp": llamacpp, "decode": decode_check}
    commands[args.command](args)


if __name__ == "__main__":
    main()
