"""The rules peer groups: Qwix's ``quantize_model`` beside stejax's on the same unmodified NNX models.

Two models from :mod:`stejax.flax.models`: the digits CNN (two ``nnx.Conv``,
one ``nnx.Linear``) and a transformer block with ``nnx.MultiHeadAttention``.
One int8 scheme for both libraries: absmax per-channel weights recomputed each
step, dynamic int8 activations, straight-through backward. Each group times one
jitted training step (the functional form of :func:`stejax.bench._nnx.nnx_steps`,
the same optax optimiser object) for ``flax float``, ``qwix int8`` and ``stejax
int8``, interleaved, and reports ``stejax int8 / qwix int8`` per sample and per round.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from stejax.bench._measure import group_record, measure_rounds, standard_promotion

if TYPE_CHECKING:
    from flax import nnx

__all__ = ["rules_peer_calls", "rules_peer_groups"]


def rules_peer_groups(
    *, repeats: int, warmup: int, quick: bool, rounds: int = 1
) -> tuple[list[dict[str, Any]], list[str]]:
    """Groups (digits CNN, transformer block) timing Qwix's and stejax's int8 QAT steps; and notes.

    Both models are built first (:func:`rules_peer_calls`), then timed together in ``rounds`` interleaved rounds
    (:func:`stejax.bench.measure_rounds`): each round times the CNN's three steps ``repeats`` times each, back to
    back, then the block's (the order alternating), so each round gives each ratio one sample (its ``rounds``).
    """
    built, notes = rules_peer_calls(quick=quick)
    measured = measure_rounds(
        {label: calls for label, calls, _ in built}, rounds=rounds, repeats=repeats, warmup=warmup
    )
    ratios = [("stejax int8", "qwix int8"), ("qwix int8", "flax float"), ("stejax int8", "flax float")]
    groups = [group_record(label, measured[label], ratios=ratios, info=info) for label, _, info in built]
    return groups, notes


def rules_peer_calls(*, quick: bool) -> tuple[list[tuple[str, dict[str, Any], dict[str, Any]]], list[str]]:
    """The untimed steps of :func:`rules_peer_groups`: ``([(group name, calls, info), ...], notes)``."""
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
    built, notes = [], []
    for name, (make, x, y) in cases.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with standard_promotion():
                float_model = make()
                qwix_rules = [qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]
                qwix_model = qwix.quantize_model(float_model, qwix_per_tensor_provider(qwix_rules), x)
                stejax_model = quantize_model(make(), stejax_rules, x)
            models = {"flax float": float_model, "qwix int8": qwix_model, "stejax int8": stejax_model}
            compiled: dict[str, str] = {}
            calls = nnx_steps(nnx, optax, optimizer, models, x, y, compiled=compiled)
        notes += sorted(
            {f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught}
        )
        quantised = [r for r in summary(stejax_model) if r.rule is not None]
        info = {
            "model": name,
            "batch": list(x.shape),
            "optimizer": "optax.adam(1e-3), the same object for every variant",
            "qwix int8": "QtRule(module_path='.*', weight_qtype=int8, act_qtype=int8): absmax per-channel weights, "
            "dynamic int8 activations, one scale per tensor (QtProvider told so by qwix_per_tensor_provider; its "
            "default is one per example)",
            "stejax int8": "Rule(weights=Quant('fake_quant', bits=8, axis=-1), inputs=Quant('fake_quant', bits=8, "
            "scale='dynamic')): absmax per-channel weights recomputed each step, one dynamic scale per tensor",
            "qwix_quantised_dot_generals": calls.pop("_quantised_dots"),
            "stejax_quantised_sites": [f"{r.path} ({r.kind})" for r in quantised],
            "differences": "Qwix computes int8 products (dot_general_qt) and differentiates the float product "
            "of the unquantised operands (custom_vjp); stejax fake-quantises, multiplies in float32 and "
            "differentiates through the estimators' declared surrogates (custom_jvp)",
            "compiled_hlo_ops": {label: hlo_op_counts(text) for label, text in compiled.items()},
        }
        built.append((f"int8 QAT step by rules, {name}", calls, info))
    return built, notes


HLO_OPS = ("convolution", "dot", "reduce", "divide", "convert", "round-nearest-even", "compare", "select", "copy")


def hlo_op_counts(compiled_text: str) -> dict[str, int]:
    """How many of each :data:`HLO_OPS` instruction a compiled step has (fused computations included), and fusions.

    Example:
      >>> counts = hlo_op_counts("%a = f32[2]{0} convert(%p); %b = f32[2]{0} fusion(%a), kind=kLoop")
      >>> counts["convert"], counts["fusion"], counts["dot"]
      (1, 1, 0)
    """
    import re

    ops = re.findall(r"= \S+ ([a-z][\w-]*)\(", compiled_text)
    return {op: ops.count(op) for op in (*HLO_OPS, "fusion")}


def qwix_per_tensor_provider(rules: list[Any]) -> Any:
    """Qwix's ``QtProvider`` with one dynamic scale per activation tensor (its default is one per example).

    Weights keep their per-channel scales: only an operand that is not a
    parameter (``flax_util.find_param`` is None) loses its channel-wise axes.
    """
    import dataclasses

    import qwix
    from qwix._src.utils import flax_util

    class PerTensorActivations(qwix.QtProvider):
        def _create_dot_general_qt_config(self, rule: Any, op_id: str, lhs: Any, rhs: Any) -> Any:
            config = super()._create_dot_general_qt_config(rule, op_id, lhs, rhs)
            return dataclasses.replace(
                config,
                lhs_disable_channelwise_axes=flax_util.find_param(lhs) is None,
                rhs_disable_channelwise_axes=flax_util.find_param(rhs) is None,
            )

        def _create_conv_general_qt_config(self, rule: Any, op_id: str, lhs: Any, rhs: Any) -> Any:
            config = super()._create_conv_general_qt_config(rule, op_id, lhs, rhs)
            return dataclasses.replace(config, lhs_disable_channelwise_axes=True)

    return PerTensorActivations(rules)


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
