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

from stejax.cli._common import configuration_names, directory, guarded, out_dir_option, progress_bar, seeds_option

__all__ = ["lm_group"]

_CONFIG_NAMES = ("float", "w8a8", "w4a8", "w4a4", "w2a8", "w1.58a8", "w4a8_no_ste")


@click.group("lm")
def lm_group() -> None:
    """A quantised byte-level transformer LM: w8a8 down to BitNet b1.58 ternary."""


@lm_group.command("train")
@out_dir_option("The run directory.")
@click.option("--config", "config_name", type=click.Choice(_CONFIG_NAMES), default="float", show_default=True)
@click.option(
    "--from",
    "from_run",
    type=directory(exists=True),
    default=None,
    help="Start from this run's parameters (QAT from a float checkpoint).",
)
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--context", type=click.IntRange(min=2), default=64, show_default=True)
@click.option("--width", type=click.IntRange(min=2), default=64, show_default=True)
@click.option("--depth", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(min=1), default=160, show_default=True)
@click.option(
    "--norms",
    type=click.Choice(["llama", "subln"]),
    default="llama",
    show_default=True,
    help="llama: llama's norm placement (exports to GGUF); subln: BitNet's RMSNorm before every linear input.",
)
@click.option("--corpus", type=click.Path(exists=True, path_type=Path), default=None, help="A directory or text file.")
def train_command(
    out: Path,
    config_name: str,
    from_run: Path | None,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    context: int,
    width: int,
    depth: int,
    heads: int,
    hidden: int,
    norms: str,
    corpus: Path | None,
) -> None:
    """Train the LM (float, or a quantised configuration) and write OUT.

    OUT gets config.json, metrics.jsonl (one line per evaluation),
    params.safetensors and report.json (the test bits per byte). With --from,
    the architecture and the starting parameters come from that run.
    """
    import jax
    from flax import nnx

    from stejax import keys
    from stejax.lm import (
        LMConfig,
        TrainSettings,
        Transformer,
        bits_per_byte,
        build_corpus,
        load_checkpoint,
        quantize_lm,
        train_lm,
    )

    if from_run is not None:
        model_config = LMConfig(**json.loads((from_run / "config.json").read_text())["model"])
    else:
        try:
            model_config = LMConfig(context=context, width=width, depth=depth, heads=heads, hidden=hidden, norms=norms)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    data = build_corpus(corpus)
    k_init, k_train = keys.split(jax.random.key(seed), where="stejax lm train")
    init_seed = int(jax.random.randint(keys.consume(k_init, where="init seed"), (), 0, 2**31 - 1))
    model: nnx.Module = Transformer(model_config, rngs=nnx.Rngs(params=init_seed))
    if from_run is not None:
        model = load_checkpoint(model, from_run / "params.safetensors")
    model = quantize_lm(model, config_name)
    settings = TrainSettings(
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup=max(1, steps // 20),
        eval_every=max(1, steps // 10),
        eval_windows=32,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(
            {
                "model": model_config.to_dict(),
                "config": config_name,
                "settings": settings.to_dict(),
                "seed": seed,
                "from": str(from_run) if from_run else None,
                "corpus": data.describe() | {"files": None},
            },
            indent=2,
        )
        + "\n"
    )
    console = Console()
    console.print(
        Text(
            f"training {config_name} ({sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))} "
            f"parameters, {steps} steps) on {data.source}"
        )
    )
    with progress_bar(console) as progress:
        task = progress.add_task(config_name, total=steps)

        def on_eval(record: Mapping[str, float]) -> None:
            progress.update(
                task, completed=record["step"], description=f"{config_name} val {record['val_bpb']:.3f} bpb"
            )

        result = guarded(
            lambda: train_lm(
                model, data.data["train"], data.data["validation"], settings, key=k_train, out_dir=out, on_eval=on_eval
            )
        )
    test_bpb = bits_per_byte(result.model, data.data["test"][:65536])
    report = {
        "config": config_name,
        "test_bpb": test_bpb,
        "step_ms_median": result.step_ms_median,
        "scored": "first 65536 bytes of the test split",
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(Text(f"test {test_bpb:.4f} bits per byte; step {result.step_ms_median:.1f} ms (median); wrote {out}"))


@lm_group.command("compare")
@out_dir_option("Folder for the report.")
@click.option("--quick", is_flag=True, default=False, help="The smoke-test tier (a few minutes on 2 cores).")
@seeds_option("Seeds 0..N-1 (quick: 1, full: 2).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Float pre-training steps.")
@click.option("--finetune-steps", type=click.IntRange(min=1), default=None, help="QAT fine-tuning steps.")
@click.option("--configs", default=None, metavar="NAME,...", help="Only these configurations (float is always run).")
@click.option(
    "--scratch",
    default=None,
    metavar="NAME,...",
    help="Also train these from scratch (default w1.58a8, w4a8, w4a8_no_ste).",
)
@click.option("--corpus", type=click.Path(exists=True, path_type=Path), default=None, help="A directory or text file.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the seeds in this many processes (the same figures; about one core each).",
)
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
    runs = len(settings.seeds) * (len(settings.configs) + len(extra) + 1 + len(settings.scratch))
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
    for column in ("configuration", "test bpb", "Δ vs float", "step ms"):
        table.add_column(column)
    for name, row in report["summary"].items():
        table.add_row(
            name,
            f"{row['test_bpb_mean']:.4f} ± {row['test_bpb_std']:.4f}",
            f"{row['delta_vs_float_pct']:+.2f}%",
            f"{row['step_ms_median']:.1f}",
        )
    for name, value in report["references"].items():
        table.add_row(f"[dim]{name}[/dim]", f"{value['bpb']:.4f}", "", "")
    console.print(table)
    console.print(Text(f"wrote {out / 'report.json'} and {out / 'report.md'}"))


@lm_group.command("export")
@click.argument("run", type=directory(exists=True))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The artifact directory (must not exist).")
def export_command(run: Path, out: Path) -> None:
    """Pack RUN's weights at their bit width into an artifact (safetensors, manifest, hashes)."""
    from flax import nnx

    from stejax.lm import LMConfig, Transformer, load_checkpoint
    from stejax.lm._export import export_lm, predicted_size

    if out.exists():
        raise click.BadParameter(f"{out} exists; artifacts are never overwritten.", param_hint="--out")
    config = json.loads((run / "config.json").read_text())
    model = load_checkpoint(Transformer(LMConfig(**config["model"]), rngs=nnx.Rngs(0)), run / "params.safetensors")
    size = predicted_size(model, config["config"])
    export_lm(model, config["config"], out, extra={"run": str(run)})
    actual = (out / "weights.safetensors").stat().st_size
    console = Console()
    console.print(
        Text(
            f"wrote {out}: weights.safetensors {actual} bytes (predicted {size['weights_file']}); "
            f"packed codes {size['codes']} bytes, float32 {size['float32']} bytes"
        )
    )


@lm_group.command("sample")
@click.option("--artifact", type=directory(exists=True), required=True)
@click.option("--prompt", required=True, help="The text to continue.")
@click.option("--tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def sample_command(artifact: Path, prompt: str, tokens: int, temperature: float, seed: int) -> None:
    """Generate from an exported artifact with a key-value cache; report tokens per second against float."""
    import jax

    from stejax.lm import generate
    from stejax.lm._export import load_lm_artifact

    loaded = load_lm_artifact(artifact)
    key = jax.random.key(seed)
    try:
        quantised = generate(loaded.model, prompt.encode("utf-8"), tokens=tokens, key=key, temperature=temperature)
        with jax.debug_key_reuse(False):  # the same key on purpose: the float run is a timing reference
            reference = generate(loaded.float_model, prompt.encode(), tokens=tokens, key=key, temperature=temperature)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    click.echo(prompt + quantised.text)
    Console(stderr=True).print(
        Text(
            f"{loaded.config.name}: {quantised.tokens_per_second:.1f} tokens/s; the same weights without "
            f"quantisers: {reference.tokens_per_second:.1f} tokens/s"
        )
    )
