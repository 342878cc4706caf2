"""The language model: corpus split, references, causal mask, KV cache, identity rules, packing, export, training."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.artifacts import ArtifactError
from stejax.flax import Rule, quantize_model
from stejax.lm import (
    CONFIGS,
    SPLITS,
    LMConfig,
    TrainSettings,
    Transformer,
    build_corpus,
    check_disjoint,
    compressor_bpb,
    generate,
    load_checkpoint,
    ngram_bpb,
    quantize_lm,
    split_of,
    train_lm,
)
from stejax.lm._configs import SITES
from stejax.lm._export import _codes_and_scale, export_lm, load_lm_artifact, predicted_size
from stejax.lowbit import OFFSET_CONTAINERS as CONTAINERS
from stejax.lowbit import pack, unpack
from stejax.train import NonFiniteError

TINY = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64)


@pytest.fixture(scope="module")
def tiny_model() -> Transformer:
    return Transformer(TINY, rngs=nnx.Rngs(params=3))


def _tokens(seed: int, shape: tuple[int, ...]) -> jax.Array:
    # device_put: a transfer, no program (jnp.asarray stages one per shape and dtype)
    return jax.device_put(np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8))


# ----------------------------------------------------------------------------- corpus


def test_corpus_split_is_deterministic_and_leak_free():
    a = build_corpus(max_bytes=600_000)
    b = build_corpus(max_bytes=600_000)
    assert a.sha256 == b.sha256 and a.files == b.files
    names = [n for s in SPLITS for n in a.files[s]]
    assert len(names) == len(set(names)), "a file is in two splits"
    for split in SPLITS:
        assert a.data[split].size > 0
        assert all(split_of(n) == split for n in a.files[split])
    assert a.describe()["source"].startswith("jax ")


def test_a_leak_is_caught():
    with pytest.raises(ValueError, match=r"corpus leak: 'a.py' is in both 'train' and 'test'"):
        check_disjoint({"train": ("a.py", "b.py"), "validation": (), "test": ("a.py",)})


def test_directory_and_file_corpora(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    for i in range(60):
        (root / f"f{i}.txt").write_text(f"line {i}\n" * 20)
    (root / "blob.bin").write_bytes(b"\x00\x01" * 100)
    corpus = build_corpus(root)
    assert "blob.bin" not in [n for s in SPLITS for n in corpus.files[s]]
    single = tmp_path / "one.txt"
    single.write_bytes(b"x" * (70 * 65536))
    assert sum(len(build_corpus(single).files[s]) for s in SPLITS) == 70
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        build_corpus(tmp_path / "missing")


# ----------------------------------------------------------------------------- references


def test_ngram_and_compressor_references():
    rng = np.random.default_rng(0)
    pattern = np.frombuffer(b"def f(x):\n    return x + 1\n" * 200, np.uint8)
    noise = rng.integers(0, 256, 4000).astype(np.uint8)
    assert ngram_bpb(pattern, pattern, pattern, 3)["bpb"] < 0.5
    assert ngram_bpb(noise, noise, rng.integers(0, 256, 4000).astype(np.uint8), 1)["bpb"] > 7.5
    assert compressor_bpb(pattern, pattern[:500], "xz") < 1.0
    with pytest.raises(ValueError, match="unknown method 'gzip'"):
        compressor_bpb(pattern, pattern, "gzip")


# ----------------------------------------------------------------------------- model


def test_causal_mask_a_future_byte_never_changes_an_earlier_logit(tiny_model):
    x = _tokens(0, (2, TINY.context))
    forward = nnx.jit(lambda m, t: m(t))
    base = np.asarray(forward(tiny_model, x))
    for j in (1, 7, TINY.context - 1):
        later = np.array(x)
        later[:, j] = (later[:, j].astype(np.int64) + 1) % 256
        changed = np.asarray(forward(tiny_model, jax.device_put(later)))
        np.testing.assert_array_equal(changed[:, :j], base[:, :j])
        assert not np.array_equal(changed[:, j], base[:, j])


@pytest.mark.parametrize("config", ["float", "w1.58a8"])
def test_cached_and_uncached_generation_agree(tiny_model, config):
    model = quantize_lm(tiny_model, config)
    key = jax.random.key(1)
    with jax.debug_key_reuse(False):
        cached = generate(model, b"ab", tokens=10, key=key, temperature=1.0, cached=True)
        full = generate(model, b"ab", tokens=10, key=key, temperature=1.0, cached=False)
    assert cached.tokens == full.tokens
    # The cached step multiplies one row where the full pass multiplies all: float32
    # sums in another order, so the logits agree to rounding, not bit for bit.
    np.testing.assert_allclose(cached.logits, full.logits, atol=2e-5, rtol=0)


def test_generation_refuses_more_than_the_context(tiny_model):
    with pytest.raises(ValueError, match="exceeds the model's context of 16"):
        generate(tiny_model, b"abcd", tokens=13, key=jax.random.key(0))


def test_identity_rules_reproduce_the_float_model_bit_for_bit(tiny_model):
    # The shape of quantize_lm's example input: the eager programs of the model's operations serve both.
    x = _tokens(2, (1, 8))
    identity = quantize_model(tiny_model, [Rule(SITES, kinds=("linear",), weights=lambda w: w, inputs=lambda a: a)], x)
    np.testing.assert_array_equal(np.asarray(identity(x)), np.asarray(tiny_model(x)))


def test_configurations_quantise_the_block_linears_only(tiny_model):
    x = _tokens(3, (1, TINY.context))
    logits = nnx.jit(lambda model, x: model(x))
    for name in ("float", "w4a4", "w1.58a8"):
        q = quantize_lm(tiny_model, name)
        same = np.array_equal(np.asarray(logits(q, x)), np.asarray(logits(tiny_model, x)))
        assert same == (name == "float"), name
    assert np.array_equal(
        np.asarray(tiny_model.head.kernel[...]), np.asarray(quantize_lm(tiny_model, "w4a4").head.kernel[...])
    )
    with pytest.raises(KeyError, match="unknown LM configuration 'w3a3'"):
        quantize_lm(tiny_model, "w3a3")


def test_config_errors():
    with pytest.raises(ValueError, match="must be a multiple of `heads`"):
        LMConfig(width=10, heads=3)
    with pytest.raises(ValueError, match="`mlp` must be 'swiglu' or 'gelu'"):
        LMConfig(mlp="relu")


# ----------------------------------------------------------------------------- packing


def test_five_trits_per_byte_round_trip_every_one_of_the_243_values():
    stored = np.arange(243, dtype=np.uint8)
    codes = unpack(stored, "trit5", 243 * 5)
    assert set(np.unique(codes).tolist()) == {-1, 0, 1}
    np.testing.assert_array_equal(pack(codes, "trit5"), stored)
    # Each byte is a distinct group of five codes: all 3**5 groups appear once.
    assert len({tuple(g) for g in codes.reshape(243, 5).tolist()}) == 243
    with pytest.raises(ValueError, match="byte 243 is not five trits"):
        unpack(np.array([243], np.uint8), "trit5", 5)


@pytest.mark.parametrize("container", sorted(CONTAINERS))
@pytest.mark.parametrize("n", [1, 7, 64, 1001])
def test_packed_formats_round_trip(container, n):
    per, low, high = CONTAINERS[container]
    codes = np.random.default_rng(n).integers(low, high + 1, n).astype(np.int8)
    stored = pack(codes, container)
    assert stored.size == -(-n // per)
    np.testing.assert_array_equal(unpack(stored, container, n), codes)
    with pytest.raises(ValueError, match=f"outside {container}'s range"):
        pack(np.array([high + 1]), container)


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize("config", ["w4a8", "w2a8", "w1.58a8"])
def test_export_round_trip_sizes_and_sampling_bound(tmp_path, tiny_model, config):
    qmodel = quantize_lm(tiny_model, config)
    art = export_lm(tiny_model, config, tmp_path / "art")
    assert (art / "weights.safetensors").stat().st_size == predicted_size(tiny_model, config)["weights_file"]
    loaded = load_lm_artifact(art)
    # Dequantised codes are the fake-quantised kernels, bit for bit.
    w = np.asarray(tiny_model.blocks[0].mlp.up.kernel[...])
    fake = np.asarray(CONFIGS[config].quantisers()[0](tiny_model.blocks[0].mlp.up.kernel[...]))
    np.testing.assert_array_equal(np.asarray(loaded.float_model.blocks[0].mlp.up.kernel[...]), fake)
    codes, _ = _codes_and_scale(w, CONFIGS[config])
    assert (
        codes.min()
        >= CONTAINERS[json.loads((art / "manifest.json").read_text())["quantised"]["blocks/0/mlp/up"]["container"]][1]
    )
    # Logits of the artifact's model against the fake-quantised model at every generation step.
    key = jax.random.key(4)
    with jax.debug_key_reuse(False):
        a = generate(loaded.model, b"x", tokens=12, key=key)
        b = generate(qmodel, b"x", tokens=12, key=key)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.logits, b.logits, atol=1e-5, rtol=0)


def test_artifact_tampering_is_refused(tmp_path, tiny_model):
    art = export_lm(tiny_model, "w8a8", tmp_path / "art")
    weights = art / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.chmod(0o644)
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="the file was changed"):
        load_lm_artifact(art)
    with pytest.raises(FileExistsError, match="never overwritten"):
        export_lm(tiny_model, "w8a8", art)


# ----------------------------------------------------------------------------- training


def test_training_writes_metrics_and_a_checkpoint_that_reloads(tmp_path, tiny_model):
    stream = np.frombuffer(b"abcabcabd" * 300, np.uint8)
    settings = TrainSettings(steps=6, batch_size=4, warmup=1, eval_every=3, eval_windows=4)
    result = train_lm(
        quantize_lm(tiny_model, "w4a8"), stream, stream, settings, key=jax.random.key(0), out_dir=tmp_path
    )
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [3, 6] and all(np.isfinite(r["val_bpb"]) for r in lines)
    reloaded = load_checkpoint(tiny_model, tmp_path / "params.safetensors")
    x = _tokens(5, (1, TINY.context))
    logits = nnx.jit(lambda model, x: model(x))  # one program for both models, not each operation eagerly
    got = np.asarray(logits(quantize_lm(reloaded, "w4a8"), x))
    np.testing.assert_array_equal(got, np.asarray(logits(result.model, x)))


def test_the_non_finite_guard_names_the_parameter(tiny_model):
    broken = nnx.clone(tiny_model)
    kernel = broken.blocks[0].attn.v.kernel
    nan_first = np.array(kernel[...])
    nan_first[0, 0] = np.nan
    kernel[...] = jax.device_put(nan_first)
    stream = np.frombuffer(b"hello world " * 100, np.uint8)
    settings = TrainSettings(steps=2, batch_size=2, warmup=0, eval_every=2, eval_windows=2)
    with pytest.raises(NonFiniteError, match=r"non-finite parameter at step 1: .*'v'.*'kernel'") as info:
        train_lm(broken, stream, stream, settings, key=jax.random.key(0))
    assert info.value.part == "parameter"


def test_no_ste_trains_only_the_embedding_final_norm_and_head(tiny_model):
    """w4a8_no_ste: zero gradient into every block parameter (quantised weights and the norms before
    quantised inputs); the embedding, the final RMSNorm and the head still get one (what the report says)."""
    tokens = _tokens(7, (2, TINY.context + 1))

    def grads(name: str) -> dict:
        graphdef, params, rest = nnx.split(quantize_lm(tiny_model, name), nnx.Param, ...)

        def loss(p):
            logits = nnx.merge(graphdef, p, rest)(tokens[:, :-1])
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None].astype(jnp.int32), -1))

        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(jax.jit(jax.grad(loss))(params)))[0]
        return {jax.tree_util.keystr(p): float(np.abs(np.asarray(g)).max()) for p, g in flat}

    no_ste, ste = grads("w4a8_no_ste"), grads("w4a8")
    blocks = [k for k in no_ste if k.startswith("['blocks']")]
    assert blocks and all(no_ste[k] == 0.0 for k in blocks), {k: no_ste[k] for k in blocks if no_ste[k]}
    outside = [k for k in no_ste if not k.startswith("['blocks']")]
    assert sorted(outside) == sorted(["['embed']['embedding']", "['final_norm']['scale']", "['head']['kernel']"])
    assert all(no_ste[k] > 0 for k in outside)
    assert all(ste[k] > 0 for k in blocks), "with an STE every block parameter gets a gradient"


@pytest.mark.parametrize(
    ("kind", "bits", "group"), [("w", 8, None), ("w", 4, 32), ("w", 4, None), ("a", 8, None), ("a", 4, None)]
)
def test_declared_identity_gradient_equals_the_composed_ste(kind, bits, group):
    """Where the clip never acts, the quantisers declare the identity gradient: the same forward bit for bit,
    and the composed form's gradient (round_ste, jnp.clip's mask, the scale products) up to s * (1/s), except
    at a code equal to the clip's top, where jnp.clip (a minimum) splits a tie and passes half."""
    from stejax.lm._quantisers import _int_weights, _per_token, activation_quantiser, weight_quantiser, weight_scale

    rng = np.random.default_rng(bits)
    # A wide spread, exact ties and an all-zero column (the scale's floor).
    x_host = (rng.standard_normal((64, 48)) * np.exp(rng.uniform(-6, 6, (1, 48)))).astype(np.float32)
    x_host[:, 0] = 0.0
    x_host[1, 1] = x_host[2, 1] * np.float32(0.5)  # exact: a power of two, no subnormal here
    x = jax.device_put(x_host)
    top = 2 ** (bits - 1) - 1
    if kind == "w":
        declared = weight_quantiser(bits, group=group)
        composed = lambda v: _int_weights(v, bits=bits, group=group, ste=True)  # noqa: E731
        codes = jnp.round(x * (1 / weight_scale(x, bits, group)))
    else:
        declared, composed = activation_quantiser(bits), lambda v: _per_token(v, bits=bits, ste=True)
        codes = jnp.round(x * (top / jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-5)))
    g = jax.device_put(rng.standard_normal(x.shape).astype(np.float32))
    y1, vjp1 = jax.vjp(jax.jit(declared), x)
    y2, vjp2 = jax.vjp(jax.jit(composed), x)
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
    (g1,), (g2,) = vjp1(g), vjp2(g)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g))  # the identity, exactly
    # Declared through stejax.surrogate, so forward mode gives the same identity (a custom_vjp could not jvp).
    # Both sides in one compiled program (the same kind of program: bit for bit on every platform).
    (y3, t3), y = jax.jit(lambda x, g: (jax.jvp(declared, (x,), (g,)), declared(x)))(x, g)
    np.testing.assert_array_equal(np.asarray(y3), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(t3), np.asarray(g))
    codes = np.asarray(codes)
    assert int(np.abs(codes).max()) == top and bool((codes >= -top).all())  # the clip's bottom is never reached
    expected = np.where(codes == top, 0.5, 1.0) * np.asarray(g)
    np.testing.assert_allclose(np.asarray(g2), expected, rtol=4e-7, atol=0)


def test_two_bit_weights_keep_the_clipped_gradient():
    """At 2 bits the code 2 is clipped to 1: there the gradient is zero (the composed form is kept); a code on
    either bound (-2, 1) gets half of it (jnp.clip splits the tie), an inner code all of it."""
    from stejax.lm._quantisers import weight_quantiser

    # Scale 1: codes 2 -> 1, 0, -2, 1, -1.
    w = np.array([[1.5], [0.2], [-1.5], [0.9], [-0.7]], np.float32)

    @jax.jit  # the value and the cotangent in one compiled program (exact values: codes and a scale of 1)
    def value_and_cotangent(w, c):
        y, vjp = jax.vjp(weight_quantiser(2, group=None), w)
        return y, vjp(c)[0]

    y, g = value_and_cotangent(w, np.ones((5, 1), np.float32))
    assert np.asarray(y).ravel().tolist() == [1.0, 0.0, -2.0, 1.0, -1.0]
    assert np.asarray(g).ravel().tolist() == [0.0, 1.0, 0.5, 0.5, 1.0]
