r"""Parity of the exported model with the fake-quantised one, and the stated tolerance.

The tolerance is an error bound, computed per example and per logit by
propagating, layer by layer, how far the two paths can drift apart in float32
(:math:`u = 2^{-24}`, :math:`K` the layer's fan-in, :math:`|W|` the absolute
dequantised weights, :math:`a` the layer's input):

.. math::

   e_{\text{out}} = (1 + 2^{-10}) \bigl(|W|^\top e_{\text{in}}
       + (2K + 8)\, u\, (|W|^\top |a| + |b|)\bigr).

The first term carries the input's own drift through the layer (ReLU does not
enlarge it); the second bounds both paths' roundings of one layer: a float32
sum of :math:`K` products (ordered as XLA likes), the dequantisation products,
the scale product and the bias. A layer with quantised inputs resets
:math:`e_{\text{in}}` to 0 when both paths give it the same integer codes; when
a code differs, the example's later logits are no longer bounded this way and
the report names the example, the layer and the unit, with the distance of the
fake-quantised value to the rounding tie (or to zero, for a sign) that the
float32 drift straddled. The factor :math:`1 + 2^{-10}` covers the roundings of
the bound's own float32 evaluation (all its terms are non-negative).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stejax.data import Normalizer
from stejax.export._model import ExportedModel, LayerSpec, _product, dequantised_weights, input_codes
from stejax.model import ModelConfig, QATConfig, apply
from stejax.model._forward import run
from stejax.model._quantize import quantize_weights

__all__ = ["TOLERANCE_RULE", "LayerParity", "ParityReport", "ParitySet", "check_parity_set", "parity"]

_U = 2.0**-24
_SAFETY = 1 + 2.0**-10

TOLERANCE_RULE = (
    "per logit |exported - fake-quant| <= e_out of the last layer, with e_out = (1 + 2^-10) (|W|^T e_in + "
    "(2K + 8) 2^-24 (|W|^T |a| + |b|)) propagated layer by layer (K the fan-in, e_in = 0 after a quantised "
    "input whose integer codes agree); examples where a code differs are listed with the tie they straddle"
)


@dataclasses.dataclass(frozen=True)
class LayerParity:
    """One layer's side of the parity report.

    Attributes:
      index: the layer.
      path: the arithmetic the exported layer runs.
      weights_bit_exact: the dequantised exported weights equal the fake-quantised ones bit for bit
        (a zero of either sign matching a zero: integer codes carry no sign of zero).
      input_codes: integer input codes compared (0 for a float input).
      code_mismatches: of those, how many differ between the two paths.
      output_bitwise: the fraction of this layer's outputs (the next layer's
        pre-quantisation input, or the logits) bitwise equal between the paths.
      why: where and why the outputs are (not) bit for bit equal.
    """

    index: int
    path: str
    weights_bit_exact: bool
    input_codes: int
    code_mismatches: int
    output_bitwise: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """The exported model against the fake-quantised one on a test set.

    Attributes:
      n_examples: examples compared.
      same_class: examples whose predicted class (argmax) agrees.
      bit_exact: examples whose logits are bitwise equal.
      within_tolerance: examples with agreeing codes whose every logit is within the bound.
      bounded: examples with agreeing codes in every layer (the bound applies).
      max_abs_diff: the largest |exported - fake-quant| logit difference.
      max_bound_ratio: the largest difference over its bound (<= 1 when within).
      drift_violations: pre-quantisation inputs of hidden layers that drifted
        further than the bound allows (0 unless the bound is wrong).
      tolerance: the stated tolerance rule.
      layers: one :class:`LayerParity` per layer.
      flips: one dict per example whose codes differ: ``example``, ``layer``,
        ``unit`` (flat index into the layer input), ``v_fake_quant``,
        ``v_exported``, ``tie``, ``drift_bound`` (in grid units), ``explained``
        (the drift bound reaches the tie).
    """

    n_examples: int
    same_class: int
    bit_exact: int
    within_tolerance: int
    bounded: int
    max_abs_diff: float
    max_bound_ratio: float
    drift_violations: int
    tolerance: str
    layers: tuple[LayerParity, ...]
    flips: tuple[dict[str, Any], ...]

    @property
    def passed(self) -> bool:
        """Same class for every example, every bounded example within its bound, every flip explained."""
        return (
            self.n_examples > 0
            and self.same_class == self.n_examples
            and self.within_tolerance == self.bounded
            and self.drift_violations == 0
            and all(f["explained"] for f in self.flips)
            and all(layer.weights_bit_exact for layer in self.layers)
        )

    def summary(self) -> str:
        """One line for a terminal."""
        return (
            f"parity {'passed' if self.passed else 'FAILED'}: same class {self.same_class}/{self.n_examples} "
            f"({100 * self.same_class / max(self.n_examples, 1):.2f}%), logits bit-exact {self.bit_exact}, "
            f"within the bound {self.within_tolerance}/{self.bounded} (max |diff| {self.max_abs_diff:.3g}, "
            f"max diff/bound {self.max_bound_ratio:.3g}), code flips {len(self.flips)}"
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["passed"] = self.passed
        out["layers"] = [layer.to_dict() for layer in self.layers]
        out["flips"] = [dict(f) for f in self.flips]
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class ParitySet:
    """The evidence kept with an artifact, so that parity can be checked again without the training run.

    Attributes:
      inputs: float32 ``(N, *input_shape)``, raw test features.
      labels: int32 ``(N,)``.
      reference_logits: float32 ``(N, n_classes)``, the fake-quantised model's logits.
      tolerance: float32 ``(N, n_classes)``, the bound per logit (``inf`` for an
        example whose codes differ: only its class is compared).
    """

    inputs: np.ndarray
    labels: np.ndarray
    reference_logits: np.ndarray
    tolerance: np.ndarray

    def tensors(self) -> dict[str, np.ndarray]:
        return {
            "inputs": self.inputs,
            "labels": self.labels,
            "reference_logits": self.reference_logits,
            "tolerance": self.tolerance,
        }


@functools.partial(jax.jit, static_argnums=(2, 3))
def _reference_logits(params, xn, model_config, qat_config):
    one = functools.partial(apply, model_config=model_config, qat_config=qat_config)
    return jax.vmap(one, in_axes=(None, 0))(params, xn)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _reference_inputs(params, xn, model_config, qat_config, n_layers):
    """Every layer's input before quantisation, per example, as the fake-quantised model computes it."""

    def one(p, x):
        return tuple(run(p, x, model_config, qat_config, stop_at=i) for i in range(n_layers))

    return jax.vmap(one, in_axes=(None, 0))(params, xn)


