"""Why the rotation trick's usage and the no-gradient control read as they do: `stejax vq compare`'s training,
evaluated on the **validation** split (the test split is never read here).

Run from the repository root (minutes each; under ``nice -n 10`` on a shared machine):

    .venv/bin/python benchmarks/vq_tune.py rotation [--epochs 150] [--out FILE.json]
    .venv/bin/python benchmarks/vq_tune.py control [--epochs 150] [--out FILE.json]

``rotation``: the straight-through and the rotation-trick codebooks side by side (same seeds, splits,
initialisation and updates) under recipe variants: the comparison's (codes at N(0, 0.1^2), commitment
weight 0.25, Adam 2e-3, EMA decay 0.95), commitment weight 1 (vector-quantize-pytorch's default), EMA decay
0.8 (its default), codes at N(0, 1). Per seed: usage and perplexity on the validation split, usage in the
last training epoch, test-free MSE, and the scale of the vectors and codes (so the quantisation error can be
read relative to ``||z||^2``, and ``||q|| / ||z||``, the rotation trick's gradient scale, estimated).

``control``: what the no-gradient control measures. The encoder frozen at its random initialisation with
the codebook trained by the codebook loss (the comparison's control); the same with the codebook frozen at
its initialisation too; the encoder trained by the commitment loss alone (no gradient from the
reconstruction); and a quantiser whose output carries no information (a constant), which is the only one
that must land on the mean image.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from stejax.estimators.latent import vq_quantize
from stejax.vq import Codebook, CompareSettings, l2_normalize
from stejax.vq._compare import AutoencoderConfig, _load, _Model, _model, _no_gradient, _run_one, references


class _FrozenCodebook(Codebook):
    """The codes keep their initialisation: no codebook loss, no commitment loss."""

    def loss(self, out, *, commitment_weight=0.25, codebook_weight=1.0):
        return jnp.zeros((), out.codebook_loss.dtype)


class _CommitmentOnly(Codebook):
    """The no-gradient quantiser, but the encoder is trained by the commitment loss (weight 0.25)."""

    def loss(self, out, *, commitment_weight=0.25, codebook_weight=1.0):
        return codebook_weight * out.codebook_loss + 0.25 * out.commitment_loss


def _constant(z, codebook):
    """A quantiser whose output does not depend on the image: the decoder can only learn the mean."""
    return jnp.zeros_like(z) + jax.lax.stop_gradient(codebook[0] * 0)


def _rotation_unscaled(z, codebook):
    """An ablation, not a catalog estimator: the rotation trick without its rescaling ``||q|| / ||z||``.

    Forward: the nearest code exactly (``sg(q) + (Rz - sg(Rz))``, and ``x - x == 0``); Jacobian ``R``, the
    paper's rotation alone, so the encoder's gradient keeps the decoder's magnitude as with the straight-through
    estimator."""
    sg = jax.lax.stop_gradient
    q = sg(vq_quantize(z, codebook))
    e = sg(l2_normalize(z))
    f = sg(l2_normalize(q))
    r = sg(l2_normalize(e + f))
    rotated = z - 2 * jnp.sum(z * r, -1, keepdims=True) * r + 2 * jnp.sum(z * e, -1, keepdims=True) * f
    return q + (rotated - sg(rotated))


def _run(m: _Model, s: CompareSettings, x_train, x_val) -> list[dict]:
    seed_keys = jnp.stack([jax.random.key(k) for k in s.seeds])
    r = jax.tree.map(np.asarray, jax.jit(jax.vmap(lambda k, a, b: _run_one(m, k, a, b)))(seed_keys, x_train, x_val))
    rows = []
    for i, seed in enumerate(s.seeds):
        z2, q2 = float(r["latent_sq_norm"][i]), float(r["code_sq_norm"][i])
        rows.append(
            {
                "seed": seed,
                "val_mse": float(r["test_mse"][i]),
                "val_usage": float(r["usage"][i]),
                "val_perplexity": float(r["perplexity"][i]),
                "train_usage_last_epoch": float(r["history"]["usage"][i][-1]),
                "quantization_error": float(r["quantization_error"][i]),
                "relative_quantization_error": float(r["quantization_error"][i]) / z2 if z2 > 0 else math.nan,
                "latent_sq_norm": z2,
                "code_sq_norm": q2,
            }
        )
    return rows


def _line(label: str, rows: list[dict]) -> str:
    def f(key, fmt):
        return ", ".join(format(r[key], fmt) for r in rows)

    return (
        f"{label}: val MSE [{f('val_mse', '.4f')}] usage [{f('val_usage', '.3f')}] perplexity "
        f"[{f('val_perplexity', '.1f')}] train usage (last epoch) [{f('train_usage_last_epoch', '.3f')}] "
        f"rel. error [{f('relative_quantization_error', '.3f')}] ||z||^2 [{f('latent_sq_norm', '.3f')}] "
        f"||q||^2 [{f('code_sq_norm', '.3f')}]"
    )


def rotation(base: CompareSettings, x_train, x_val, codebooks, variants, estimators) -> dict:
    out = {}
    all_variants = {
        "comparison recipe": {},
        "commitment weight 1.0": {"commitment_weight": 1.0},
        "commitment weight 0.05": {"commitment_weight": 0.05},
        "EMA decay 0.8": {"decay": 0.8},
        "codes at N(0, 1)": {"codebook_init_scale": 1.0},
        "learning rate 1e-3": {"learning_rate": 1e-3},
    }
    for label in variants:
        s = dataclasses.replace(base, **all_variants[label])
        for c in codebooks:
            if label == "EMA decay 0.8" and c == "plain":
                continue
            for q in estimators:
                t0 = time.perf_counter()
                quantizer = "rotation_trick" if q == "rotation_unscaled" else q
                m = _model(AutoencoderConfig(f"{quantizer}-{c}", quantizer, c), s)
                if q == "rotation_unscaled" and m.codebook is not None:
                    m = m._replace(codebook=dataclasses.replace(m.codebook, estimator=_rotation_unscaled))
                rows = _run(m, s, x_train, x_val)
                name = f"{label} | {q}-{c}"
                out[name] = rows
                print(_line(name, rows) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def control(s: CompareSettings, x_train, x_val) -> dict:
    config = AutoencoderConfig("no_gradient", "no_gradient", "plain")
    base = _model(config, s)
    assert base.codebook is not None
    fields = {f.name: getattr(base.codebook, f.name) for f in dataclasses.fields(base.codebook)}
    variants = {
        "encoder frozen at init, codebook trained (the comparison's control)": base,
        "encoder frozen at init, codebook frozen at init": base._replace(codebook=_FrozenCodebook(**fields)),
        "encoder trained by the commitment loss only": base._replace(codebook=_CommitmentOnly(**fields)),
        "constant quantiser output (no information)": base._replace(
            codebook=Codebook(**{**fields, "estimator": _constant})
        ),
    }
    assert fields["estimator"] is _no_gradient
    out = {}
    for label, m in variants.items():
        t0 = time.perf_counter()
        rows = _run(m, s, x_train, x_val)
        out[label] = rows
        print(_line(label, rows) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", choices=("rotation", "control"))
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--codebooks", default="ema,plain", help="comma-separated")
    ap.add_argument(
        "--variants",
        default="comparison recipe;commitment weight 1.0;EMA decay 0.8;codes at N(0, 1)",
        help="semicolon-separated",
    )
    ap.add_argument(
        "--estimators",
        default="vq_ste,rotation_trick",
        help="comma-separated: vq_ste, rotation_trick, rotation_unscaled",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    s = CompareSettings(seeds=tuple(range(a.seeds)), epochs=a.epochs)
    x_train, x_val = _load(s, "val")
    refs = [references(x_train[i], x_val[i], seed=k) for i, k in enumerate(s.seeds)]
    print("validation references (mean image, PCA 8, k-means 256):", [[round(v, 4) for v in r.values()] for r in refs])
    if a.sweep == "rotation":
        result = rotation(s, x_train, x_val, a.codebooks.split(","), a.variants.split(";"), a.estimators.split(","))
    else:
        result = control(s, x_train, x_val)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"sweep": a.sweep, "settings": dataclasses.asdict(s), "references": refs, "runs": result}, fh)


if __name__ == "__main__":
    main()
