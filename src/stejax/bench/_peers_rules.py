"""The rules peer groups: Qwix's ``quantize_model`` beside stejax's on the same unmodified NNX models.

Two models from :mod:`stejax.flax.models`: the digits CNN (two ``nnx.Conv``,
one ``nnx.Linear``) and a transformer block with ``nnx.MultiHeadAttention``.
One int8 scheme for both libraries: absmax per-channel weights recomputed each
step, dynamic int8 activations, straight-through backward. Each group times one
jitted training step (the functional form of :func:`stejax.bench._nnx.nnx_steps`,
the same optax optimiser object) for ``flax float``, ``qwix int8`` and ``stejax
int8``, interleaved, and reports ``stejax int8 / qwix int8`` per round.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from stejax.bench._measure import compare, standard_promotion

if TYPE_CHECKING:
    from flax import nnx

__all__ = ["rules_peer_groups"]


def rules_peer_groups(*, repeats: int, warmup: int, quick: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Groups (digits CNN, transformer block) timing Qwix's and stejax's int8 QAT steps; and notes."""
    import optax
    import qwix
    from flax import nnx

    from stejax.bench._nnx import nnx_steps
    from stejax.flax import Quant, Rule, quantize_model, summary
    from stejax.flax.models import AttentionBlock, DigitsCNN

    optimizer = optax.adam(1e-3)
    key_x, key_y = jax.random.split(jax.random.key(0))
    batch = 16 if quick else 64
    cases = {
        "digits CNN": (
            lambda: DigitsCNN((8, 16) if quick else (16, 32), rngs=nnx.Rngs(0)),
            jax.random.normal(key_x, (batch, 64)),
            jax.random.randint(key_y, (batch,), 0, 10),
        ),
        "transformer block": (
            lambda: _classifier(AttentionBlock(rngs=nnx.Rngs(0))),
            jax.random.normal(key_x, (batch // 4, 16, 32)),
            jax.random.randint(key_y, (batch // 4,), 0, 10),
        ),
    }
    stejax_rules = [
        Rule(weights=Quant("fake_quant", bits=8, axis=-1), inputs=Quant("fake_quant", bits=8, scale="dynamic"))
    ]
    groups, notes = [], []
    for name, (make, x, y) in cases.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with standard_promotion():
                float_model = make()
                qwix_rules = [qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]
                qwix_model = qwix.quantize_model(float_model, qwix.QtProvider(qwix_rules), x)
                stejax_model = quantize_model(make(), stejax_rules, x)
            models = {"flax float": float_model, "qwix int8": qwix_model, "stejax int8": stejax_model}
            calls = nnx_steps(nnx, optax, optimizer, models, x, y)
        notes += sorted(
            {f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught}
        )
        quantised = [r for r in summary(stejax_model) if r.rule is not None]
        info = {
            "model": name,
            "batch": list(x.shape),
            "optimizer": "optax.adam(1e-3), the same object for every variant",
            "qwix int8": "QtRule(module_path='.*', weight_qtype=int8, act_qtype=int8): absmax per-channel weights, "
            "dynamic int8 activations (one scale per example), QtProvider",
            "stejax int8": "Rule(weights=Quant('fake_quant', bits=8, axis=-1), inputs=Quant('fake_quant', bits=8, "
            "scale='dynamic')): absmax per-channel weights recomputed each step, one dynamic scale per tensor",
            "qwix_quantised_dot_generals": calls.pop("_quantised_dots"),
            "stejax_quantised_sites": [f"{r.path} ({r.kind})" for r in quantised],
            "differences": "Qwix computes int8 products (dot_general_qt); stejax fake-quantises in float32 and "
            "multiplies in float32; Qwix's activation scales are per example, stejax's per tensor",
        }
        groups.append(
            compare(
                f"int8 QAT step by rules, {name}",
                calls,
                repeats=repeats,
                warmup=warmup,
                ratios=[("stejax int8", "qwix int8"), ("qwix int8", "flax float"), ("stejax int8", "flax float")],
                info=info,
            )
        )
    return groups, notes


def _classifier(block: nnx.Module) -> nnx.Module:
    """A block and a mean-pooled linear head to 10 classes (the class made here so that nnx is imported lazily)."""
    from flax import nnx

    class Classifier(nnx.Module):
        def __init__(self, block: nnx.Module) -> None:
            self.block = block
            self.head = nnx.Linear(32, 10, rngs=nnx.Rngs(1))

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.head(jnp.mean(self.block(x), axis=1))

    return Classifier(block)
