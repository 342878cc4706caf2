"""Compiled, batched decoding and low-bit resident weights: parity with the per-byte loop, buckets, errors."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from flax import nnx

from stejax.artifacts import ArtifactError
from stejax.bench import CompileCounter
from stejax.lm import LMConfig, LowBitLinear, Transformer, decode, draw_byte, generate, load_lowbit
from stejax.lm._export import export_lm

from helpers import CONTRACT, apply_split, per_byte_greedy

# Room for a 16-byte prompt and 256 new bytes.
TINY = LMConfig(context=272, width=32, depth=1, heads=2, hidden=64)
PROMPTS = (b"def main():", b"x = y + 1\n")  # one length: the loop compiles one prefill
SAMPLE_PROMPTS = (b"abc", b"a much longer prompt of bytes", b"z")  # batch bucket 4, length bucket 32
PARITY_CONFIGS = ("float", "w8a8", "w4a8", "w1.58a8")
# The low-bit layers' integer sums are exact; the exported model sums float products, so the logits
# agree to float32 rounding of a sum of `width` terms and of the rescaling.
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    model = Transformer(TINY, rngs=nnx.Rngs(params=7))
    root = tmp_path_factory.mktemp("lm_decode")
    return model, {c: export_lm(model, c, root / c) for c in (*PARITY_CONFIGS, "w2a8")}


_LOADED: dict[tuple[str, str, str], Any] = {}


def _load(artifacts, config: str, form: str = "int8") -> Any:
    """load_lowbit, once per artifact and form for the whole module."""
    path = artifacts[1][config]
    if (str(path), config, form) not in _LOADED:
        _LOADED[str(path), config, form] = load_lowbit(path, ternary=form)
    return _LOADED[str(path), config, form]


# Greedy bytes per configuration: float decodes 256 (11 + 256 bytes: a cache bucket of 512, capped at the context);
# the low-bit configurations, whose resident layers are what they add, decode 48 (a bucket of 64), which exercises
# the same compiled loop, its prefill and every step of the cache's writes in fewer steps.
GREEDY_TOKENS = {"float": 256, "w8a8": 48, "w4a8": 48, "w1.58a8": 48}


def _per_byte(artifacts, config: str) -> tuple[bytes, ...]:
    """The per-byte loop's greedy bytes (GREEDY_TOKENS) after each prompt, by the artifact's integer reference."""
    return per_byte_greedy(artifacts[1][config], _load(artifacts, config).reference, PROMPTS, GREEDY_TOKENS[config])


@pytest.mark.parametrize("config", PARITY_CONFIGS)
def test_greedy_bytes_match_the_per_byte_loop(artifacts, config):
    loaded = _load(artifacts, config)
    key = jax.random.key(0)
    expected = _per_byte(artifacts, config)
    tokens = GREEDY_TOKENS[config]
    # The default resident form (ternary as int8); the packed form's logits are checked below.
    got = decode(loaded.model, list(PROMPTS), tokens=tokens, key=key, temperature=0)
    # 11 + 256 bytes: a bucket of 512, capped at the context; 11 + 48 bytes: a bucket of 64.
    assert got.cache_bucket == (TINY.context if tokens == 256 else 64)
    assert got.texts == expected
    assert [len(t) for t in got.texts] == [tokens, tokens]


def test_both_attention_forms_are_the_same_sums():
    # Heads, width, slots and rows all differ, so a block or diagonal read from the wrong axis cannot pass.
    from stejax.lm._decode import _attend

    rng = np.random.default_rng(3)
    batch, context, heads, d = 2, 5, 3, 4
    q = rng.standard_normal((batch, 1, heads, d)).astype(np.float32)
    keys, values = (rng.standard_normal((batch, context, heads, d)).astype(np.float32) for _ in range(2))
    visible = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], bool)[:, None, None, :]
    attend = jax.jit(_attend, static_argnums=4)
    got = np.asarray(attend(*jax.device_put((q, keys, values, visible)), "matmul"))
    want = np.asarray(attend(*jax.device_put((q, keys, values, visible)), "reduce"))
    assert got.shape == want.shape == (batch, 1, heads * d)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # The reference by hand: head g of row b sees only its visible slots.
    scores = np.einsum("bhd,bkhd->bhk", q[:, 0], keys) / np.sqrt(d)
    scores = np.where(visible[:, 0], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    # Against NumPy, the backend's exp and division (the softmax) count too: each weight is within their ulps
    # (the platform contract; 0 on CPU), so each output within that share of the values it weighs.
    softmax_error = CONTRACT.function_error("exp") + CONTRACT.function_error("divide")
    want_np = np.einsum("bhk,bkhd->bhd", weights, values).reshape(batch, -1)
    np.testing.assert_allclose(got[:, 0], want_np, rtol=1e-5, atol=softmax_error * float(np.abs(values).max()))


@pytest.mark.parametrize("config", ["float", "w1.58a8"])
def test_matmul_attention_decodes_like_the_per_byte_loop(artifacts, config):
    # The accelerator's attention (every head of a row as one block-diagonal product), run on CPU.
    loaded = _load(artifacts, config)
    tokens = GREEDY_TOKENS[config]
    got = decode(loaded.model, list(PROMPTS), tokens=tokens, key=jax.random.key(0), temperature=0, attention="matmul")
    assert got.texts == _per_byte(artifacts, config)  # the same loop as the greedy test's, computed once


@pytest.mark.parametrize(
    ("config", "form"), [("w8a8", "int8"), ("w4a8", "int8"), ("w2a8", "int8"), ("w1.58a8", "2bit")]
)
def test_lowbit_logits_match_the_exported_integer_forward(artifacts, config, form):
    # device_put: a transfer, no program (jnp.asarray stages one per shape and dtype)
    x = jax.device_put(np.random.default_rng(1).integers(0, 256, (3, 40)).astype(np.uint8))
    loaded = _load(artifacts, config, form)
    got = np.asarray(apply_split(nnx.split(loaded.model), x))
    want = np.asarray(apply_split(nnx.split(loaded.reference), x))
    np.testing.assert_allclose(got, want, atol=LOGIT_TOLERANCE, rtol=0)


def test_weights_stay_low_bit_in_the_compiled_step(artifacts):
    sizes = {}
    for config, form in (("w8a8", "int8"), ("w4a8", "int8"), ("w1.58a8", "2bit"), ("w1.58a8", "int8")):
        loaded = load_lowbit(artifacts[1][config], ternary=form, fuse_projections=False)
        layers = [m for _, m in nnx.iter_modules(loaded.model) if isinstance(m, LowBitLinear)]
        assert len(layers) == 7 * TINY.depth
        assert all(m.codes[...].dtype in (jnp.int8, jnp.uint8) for m in layers)
        # The compiled step reads the codes as they are: no float kernel of the quantised layers is an input.
        graphdef, state = nnx.split(loaded.model)
        jaxpr = jax.make_jaxpr(lambda s, g=graphdef: nnx.merge(g, s)(jnp.zeros((1, 4), jnp.uint8)))(state)
        dtypes = [str(v.aval.dtype) for v in jaxpr.jaxpr.invars]
        assert dtypes.count("int8") + dtypes.count("uint8") == len(layers)
        sizes[(config, form)] = loaded.bytes
    float32 = sizes[("w8a8", "int8")]["linear_float32"]
    assert sizes[("w4a8", "int8")]["linear"] <= float32 / 6
    scales = 4 * len(layers)  # one float32 scale per ternary tensor
    assert sizes[("w1.58a8", "2bit")]["linear"] <= float32 / 8 + scales
    assert sizes[("w1.58a8", "int8")]["linear"] == float32 / 4 + scales


def test_fused_projections_stay_low_bit_in_the_compiled_step(artifacts):
    # The default load: q/k/v one layer, gate/up another; four layers a block, each column with its own scale.
    d, h = TINY.width, TINY.hidden
    for config, form in (("w8a8", "int8"), ("w1.58a8", "2bit"), ("w1.58a8", "int8")):
        loaded = _load(artifacts, config, form)
        layers = [m for _, m in nnx.iter_modules(loaded.model) if isinstance(m, LowBitLinear)]
        assert sorted(m.out_features for m in layers) == sorted([3 * d, d, 2 * h, d] * TINY.depth)
        graphdef, state = nnx.split(loaded.model)
        jaxpr = jax.make_jaxpr(lambda s, g=graphdef: nnx.merge(g, s)(jnp.zeros((1, 4), jnp.uint8)))(state)
        dtypes = [str(v.aval.dtype) for v in jaxpr.jaxpr.invars]
        assert dtypes.count("int8") + dtypes.count("uint8") == len(layers) == 4 * TINY.depth
        if config == "w1.58a8":  # a float32 scale per column of q/k/v and gate/up, one for o and down
            float32 = loaded.bytes["linear_float32"]
            scales = 4 * TINY.depth * (3 * d + 2 * h + 2)
            assert loaded.bytes["linear"] == float32 // (4 if form == "int8" else 16) + scales


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.3, "top_p": 0.6},
        {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "stop": [b"a", b"\x00\x01"]},
    ],
)
def test_sampled_batches_match_the_loop_row_by_row(artifacts, settings):
    model = artifacts[0]
    prompts = list(SAMPLE_PROMPTS)
    key = jax.random.key(5)
    got = decode(model, prompts, tokens=40, key=key, **settings)
    with jax.debug_key_reuse(False):
        want = tuple(generate(model, p, tokens=40, key=key, row=r, **settings).tokens for r, p in enumerate(prompts))
    assert got.texts == want
    assert len(set(got.texts)) == 3


def test_each_row_stops_on_its_own(artifacts):
    model = artifacts[0]
    prompts = list(SAMPLE_PROMPTS)
    free = decode(model, prompts, tokens=60, key=jax.random.key(2), temperature=1.0)
    stop = free.texts[0][10:12]  # a sequence row 0 is known to produce
    stopped = decode(model, prompts, tokens=60, key=jax.random.key(2), temperature=1.0, stop=stop)
    for before, after in zip(free.texts, stopped.texts, strict=True):
        cut = before.find(stop)
        assert after == (before if cut < 0 else before[: cut + len(stop)])
    assert len(stopped.texts[0]) <= 12


def test_second_call_in_a_bucket_compiles_nothing(artifacts):
    model = artifacts[0]
    first = decode(model, [b"one", b"two", b"three"], tokens=40, key=jax.random.key(0), temperature=0)
    # The cache holds the longest prompt and the budget: 5 + 40 bytes -> 64 slots, not the context's 272.
    assert (first.batch_bucket, first.length_bucket, first.cache_bucket) == (4, 16, 64)
    with CompileCounter() as counter:  # other prompts, budget and sampling settings: the same buckets
        again = decode(
            model, [b"four", b"fifteen bytes!!", b"6"], tokens=21, key=jax.random.key(1), temperature=0.9, top_k=7
        )
    assert counter.count == 0 and again.compiles == 0
    assert again.cache_bucket == 64  # 15 + 21 bytes
    assert [len(t) for t in again.texts] == [21, 21, 21]


def test_init_cache_takes_a_length_up_to_the_context():
    from stejax.lm import init_cache

    assert init_cache(TINY, 3, 16)[0].keys.shape == (3, 16, TINY.heads, TINY.width // TINY.heads)
    assert init_cache(TINY, 1)[0].values.shape[1] == TINY.context
    for bad in (0, TINY.context + 1):
        with pytest.raises(ValueError, match=rf"init_cache: length must be in \[1, 272\].*got {bad}"):
            init_cache(TINY, 1, bad)


def test_draw_byte_keeps_only_what_top_k_and_top_p_allow():
    # Probabilities 0.5, 0.25, 0.125, 0.0625, ... on bytes 0, 1, 2, 3, ...
    logits = jax.device_put((-np.log(2.0) * np.arange(256)).astype(np.float32))
    draws = jax.random.split(jax.random.key(3), 400)

    def drawn(temperature, top_k, top_p):
        settings = (jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p))
        return set(np.asarray(jax.vmap(lambda k: draw_byte(logits, k, *settings))(draws)).tolist())

    assert drawn(1.0, 2, 1.0) == {0, 1}
    assert drawn(1.0, 256, 0.7) == {0, 1}  # 0.5 < 0.7 keeps byte 1; 0.75 >= 0.7 stops there
    assert drawn(1.0, 256, 0.5) == {0}
    assert drawn(0.0, 256, 1.0) == {0}
    assert drawn(1.0, 256, 1.0) >= {0, 1, 2, 3}


def test_llama_norm_placement_decodes_like_the_loop():
    model = Transformer(LMConfig(context=32, width=32, depth=1, heads=2, hidden=64, norms="llama"), rngs=nnx.Rngs(1))
    got = decode(model, [b"ab", b"cd"], tokens=16, key=jax.random.key(0), temperature=0)
    with jax.debug_key_reuse(False):
        want = tuple(generate(model, p, tokens=16, key=jax.random.key(0), temperature=0).tokens for p in (b"ab", b"cd"))
    assert got.texts == want


@pytest.mark.parametrize(
    ("prompts", "kwargs", "message"),
    [
        (
            [b"x" * 300],
            {},
            r"prompt 0 of 300 bytes plus 4 new bytes is longer than the model's context; "
            r"expected at most 272 bytes in all, got 304",
        ),
        ([], {}, r"the batch is empty; expected at least one prompt"),
        ([b"a"], {"temperature": -0.5}, r"temperature must be >= 0 \(0 is greedy\); got -0.5"),
        ([b"a"], {"top_p": 0.0}, r"top_p must lie in \(0, 1\]; got 0.0"),
        ([b"a"], {"top_p": 1.5}, r"top_p must lie in \(0, 1\]; got 1.5"),
        ([b"a"], {"top_k": 0}, r"top_k must be an int >= 1 \(or None for all 256 bytes\); got 0"),
        ([b""], {}, r"prompt 0 must be non-empty bytes; got b''"),
        ([b"a"], {"attention": "flash"}, r"attention must be 'matmul', 'reduce' or None; got 'flash'"),
    ],
)
def test_bad_input_is_refused_naming_expected_and_got(artifacts, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        decode(artifacts[0], prompts, tokens=4, key=jax.random.key(0), **kwargs)


def test_a_tampered_artifact_is_refused(artifacts, tmp_path):
    import shutil

    art = shutil.copytree(artifacts[1]["w1.58a8"], tmp_path / "art")
    data = bytearray((art / "weights.safetensors").read_bytes())
    data[-1] ^= 1
    (art / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="the file was changed"):
        load_lowbit(art)


def test_cli_samples_a_batch_and_reports_speed_and_bytes(artifacts, tmp_path):
    from stejax.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first line\n", encoding="utf-8")  # two prompts: the bucket of the parity test
    art = str(artifacts[1]["w4a8"])
    result = CliRunner().invoke(
        main, ["lm", "sample", art, "--prompt", "hi", "--prompt-file", str(prompts), "--tokens", "8", "--top-k", "5"]
    )
    assert result.exit_code == 0, result.output
    out = result.stdout  # one line per prompt, but generated bytes may hold line breaks too
    assert out.startswith("hi") and "\nfirst line" in out
    assert "bytes/s" in result.stderr and "first byte" in result.stderr and "resident weights" in result.stderr
    bad = CliRunner().invoke(main, ["lm", "sample", art, "--prompt", "hi", "--top-p", "2"])
    assert bad.exit_code == 2 and "top_p must lie in (0, 1]; got 2.0" in bad.output


def _primitives(jaxpr: Any, into: dict[str, int]) -> dict[str, int]:
    for eqn in jaxpr.eqns:
        into[eqn.primitive.name] = into.get(eqn.primitive.name, 0) + 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    _primitives(getattr(inner, "jaxpr", inner), into)
    return into


@pytest.mark.parametrize("attention", ["reduce", "matmul"])
def test_the_decode_loop_writes_every_row_at_once(attention):
    # Per-row cache writes were scatters (one per row, layer, keys and values) inside the loop: none now.
    from stejax.lm import _decode

    model = Transformer(LMConfig(context=32, width=32, depth=2, heads=2, hidden=64), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    batch = 4
    keys = jax.random.split(jax.random.key(0), (batch, 32))
    cache = _decode.init_cache(model.config, batch)
    table, lengths = _decode._stop_table(b"ab")
    host = (np.zeros(batch, np.int32), np.full(batch, 3, np.int32), np.int32(16), np.ones(batch, bool), np.int32(5))
    scalars = (np.float32(0), np.int32(256), np.float32(1))
    args = (state, cache, *jax.device_put(host[:3]))
    args += (*jax.device_put(host[3:]), keys, jax.device_put(scalars))
    jaxpr = jax.make_jaxpr(lambda *a: _decode._decode_loop.__wrapped__(graphdef, attention, *a))(*args, table, lengths)
    loops = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "while"]
    assert len(loops) == 1
    body = _primitives(loops[0].params["body_jaxpr"].jaxpr, {})
    assert body.get("scatter", 0) == 0 and body.get("scatter-add", 0) == 0
    assert body["dynamic_update_slice"] == 2 * 2 + 1  # keys and values of each block, and the new bytes
