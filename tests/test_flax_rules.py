"""stejax.flax.quantize_model: any NNX model quantised by rules.

Golden values: the float model itself (identity quantisers must give its bits),
and the catalog estimators applied by hand (``entry.fn``) to the operands with
the site's own learned arguments, multiplied with ``jax.lax``/``jnp``. The
models are :mod:`stejax.flax.models`, plain NNX code that knows nothing of
stejax.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stejax.estimators.calibration import absmax_scale
from stejax.estimators.catalog import CATALOG
from stejax.flax import Calibration, Quant, Rule, calibrate, quantize_model, summary
from stejax.flax.models import AttentionBlock, ConvDecoder, DigitsCNN, EinsumAttentionBlock, TiedLM
from stejax.verify import check_surrogate

from helpers import assert_bitwise_equal

IDENTITY = Quant(lambda v: v)
LSQ = CATALOG["lsq"].fn
FQ = CATALOG["fake_quant"].fn


def _x(shape, seed=0, dtype=jnp.float32):
    # The values jnp.asarray gave (float64 draws rounded to float32, then to the dtype), handed over as a transfer:
    # on an accelerator jnp.asarray compiles a conversion program for each shape and dtype.
    draws = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jax.device_put(draws.astype(np.dtype(dtype)))


# One compiled program for two models on the same input: the quantised and the float model jitted by one function.
_BOTH = nnx.jit(lambda a, b, x: (a(x), b(x)))


MODELS = {
    "digits_cnn": (DigitsCNN, (2, 64)),
    "mha_block": (AttentionBlock, (2, 5, 32)),
    "einsum_block": (EinsumAttentionBlock, (2, 5, 32)),
    "tied_lm": (TiedLM, None),
    "conv_decoder": (ConvDecoder, (2, 8, 8, 1)),
}


def _example(name, dtype=jnp.float32, seed=0):
    make, shape = MODELS[name]
    x = jax.device_put(np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)) if shape is None else _x(shape, seed, dtype)
    return make, x


class Custom(nnx.Module):
    """A module the rules cannot see into: an elementwise learned scale, then a Linear."""

    def __init__(self, rngs):
        self.scale = nnx.Param(jnp.full((4,), 2.0))
        self.fc = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc(x * jnp.reshape(self.scale[...], (1, -1)))


class HandWritten(nnx.Module):
    """A product with a parameter written with ``@`` in the module's own code."""

    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (6, 3)))

    def __call__(self, x):
        return x @ self.w[...]


# ----------------------------------------------------------------------------- identity


# bfloat16 where its code paths differ: Flax's attention (mha_block), Embed, hand-written einsums and a tied head
# (tied_lm, whose block is an einsum_block), Conv and ConvTranspose (conv_decoder). digits_cnn's Conv and Linear
# and einsum_block's Linear and einsums run in bfloat16 inside those models.
IDENTITY_CASES = [(name, jnp.float32) for name in MODELS] + [
    (name, jnp.bfloat16) for name in ("mha_block", "tied_lm", "conv_decoder")
]


@pytest.mark.parametrize(("name", "dtype"), IDENTITY_CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in IDENTITY_CASES])
def test_identity_quantisers_give_the_float_model_bit_for_bit(name, dtype):
    make, x = _example(name, dtype)
    model = make(dtype=dtype, rngs=nnx.Rngs(0))
    # Flax's own bfloat16 attention mixes float32 constants in, which the suite's strict promotion refuses.
    with jax.numpy_dtype_promotion("standard" if dtype == jnp.bfloat16 else "strict"):
        _check_identity(name, model, x, dtype)


def _check_identity(name, model, x, dtype):
    qmodel = quantize_model(model, [Rule(weights=IDENTITY, inputs=IDENTITY)], x)
    kinds = {row.kind for row in summary(qmodel) if row.rule == 0}
    expected_kinds = {
        "digits_cnn": {"conv", "linear"},
        "mha_block": {"linear", "attention"},
        "einsum_block": {"linear", "dot"},
        "tied_lm": {"linear", "dot", "embed"},
        "conv_decoder": {"conv"},
    }[name]
    assert kinds == expected_kinds, summary(qmodel)
    assert_bitwise_equal(qmodel(x), np.asarray(model(x)), context=f"{name} eager")
    if dtype == jnp.float32:
        jitted, float_jitted = _BOTH(qmodel, model, x)
        assert_bitwise_equal(jitted, np.asarray(float_jitted), context=f"{name} jit")