@functools.partial(jax.jit, static_argnums=(0,))
def _layer_bound_terms(layer: LayerSpec, p, u_ref, e_in, w_fq):
    """For one layer: the fake-quant input codes and v, |W|^T |a|, |W|^T e_in, and the weights' bitwise check."""
    w_deq = dequantised_weights(layer.weights, p, layer.w_shape)
    same = (lax.bitcast_convert_type(w_deq, jnp.uint32) == lax.bitcast_convert_type(w_fq, jnp.uint32)) | (
        (w_deq == 0) & (w_fq == 0)
    )
    w_abs = jnp.abs(w_deq)
    if layer.inputs.quantised:
        v, codes = input_codes(layer.inputs, u_ref, p.get("a_step"))
        scale = jnp.float32(1) if layer.inputs.method == "sign" else jnp.abs(p["a_step"])
        a_mag = jnp.abs(codes) * scale
        e_in = jnp.zeros_like(e_in)
    else:
        v, codes = u_ref, u_ref
        a_mag = jnp.abs(u_ref) + e_in
    hi = lax.Precision.HIGHEST
    return v, codes, _product(layer, a_mag, w_abs, precision=hi), _product(layer, e_in, w_abs, precision=hi), same.all()


@functools.partial(jax.jit, static_argnums=(0,))
def _fake_quant_weights(q, w, w_step):
    return quantize_weights(w, w_step, q)[0]


def _tie(v_ref: float, v_exp: float, sign: bool) -> float:
    if sign:
        return 0.0
    # The half-integer k + 1/2 nearest to the two values' midpoint.
    return float(np.round((v_ref + v_exp) / 2 - 0.5) + 0.5)


