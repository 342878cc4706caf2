"""The language-model peer group: Qwix's QAT beside stejax's rules on :mod:`stejax.lm`'s transformer.

One unmodified :class:`stejax.lm.Transformer` (the quick tier's architecture;
``quick``: a tiny one), quantised on the same sites (the block linears q, k, v,
o, gate, up, down: :data:`stejax.lm._configs.SITES`) by each library:

* ``qwix int8``: ``QtRule(module_path=SITES, weight_qtype=int8, act_qtype=int8,
  act_batch_axes=(0, 1))``: absmax int8 weights per output channel, dynamic int8
  activations with one scale per token, straight-through (for absmax calibration
  Qwix skips its gradient mask: the identity); stejax's ``w8a8`` configuration is
  the same scheme with the same identity gradient (:func:`stejax.lm.quantize_lm`).
  The one difference: Qwix's forward products are int8 x int8 -> int32 dots,
  stejax's are float32 products of the fake-quantised operands (the group's
  ``compiled_hlo_ops`` counts them);
* ``qwix int4 weight-only``: ``QtRule(module_path=SITES, weight_qtype=int4,
  tile_size=32)``: absmax int4 weights per group of 32 along the contraction
  axis, float activations; stejax's ``w4 weight-only`` is the ``w4a8`` weight
  quantiser with no input quantiser.

:func:`lm_peer_groups` times one jitted training step of each (the functional
form of :func:`stejax.bench._nnx.nnx_steps`, one optax object), interleaved.
:func:`qwix_lm` is the quantised model itself, for fine-tuning it inside
:func:`stejax.lm.compare_lm` (``extra=``) on the same float checkpoint and
budget as stejax's configurations (``benchmarks/lm_qwix.py``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from stejax.bench._measure import compare, standard_promotion

if TYPE_CHECKING:
    from flax import nnx

__all__ = ["QWIX_LM_KINDS", "lm_peer_groups", "qwix_lm", "stejax_w4_weight_only"]

QWIX_LM_KINDS = ("qwix int8", "qwix int4 weight-only")


def qwix_lm(model: nnx.Module, kind: str) -> nnx.Module:
    """``model`` (a :class:`stejax.lm.Transformer`) quantised by Qwix as ``kind`` (one of :data:`QWIX_LM_KINDS`).

    Raises:
      ValueError: an unknown ``kind`` (the message lists the kinds).
    """
    import qwix

    from stejax.lm._configs import SITES

    if kind == "qwix int8":
        rule = qwix.QtRule(module_path=SITES, weight_qtype=jnp.int8, act_qtype=jnp.int8, act_batch_axes=(0, 1))
    elif kind == "qwix int4 weight-only":
        rule = qwix.QtRule(module_path=SITES, weight_qtype=jnp.int4, tile_size=32)
    else:
        raise ValueError(f"qwix_lm: unknown kind {kind!r}; expected one of {QWIX_LM_KINDS}.")
    example = jnp.zeros((1, 8), jnp.uint8)
    with standard_promotion():
        return qwix.quantize_model(model, qwix.QtProvider([rule]), example)


def stejax_w4_weight_only(model: nnx.Module) -> nnx.Module:
    """``model`` with stejax's ``w4a8`` weight quantiser (int4, groups of 32) on the block linears, inputs float."""
    from stejax.flax import Rule, quantize_model
    from stejax.lm._configs import CONFIGS, SITES

    weights, _ = CONFIGS["w4a8"].quantisers()
    return quantize_model(model, [Rule(SITES, kinds=("linear",), weights=weights)], jnp.zeros((1, 8), jnp.uint8))


def lm_peer_groups(*, repeats: int, warmup: int, quick: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """One group timing the LM's QAT training step: flax float, Qwix and stejax at int8 and int4 weight-only."""
    import optax
    from flax import nnx

    from stejax.bench._nnx import nnx_steps
    from stejax.bench._peers_rules import hlo_op_counts
    from stejax.lm import QUICK, LMConfig, Transformer, quantize_lm

    config = LMConfig(context=32, width=32, depth=1, heads=2, hidden=64) if quick else QUICK.model
    batch = 4 if quick else QUICK.batch_size
    tokens = jax.random.randint(jax.random.key(0), (batch, config.context + 1), 0, 256).astype(jnp.uint8)
    x, y = tokens[:, :-1], tokens[:, 1:].astype(jnp.int32)
    optimizer = optax.adamw(1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        float_model = Transformer(config, rngs=nnx.Rngs(params=0))
        models = {
            "flax float": float_model,
            "qwix int8": qwix_lm(float_model, "qwix int8"),
            "stejax w8a8": quantize_lm(float_model, "w8a8"),
            "qwix int4 weight-only": qwix_lm(float_model, "qwix int4 weight-only"),
            "stejax w4 weight-only": stejax_w4_weight_only(float_model),
        }
        compiled: dict[str, str] = {}
        calls = nnx_steps(nnx, optax, optimizer, models, x, y, compiled=compiled)
    notes = sorted({f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught})
    info = {
        "model": f"stejax.lm.Transformer {config.to_dict()}",
        "batch": list(x.shape),
        "optimizer": "optax.adamw(1e-3), the same object for every variant",
        "sites": "the block linears q, k, v, o, gate, up, down (embedding, norms, head and attention products float)",
        "qwix int8": "QtRule(module_path=SITES, weight_qtype=int8, act_qtype=int8, act_batch_axes=(0, 1)): "
        "absmax per-channel weights, one activation scale per token, QtProvider",
        "stejax w8a8": "stejax.lm.quantize_lm(model, 'w8a8'): absmax per-channel int8 weights, per-token int8 "
        "activations, the identity straight-through gradient declared (the clip cannot act), as Qwix's",
        "difference": "Qwix's forward block products are int8 x int8 -> int32 dots; stejax's are float32 products "
        "of the fake-quantised operands (the same values)",
        "compiled_hlo_ops": {label: hlo_op_counts(text) for label, text in compiled.items()},
        "qwix int4 weight-only": "QtRule(module_path=SITES, weight_qtype=int4, tile_size=32)",
        "stejax w4 weight-only": "Rule(SITES, weights=the w4a8 weight quantiser): int4 per group of 32",
        "qwix_quantised_dot_generals": calls.pop("_quantised_dots"),
    }
    group = compare(
        "LM QAT training step (stejax.lm transformer)",
        calls,
        repeats=repeats,
        warmup=warmup,
        ratios=[
            ("stejax w8a8", "qwix int8"),
            ("stejax w4 weight-only", "qwix int4 weight-only"),
            ("qwix int8", "flax float"),
            ("stejax w8a8", "flax float"),
        ],
        info=info,
    )
    return [group], notes