def test_the_users_model_is_left_as_it_was():
    model = DigitsCNN(rngs=nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.state(model))
    qmodel = quantize_model(model, [Rule(weights=Quant("lsq", bits=4))], _x((2, 64)))
    assert type(model) is DigitsCNN and isinstance(qmodel, DigitsCNN) and type(qmodel) is not DigitsCNN
    assert not hasattr(model.conv1, "stejax_quant") and model.conv1.conv_general_dilated is jax.lax.conv_general_dilated
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(nnx.state(model)), strict=True):
        np.testing.assert_array_equal(a, b)
    # Parameters are kept, and shared rather than copied.
    assert qmodel.conv1.kernel[...] is model.conv1.kernel[...]


# ----------------------------------------------------------------------------- exactness


def test_a_linear_site_computes_the_estimators_by_hand():
    model = nnx.Sequential(nnx.Linear(6, 4, rngs=nnx.Rngs(0)))
    x = _x((3, 6), seed=1)
    qmodel = quantize_model(model, [Rule(weights=Quant("lsq", bits=4, axis=-1), inputs=Quant("fake_quant", bits=8))], x)
    site = qmodel.layers[0].stejax_quant.p0
    assert type(site.weight_step) is nnx.Param and site.weight_step.shape == (4,)
    assert type(site.input_scale) is Calibration
    np.testing.assert_allclose(site.input_scale[...], absmax_scale(x, bits=8), rtol=0)  # from the example inputs
    kernel, bias = model.layers[0].kernel[...], model.layers[0].bias[...]

    def by_hand(kernel, step, x):
        a = FQ(x, site.input_scale[...], bits=8)
        product = jax.lax.dot_general(a, LSQ(kernel, step, bits=4, axis=-1), (((1,), (0,)), ((), ())))
        return product + jnp.reshape(bias, (1, -1))

    assert_bitwise_equal(qmodel(x), np.asarray(by_hand(kernel, site.weight_step[...], x)))
    c = jax.device_put(np.reshape(np.arange(4.0, dtype=np.float32), (1, 4)))

    grads = nnx.grad(lambda m: jnp.sum(m(x) * c))(qmodel)
    want_k, want_s = jax.grad(lambda k, s: jnp.sum(by_hand(k, s, x) * c), argnums=(0, 1))(kernel, site.weight_step[...])
    np.testing.assert_allclose(grads["layers"][0]["kernel"][...], want_k, rtol=1e-6)
    np.testing.assert_allclose(grads["layers"][0]["stejax_quant"]["p0"]["weight_step"][...], want_s, rtol=1e-6)


