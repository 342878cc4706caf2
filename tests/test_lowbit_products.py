"""Integer training products: the declared int8 backward against its NumPy reference, rules, LM, quality."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stejax import integer_dot_general, integer_einsum
from stejax.flax import Quant, Rule, quantize_model, summary
from stejax.lm import INTEGER_CONFIGS, LMConfig, Transformer, build_corpus, lm_quant, quantize_lm
from stejax.verify import check_integer_product, gradient_error

LINEAR = (((2,), (0,)), ((), ()))
# The declared cotangents' relative L2 error to the exact straight-through gradient (measured on these
# seeded inputs: 0.54-0.70% to nearest, 0.80-0.97% stochastic; int8 rounding of the scaled cotangent
# costs about 2^-8 relative per element). The bounds leave a margin and still fail a wrong scale or fold.
NEAREST_BOUND, STOCHASTIC_BOUND = 0.012, 0.016
# The whole LM gradient on a real batch of bytes, product="int8" against "int8-forward" (measured 0.82%).
LM_GRADIENT_BOUND = 0.02
TINY = LMConfig(context=32, width=32, depth=1, heads=2, hidden=64, norms="llama")


def _operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, 16, 64)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"group_size": 16},
        {"lhs_scale": "tensor", "rhs_scale": "tensor"},
        {"bits": 4},
        {"rounding": "stochastic", "key": jax.random.key(1), "group_size": 32},
    ],
    ids=["per-token-per-channel", "groups", "per-tensor", "4-bit", "stochastic"],
)
def test_the_declared_backward_matches_its_reference_bit_for_bit(options):
    x, w = _operands()
    result = check_integer_product(x, w, LINEAR, **options)
    assert result.ok, result.mismatches
    bound = STOCHASTIC_BOUND if options.get("rounding") == "stochastic" else NEAREST_BOUND
    assert 0 < result.lhs_grad_error < bound and 0 < result.rhs_grad_error < bound, result


@pytest.mark.parametrize(
    ("lhs_scale", "rhs_scale", "rounding"),
    [("row", "column", "nearest"), ("tensor", "tensor", "nearest"), ("row", "column", "stochastic")],
)
def test_the_plain_form_is_the_canonical_form_bit_for_bit(lhs_scale, rhs_scale, rounding):
    # A dense layer's product (no batch axes, one group) keeps lhs's free axes (4, 16) instead of flattening
    # them to M = 64 rows: the same codes, scales, output and declared cotangents, bit for bit.
    import stejax.lowbit._products as module

    x, w = _operands(4)
    g = np.random.default_rng(5).standard_normal((4, 16, 48)).astype(np.float32)
    key = jax.random.key(3) if rounding == "stochastic" else None
    plain = module._Spec(8, lhs_scale, rhs_scale, 1, rounding, True)
    canonical = plain._replace(plain=False)
    # Each form's forward and backward as one compiled program (the same operations, not one eager program each).
    forward = jax.jit(module._forward, static_argnums=2)
    backward = jax.jit(module._backward, static_argnums=(0, 4))
    y_p, res_p = forward(x, w, plain)
    y_c, res_c = forward(x.reshape(1, 64, 64), w[None], canonical)
    np.testing.assert_array_equal(np.asarray(y_p), np.asarray(y_c).reshape(4, 16, 48))
    for a, b in zip(res_p, res_c, strict=True):
        np.testing.assert_array_equal(np.asarray(a).ravel(), np.asarray(b).ravel())
    dx_p, dw_p = (np.asarray(d) for d in backward(plain, res_p, g, key, (jnp.float32, jnp.float32)))
    dx_c, dw_c = (np.asarray(d) for d in backward(canonical, res_c, g.reshape(1, 64, 48), key, (jnp.float32,) * 2))
    np.testing.assert_array_equal(dx_p, dx_c.reshape(4, 16, 64))
    np.testing.assert_array_equal(dw_p, dw_c[0])
    assert np.abs(dx_p).max() > 0 and np.abs(dw_p).max() > 0
    # And through the public function, against the NumPy reference.
    options = {"rounding": rounding, "key": key} if key is not None else {}
    result = check_integer_product(x, w, LINEAR, lhs_scale=lhs_scale, rhs_scale=rhs_scale, **options)
    assert result.ok, result.mismatches


def test_batch_axes_attention_scores_match_the_reference():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 5, 3, 8)).astype(np.float32), rng.standard_normal((2, 7, 3, 8)).astype(np.float32)
    result = check_integer_product(q, k, (((3,), (3,)), ((0, 2), (0, 2))))
    assert result.ok and result.lhs_grad_error < NEAREST_BOUND, result
    y = jax.jit(lambda a, c: integer_einsum("bqhd,bkhd->bhqk", a, c))(q, k)
    # dot_general's output order (batch b, h; then q; then k) is already the einsum's "bhqk".
    dot = jax.jit(lambda a, c: integer_dot_general(a, c, (((3,), (3,)), ((0, 2), (0, 2)))))(q, k)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(dot))
    assert y.shape == (2, 3, 5, 7)


def test_a_wrong_fold_is_caught_by_the_check(monkeypatch):
    import stejax.lowbit._products as module

    real = module._backward

    def unfolded(spec, residuals, g, key, dtypes):  # quantises the cotangent without w's scales folded in
        qx, sx, qw, sw = residuals
        ones = jnp.ones((1,) * sw.ndim, sw.dtype)  # a per-tensor scale of 1, in the residual's rank
        return real(spec._replace(rhs_scale="tensor"), (qx, sx, qw, ones), g, key, dtypes)

    monkeypatch.setattr(module, "_backward", unfolded)
    x, w = _operands(3)
    assert not check_integer_product(x, w, LINEAR).lhs_grad_exact


def test_forward_mode_is_refused_with_the_alternative_named():
    x, w = _operands()
    with pytest.raises(TypeError, match=r"backward='int8'.*no forward mode.*backward='float'.*fake_quant"):
        jax.jvp(lambda a: integer_dot_general(a, w, LINEAR), (x,), (x,))

    # backward="float" has a forward mode: the straight-through tangent, equal to the transpose's gradient.
    def total(a):
        return integer_dot_general(a, w, LINEAR, backward="float").sum()

    tangent = jax.jit(lambda a, t: jax.jvp(total, (a,), (t,))[1])(x, np.ones_like(x))
    grad_sum = jax.jit(lambda a: jax.grad(total)(a).sum())(x)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(grad_sum), rtol=1e-5)


def test_scan_checkpoint_and_vmap_compose_with_the_declared_backward():
    dims = (((1,), (0,)), ((), ()))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ws = rng.standard_normal((3, 16, 16)).astype(np.float32)

    def layers(x, ws, remat):
        def layer(h, w):
            return jnp.tanh(integer_dot_general(h, w, dims))

        def body(h, w):
            return (jax.checkpoint(layer) if remat else layer)(h, w), None

        return jax.lax.scan(body, x, ws)[0].sum()

    plain = jax.jit(jax.grad(functools.partial(layers, remat=False), argnums=(0, 1)))(x, ws)
    remat = jax.jit(jax.grad(functools.partial(layers, remat=True), argnums=(0, 1)))(x, ws)
    for a, b in zip(plain, remat, strict=True):
        np.testing.assert_array_equal(a, b)

    def row_grad(row):
        return jax.grad(lambda r: integer_dot_general(r[None], ws[0], dims).sum())(row)

    # The reference: one row at a time, unbatched (one compiled program for all eight rows).
    one_row = jax.jit(row_grad)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(row_grad))(x)), np.stack([one_row(r) for r in x]))


def test_outputs_and_cotangents_follow_the_input_dtype():
    x, w = (a.astype(jnp.bfloat16) for a in _operands())

    def forward_and_backward(a, b):
        y, vjp = jax.vjp(lambda a, b: integer_dot_general(a, b, LINEAR), a, b)
        return (y, *vjp(jnp.ones_like(y)))

    y, dx, dw = jax.jit(forward_and_backward)(x, w)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16,) * 3


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"bits": 9}, ValueError, r"bits must be an int in \[2, 8\].*got 9"),
        ({"lhs_scale": "column"}, ValueError, r"lhs_scale must be one of \['row', 'tensor'\]; got 'column'"),
        ({"backward": "int4"}, ValueError, r"backward must be one of \['int8', 'float'\]"),
        ({"rounding": "stochastic"}, ValueError, r"stochastic' needs a PRNG key"),
        ({"key": jax.random.key(0)}, TypeError, r"a key is only for rounding='stochastic'"),
        ({"group_size": 5}, ValueError, r"group_size 5 must divide a single contracting axis.*K = 64"),
        ({"dimension_numbers": (((2,), (1,)), ((), ()))}, ValueError, r"contracting axes must have equal sizes"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(kwargs, error, match):
    x, w = _operands()
    dims = kwargs.pop("dimension_numbers", LINEAR)
    with pytest.raises(error, match=match):
        integer_dot_general(x, w, dims, **kwargs)


def test_einsum_subscripts_outside_the_supported_form_are_refused():
    with pytest.raises(ValueError, match=r"two operands and an explicit output.*got 'ij,jk'"):
        integer_einsum("ij,jk", np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))


# ----------------------------------------------------------------------------- rules and the LM


def test_rules_take_a_product_kind():
    # Models initialised by one compiled program each (not one program per operation).
    model = nnx.jit(
        lambda: nnx.Sequential(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(16, 4, rngs=nnx.Rngs(1)))
    )()
    x = jax.device_put(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))

    def loss(m):
        return jnp.mean(m(x) ** 2)

    models = {p: quantize_model(model, [Rule(product=p)], x) for p in ("int8-forward", "int8")}
    assert [r.bits for r in summary(models["int8"])] == ["w8a8", "w8a8"]
    assert "int8 products forward and backward" in summary(models["int8"])[0].note
    value_and_grad = nnx.jit(nnx.value_and_grad(loss))
    losses, grads = {}, {}
    for p, m in models.items():
        losses[p], grads[p] = value_and_grad(m)
    assert float(losses["int8"]) == float(losses["int8-forward"])  # one forward

    @jax.jit
    def relative_error(declared, forward_only):
        a, b = (jnp.concatenate([g.ravel() for g in jax.tree.leaves(t)]) for t in (declared, forward_only))
        return jnp.linalg.norm(a - b) / jnp.linalg.norm(b)

    assert 0 < float(relative_error(grads["int8"], grads["int8-forward"])) < LM_GRADIENT_BOUND
    with pytest.raises(ValueError, match=r"product must be one of \['fake-quant', 'int8-forward', 'int8'\]"):
        Rule(product="int4")
    with pytest.raises(ValueError, match=r"gradient_rounding='stochastic' rounds the int8 cotangent"):
        Rule(weights=Quant("lsq", bits=8), gradient_rounding="stochastic")
    conv = nnx.jit(lambda: nnx.Conv(3, 4, (3, 3), rngs=nnx.Rngs(0)))()
    with pytest.raises(ValueError, match=r"product='int8' covers products written with dot_general or einsum; a conv"):
        quantize_model(conv, [Rule(product="int8")], np.ones((1, 5, 5, 3), np.float32))


def test_lm_integer_configurations():
    assert set(INTEGER_CONFIGS) == {"w8a8_int8", "w1.58a8_int8"}
    assert lm_quant("w1.58a8", product="int8").product == "int8"
    with pytest.raises(ValueError, match=r"integer products take int8 per-channel or ternary weights.*4-bit weights"):
        lm_quant("w4a8", product="int8")
    with pytest.raises(KeyError, match=r"unknown LM configuration 'w9a9'.*w8a8_int8"):
        lm_quant("w9a9")
    model = Transformer(TINY, rngs=nnx.Rngs(params=0))
    rows = summary(quantize_lm(model, "w1.58a8_int8"))
    assert {r.bits for r in rows if r.kind == "linear" and r.rule == 0} == {"w1.58a8"}


@pytest.fixture
def corpus():
    # Function-scoped (0.1 s): a module-scoped fixture would keep this file's tests on one test worker.
    return build_corpus(max_bytes=300_000)


def _batches(stream: np.ndarray, n: int, batch: int, seed: int) -> np.ndarray:
    starts = np.random.default_rng(seed).integers(0, stream.size - TINY.context - 1, (n, batch))
    return np.stack([[stream[s : s + TINY.context + 1] for s in row] for row in starts])


def test_the_lm_gradient_on_a_real_batch_is_close_to_the_straight_through_one(corpus):
    (batch,) = _batches(corpus.data["train"], 1, 16, seed=0)
    x, y = jax.device_put(batch[:, :-1]), jax.device_put(batch[:, 1:].astype(np.int32))
    model = Transformer(TINY, rngs=nnx.Rngs(params=0))

    def loss_for(product):
        graphdef, params, rest = nnx.split(quantize_lm(model, lm_quant("w8a8", product=product)), nnx.Param, ...)

        def loss(p):
            logits = nnx.merge(graphdef, p, rest)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        return loss, params

    declared, params = loss_for("int8")
    error = gradient_error(declared, loss_for("int8-forward")[0], params)
    assert 0 < error["total"] < LM_GRADIENT_BOUND, error


def _train_bpb(config, train: np.ndarray, validation: np.ndarray, steps: int = 200) -> float:
    """Bits per byte on fixed validation windows after ``steps`` Adam steps (one compiled scan)."""
    model = quantize_lm(Transformer(TINY, rngs=nnx.Rngs(params=0)), config)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adam(3e-3)

    def loss(p, batch):
        logits = nnx.merge(graphdef, p, rest)(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:].astype(jnp.int32)).mean()

    def step(carry, batch):
        p, state = carry
        grads = jax.grad(loss)(p, batch)
        updates, state = optimizer.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), None

    @jax.jit
    def run(p, batches, held_out):
        (p, _), _ = jax.lax.scan(step, (p, optimizer.init(p)), batches)
        return loss(p, held_out)

    batches = jax.device_put(_batches(train, steps, 8, seed=1))
    held_out = jax.device_put(_batches(validation, 1, 64, 2)[0])
    with jax.numpy_dtype_promotion("standard"):  # optax.adam mixes its int32 step count with Python floats
        nats = run(params, batches, held_out)
    return float(nats) / math.log(2)


def test_integer_training_reaches_the_fake_quant_bits_per_byte(corpus):
    train, validation = corpus.data["train"], corpus.data["validation"]
    fake = _train_bpb(lm_quant("w8a8"), train, validation)
    integer = _train_bpb(lm_quant("w8a8", product="int8"), train, validation)
    assert fake < 6.0  # it learned: uniform bytes are 8 bits
    assert abs(integer - fake) <= 0.02 * fake, (integer, fake)


# ----------------------------------------------------------------------------- the command line


def test_lm_train_takes_a_product(tmp_path, monkeypatch):
    import click
    from click.testing import CliRunner

    import stejax.lm
    from stejax.cli import main

    seen = []

    def stop(model, config):
        seen.append(config)
        raise click.ClickException("stopped before training")

    monkeypatch.setattr(stejax.lm, "Transformer", lambda config, rngs: None)  # no model is built
    monkeypatch.setattr(stejax.lm, "quantize_lm", stop)
    monkeypatch.setattr(stejax.lm, "build_corpus", lambda corpus: None)
    run = ["lm", "train", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, [*run, "--preset", "w1.58a8", "--product", "int8"])
    assert result.exit_code == 1 and "stopped before training" in result.output, result.output
    (config,) = seen
    assert (config.product, config.input_block) == ("int8", None)  # integer products scale inputs per token
    refused = CliRunner().invoke(main, [*run, "--preset", "w4a8", "--product", "int8"])
    assert refused.exit_code == 2 and "Invalid value for --product" in refused.output, refused.output
    assert "integer products take int8 per-channel or ternary weights" in " ".join(refused.output.split())
