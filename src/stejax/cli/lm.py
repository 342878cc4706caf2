"""``stejax lm train|compare|export|sample``: the quantised byte-level transformer language model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.cli._common import (
    artifact_dir_argument,
    configuration_names,
    deprecated_argument,
    deprecated_option,
    directory,
    guarded,
    out_dir_option,
    progress_bar,
    seeds_option,
    workers_option,
)

__all__ = ["lm_group"]

_CONFIG_NAMES = ("float", "w8a8", "w4a8", "w4a4", "w2a8", "w1.58a8", "w4a8_no_ste")


@click.group("lm", short_help="A byte-level transformer LM, float down to ternary weights.")
def lm_group() -> None:
    """A quantised byte-level transformer LM: w8a8 down to BitNet b1.58 ternary."""


@lm_group.command("train", short_help="Train the LM (float, or a quantised configuration).")
@out_dir_option("The run directory to write.")
@click.option(
    "--preset",
    "config_name",
    type=click.Choice(_CONFIG_NAMES),
    default="float",
    show_default=True,
    help="The quantisation: float, or wNaM (N-bit weights, M-bit activations; w1.58: BitNet b1.58 ternary; "
    "w4a8_no_ste: w4a8 without the straight-through gradient, a control).",
)
@click.option(
    "--input-block",
    type=click.Choice(["auto", "32", "256", "token"]),
    default="auto",
    show_default=True,
    help="How each quantised linear's int8 input is scaled: one scale per block of 32 values (llama.cpp's Q8_0, "
    "the inputs of Q8_0 and Q4_0 weights), per block of 256 (Q8_K, of TQ2_0 and TQ1_0 weights) or per token. "
    "auto: the block llama.cpp uses for this architecture's GGUF export, so that llama.cpp computes what the "
    "model computes; per token where the model has no GGUF form.",
)
@click.option(
    "--product",
    type=click.Choice(["fake-quant", "int8-forward", "int8"]),
    default="fake-quant",
    show_default=True,
    help="How the quantised linears multiply. fake-quant: float products of the fake-quantised operands. "
    "int8-forward: int8 x int8 -> int32 forward products, float straight-through gradient. int8: the forward "
    "and both backward products in int8, the gradient's cotangent quantised per row and per column (a declared "
    "gradient, about 1% from the straight-through one). Integer products take w8a8 and w1.58a8, with inputs "
    "scaled per token; they pay off on accelerators with fast int8 products (a TPU: see docs/integer-training.md).",
)
@click.option(
    "--from",
    "from_run",
    type=directory(exists=True),
    default=None,
    help="Start from this run's parameters (QAT from a float checkpoint).",
)
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True, help="Optimiser steps.")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=16, show_default=True, help="Windows of text per step."
)
@click.option(
    "--learning-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=3e-3,
    show_default=True,
    help="The peak learning rate (linear warm-up over the first 5% of the steps).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The seed of the initial parameters and batches.")
@click.option(
    "--size",
    type=click.Choice(["25M", "100M", "350M"]),
    default=None,
    help="A named architecture (docs/lm.md: width, depth, heads, hidden width, 256 bytes of context, SubLN "
    "norms); shape options given beside it change that field only. Without it: the small shape of the options' "
    "defaults.",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "float32", "bfloat16"]),
    default="auto",
    show_default=True,
    help="The step's compute dtype. bfloat16: mixed precision, float32 master weights and optimiser state. "
    "auto: bfloat16 on a TPU, float32 elsewhere.",
)
@click.option(
    "--recipe",
    type=click.Choice(["standard", "bitnet"]),
    default="standard",
    show_default=True,
    help="The schedule. standard: warm-up, one cosine, weight decay 0.1 throughout. bitnet: BitNet b1.58's two "
    "stages, a cosine to the midpoint, a drop, a second cosine, and no weight decay from the midpoint on.",
)
@click.option(
    "--eval-every",
    type=click.IntRange(min=1),
    default=None,
    help="Steps between validation evaluations (a line of metrics.jsonl each). Default: a tenth of the steps.",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    help="Steps between orbax checkpoints in OUT/checkpoints (parameters, optimiser state, step, key); a "
    "multiple of --eval-every. Default: none.",
)
@click.option(
    "--resume",
    is_flag=True,
    default=False,
    help="Continue the run in OUT from its newest checkpoint, with the same options: it ends where the run "
    "would have ended without the stop.",
)
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Train data parallel on this many devices (a mesh over jax.devices(); across hosts, every process "
    "runs the same command after jax.distributed.initialize). The batch size must be a multiple.",
)
@click.option(
    "--fsdp",
    is_flag=True,
    default=False,
    help="With --devices: split every parameter and its optimiser state over the devices (FSDP) instead of "
    "keeping a copy on each.",
)
@click.option(
    "--test-bytes",
    type=click.IntRange(min=1024),
    default=65536,
    show_default=True,
    help="Bytes of the test split scored at the end (from its start).",
)
@click.option(
    "--context", type=click.IntRange(min=2), default=64, show_default=True, help="Bytes the model sees at once."
)
@click.option("--width", type=click.IntRange(min=2), default=64, show_default=True, help="The model dimension.")
@click.option("--depth", type=click.IntRange(min=1), default=2, show_default=True, help="Transformer blocks.")
@click.option("--heads", type=click.IntRange(min=1), default=2, show_default=True, help="Attention heads per block.")
@click.option(
    "--hidden", type=click.IntRange(min=1), default=160, show_default=True, help="The feed-forward layers' width."
)
@click.option(
    "--norms",
    type=click.Choice(["llama", "subln"]),
    default="llama",
    show_default=True,
    help="llama: llama's norm placement (exports to GGUF as a llama); subln: BitNet's RMSNorm before every linear "
    "input (exports as llama.cpp's bitnet when the head is tied).",
)
@click.option(
    "--tied/--untied",
    default=False,
    show_default=True,
    help="Whether the output head is the embedding table. llama.cpp's bitnet architecture computes its logits "
    "with the embedding, so a SubLN model exports to GGUF only with --tied.",
)
@click.option(
    "--corpus",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A directory or text file to train on (default: the .py files of the installed jax package).",
)
def train_command(
    out: Path,
    config_name: str,
    input_block: str,
    product: str,
    from_run: Path | None,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    size: str | None,
    precision: str,
    recipe: str,
    eval_every: int | None,
    checkpoint_every: int | None,
    resume: bool,
    devices: int,
    fsdp: bool,
    test_bytes: int,
    context: int,
    width: int,
    depth: int,
    heads: int,
    hidden: int,
    norms: str,
    tied: bool,
    corpus: Path | None,
) -> None:
    """Train the LM (float, or a quantised configuration) and write OUT.

    OUT gets config.json, metrics.jsonl (one line per evaluation),
    params.safetensors and report.json (the test bits per byte). With --from,
    the architecture and the starting parameters come from that run. With a
    corpus folder built by `stejax lm corpus`, the splits are memory-mapped.
    """
    import jax
    from flax import nnx

    from stejax import keys
    from stejax.lm import (
        CONFIGS,
        LMConfig,
        TrainSettings,
        Transformer,
        bits_per_byte,
        build_corpus,
        lm_size,
        load_checkpoint,
        parameter_count,
        quantize_lm,
        train_lm,
    )

    if from_run is not None:
        model_config = LMConfig(**json.loads((from_run / "config.json").read_text())["model"])
    else:
        shape: dict[str, Any] = {
            "context": context,
            "width": width,
            "depth": depth,
            "heads": heads,
            "hidden": hidden,
            "norms": norms,
            "tied": tied,
        }
        try:
            if size is None:
                model_config = LMConfig(**shape)
            else:
                # A named size, with the shape options the user gave on the command line.
                given = click.get_current_context().get_parameter_source
                changes = {k: v for k, v in shape.items() if given(k) is click.core.ParameterSource.COMMANDLINE}
                model_config = lm_size(size).replace(**changes)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    try:
        config = CONFIGS[config_name].with_product(product)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--product") from None
    # Last among the configuration's changes: auto depends on the rest (integer products scale per token).
    config, gguf_notes = _with_input_block(config, input_block, model_config)
    data = build_corpus(corpus)
    k_init, k_train = keys.split(jax.random.key(seed), where="stejax lm train")
    init_seed = int(jax.random.randint(keys.consume(k_init, where="init seed"), (), 0, 2**31 - 1))
    model: nnx.Module = Transformer(model_config, rngs=nnx.Rngs(params=init_seed))
    if from_run is not None:
        model = load_checkpoint(model, from_run / "params.safetensors")
    model = quantize_lm(model, config_name if config.input_block is None and product == "fake-quant" else config)
    if precision == "auto":
        precision = "bfloat16" if jax.default_backend() == "tpu" else "float32"
    mesh = None
    if devices > 1 or fsdp:
        from stejax.train import data_mesh

        try:
            mesh = data_mesh(devices)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--devices") from None
        if batch_size % devices:
            raise click.BadParameter(
                f"the batch of {batch_size} windows does not split over {devices} devices; expected a multiple "
                f"of {devices}.",
                param_hint="--batch-size",
            )
    eval_every = eval_every or max(1, steps // 10)
    try:
        settings = TrainSettings(
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            warmup=max(1, steps // 20),
            eval_every=eval_every,
            eval_windows=32,
            compute_dtype=precision,
            checkpoint_every=checkpoint_every,
            two_stage=recipe == "bitnet",
            stage_two_weight_decay=0.0 if recipe == "bitnet" else None,
        )
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(
            {
                "model": model_config.to_dict(),
                "config": config_name,
                "input_block": config.input_block,
                "product": product,
                "settings": settings.to_dict(),
                "recipe": recipe,
                "devices": devices,
                "param_sharding": "sharded" if fsdp else "replicated",
                "seed": seed,
                "from": str(from_run) if from_run else None,
                "corpus": data.describe() | {"files": None},
            },
            indent=2,
        )
        + "\n"
    )
    console = Console()
    blocks = "" if config.input_block is None else f", inputs per block of {config.input_block}"
    where = "" if mesh is None else f", {devices} devices{' (FSDP)' if fsdp else ''}"
    console.print(
        Text(
            f"training {config_name}{blocks} ({parameter_count(model_config):,} parameters, {steps} steps of "
            f"{batch_size}x{model_config.context} bytes, {precision}{where}) on {data.source}"
        )
    )
    for note in gguf_notes:
        console.print(Text(f"note: {note}"))
    with progress_bar(console, rate=True) as progress:
        task = progress.add_task(config_name, total=steps, rate="")
        last_val = [""]

        def on_step(record: Mapping[str, float]) -> None:
            progress.update(
                task,
                completed=record["step"],
                description=f"{config_name} loss {record['loss'] / 0.6931471805599453:.3f} bpb{last_val[0]}",
                rate=f"{record['bytes_per_s'] / 1e6:.2f} MB/s",
            )

        def on_eval(record: Mapping[str, float]) -> None:
            last_val[0] = f", val {record['val_bpb']:.3f}"

        result = guarded(
            lambda: train_lm(
                model,
                data.data["train"],
                data.data["validation"],
                settings,
                key=k_train,
                out_dir=out,
                on_eval=on_eval,
                on_step=on_step,
                mesh=mesh,
                param_sharding="sharded" if fsdp else "replicated",
                resume=resume,
            )
        )
    scored = data.data["test"][:test_bytes]
    test_bpb = bits_per_byte(result.model, scored)
    report = {
        "config": config_name,
        "input_block": config.input_block,
        "test_bpb": test_bpb,
        "step_ms_median": result.step_ms_median,
        "scored": f"first {scored.size} bytes of the test split",
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(Text(f"test {test_bpb:.4f} bits per byte; step {result.step_ms_median:.1f} ms (median); wrote {out}"))


def _with_input_block(config: Any, choice: str, model: Any) -> tuple[Any, list[str]]:
    """``config`` with the input block ``--input-block`` names, checked against the configuration, then the
    architecture ``model``.

    Returns the configuration and what the run's output says about its GGUF export (:func:`_gguf_notes`).
    """
    from stejax.lm import CONFIGS
    from stejax.lm._gguf import GGUFError, check_input_block, llamacpp_input_blocks

    integer = getattr(config, "product", "fake-quant") != "fake-quant"
    if choice not in ("auto", "token"):
        # The configuration first: a block means nothing to a model without 8-bit quantised inputs.
        if config.input_bits != 8:
            takes = ", ".join(n for n in _CONFIG_NAMES if CONFIGS[n].input_bits == 8)
            has = "no quantised inputs" if config.input_bits is None else f"{config.input_bits}-bit inputs"
            raise click.BadParameter(
                f"--preset {config.name} has {has}; input blocks are llama.cpp's scales of 8-bit inputs, taken by "
                f"{takes}. Leave --input-block at auto.",
                param_hint="--input-block",
            )
        if integer:
            raise click.BadParameter(
                f"integer products (--product {config.product}) scale their inputs per token; input blocks of "
                f"{choice} need --product fake-quant. Leave --input-block at auto or token.",
                param_hint="--input-block",
            )
    try:
        blocks = llamacpp_input_blocks(model, config)
    except GGUFError:
        blocks = ()
    if choice == "auto":
        # Two blocks: ternary tensors whose rows are multiples of 256 (TQ2_0) and others (Q4_0); with 32,
        # an export with --ternary Q4_0 matches every one. Integer products scale their inputs per token.
        blockwise = blocks and config.input_bits == 8 and not integer
        block = (blocks[0] if len(blocks) == 1 else 32) if blockwise else None
    else:
        block = None if choice == "token" else int(choice)
    try:
        check_input_block(model, block)
        config = config.with_input_block(block)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--input-block") from None
    return config, _gguf_notes(config, model, choice=choice)


def _gguf_notes(config: Any, model: Any, *, choice: str | None = None) -> list[str]:
    """What a run's output says about its GGUF export: nothing when llama.cpp will quantise every quantised
    product's input as the model does, else how it differs and what to change to make it match.

    ``choice``: the run's ``--input-block`` (None: not known, as at export).
    """
    from stejax.lm._gguf import GGUFError, llamacpp_input_blocks

    if config.input_bits is None:
        return []
    try:
        blocks = llamacpp_input_blocks(model, config)
    except GGUFError as e:
        return [f"no GGUF export for llama.cpp: {e}"]
    block = config.input_block
    product = getattr(config, "product", "fake-quant")
    if len(blocks) == 2 and block == 32:
        return [
            "`stejax lm export --format gguf` writes ternary tensors whose rows are multiples of 256 as TQ2_0, "
            "whose inputs llama.cpp quantises per block of 256, not 32; export with --ternary Q4_0 for a file "
            "that computes exactly what this model computes."
        ]
    if blocks == (block,):
        return []
    ours = "one scale per token" if block is None else f"blocks of {block}"
    theirs = " and ".join(map(str, blocks))
    changes = []
    if product != "fake-quant":
        changes.append("--product fake-quant")
    if choice != "auto":  # auto picks llama.cpp's block for fake-quant products
        changes.append("--input-block auto")
    how = "train with " + " and ".join(changes) + (" and export with --ternary Q4_0" if len(blocks) == 2 else "")
    if product != "fake-quant" and choice == "auto":  # say what auto did, once
        return [
            f"--product {product} scales the quantised products' inputs per token (integer products take no input "
            f"blocks), so a GGUF export of this run will not match llama.cpp exactly, which quantises them per "
            f"block of {theirs}; to match, {how}."
        ]
    return [
        f"a GGUF export of this run will not match llama.cpp exactly: llama.cpp quantises the quantised "
        f"products' inputs per block of {theirs}, and this run uses {ours}; to match, {how}."
    ]


@lm_group.command("compare", short_help="Train and compare float and every quantised configuration.")
@out_dir_option("Folder for the report.")
@click.option(
    "--quick",
    is_flag=True,
    default=False,
    help="The quick tier: 1 seed, 250 float steps and 150 fine-tuning steps, 16 KiB of the test split scored "
    "(the full tier: 3 seeds, 600 + 200 steps, 128 KiB).",
)
@seeds_option("Seeds 0..N-1 (quick: 1, full: 3).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Float pre-training steps.")
@click.option("--finetune-steps", type=click.IntRange(min=1), default=None, help="QAT fine-tuning steps.")
@click.option(
    "--configs",
    default=None,
    metavar="NAME,...",
    help=f"Only these configurations, comma-separated, from {', '.join(_CONFIG_NAMES)} (float is always run).",
)
@click.option(
    "--scratch",
    default=None,
    metavar="NAME,...",
    help="Also train these from scratch (default w1.58a8, w4a8, w4a8_no_ste); float is then trained from scratch "
    "too (float_scratch), the baseline of every from-scratch row.",
)
@click.option(
    "--corpus",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A directory or text file to train on (default: the .py files of the installed jax package).",
)
@workers_option()
@click.option(
    "--qwix",
    is_flag=True,
    default=False,
    help="Also fine-tune Qwix's int8 QAT and int4 weight-only from the same float checkpoints (needs qwix).",
)
def compare_command(
    out: Path,
    quick: bool,
    seeds: int | None,
    steps: int | None,
    finetune_steps: int | None,
    configs: str | None,
    scratch: str | None,
    corpus: Path | None,
    workers: int,
    qwix: bool,
) -> None:
    """Train float and every quantised configuration on the same budget; write OUT/report.json and report.md.

    Prints the test bits per byte of each configuration beside byte n-gram and
    zlib/bz2/xz references on the same bytes.
    """
    from stejax.lm import FULL, QUICK

    settings = QUICK if quick else FULL
    changes: dict = {}
    if seeds is not None:
        changes["seeds"] = tuple(range(seeds))
    if steps is not None:
        changes["float_steps"] = steps
    if finetune_steps is not None:
        changes["finetune_steps"] = finetune_steps
    chosen = configuration_names(configs, _CONFIG_NAMES, option="--configs")
    if chosen is not None:
        changes["configs"] = ("float", *(c for c in chosen if c != "float"))
    scratch_names = configuration_names(scratch, _CONFIG_NAMES, option="--scratch") if scratch != "" else ()
    if scratch_names is not None:
        changes["scratch"] = scratch_names
    settings = settings.replace(**changes)
    from stejax.lm import compare_lm

    extra = {}
    if qwix:
        import functools

        from stejax.bench._peers_lm import QWIX_LM_KINDS, qwix_lm

        extra = {kind: functools.partial(qwix_lm, kind=kind) for kind in QWIX_LM_KINDS}

    console = Console()
    runs = len(settings.seeds) * (len(settings.configs) + len(extra) + 1 + len(settings.scratch_names))
    with progress_bar(console) as progress:
        task = progress.add_task("references", total=runs)

        def on_event(event: Mapping[str, Any]) -> None:
            if event["event"] == "train":
                progress.update(task, advance=1, description=f"{event['config']} seed {event['seed']}")
            elif event["event"] == "seed done":
                progress.update(task, advance=runs // len(settings.seeds), description=f"seed {event['seed']} done")

        report = guarded(
            lambda: compare_lm(settings, out_dir=out, corpus=corpus, on_event=on_event, workers=workers, extra=extra)
        )
    table = Table(title=f"stejax lm compare ({settings.tier})")
    for column in ("configuration", "test bpb", "Δ vs baseline", "Δ vs float", "step ms"):
        table.add_column(column)
    for name, row in report["summary"].items():
        table.add_row(
            name,
            f"{row['test_bpb_mean']:.4f} ± {row['test_bpb_std']:.4f}",
            f"{row['delta_pct']:+.2f}% ({row['baseline']})",
            f"{row['delta_vs_float_pct']:+.2f}%",
            f"{row['step_ms_median']:.1f}",
        )
    for name, value in report["references"].items():
        table.add_row(f"[dim]{name}[/dim]", f"{value['bpb']:.4f}", "", "", "")
    console.print(table)
    console.print(Text(f"wrote {out / 'report.json'} and {out / 'report.md'}"))


@lm_group.command("export", short_help="Export a run as an LM artifact or a GGUF file for llama.cpp.")
@click.argument("run", metavar="RUN_OR_ARTIFACT", type=directory(exists=True))
@deprecated_argument("OUT", "out", required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    metavar="PATH",
    default=None,
    help="The LM artifact directory to write (with --format gguf: the GGUF file); it must not exist.",
)
@click.option(
    "--format",
    "format_",
    type=click.Choice(["artifact", "gguf"]),
    default="artifact",
    show_default=True,
    help="artifact: a stejax LM artifact directory from a run; gguf: one llama.cpp GGUF file from a run or artifact.",
)
@click.option(
    "--ternary",
    type=click.Choice(["TQ2_0", "TQ1_0", "Q4_0"]),
    default="TQ2_0",
    show_default=True,
    help="With --format gguf: the type of ternary weights whose rows are multiples of 256 (2.06, 1.69 or 4.5 "
    "bits; Q4_0's inputs are blocks of 32, as a model trained with --input-block 32 quantises them).",
)
def export_command(run: Path, out: Path, format_: str, ternary: str) -> None:
    """Pack RUN's weights at their bit width into the artifact --out PATH (safetensors, manifest, hashes).

    With --format gguf, write RUN_OR_ARTIFACT (a run or an LM artifact, whose
    manifest is checked) as the GGUF file PATH, a llama that llama.cpp runs.
    PATH must not exist: exports never overwrite.
    """
    if format_ == "gguf":
        _export_gguf(run, out, ternary)
        return
    from flax import nnx

    from stejax.lm import CONFIGS, LMConfig, Transformer, load_checkpoint
    from stejax.lm._export import export_lm, predicted_size

    if out.exists():
        raise click.BadParameter(f"{out} exists; artifacts are never overwritten.", param_hint="--out")
    if not (run / "config.json").is_file() or not (run / "params.safetensors").is_file():
        raise click.BadParameter(
            f"{run} has no config.json and params.safetensors; expected a run directory written by "
            "`stejax lm train` or one of `stejax lm compare` (OUT/seed<S>/<configuration>).",
            param_hint="RUN_OR_ARTIFACT",
        )
    run_config = json.loads((run / "config.json").read_text())
    architecture = LMConfig(**run_config["model"])
    model = load_checkpoint(Transformer(architecture, rngs=nnx.Rngs(0)), run / "params.safetensors")
    config = CONFIGS[run_config["config"]].with_input_block(run_config.get("input_block"))
    size = predicted_size(model, config)
    export_lm(model, config, out, extra={"run": str(run)})
    actual = (out / "weights.safetensors").stat().st_size
    console = Console()
    console.print(
        Text(
            f"wrote {out}: weights.safetensors {actual} bytes (predicted {size['weights_file']}); "
            f"packed codes {size['codes']} bytes, float32 {size['float32']} bytes"
        )
    )
    product = run_config.get("product", "fake-quant")
    for note in _gguf_notes(config if product == "fake-quant" else config.with_product(product), architecture):
        console.print(Text(f"note: {note}"))


def _export_gguf(source: Path, out: Path, ternary: str) -> None:
    from stejax.artifacts import ArtifactError
    from stejax.lm import GGUFError, export_gguf

    try:
        result = export_gguf(source, out, ternary=ternary)
    except (GGUFError, ArtifactError, FileExistsError) as e:
        raise click.ClickException(str(e)) from None
    counts: dict[str, int] = {}
    for kind in result.types.values():
        counts[kind] = counts.get(kind, 0) + 1
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    console = Console()
    console.print(
        Text(
            f"wrote {out}: {result.bytes} bytes, {result.config} as {kinds} tensors; "
            f"block weights {result.bits_per_weight:.4g} bits each"
        )
    )
    for note in result.input_differences:
        console.print(Text(f"note: {note}."))
    if result.input_differences:
        from stejax.lm._gguf import INPUT_TYPES

        blocks = sorted({INPUT_TYPES[kind][1] for kind in result.types.values() if kind in INPUT_TYPES})
        if result.input_block == 32:
            how = "export it with --ternary Q4_0, whose inputs llama.cpp quantises per block of 32, as the model does"
        elif len(blocks) == 1:
            how = f"train with `stejax lm train --input-block {blocks[0]}` (what the default, auto, picks here)"
        else:
            how = (
                "train with `stejax lm train --input-block 32` (what the default, auto, picks here) and export "
                "with --ternary Q4_0"
            )
        console.print(Text(f"{out} will not compute exactly what the model computes in llama.cpp; to match, {how}."))


@lm_group.command("sample", short_help="Generate text from an exported LM artifact.")
@artifact_dir_argument(exists=True, required=False)
@deprecated_option("--artifact", "artifact_dir", required=True, type=directory(exists=True))
@click.option("--prompt", "prompts", multiple=True, help="A text to continue (repeatable: one row of the batch each).")
@click.option(
    "--prompt-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A UTF-8 file of prompts, one per line (after any --prompt).",
)
@click.option(
    "--tokens", type=click.IntRange(min=1), default=48, show_default=True, help="Bytes to generate per prompt."
)
@click.option(
    "--temperature",
    type=float,
    default=0.8,
    show_default=True,
    help="Sampling temperature, >= 0; 0 picks the most likely byte every time.",
)
@click.option("--top-k", type=int, default=None, help="Sample among the K most likely bytes only (K >= 1).")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling: a probability in (0, 1].")
@click.option("--stop", "stops", multiple=True, help="Stop a row when its new bytes end with this text (repeatable).")
@click.option(
    "--ternary",
    type=click.Choice(["int8", "2bit"]),
    default="int8",
    show_default=True,
    help="How ternary weights stay in memory: one byte each, or four to a byte unpacked in the step.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The seed of the sampling key.")
def sample_command(
    artifact_dir: Path,
    prompts: tuple[str, ...],
    prompt_file: Path | None,
    tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float,
    stops: tuple[str, ...],
    ternary: str,
    seed: int,
) -> None:
    """Generate from the exported artifact ARTIFACT: every prompt in one batch, decoded in one compiled loop.

    The quantised weights stay in their exported integer form in memory. Prints
    each continuation, then bytes per second, the time to the first byte, the
    resident weight bytes and the number of compilations.
    """
    import jax

    from stejax.lm import decode, load_lowbit

    texts = list(prompts)
    if prompt_file is not None:
        texts += [line for line in prompt_file.read_text(encoding="utf-8").splitlines() if line]
    if not texts:
        raise click.UsageError("no prompt: expected --prompt TEXT (repeatable) or --prompt-file FILE; got neither.")
    loaded = load_lowbit(artifact_dir, ternary=ternary)
    try:
        done = decode(
            loaded.model,
            [t.encode("utf-8") for t in texts],
            tokens=tokens,
            key=jax.random.key(seed),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop=[s.encode("utf-8") for s in stops],
        )
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    for text, new in zip(texts, done.texts, strict=True):
        click.echo(text + new.decode("utf-8", errors="replace"))
    weights = loaded.bytes
    Console(stderr=True).print(
        Text(
            f"{loaded.config.name}: {len(texts)} prompt(s), {done.new_bytes} bytes in {done.seconds:.3f} s: "
            f"{done.bytes_per_second:.1f} bytes/s; first byte {1e3 * done.first_byte_seconds:.1f} ms; resident "
            f"weights {weights['resident']} bytes (quantised linears {weights['linear']} bytes, "
            f"{weights['linear_float32']} in float32); {done.compiles} compilation(s)"
        )
    )


@lm_group.command("corpus", short_help="Build the large byte corpus from the pinned wheels.")
@click.option(
    "--wheels",
    "wheels_dir",
    type=directory(exists=True),
    metavar="DIR",
    required=True,
    help="The folder of wheels that `make corpus` fetches (.corpus/wheels).",
)
@out_dir_option("The corpus directory to write (`lm train --corpus DIR` reads it).")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    default="requirements/corpus.txt",
    show_default=True,
    metavar="FILE",
    help="The pinned wheels: one 'name==version --hash=sha256:...' a line.",
)
def corpus_command(wheels_dir: Path, out: Path, manifest: Path) -> None:
    """Build a byte corpus in OUT from the text of the pinned wheels in --wheels.

    Every wheel the manifest lists must be there with its pinned sha256. The
    .py, .md, .rst and .txt members are read from the wheels, exact duplicates
    dropped, and each file goes to train, validation or test by a hash of its
    path. OUT gets train.bin, validation.bin and test.bin (raw bytes, memory-
    mapped when read), corpus.json and files.json. Prints each split's files,
    bytes and sha256.
    """
    import time

    from stejax.lm import SPLITS, build_wheel_corpus

    started = time.perf_counter()
    try:
        built = build_wheel_corpus(wheels_dir, out, manifest=manifest)
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    seconds = time.perf_counter() - started
    table = Table(title=f"byte corpus {out}")
    for column in ("split", "files", "bytes", "sha256"):
        table.add_column(column, justify="left" if column in ("split", "sha256") else "right")
    for split in SPLITS:
        table.add_row(split, str(built.files[split]), str(built.bytes[split]), built.sha256[split][:16])
    console = Console()
    console.print(table)
    console.print(
        Text(
            f"{sum(built.bytes.values())} bytes from {len(built.wheels)} wheels ({built.wheel_bytes} bytes); "
            f"exact duplicates dropped: {built.duplicates} file(s), {built.duplicate_bytes} bytes; {seconds:.1f} s"
        )
    )