@pytest.mark.parametrize("transpose_kernel", [True, False], ids=["transpose_kernel", "plain_kernel"])
def test_a_conv_transpose_site_computes_the_estimators_by_hand(transpose_kernel):
    """Per output channel wherever the layer stores it: (3, 3, out, in) with transpose_kernel, else (3, 3, in, out)."""
    model = ConvDecoder(4, transpose_kernel=transpose_kernel, rngs=nnx.Rngs(0))
    x = _x((2, 4, 4, 4), seed=1)
    rules = [Rule("up", weights=Quant("lsq", bits=4, axis=-1), inputs=Quant("fake_quant", bits=8, scale="dynamic"))]
    qmodel = quantize_model(model, rules, _x((2, 8, 8, 1)))
    (row,) = [r for r in summary(qmodel) if r.rule == 0]
    assert (row.path, row.kind, row.bits) == ("up", "conv", "w4a8")
    site = qmodel.up.stejax_quant.p0
    assert type(site.weight_step) is nnx.Param and site.weight_step.shape == (1,)  # one output channel
    kernel, bias = model.up.kernel[...], model.up.bias[...]
    out_axis = -2 if transpose_kernel else -1

    def by_hand(kernel, step, x):
        a = FQ(x, absmax_scale(x, bits=8), bits=8)
        w = LSQ(kernel, step, bits=4, axis=out_axis)
        y = jax.lax.conv_transpose(a, w, (2, 2), "SAME", transpose_kernel=transpose_kernel)
        return y + jnp.reshape(bias, (1, 1, 1, -1))

    assert_bitwise_equal(qmodel.up(x), np.asarray(by_hand(kernel, site.weight_step[...], x)))
    c = _x((2, 8, 8, 1), seed=2)
    # The gradients compared within tolerances, each computed in one compiled program.
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m.up(x) * c)))(qmodel)
    want_k, want_s = jax.jit(jax.grad(lambda k, s: jnp.sum(by_hand(k, s, x) * c), argnums=(0, 1)))(
        kernel, site.weight_step[...]
    )
    np.testing.assert_allclose(grads["up"]["kernel"][...], want_k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["up"]["stejax_quant"]["p0"]["weight_step"][...], want_s, rtol=1e-5)
    assert not np.allclose(qmodel.up(x), model.up(x), atol=1e-3), "the site is quantised"


def test_a_site_quantiser_passes_the_verifier_against_the_declared_surrogate():
    model = nnx.Sequential(nnx.Linear(6, 4, rngs=nnx.Rngs(0)))
    qmodel = quantize_model(model, [Rule(weights=Quant("lsq", bits=4))], _x((3, 6)))
    site = qmodel.layers[0].stejax_quant.p0
    step = site.weight_step[...]
    entry = CATALOG["lsq"]

    def quantised(w):
        return site.quantise(1, w)

    report = check_surrogate(
        quantised,
        reference=lambda w: entry.forward(w, step.astype(w.dtype), bits=4),
        derivative=lambda w: entry.derivative(w, step.astype(w.dtype), bits=4)[0],
        boundaries=[float(step) * (k + 0.5) for k in range(-8, 8)],
        dtypes=[jnp.float32],
        composition_dtypes=[jnp.float32],
        name="lsq site",
    )
    assert report.ok, report.summary()


def test_a_hand_written_product_with_a_parameter_quantises_it_as_weights():
    model = HandWritten(nnx.Rngs(0))
    x = _x((2, 6), seed=2)
    qmodel = quantize_model(
        model, [Rule(kinds=("dot",), weights=Quant("lsq", bits=3), inputs=Quant("pact", bits=4))], x
    )
    (row,) = summary(qmodel)
    assert (row.path, row.kind, row.bits) == ("dot0", "dot", "w3a4")
    site = qmodel.stejax_quant.p0
    want = CATALOG["pact"].fn(x, site.lhs_alpha[...], bits=4) @ LSQ(model.w[...], site.rhs_step[...], bits=3)
    assert_bitwise_equal(qmodel(x), np.asarray(want))


