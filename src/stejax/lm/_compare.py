r"""``stejax lm compare``: float against every quantised configuration, on the same bytes and budget.

Per seed: the float model trains for ``float_steps``; each QAT configuration
starts from that checkpoint, is quantised by rules (:func:`stejax.lm.quantize_lm`)
and fine-tunes for ``finetune_steps``; the float baseline continues for the same
``finetune_steps`` on the same fine-tuning schedule, so every configuration sees
``float_steps + finetune_steps`` steps in all. ``w1.58a8`` is also trained from
scratch (quantised from initialisation) for that whole budget
(``w1.58a8_scratch``), and so, in both tiers, are ``w4a8`` and the no-STE
control ``w4a8_no_ste``, so that the control is also seen beside its STE
counterpart from the same start. Whenever anything is trained from scratch,
float is too (``float_scratch``): the same initialisation, steps, schedule and
batches (one key for every from-scratch run of a seed), so that each
``*_scratch`` row is read against a float model trained the same way, seed by
seed. A configuration's from-scratch recipe may differ from float's only where
``scratch_recipes`` says so (BitNet b1.58's higher rate, two stages, late
weight decay: :class:`~stejax.lm.TrainSettings`). Every quantised configuration is also scored
straight after quantisation, with no fine-tuning (``ptq``: post-training
quantisation of the float checkpoint). Everything is scored on the same test
text (the first ``eval_bytes`` of the test split), as are the references.

The no-STE control from the checkpoint: plain rounding gives every block
parameter a zero gradient, so only the embedding, the final RMSNorm and the
head train; AdamW's decoupled weight decay still acts on the block kernels
(matrices), which shrink uniformly by :math:`\prod_t (1 - \eta_t \lambda)`
(recorded per run as ``block_kernel_norm_ratio``). With absmax scales the codes
do not change; each dequantised kernel scales by that factor.

``delta_pct`` is the relative increase of the mean test bits per byte over
the row's baseline, :math:`100\,(b - b_{base}) / b_{base}`: ``float_scratch``
for a ``*_scratch`` row, ``float`` (from the checkpoint, continued) for every
other row. ``delta_vs_float_pct`` reads every row against ``float``.

Each training writes its run directory ``seed<S>/<name>`` with
``config.json`` (the architecture and configuration), ``metrics.jsonl`` and
``params.safetensors``, so that ``stejax lm export`` takes it like a run of
``stejax lm train``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from stejax import keys
from stejax.lm._configs import CONFIGS, SITES, quantize_lm
from stejax.lm._corpus import build_corpus
from stejax.lm._model import LMConfig, Transformer
from stejax.lm._references import references
from stejax.lm._sample import generate
from stejax.lm._train import LMTrainResult, TrainSettings, bits_per_byte, train_lm

__all__ = [
    "FULL",
    "QUICK",
    "CompareSettings",
    "compare_lm",
    "train_from_scratch",
    "write_report_md",
]

# Full tier targets: the relative bpb gap to float, in percent (at most).
TARGETS = {"w8a8": 1.0, "w4a8": 2.0, "w4a4": 6.0, "w1.58a8": 6.0, "w2a8": 8.0}
# From scratch, against float from scratch: (target, stretch goal), in percent (at most).
SCRATCH_TARGETS = {"w1.58a8": (4.0, 3.0)}
NO_STE_MARGIN_BPB = 0.2
NGRAM_TARGET = "ngram-3"
# TrainSettings fields that a from-scratch recipe may change (the budget and the evaluation stay the tier's),
# and warmup_fraction (a fraction of the steps, as the tier's own).
_RECIPE_FIELDS = (
    "learning_rate",
    "weight_decay",
    "min_lr_ratio",
    "two_stage",
    "stage_one_end",
    "stage_two_start",
    "stage_two_weight_decay",
    "warmup_fraction",
)


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    """One tier of the comparison.

    Attributes:
      tier: a label (``"quick"``, ``"full"``).
      model: the architecture.
      float_steps: float pre-training steps.
      finetune_steps: QAT (and float continuation) steps from the float checkpoint.
      seeds: one run of everything per seed.
      configs: configuration names (``float`` first).
      scratch: configurations also trained from scratch for the whole budget; float is then trained from
        scratch too (``float_scratch``), the baseline of every ``*_scratch`` row.
      ptq: also score every quantised configuration of ``configs`` straight after quantisation of the
        float checkpoint, with no fine-tuning (``report["ptq"]``).
      batch_size: windows per step.
      learning_rate: the float (and from-scratch) peak learning rate.
      finetune_learning_rate: the fine-tuning peak learning rate (float's continuation and every
        configuration not in ``finetune_learning_rates``).
      finetune_learning_rates: a peak fine-tuning learning rate per configuration name, overriding
        ``finetune_learning_rate`` (ternary weights want a larger one).
      warmup_fraction: the float (and from-scratch) warm-up, as a fraction of its steps.
      finetune_warmup_fraction: every fine-tuning's fresh warm-up, as a fraction of its steps.
      finetune_weight_decays: AdamW's weight decay per configuration name for its fine-tuning, overriding
        :class:`~stejax.lm.TrainSettings`' default (0.1) there.
      finetune_min_lr_ratios: the cosine's final learning rate over the peak per configuration name for its
        fine-tuning, overriding :class:`~stejax.lm.TrainSettings`' default (0.1) there.
      scratch_recipe: changes to every from-scratch run's schedule, ``float_scratch`` included (fields of
        :class:`~stejax.lm.TrainSettings`: ``learning_rate``, ``weight_decay``, ``min_lr_ratio``,
        ``two_stage``, ``stage_one_end``, ``stage_two_start``, ``stage_two_weight_decay``, and
        ``warmup_fraction``).
      scratch_recipes: further changes per configuration name (``{"w1.58a8": {"learning_rate": 1.5e-2}}``),
        applied after ``scratch_recipe``.
      eval_bytes: bytes of the test split scored (None: all of it).
      eval_every: steps between validation evaluations.
      corpus_max_bytes: cap on the corpus (None: all of it).
      reference_context_bytes: the compressors' context (None: the whole training split).
      prompt: the sampling prompt of the report.
      sample_tokens: bytes sampled per configuration.
    """

    tier: str
    model: LMConfig
    float_steps: int
    finetune_steps: int
    seeds: tuple[int, ...] = (0,)
    configs: tuple[str, ...] = tuple(CONFIGS)
    scratch: tuple[str, ...] = ("w1.58a8",)
    ptq: bool = True
    batch_size: int = 32
    learning_rate: float = 1e-2
    finetune_learning_rate: float = 3e-3
    finetune_learning_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    warmup_fraction: float = 0.1
    finetune_warmup_fraction: float = 0.1
    finetune_weight_decays: Mapping[str, float] = dataclasses.field(default_factory=dict)
    finetune_min_lr_ratios: Mapping[str, float] = dataclasses.field(default_factory=dict)
    scratch_recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    scratch_recipes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    eval_bytes: int | None = 65536
    eval_every: int = 100
    corpus_max_bytes: int | None = None
    reference_context_bytes: int | None = None
    prompt: str = "def "
    sample_tokens: int = 48

    def __post_init__(self) -> None:
        unknown = [c for c in (*self.configs, *self.scratch) if c not in CONFIGS]
        if unknown:
            raise ValueError(f"CompareSettings: unknown configuration(s) {unknown}; expected among {list(CONFIGS)}.")
        if "float" not in self.configs:
            raise ValueError("CompareSettings: configs must include 'float' (every delta is relative to it).")
        if not self.seeds:
            raise ValueError("CompareSettings: at least one seed is needed.")
        for field in ("finetune_learning_rates", "finetune_weight_decays", "finetune_min_lr_ratios"):
            odd = [n for n in getattr(self, field) if n not in CONFIGS]
            if odd:
                raise ValueError(f"CompareSettings: {field} names {odd}; expected among {list(CONFIGS)}.")
        negative = {n: v for n, v in self.finetune_weight_decays.items() if not v >= 0}
        if negative:
            raise ValueError(f"CompareSettings: finetune_weight_decays must be >= 0; got {negative}.")
        outside = {n: v for n, v in self.finetune_min_lr_ratios.items() if not 0 <= v <= 1}
        if outside:
            raise ValueError(f"CompareSettings: finetune_min_lr_ratios must lie in [0, 1]; got {outside}.")
        for name in ("warmup_fraction", "finetune_warmup_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"CompareSettings: `{name}` must lie in [0, 1]; got {getattr(self, name)!r}.")
        odd = [n for n in self.scratch_recipes if n not in CONFIGS]
        if odd:
            raise ValueError(f"CompareSettings: scratch_recipes names {odd}; expected among {list(CONFIGS)}.")
        for label, recipe in (("scratch_recipe", self.scratch_recipe), *self.scratch_recipes.items()):
            unknown_fields = [k for k in recipe if k not in _RECIPE_FIELDS]
            if unknown_fields:
                raise ValueError(
                    f"CompareSettings: the from-scratch recipe of {label!r} changes {unknown_fields}; expected "
                    f"fields among {list(_RECIPE_FIELDS)}."
                )
        for name in self.scratch_names:
            self.scratch_for(name)  # TrainSettings checks the values

    @property
    def scratch_names(self) -> tuple[str, ...]:
        """The configurations trained from scratch: ``float`` first whenever ``scratch`` names any."""
        return ("float", *(n for n in self.scratch if n != "float")) if self.scratch else ()

    def schedules(self) -> tuple[TrainSettings, TrainSettings, TrainSettings]:
        """(float pre-training, fine-tuning at ``finetune_learning_rate``, from scratch for the whole budget)."""
        total = self.float_steps + self.finetune_steps
        main = TrainSettings(
            steps=self.float_steps,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            warmup=max(1, int(self.float_steps * self.warmup_fraction)),
            eval_every=min(self.eval_every, self.float_steps),
            eval_windows=32,
        )
        finetune = dataclasses.replace(
            main,
            steps=self.finetune_steps,
            learning_rate=self.finetune_learning_rate,
            warmup=int(self.finetune_steps * self.finetune_warmup_fraction),
            eval_every=min(self.eval_every, self.finetune_steps),
        )
        scratch = dataclasses.replace(
            main, steps=total, warmup=max(1, int(total * self.warmup_fraction)), eval_every=min(self.eval_every, total)
        )
        return main, finetune, scratch

    def finetune_for(self, name: str, finetune: TrainSettings) -> TrainSettings:
        """``finetune`` with ``name``'s own peak and final learning rates and weight decay where the maps give them."""
        if name in self.finetune_learning_rates:
            finetune = dataclasses.replace(finetune, learning_rate=self.finetune_learning_rates[name])
        if name in self.finetune_weight_decays:
            finetune = dataclasses.replace(finetune, weight_decay=self.finetune_weight_decays[name])
        if name in self.finetune_min_lr_ratios:
            finetune = dataclasses.replace(finetune, min_lr_ratio=self.finetune_min_lr_ratios[name])
        return finetune

    def scratch_for(self, name: str) -> TrainSettings:
        """The from-scratch schedule of configuration ``name``: the tier's, changed by ``scratch_recipe`` then by
        ``scratch_recipes[name]``."""
        _, _, scratch = self.schedules()
        changes = {**self.scratch_recipe, **self.scratch_recipes.get(name, {})}
        fraction = changes.pop("warmup_fraction", None)
        if fraction is not None:
            if not 0 <= fraction <= 1:
                raise ValueError(f"CompareSettings: a recipe's warmup_fraction must lie in [0, 1]; got {fraction!r}.")
            changes["warmup"] = int(scratch.steps * fraction)
        return dataclasses.replace(scratch, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        out["finetune_learning_rates"] = dict(self.finetune_learning_rates)
        out["finetune_weight_decays"] = dict(self.finetune_weight_decays)
        out["finetune_min_lr_ratios"] = dict(self.finetune_min_lr_ratios)
        out["scratch_recipe"] = dict(self.scratch_recipe)
        out["scratch_recipes"] = {k: dict(v) for k, v in self.scratch_recipes.items()}
        out["scratch_schedules"] = {n: self.scratch_for(n).to_dict() for n in self.scratch_names}
        return out

    def replace(self, **changes: Any) -> CompareSettings:
        """A copy with fields changed."""
        return dataclasses.replace(self, **changes)


# Both tiers' architecture, every field spelled out so that a change of LMConfig's defaults leaves them as measured.
TIER_MODEL = LMConfig(
    context=64, width=64, depth=2, heads=2, hidden=160, mlp="swiglu", positions="rotary", tied=False, norms="subln"
)

# The from-scratch recipe of both tiers, chosen on the validation split (benchmarks/lm_recipe.py, seeds 10-12,
# never the comparison's): a 30% warm-up for every from-scratch run (float's validation bpb -1.0%, w1.58a8's
# -0.8%); for w1.58a8 also BitNet b1.58's second stage without weight decay and a final rate of 0 (-1.7% with
# the warm-up). A higher peak rate (1.5e-2, 2e-2, 3e-2) and the two-stage drop of the rate made both worse.
SCRATCH_RECIPE: Mapping[str, Any] = {"warmup_fraction": 0.3}
SCRATCH_RECIPES: Mapping[str, Mapping[str, Any]] = {"w1.58a8": {"stage_two_weight_decay": 0.0, "min_lr_ratio": 0.0}}

QUICK = CompareSettings(
    tier="quick",
    model=TIER_MODEL,
    float_steps=250,
    finetune_steps=150,
    scratch=("w1.58a8", "w4a8", "w4a8_no_ste"),
    scratch_recipe=SCRATCH_RECIPE,
    scratch_recipes=SCRATCH_RECIPES,
    batch_size=16,
    eval_bytes=16384,
    eval_every=100,
    reference_context_bytes=1 << 20,
    sample_tokens=32,
)

# The full tier as run on a shared 2-core machine: the quick tier's 0.1M-parameter model,
# 800 steps on the recipe tuned on validation (float 600, fine-tuning 200: the split with the
# lower validation bpb for float and for w1.58a8; 500 + 300 narrows w1.58a8's gap to float
# only by making float worse, and is not used), 3 seeds, 128 KiB of the test split. The
# 0.87M-parameter model (LMConfig(), context 128, batch 32) takes over a second a step
# there: hours a seed. model=LMConfig() is one replace away.
FULL = CompareSettings(
    tier="full",
    model=TIER_MODEL,
    float_steps=600,
    finetune_steps=200,
    seeds=(0, 1, 2),
    scratch=("w1.58a8", "w4a8", "w4a8_no_ste"),
    scratch_recipe=SCRATCH_RECIPE,
    scratch_recipes=SCRATCH_RECIPES,
    batch_size=16,
    eval_bytes=131072,
    eval_every=200,
    reference_context_bytes=1 << 20,
    sample_tokens=48,
)


def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "devices": [str(d) for d in jax.devices()],
        **{name: md.version(name) for name in ("jax", "jaxlib", "flax", "optax", "numpy")},
    }