def parity(
    model: ExportedModel,
    params: Any,
    model_config: ModelConfig,
    qat_config: QATConfig,
    normalizer: Normalizer,
    inputs: np.ndarray,
    labels: np.ndarray,
) -> tuple[ParityReport, ParitySet]:
    """Compare the exported model with the fake-quantised one on raw test features.

    Returns:
      The :class:`ParityReport` and the :class:`ParitySet` to keep with the artifact.
    """
    inputs = np.asarray(inputs, np.float32)
    xn = normalizer.apply(inputs)
    ref = np.asarray(_reference_logits(params, jnp.asarray(xn), model_config, qat_config))
    got_logits, records = model.compiled_trace(model.weights, jnp.asarray(inputs))
    got = np.asarray(got_logits)
    n = inputs.shape[0]
    weights = model.weights
    e_in = np.abs(np.asarray(model.compiled_normalize(weights, jnp.asarray(inputs)), np.float64) - xn)
    flagged = np.zeros(n, bool)
    flips: list[dict[str, Any]] = []
    layers_out: list[LayerParity] = []
    drift_violations = 0
    bound = np.zeros_like(ref, np.float64)
    ref_inputs = _reference_inputs(params, jnp.asarray(xn), model_config, qat_config, len(model.layers))
    for i, layer in enumerate(model.layers):
        p = weights["layers"][i]
        u_ref = np.asarray(ref_inputs[i], np.float64)
        u_exp = np.asarray(records[i]["u"], np.float64)
        e_in = np.reshape(e_in, u_ref.shape)
        if i > 0:
            over = (np.abs(u_exp - u_ref) > e_in) & ~flagged.reshape((n,) + (1,) * (u_ref.ndim - 1))
            drift_violations += int(over.sum())
        w_fq = _fake_quant_weights(
            qat_config.layer(i, len(model.layers)).weights,
            params["layers"][i]["w"],
            params["layers"][i].get("w_step"),
        )
        v_ref, codes_ref, s, prop, weights_exact = _layer_bound_terms(
            layer, p, jnp.asarray(u_ref, jnp.float32), jnp.asarray(e_in, jnp.float32), w_fq
        )
        v_ref, codes_ref = np.asarray(v_ref, np.float64), np.asarray(codes_ref)
        s, prop, weights_exact = np.asarray(s, np.float64), np.asarray(prop, np.float64), bool(weights_exact)
        n_codes = mismatches = 0
        if layer.inputs.quantised:
            codes_exp = np.asarray(records[i]["codes"])
            differ = codes_ref.astype(np.int64) != codes_exp
            n_codes, mismatches = differ.size, int(differ.sum())
            step = 1.0 if layer.inputs.method == "sign" else abs(float(np.asarray(p["a_step"])))
            for ex in np.flatnonzero(differ.reshape(n, -1).any(axis=1)):
                if flagged[ex]:
                    continue
                flagged[ex] = True
                unit = int(np.flatnonzero(differ[ex].reshape(-1))[0])
                vr = float(v_ref[ex].reshape(-1)[unit])
                ve = float(np.asarray(records[i]["v"][ex]).reshape(-1)[unit])
                reach = float(e_in[ex].reshape(-1)[unit]) / step * _SAFETY + 4 * _U * abs(vr)
                tie = _tie(vr, ve, layer.inputs.method == "sign")
                flips.append(
                    {
                        "example": int(ex),
                        "layer": i,
                        "unit": unit,
                        "v_fake_quant": vr,
                        "v_exported": ve,
                        "tie": tie,
                        "drift_bound": reach,
                        "explained": bool(min(vr, ve) <= tie <= max(vr, ve) and abs(vr - ve) <= reach),
                    }
                )
        b_abs = np.abs(np.asarray(p["b"], np.float64))
        e_out = _SAFETY * (prop + (2 * layer.fan_in + 8) * _U * (s + b_abs))
        # The next layer's input is this layer's output (after a ReLU, which does not enlarge drift).
        e_in = e_out.reshape(n, -1)
        if i + 1 < len(model.layers):
            nxt_ref = np.asarray(ref_inputs[i + 1])
            nxt_exp = np.asarray(records[i + 1]["u"])
            same_out = np.mean(nxt_ref.view(np.uint32) == nxt_exp.view(np.uint32))
        else:
            bound = e_in
            same_out = np.mean(ref.view(np.uint32) == got.view(np.uint32))
        layers_out.append(
            LayerParity(
                index=i,
                path=layer.path,
                weights_bit_exact=weights_exact,
                input_codes=n_codes,
                code_mismatches=mismatches,
                output_bitwise=float(same_out),
                why=_why(layer),
            )
        )
    diff = np.abs(got.astype(np.float64) - ref)
    ok_rows = ~flagged
    within = ok_rows & (diff <= bound).all(axis=1)
    ratio = np.where(bound > 0, diff / np.where(bound > 0, bound, 1), np.where(diff > 0, np.inf, 0))
    tolerance = bound.astype(np.float32)
    # Rounding the bound to float32 must not shrink it.
    tolerance = np.where(tolerance < bound, np.nextafter(tolerance, np.float32(np.inf)), tolerance)
    tolerance = np.where(flagged[:, None], np.float32(np.inf), tolerance).astype(np.float32)
    report = ParityReport(
        n_examples=n,
        same_class=int((got.argmax(axis=1) == ref.argmax(axis=1)).sum()),
        bit_exact=int((got.view(np.uint32) == ref.astype(np.float32).view(np.uint32)).all(axis=1).sum()),
        within_tolerance=int(within.sum()),
        bounded=int(ok_rows.sum()),
        max_abs_diff=float(diff.max()) if n else 0.0,
        max_bound_ratio=float(ratio[ok_rows].max()) if ok_rows.any() else 0.0,
        drift_violations=drift_violations,
        tolerance=TOLERANCE_RULE,
        layers=tuple(layers_out),
        flips=tuple(flips),
    )
    evidence = ParitySet(
        inputs=inputs,
        labels=np.asarray(labels, np.int32),
        reference_logits=ref.astype(np.float32),
        tolerance=tolerance,
    )
    return report, evidence