def test_attention_rules_quantise_both_products_of_multi_head_attention():
    model = AttentionBlock(rngs=nnx.Rngs(0))
    x = _x((2, 5, 32))
    rules = [Rule(kinds=("attention",), inputs=Quant("fake_quant", bits=4, scale="dynamic"))]
    qmodel = quantize_model(model, rules, x)
    rows = {r.path: r for r in summary(qmodel)}
    assert rows["attn/scores"].rule == 0 and rows["attn/values"].rule == 0 and rows["mlp/fc1"].rule is None

    # By hand: the block with the two products' operands quantised per tensor (jax.nn's attention, as flax calls it).
    # Compared within tolerances, so computed in one compiled program.
    def fq(t):
        return FQ(t, absmax_scale(t, bits=4), bits=4)

    @nnx.jit
    def by_hand(model, x):
        attn = model.attn
        h = model.norm1(x)
        q, k, v = attn.query(h), attn.key(h), attn.value(h)
        depth = q.shape[-1]
        logits = jnp.einsum("BTNH,BSNH->BNTS", fq(q), fq(k)) * jnp.float32(1 / np.sqrt(depth))
        probs = jax.nn.softmax(logits, axis=-1)
        o = jnp.einsum("BNTS,BSNH->BTNH", fq(probs), fq(v))
        y = x + attn.out(o)
        return y + model.mlp(model.norm2(y))

    @nnx.jit
    def models_and_by_hand(qmodel, model, x):
        return qmodel(x), model(x), by_hand(model, x)

    got, float_model, want = (np.asarray(v) for v in models_and_by_hand(qmodel, model, x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, float_model, atol=1e-3), "the attention is quantised"


# ----------------------------------------------------------------------------- what Qwix does not do


def test_inputs_only_rules_quantise_inputs():
    model = DigitsCNN(rngs=nnx.Rngs(0))
    x = _x((2, 64))
    qmodel = quantize_model(model, [Rule(r"conv1", inputs=Quant("fake_quant", bits=2, scale="dynamic"))], x)
    z = jnp.reshape(x, (2, 8, 8, 1))
    by_hand = model.conv1.__class__.__call__(model.conv1, FQ(z, absmax_scale(z, bits=2), bits=2))
    hand_model = jax.nn.relu(by_hand)
    want = model.head(jnp.reshape(jax.nn.relu(model.conv2(hand_model)), (2, -1)))
    assert_bitwise_equal(qmodel(x), np.asarray(want))


def test_embedding_tables_are_quantised_and_a_tied_head_shares_them():
    model = TiedLM(rngs=nnx.Rngs(0))
    _, tokens = _example("tied_lm")
    rules = [Rule(kinds=("embed",), weights=Quant("fake_quant", bits=4, axis=0)), Rule(weights=None, inputs=None)]
    qmodel = quantize_model(model, rules, tokens)
    table = model.embed.embedding[...]
    qtable = FQ(table, absmax_scale(table, bits=4, axis=0), bits=4, axis=0)
    assert_bitwise_equal(qmodel.embed(tokens), np.asarray(jnp.take(qtable, tokens, axis=0)))
    h = _x((2, 4, 32), seed=3)
    assert_bitwise_equal(qmodel.embed.attend(h), np.asarray(jnp.dot(h, qtable.T)))


@pytest.mark.parametrize(
    "weights",
    [Quant("sign_ste"), Quant("magnitude_aware_sign", axis=-1), Quant("ternary")],
    ids=["sign_ste", "magnitude_aware_sign", "ternary"],
)
def test_binary_and_ternary_weights_on_every_site(weights):
    model = TiedLM(rngs=nnx.Rngs(0))
    _, tokens = _example("tied_lm")
    qmodel = quantize_model(model, [Rule(kinds=("linear", "embed"), weights=weights)], tokens)

    @nnx.jit
    def quantised_kernel_and_logits(qmodel, kernel, tokens):
        return qmodel.block.mlp.fc1.stejax_quant.p0.quantise(1, kernel), qmodel(tokens)

    kernel, logits = quantised_kernel_and_logits(qmodel, model.block.mlp.fc1.kernel[...], tokens)
    levels = np.unique(np.asarray(kernel))
    assert len(levels) <= {"sign_ste": 2, "magnitude_aware_sign": 128, "ternary": 3}[weights.name]
    if weights.name != "magnitude_aware_sign":
        assert set(levels.tolist()) <= {-1.0, 0.0, 1.0}
    assert np.all(np.isfinite(np.asarray(logits)))


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_every_bit_width_runs_on_cpu_with_forward_mode(bits):
    model = AttentionBlock(rngs=nnx.Rngs(0))
    x = _x((2, 5, 32))  # the shape the other AttentionBlock tests use: their eager programs are built already
    rules = [
        Rule(weights=Quant("fake_quant", bits=bits, axis=-1), inputs=Quant("fake_quant", bits=bits, scale="dynamic"))
    ]
    qmodel = quantize_model(model, rules, x)
    t, c = _x(x.shape, seed=5), _x(x.shape, seed=6)

    def forward_and_reverse(x, t, c):
        y, tangent = jax.jvp(lambda x: qmodel(x), (x,), (t,))
        (cot,) = jax.vjp(lambda x: qmodel(x), x)[1](c)
        jac = jax.jacfwd(lambda x: qmodel(x))(x) if bits == 8 else None
        return y, tangent, cot, jac

    # One compiled program for jvp, vjp (and the Jacobian): each is its own computation in it.
    y, tangent, cot, jac = jax.jit(forward_and_reverse)(x, t, c)
    np.testing.assert_allclose(y, qmodel(x), rtol=1e-6, atol=1e-6)  # jit against eager
    # Forward and reverse mode agree: <jvp(t), c> = <t, vjp(c)>.
    np.testing.assert_allclose(
        np.vdot(np.asarray(tangent), np.asarray(c)), np.vdot(np.asarray(t), np.asarray(cot)), rtol=1e-4
    )
    if bits == 8:
        assert jac.shape == (*x.shape, *x.shape) and np.all(np.isfinite(jac))


def test_lsq_steps_and_pact_clips_train_per_site():
    model = DigitsCNN(rngs=nnx.Rngs(0))
    x, y = _x((16, 64), seed=7), jax.device_put(np.arange(16, dtype=np.int32) % 10)
    rules = [
        Rule(r"head", inputs=Quant("pact", bits=4, init={"alpha": 0.5})),
        Rule(weights=Quant("lsq", bits=4, axis=-1)),
    ]
    qmodel = quantize_model(model, rules, x)
    before = jax.tree.map(np.asarray, nnx.state(qmodel, nnx.Param))
    optimizer = nnx.Optimizer(qmodel, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(m(x), y)))(
            m
        )
        opt.update(m, grads)
        return loss

    for _ in range(3):
        step(qmodel, optimizer)
    after = nnx.state(qmodel, nnx.Param)
    for path in (("conv1", "stejax_quant", "p0", "weight_step"), ("head", "stejax_quant", "p0", "input_alpha")):
        b, a = before, after
        for p in path:
            b, a = b[p], a[p]
        assert not np.array_equal(b, a[...]), f"{'/'.join(path)} did not train"