def compare_lm(
    settings: CompareSettings,
    *,
    out_dir: str | os.PathLike,
    corpus: str | os.PathLike | None = None,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    workers: int = 1,
    extra: Mapping[str, Callable[[nnx.Module], nnx.Module]] | None = None,
) -> dict[str, Any]:
    """Run the comparison and write ``report.json``, ``report.md`` and one run directory per training.

    ``workers > 1`` runs the seeds in that many processes (``spawn``), one seed
    each at a time: the same keys, so the same figures as one process (each
    worker reads the corpus again); ``on_event`` then hears of a seed only when
    it is done. Runs of a small model use about one core each, so on 2 cores
    2 workers halve the wall time of 2 seeds.

    ``extra`` adds fine-tuned configurations made by other means (a peer
    library's quantisation, as the peers suite of ``stejax bench`` does): ``name -> f`` with
    ``f(float checkpoint) -> model``, fine-tuned exactly as the configurations
    (the same schedule, one key each from ``fold_in(key(seed), 1000 + i)`` so
    that the other runs' keys do not change) and scored on the same text. With
    ``workers > 1`` each ``f`` must pickle (a module-level function).

    Returns:
      The report (also in ``out_dir/report.json``): ``summary[cfg]`` with
      ``test_bpb_mean``, ``test_bpb_std`` (population std over seeds, 0 for one
      seed), ``test_bpb_min``, ``test_bpb_max``, ``baseline`` (``float_scratch``
      for a ``*_scratch`` row, else ``float``), ``delta_pct`` (against the
      baseline), ``delta_vs_float_pct`` (against ``float``) and
      ``step_ms_median``; ``paired[cfg]`` for each ``*_scratch`` row but
      ``float_scratch``: the delta against ``float_scratch`` seed by seed, its
      mean, std, min and max; ``per_seed[cfg]``; ``ptq``; ``references``;
      ``targets``; ``samples``; ``corpus``; ``policy``; ``settings``;
      ``environment``.
    """
    extra = dict(extra or {})
    clash = [n for n in extra if n in CONFIGS or n.endswith("_scratch")]
    if clash:
        raise ValueError(f"compare_lm: extra names {clash} clash with configuration names; choose others.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda event: None)
    started = time.perf_counter()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    environment = _environment()
    data = build_corpus(corpus, max_bytes=settings.corpus_max_bytes)
    text = data.data["test"] if settings.eval_bytes is None else data.data["test"][: settings.eval_bytes]

    def compute_references() -> dict[str, Any]:
        emit({"event": "references"})
        return references(
            data.data["train"], data.data["validation"], text, context_bytes=settings.reference_context_bytes
        )

    names = [*settings.configs, *extra, *(f"{c}_scratch" for c in settings.scratch_names)]
    per_seed: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    ptq_per_seed: dict[str, list[float]] = {}
    samples: dict[str, str] = {}
    total = settings.float_steps + settings.finetune_steps
    if workers > 1 and len(settings.seeds) > 1:
        # The references are computed here while the workers train.
        results, refs = _run_parallel(settings, out, corpus, workers, emit, extra, compute_references)
    else:
        refs = compute_references()
        results = [_run_seed(settings, seed, data.data, text, out, emit, extra) for seed in settings.seeds]
    for seed, (records, seed_samples) in zip(settings.seeds, results, strict=True):
        for name, record in records.items():
            if name.endswith("_ptq"):
                ptq_per_seed.setdefault(name.removesuffix("_ptq"), []).append(record["test_bpb"])
            else:
                per_seed[name].append(record)
        if seed == settings.seeds[0]:
            samples.update(seed_samples)
    summary = _summary(per_seed)
    report = {
        "tier": settings.tier,
        "summary": summary,
        "paired": _paired(per_seed),
        "per_seed": per_seed,
        "ptq": _ptq_summary(ptq_per_seed, summary["float"]["test_bpb_mean"]),
        "references": refs,
        "targets": _targets(summary, refs, settings),
        "samples": {
            "prompt": settings.prompt,
            "key": "the last of 5 keys split from jax.random.key(first seed)",
            "text": samples,
        },
        "corpus": {
            **data.describe(),
            "scored_bytes": int(text.size),
            "scored": "the first eval_bytes of the test split",
        },
        "policy": {
            "quantised": f"the nnx.Linear layers matching {SITES!r} (q, k, v, o, gate, up, down), weights and inputs",
            "float": "embedding, RMSNorms, output head, attention products q.k and p.v, softmax",
            "rmsnorm_before_each_quantised_input": True,
            "mechanism": "stejax.flax.quantize_model with one Rule(SITES, kinds=('linear',), weights=..., inputs=...)",
            "configs": {name: CONFIGS[name].description for name in CONFIGS},
            "w4a8_no_ste_trains": "only the embedding, the final RMSNorm and the output head: plain rounding gives "
            "zero gradient to every quantised weight and, through the rounded inputs, to everything before them in "
            "the blocks (the RMSNorms feeding q, k, v, o, gate, up, down); the residual stream still carries the "
            "embedding's gradient to the head (tested in tests/test_lm.py). AdamW's decoupled weight decay still "
            "shrinks the block kernels (zero gradient, but matrices): per_seed[...]['block_kernel_norm_ratio'] "
            "records the factor; the absmax codes do not change, each dequantised kernel scales by it. From the "
            "checkpoint this control is therefore post-training quantisation (report['ptq']['w4a8']) plus a "
            "fine-tune of the embedding, final norm and head; from scratch (w4a8_no_ste_scratch) the blocks keep "
            "their initial weights (shrunk by the decay)",
            "budget": f"float {settings.float_steps} steps, then {settings.finetune_steps} fine-tuning steps for every "
            f"configuration (float continues); from scratch: {total} steps",
            "baselines": "a *_scratch row is read against float_scratch (float trained from scratch on the same "
            "steps, schedule, initialisation and batches); every other row against float (pre-trained, then "
            "continued on the fine-tuning schedule)",
        },
        "settings": settings.to_dict(),
        "environment": {**environment, "load_average_at_end": list(os.getloadavg())},
        "started": started_at,
        "seconds": time.perf_counter() - started,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    write_report_md(report, out)
    return report


def _run_seed(
    settings: CompareSettings,
    seed: int,
    data: Mapping[str, np.ndarray],
    text: np.ndarray,
    out: Path,
    emit: Callable[[Mapping[str, Any]], None],
    extra: Mapping[str, Callable[[nnx.Module], nnx.Module]],
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """One seed: float pre-training, every fine-tuning, every from-scratch run; (records by name, samples)."""
    main, finetune, _ = settings.schedules()
    records: dict[str, dict[str, Any]] = {}
    samples: dict[str, str] = {}
    fresh, (k_float, k_tune, k_scratch, k_sample) = _seed_start(settings, seed)
    emit({"event": "train", "config": "float (pre-training)", "seed": seed, "steps": settings.float_steps})
    run_dir = out / f"seed{seed}" / "float_base"
    _write_run_config(run_dir, settings, "float", main, seed, start="initialisation")
    base = train_lm(fresh, data["train"], data["validation"], main, key=k_float, out_dir=run_dir)
    tune_keys = keys.split(k_tune, len(settings.configs), where="one fine-tuning key per configuration")
    for name, k in zip(settings.configs, tune_keys, strict=True):
        emit({"event": "train", "config": name, "seed": seed, "steps": settings.finetune_steps})
        model = quantize_lm(base.model, name)
        if settings.ptq and name != "float" and CONFIGS[name].ste:  # no-STE's forward is its STE twin's
            records[f"{name}_ptq"] = {"seed": seed, "test_bpb": bits_per_byte(model, text)}
        schedule = settings.finetune_for(name, finetune)
        run_dir = out / f"seed{seed}" / name
        _write_run_config(run_dir, settings, name, schedule, seed, start="float_base")
        run = train_lm(model, data["train"], data["validation"], schedule, key=k, out_dir=run_dir)
        records[name] = {**_record(seed, run, text, base.history), **_kernel_ratio(model, run.model)}
        samples[name] = _sample(run.model, settings, k_sample)
    for i, (name, make) in enumerate(extra.items()):
        emit({"event": "train", "config": name, "seed": seed, "steps": settings.finetune_steps})
        k = jax.random.fold_in(jax.random.key(seed), 1000 + i)
        run = train_lm(
            make(base.model), data["train"], data["validation"], finetune, key=k, out_dir=out / f"seed{seed}" / name
        )
        records[name] = _record(seed, run, text, base.history)
        samples[name] = _sample(run.model, settings, k_sample)
    for name in settings.scratch_names:
        label = f"{name}_scratch"
        schedule = settings.scratch_for(name)
        emit({"event": "train", "config": label, "seed": seed, "steps": schedule.steps})
        model = quantize_lm(fresh, name)
        run_dir = out / f"seed{seed}" / label
        _write_run_config(run_dir, settings, name, schedule, seed, start="initialisation")
        # One key for every from-scratch run of the seed: the same batches, so the paired delta compares models.
        with jax.debug_key_reuse(False):
            run = train_lm(model, data["train"], data["validation"], schedule, key=k_scratch, out_dir=run_dir)
        records[label] = {**_record(seed, run, text, ()), **_kernel_ratio(model, run.model)}
        samples[label] = _sample(run.model, settings, k_sample)
    return records, samples


def _seed_start(settings: CompareSettings, seed: int) -> tuple[nnx.Module, tuple[jax.Array, ...]]:
    """A seed's initial model and its keys (float pre-training, fine-tunings, from scratch, samples)."""
    k_init, *rest = keys.split(jax.random.key(seed), 5, where=f"compare seed {seed}")
    init_seed = int(jax.random.randint(keys.consume(k_init, where="init seed"), (), 0, 2**31 - 1))
    return Transformer(settings.model, rngs=nnx.Rngs(params=init_seed)), tuple(rest)


def train_from_scratch(
    settings: CompareSettings,
    name: str,
    seed: int,
    train: np.ndarray,
    validation: np.ndarray,
    *,
    out_dir: str | os.PathLike | None = None,
) -> LMTrainResult:
    """The run :func:`compare_lm` makes for ``<name>_scratch`` and ``seed``: the same initial weights, batches
    and schedule (:meth:`CompareSettings.scratch_for`), so a recipe is tuned on exactly the comparison's runs."""
    if name not in CONFIGS:
        raise KeyError(f"train_from_scratch: unknown configuration {name!r}; expected one of {', '.join(CONFIGS)}.")
    fresh, (_, _, k_scratch, _) = _seed_start(settings, seed)
    schedule = settings.scratch_for(name)
    if out_dir is not None:
        _write_run_config(Path(out_dir), settings, name, schedule, seed, start="initialisation")
    return train_lm(quantize_lm(fresh, name), train, validation, schedule, key=k_scratch, out_dir=out_dir)


def _write_run_config(
    run_dir: Path, settings: CompareSettings, name: str, schedule: TrainSettings, seed: int, *, start: str
) -> None:
    """``config.json`` as ``stejax lm train`` writes it: what ``stejax lm export`` reads (model, config)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "model": settings.model.to_dict(),
        "config": name,
        "settings": schedule.to_dict(),
        "seed": seed,
        "from": start,
        "comparison": settings.tier,
    }
    (run_dir / "config.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _seed_worker(
    settings: CompareSettings,
    seed: int,
    out: Path,
    corpus: str | os.PathLike | None,
    extra: Mapping[str, Callable[[nnx.Module], nnx.Module]],
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """:func:`_run_seed` in a worker process (the corpus read again there)."""
    data = build_corpus(corpus, max_bytes=settings.corpus_max_bytes)
    text = data.data["test"] if settings.eval_bytes is None else data.data["test"][: settings.eval_bytes]
    return _run_seed(settings, seed, data.data, text, out, lambda event: None, extra)


def _run_parallel(
    settings: CompareSettings,
    out: Path,
    corpus: str | os.PathLike | None,
    workers: int,
    emit: Callable[[Mapping[str, Any]], None],
    extra: Mapping[str, Callable[[nnx.Module], nnx.Module]],
    meanwhile: Callable[[], dict[str, Any]],
) -> tuple[list[tuple[dict[str, dict[str, Any]], dict[str, str]]], dict[str, Any]]:
    """The seeds in worker processes, and ``meanwhile()`` in this one while they run."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_seed_worker, settings, seed, out, corpus, extra) for seed in settings.seeds]
        side = meanwhile()
        results = []
        for seed, future in zip(settings.seeds, futures, strict=True):
            results.append(future.result())
            emit({"event": "seed done", "seed": seed})
        return results, side


def _record(seed: int, run: Any, text: np.ndarray, before: tuple[dict[str, float], ...]) -> dict[str, Any]:
    return {
        "seed": seed,
        "test_bpb": bits_per_byte(run.model, text),
        "step_ms_median": run.step_ms_median,
        "history": [*({**h, "phase": "float"} for h in before), *({**h, "phase": "this"} for h in run.history)],
    }


def _kernel_ratio(before: nnx.Module, after: nnx.Module) -> dict[str, float]:
    """``block_kernel_norm_ratio``: :math:`\\lVert W_{after} \rVert / \\lVert W_{before} \rVert` over every
    quantised block kernel together (the weight decay's shrink where the gradient is zero)."""

    def norm(model: nnx.Module) -> float:
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]
        total = 0.0
        for path, leaf in flat:
            name = "/".join(str(getattr(p, "key", p)) for p in path)
            if name.endswith("/kernel") and re.fullmatch(SITES, name.removesuffix("/kernel")):
                total += float(np.sum(np.square(np.asarray(leaf, np.float64))))
        return math.sqrt(total)

    return {"block_kernel_norm_ratio": norm(after) / norm(before)}


def _ptq_summary(per_seed: Mapping[str, list[float]], float_mean: float) -> dict[str, dict[str, Any]]:
    """Test bpb of each configuration quantised from the float checkpoint without fine-tuning."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in per_seed.items():
        bpb = np.array(values)
        out[name] = {
            "test_bpb_mean": float(bpb.mean()),
            "test_bpb_std": float(bpb.std()),
            "delta_pct": float(100 * (bpb.mean() - float_mean) / float_mean),
            "delta_vs_float_pct": float(100 * (bpb.mean() - float_mean) / float_mean),
            "per_seed": [float(v) for v in bpb],
            "what": "the float checkpoint (before float's continuation) quantised, no fine-tuning; delta against "
            "the float baseline after the whole budget",
        }
    return out


def _sample(model: nnx.Module, settings: CompareSettings, key: jax.Array) -> str:
    prompt = settings.prompt.encode("utf-8")
    tokens = min(settings.sample_tokens, settings.model.context - len(prompt))
    # The same key for every configuration, on purpose: the samples differ only by the model.
    with jax.debug_key_reuse(False):
        return generate(model, prompt, tokens=tokens, key=key, temperature=0.8).text


def _baseline(name: str) -> str:
    return "float_scratch" if name.endswith("_scratch") else "float"


def _summary(per_seed: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    means = {name: float(np.mean([r["test_bpb"] for r in runs])) for name, runs in per_seed.items()}
    for name, runs in per_seed.items():
        bpb = np.array([r["test_bpb"] for r in runs])
        base = _baseline(name)
        out[name] = {
            "test_bpb_mean": means[name],
            "test_bpb_std": float(bpb.std()),
            "test_bpb_min": float(bpb.min()),
            "test_bpb_max": float(bpb.max()),
            "baseline": base,
            "delta_pct": float(100 * (means[name] - means[base]) / means[base]),
            "delta_vs_float_pct": float(100 * (means[name] - means["float"]) / means["float"]),
            "step_ms_median": float(np.median([r["step_ms_median"] for r in runs])),
        }
    return out


def _paired(per_seed: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each ``*_scratch`` row against ``float_scratch`` seed by seed (the same initialisation and batches)."""
    if "float_scratch" not in per_seed:
        return {}
    floats = {r["seed"]: r["test_bpb"] for r in per_seed["float_scratch"]}
    out: dict[str, dict[str, Any]] = {}
    for name, runs in per_seed.items():
        if not name.endswith("_scratch") or name == "float_scratch":
            continue
        rows = [
            {
                "seed": r["seed"],
                "test_bpb": r["test_bpb"],
                "float_scratch_test_bpb": floats[r["seed"]],
                "delta_pct": 100 * (r["test_bpb"] - floats[r["seed"]]) / floats[r["seed"]],
            }
            for r in runs
        ]
        deltas = np.array([r["delta_pct"] for r in rows])
        out[name] = {
            "per_seed": rows,
            "delta_pct_mean": float(deltas.mean()),
            "delta_pct_std": float(deltas.std()),
            "delta_pct_min": float(deltas.min()),
            "delta_pct_max": float(deltas.max()),
        }
    return out


def _targets(
    summary: Mapping[str, Mapping[str, float]], refs: Mapping[str, Any], settings: CompareSettings
) -> dict[str, Any]:
    rows = {}
    if NGRAM_TARGET in refs:
        rows[f"float < {NGRAM_TARGET}"] = {
            "measured": summary["float"]["test_bpb_mean"],
            "bound": refs[NGRAM_TARGET]["bpb"],
            "met": summary["float"]["test_bpb_mean"] < refs[NGRAM_TARGET]["bpb"],
        }
    for name, bound in TARGETS.items():
        if name in summary:
            delta = summary[name]["delta_pct"]
            rows[f"{name} delta <= {bound}%"] = {"measured": delta, "bound": bound, "met": delta <= bound}
    for name, (bound, stretch) in SCRATCH_TARGETS.items():
        label = f"{name}_scratch"
        if label in summary and "float_scratch" in summary:
            delta = summary[label]["delta_pct"]
            rows[f"{label} delta vs float_scratch <= {bound}%"] = {
                "measured": delta,
                "bound": bound,
                "met": delta <= bound,
                "stretch": stretch,
                "stretch_met": delta <= stretch,
                "note": f"stretch goal <= {stretch}%: {'met' if delta <= stretch else 'missed'}",
            }
    # From scratch first: ternary and the control are judged as BitNet trains them, as the digits comparison does.
    pairings = {
        "from scratch": (
            "w4a8_no_ste_scratch",
            [f"{n}_scratch" for n in settings.scratch_names if CONFIGS[n].ste and n != "float"],
        ),
        "from the float checkpoint": ("w4a8_no_ste", [n for n in summary if n in CONFIGS and CONFIGS[n].ste]),
    }
    gaps: dict[str, dict[str, Any]] = {}
    for pairing, (control, candidates) in pairings.items():
        ste = [n for n in candidates if n not in ("float", "float_scratch") and n in summary]
        if control in summary and ste:
            worst = max(ste, key=lambda n: summary[n]["test_bpb_mean"])
            gap = summary[control]["test_bpb_mean"] - summary[worst]["test_bpb_mean"]
            gaps[pairing] = {"control": control, "worst_ste": worst, "measured": gap, "met": gap >= NO_STE_MARGIN_BPB}
    if gaps:
        judged, *other = list(gaps)
        row: dict[str, Any] = {
            **gaps[judged],
            "bound": NO_STE_MARGIN_BPB,
            "pairing": f"judged {judged}: {gaps[judged]['control']} against every STE configuration {judged}",
        }
        if other:
            row["other_pairing"] = {"pairing": other[0], **gaps[other[0]]}
            row["note"] = (
                f"{other[0]}: {gaps[other[0]]['control']} - {gaps[other[0]]['worst_ste']} = "
                f"{gaps[other[0]]['measured']:+.4f} bpb"
            )
        rows[f"w4a8_no_ste >= every STE configuration + {NO_STE_MARGIN_BPB} bpb"] = row
    return {
        "tier": settings.tier,
        "judged": settings.tier == "full" and len(settings.seeds) >= 2,
        "note": "The targets are stated for the full tier (mean over at least 2 seeds); other tiers report them, "
        "unjudged.",
        "rows": rows,
    }


def write_report_md(report: Mapping[str, Any], out: Path) -> Path:
    """Write ``report.md`` (and ``curves.png`` with matplotlib): the table, references, targets, curves, samples."""
    lines = [f"# stejax lm compare ({report['tier']} tier)", ""]
    lines += [
        "| configuration | test bpb (mean ± std) | Δ vs baseline | baseline | Δ vs float | step ms (median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["summary"].items():
        lines.append(
            f"| `{name}` | {row['test_bpb_mean']:.4f} ± {row['test_bpb_std']:.4f} | {row['delta_pct']:+.2f}% "
            f"| `{row['baseline']}` | {row['delta_vs_float_pct']:+.2f}% | {row['step_ms_median']:.1f} |"
        )
    if report.get("paired"):
        lines += ["", "From scratch against `float_scratch`, seed by seed (Δ test bpb):", ""]
        lines += ["| configuration | per seed | mean ± std | min .. max |", "|---|---|---|---|"]
        lines += [
            f"| `{name}` | {_per_seed_deltas(pair['per_seed'])} "
            f"| {pair['delta_pct_mean']:+.2f}% ± {pair['delta_pct_std']:.2f} "
            f"| {pair['delta_pct_min']:+.2f}% .. {pair['delta_pct_max']:+.2f}% |"
            for name, pair in report["paired"].items()
        ]
    lines += ["", "References on the same bytes (bits per byte):", "", "| reference | bpb |", "|---|---|"]
    lines += [f"| {name} | {value['bpb']:.4f} |" for name, value in report["references"].items()]
    lines += [
        "",
        f"Targets ({'judged' if report['targets']['judged'] else 'not judged: ' + report['targets']['note']}):",
        "",
    ]
    lines += ["| target | measured | bound | met | note |", "|---|---|---|---|---|"]
    lines += [
        f"| {k} | {v['measured']:.4f} | {v['bound']} | {v['met']} | "
        f"{'; '.join(x for x in (v.get('pairing', ''), v.get('note', '')) if x)} |"
        for k, v in report["targets"]["rows"].items()
    ]
    if report.get("ptq"):
        lines += ["", "Post-training quantisation of the float checkpoint, no fine-tuning (test bpb):", ""]
        lines += ["| configuration | test bpb (mean ± std) | Δ vs float |", "|---|---|---|"]
        lines += [
            f"| `{name}` | {row['test_bpb_mean']:.4f} ± {row['test_bpb_std']:.4f} | {row['delta_pct']:+.2f}% |"
            for name, row in report["ptq"].items()
        ]
    ratios = {
        name: float(np.mean([r["block_kernel_norm_ratio"] for r in runs]))
        for name, runs in report["per_seed"].items()
        if runs and "block_kernel_norm_ratio" in runs[0]
    }
    if ratios:
        lines += [
            "",
            "Block kernels' norm after / before training (the weight decay's shrink where the gradient is zero): "
            + ", ".join(f"`{n}` {v:.4f}" for n, v in ratios.items()),
        ]
    picture = _plot_curves(report, out)
    if picture is not None:
        lines += ["", f"![validation bits per byte by step]({picture.name})"]
    lines += ["", f"Samples from the prompt {report['samples']['prompt']!r}, one key for all, temperature 0.8:", ""]
    for name, sample in report["samples"]["text"].items():
        lines += [f"**{name}**", "", "```text", report["samples"]["prompt"] + sample, "```", ""]
    lines += [
        "",
        f"Policy: {report['policy']['quantised']} are quantised; {report['policy']['float']} stay float32.",
        "",
    ]
    lines += [f"Corpus: {report['corpus']['source']}; sha256 {json.dumps(report['corpus']['sha256'])}.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _per_seed_deltas(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seed']}: {r['delta_pct']:+.2f}%" for r in rows)


def _plot_curves(report: Mapping[str, Any], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the report is complete without the picture
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, runs in report["per_seed"].items():
        history = runs[0]["history"]
        steps, offset, xs, ys = [], 0, [], []
        for h in history:
            if h["phase"] == "float":
                offset = max(offset, h["step"])
        for h in history:
            steps.append(h["step"] + (offset if h["phase"] == "this" else 0))
            xs.append(steps[-1])
            ys.append(h["val_bpb"])
        ax.plot(xs, ys, label=name, marker=".")
    ax.set_xlabel("step (float pre-training, then fine-tuning)")
    ax.set_ylabel("validation bits per byte")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