def _why(layer: LayerSpec) -> str:
    if layer.integer:
        return (
            "not bit for bit: the int32 sum of integer codes is exact, while the fake-quantised model rounds a "
            f"float32 sum of {layer.fan_in} dequantised products (and the scale is applied once, after the sum); "
            "equal within the bound"
        )
    if layer.weights.quantised or layer.inputs.quantised:
        return (
            "the same float32 operations on the same values (the dequantised weights equal the fake-quantised "
            "ones bit for bit): bitwise equal unless XLA orders the sum differently in the two programs"
        )
    return "float32 weights, the same float32 product: bitwise equal unless XLA orders the sum differently"


def check_parity_set(model: ExportedModel, weights: Any, evidence: ParitySet) -> tuple[bool, str]:
    """Recompute the exported logits on a stored :class:`ParitySet`; ``(passed, detail)``.

    Passes when every example's class equals the fake-quantised model's and every
    logit with a finite tolerance lies within it.
    """
    got = np.asarray(model.compiled_apply(weights, jnp.asarray(evidence.inputs)), np.float64)
    ref = evidence.reference_logits.astype(np.float64)
    n = ref.shape[0]
    same = got.argmax(axis=1) == ref.argmax(axis=1)
    tol = evidence.tolerance.astype(np.float64)
    over = np.abs(got - ref) > tol
    detail = (
        f"same class {int(same.sum())}/{n}; logits within the stored bound {int((~over).all(axis=1).sum())}/{n} "
        f"({int(np.isinf(tol).any(axis=1).sum())} example(s) with a code flip compared by class only)"
    )
    if not same.all():
        ex = int(np.flatnonzero(~same)[0])
        detail += f"; example {ex}: class {int(got[ex].argmax())}, fake-quant {int(ref[ex].argmax())}"
    if over.any():
        ex, k = (int(v) for v in np.argwhere(over)[0])
        detail += f"; example {ex} logit {k}: |{got[ex, k]!r} - {ref[ex, k]!r}| > {tol[ex, k]!r}"
    return bool(n > 0 and same.all() and not over.any()), detail