# ----------------------------------------------------------------------------- coverage, summary, errors


def test_a_module_the_rules_cannot_see_into_is_listed_as_float():
    model = Custom(nnx.Rngs(0))
    qmodel = quantize_model(model, [Rule(weights=Quant("lsq", bits=4))], _x((2, 4)))
    rows = {r.path: r for r in summary(qmodel)}
    assert rows[""].kind == "float" and rows[""].note == "parameters, no product the rules can see"
    assert rows["fc"].bits == "w4a32"
    text = str(summary(qmodel))
    assert "(root)" in text and "fc" in text and "w4a32" in text


def test_calibrate_sets_static_input_scales_from_the_batches():
    model = nnx.Sequential(nnx.Linear(6, 4, rngs=nnx.Rngs(0)))
    qmodel = quantize_model(model, [Rule(inputs=Quant("fake_quant", bits=8, axis=-1))], _x((2, 6)))
    host = [np.asarray(_x((5, 6), seed=s)) * np.float32(s + 1) for s in range(3)]
    batches = [jax.device_put(b) for b in host]
    assert calibrate(qmodel, batches) == {"layers/0": 1}
    every = jax.device_put(np.concatenate(host))
    np.testing.assert_array_equal(
        qmodel.layers[0].stejax_quant.p0.input_scale[...], absmax_scale(every, bits=8, axis=-1)
    )
    calibrate(qmodel, batches, method="mse")
    mse_scale = np.asarray(qmodel.layers[0].stejax_quant.p0.input_scale[...])
    assert np.all(mse_scale <= np.asarray(absmax_scale(every, bits=8, axis=-1)))


