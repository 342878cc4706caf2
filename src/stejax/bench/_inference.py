"""The inference suite: float, fake-quantised and integer-exported forward passes."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax.bench._measure import compare
from stejax.data import Normalizer
from stejax.model import init_params, preset

__all__ = ["QUANTISED", "inference_suite"]

# The QAT presets whose fake-quantised and integer forward passes are timed.
QUANTISED = ("w8a8", "w4a4")


def inference_suite(*, repeats: int, warmup: int, quick: bool) -> dict[str, Any]:
    """Time the jitted eval-mode forward pass at batch 1 (latency) and a large batch (throughput).

    Variants: ``float`` (the float preset), ``fake-quant <preset>``
    (:func:`stejax.train.forward` with the preset's quantisers, float arithmetic)
    and ``integer <preset>`` (:meth:`stejax.export.ExportedModel.apply`: packed
    integer weights, int8 products with int32 accumulation). The fake-quantised
    and float passes take standardised features; the integer model takes raw
    features and standardises them itself (it is what a server runs). Parameters
    are freshly initialised (the timing does not depend on their values). The
    integer variants are skipped, with a note, when :mod:`stejax.export` is not
    available.

    Returns:
      ``{"config", "groups", "notes"}``: one group per batch size, each variant
      compared with ``float`` as per-round ratios.
    """
    from stejax.train import TrainConfig, forward, load_splits

    config = TrainConfig(model="mlp", hidden=(16,)) if quick else TrainConfig()
    batch_sizes = (1, 32) if quick else (1, 256)
    splits = load_splits(config)
    normalizer = Normalizer.fit(splits.train.x)
    model_config = config.model_config(splits.train)
    rng = np.random.default_rng(0)
    rows = rng.choice(len(splits.train), max(batch_sizes), replace=False)
    raw = np.asarray(splits.train.x[rows], np.float32)

    exporter, notes = _exporter()
    variants: dict[str, Any] = {}
    for name in ("float", *QUANTISED):
        qc = preset(name)
        params = init_params(jax.random.key(0), model_config, qc)
        fn = jax.jit(functools.partial(forward, model_config=model_config, qat_config=qc))
        label = "float" if name == "float" else f"fake-quant {name}"
        variants[label] = ("standardised", fn, params)
        if name != "float" and exporter is not None:
            try:
                model = exporter(params, model_config, qc, normalizer)
            except Exception as error:  # a preset the export does not cover is reported, not fatal
                notes.append(f"integer {name}: not exported ({type(error).__name__}: {error})")
                continue
            variants[f"integer {name}"] = ("raw", jax.jit(model.apply), model.weights)
    groups = []
    for n in batch_sizes:
        x_raw = jnp.asarray(raw[:n])
        x_std = jnp.asarray(normalizer.apply(raw[:n]))
        calls = {
            label: (lambda f=fn, p=p, x=(x_std if kind == "standardised" else x_raw): f(p, x))
            for label, (kind, fn, p) in variants.items()
        }
        groups.append(
            compare(
                f"forward, batch {n} ({config.model})",
                calls,
                repeats=repeats,
                warmup=warmup,
                baseline="float",
                info={"batch_size": n, "inputs": {label: kind for label, (kind, _, _) in variants.items()}},
            )
        )
    return {
        "config": {"model": config.model, "batch_sizes": list(batch_sizes), "presets": list(QUANTISED)},
        "groups": groups,
        "notes": notes,
    }


def _exporter():
    """``stejax.export.export_model`` if the export is available, and notes on why not."""
    try:
        from stejax.export import export_model
    except ImportError as error:
        return None, [f"integer export skipped: stejax.export is not available ({error})."]
    return export_model, []