def _literal(text):
    return re.escape(text)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda m, x: quantize_model(m, [Rule(weights="sign_ste"), Rule(r"conv_1", weights="ternary")], x),
            ValueError,
            "rule 1 (Rule('conv_1', weights=Quant('ternary', clip=1.0, threshold=None), inputs=None)) matches no site",
        ),
        (
            lambda m, x: quantize_model(m, [Rule(weights=Quant("lsq", bits=4, group_size=5))], x),
            ValueError,
            "rule 0 ('.*') at 'conv1': group_size 5 does not divide the contraction axis of operand 1 (weights), "
            "of length 1",
        ),
        (
            lambda m, x: quantize_model(m, [Rule(weights="stochastic_round")], x),
            TypeError,
            "rule 0 ('.*') at 'conv1': stochastic_round draws random numbers; pass rngs=nnx.Rngs(quant=...)",
        ),
        (
            lambda m, x: quantize_model(m, [Rule(weights="sign_ste")], jax.device_put(np.asarray(x)[:, :10])),
            ValueError,
            "failed on the example",
        ),
        (lambda m, x: quantize_model(m, Rule(weights="sign_ste"), x), TypeError, "rules must be a list of Rule"),
        (lambda m, x: quantize_model(m, ["sign_ste"], x), TypeError, "rules[0] must be a Rule; got 'sign_ste'"),
        (lambda m, x: Rule(kinds="conv"), TypeError, "kinds must be a tuple of kinds, e.g. ('conv',)"),
        (lambda m, x: Rule(kinds=("matmul",)), ValueError, "kinds must be among ['linear', 'conv'"),
        (lambda m, x: Rule("blocks/(", weights="sign_ste"), ValueError, "the path is not a valid regular expression"),
        (lambda m, x: Rule(weights="gumbel_softmax_st"), ValueError, "gumbel_softmax_st is a latent estimator"),
        (lambda m, x: summary(m), TypeError, "summary: expected a model returned by quantize_model; got a DigitsCNN"),
    ],
)
def test_errors_name_the_rule_the_path_and_the_problem(call, error, message):
    model = DigitsCNN(rngs=nnx.Rngs(0))
    with pytest.raises(error, match=_literal(message)):
        call(model, _x((2, 64)))


def test_strict_false_allows_unused_rules_and_a_model_is_quantised_once():
    model = DigitsCNN(rngs=nnx.Rngs(0))
    x = _x((2, 64))
    qmodel = quantize_model(model, [Rule(r"nothing"), Rule(weights="sign_ste")], x, strict=False)
    with pytest.raises(ValueError, match="already quantised"):
        quantize_model(qmodel, [Rule(weights="sign_ste")], x)
    stochastic = quantize_model(model, [Rule(weights="stochastic_round")], x, rngs=nnx.Rngs(quant=1))
    call = nnx.jit(lambda m, x: m(x))  # the key stream advances through the compiled call
    assert not np.array_equal(call(stochastic, x), call(stochastic, x)), "a new key per call"


def test_save_and_load_quantise_again_identically(tmp_path):
    from stejax.flax import load_quantized, save_quantized

    model = DigitsCNN(rngs=nnx.Rngs(0))
    x = _x((2, 64))
    rules = [
        Rule(r"conv1", weights=None),
        Rule(weights=Quant("lsq", bits=4, group_size=8), inputs=Quant("fake_quant", bits=8)),
    ]
    qmodel = quantize_model(model, rules, x)
    step = qmodel.head.stejax_quant.p0.weight_step
    step[...] = jax.device_put(np.asarray(step[...]) * np.float32(1.5))  # a learned value the file must carry
    calibrate(qmodel, [_x((2, 64), seed=9)])  # the example's shape: its eager programs are built already
    path = save_quantized(qmodel, tmp_path / "q.safetensors")
    loaded = load_quantized(DigitsCNN(rngs=nnx.Rngs(1)), path, x)
    assert loaded.stejax_rules == qmodel.stejax_rules
    assert_bitwise_equal(loaded(x), np.asarray(qmodel(x)))
    # Refused before the model runs: the example input (a shape the model refuses) is never used.
    with pytest.raises(ValueError, match=re.escape("conv1/bias is float32[16]; the model has float32[8]")):
        load_quantized(DigitsCNN((8, 16), rngs=nnx.Rngs(1)), path, _x((2, 3)))
