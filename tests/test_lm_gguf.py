"""GGUF export and llama.cpp: llama.cpp's input blocks, the reader round trip, logits and greedy parity (llama and,
for SubLN models, bitnet), refusals, atomic writes, the CLI."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.artifacts import ArtifactError
from stejax.lm import (
    CONFIGS,
    GGUFError,
    LMConfig,
    LMQuant,
    TrainSettings,
    Transformer,
    build_corpus,
    export_gguf,
    generate,
    gguf_name,
    gguf_types,
    llama_differences,
    llamacpp_greedy,
    llamacpp_logits,
    load_llama,
    quantize_lm,
    read_gguf,
    save_checkpoint,
    train_lm,
)
from stejax.lm._export import _flat_params, export_lm, load_lm_artifact
from stejax.lm._gguf import _from_artifact, gguf_architecture, gguf_differences, llamacpp_input_blocks, neox_rows
from stejax.lm._llamacpp import _refuse_amx_build

pytestmark = pytest.mark.xdist_group("lm_gguf")

NAMES = ("float", "w8a8", "w4a8", "w1.58a8")
# Trained at 64 bytes; the context of 192 lets greedy decoding run 128 bytes past a prompt (rotary positions
# have no parameters, so the same weights serve both).
TRAIN = LMConfig(context=64, width=64, depth=2, heads=2, hidden=160, norms="llama")
MODEL = TRAIN.replace(context=192)
# Of one length, so that stejax's per-byte reference compiles its prompt call once.
PROMPTS = (b"def f(x)", b"import n", b"  return", b"class Ar")
WINDOWS, WINDOW = 16, 64
# One llama.cpp thread: the suite runs two workers on two cores, and llama.cpp's threads wait on each other
# by spinning, which a busy core turns from microseconds into seconds.
THREADS = 1
# The model's every quantised product becomes Q8_0 or Q4_0 (rows of 64 and 160), whose inputs llama.cpp
# quantises per block of 32 (Q8_0): the quantised configurations are fine-tuned with that block.
INPUT_BLOCK = 32
TOP1_AGREEMENT = 0.99  # llama.cpp's top-1 byte is stejax's at least this often, every configuration
BPB_RELATIVE = 0.01  # llama.cpp's bits per byte within 1% of stejax's
GREEDY_BYTES = 32  # greedy decoding agrees on at least the first 32 bytes of a prompt, unless at a near-tie:
# stejax's two best bytes within these logits. llama.cpp sums in another order, so its float logits differ from
# stejax's by about 1e-5; a quantised product's input within rounding of a code boundary can take the neighbouring
# code there, and the logits of the quantised models differ by up to about 0.1.
NEAR_TIE = {"float": 1e-3, "quantised": 0.05}


def _trained_config(name: str) -> LMQuant:
    return CONFIGS[name] if name == "float" else CONFIGS[name].with_input_block(INPUT_BLOCK)


# ----------------------------------------------------------------------------------------------- input blocks


def _q8_0_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q8_0 (its AVX2 path), dequantised: per block of 32, codes * float16 d."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float16)  # y[i].d = GGML_CPU_FP32_TO_FP16(maxScalar / 127.f)
    safe = np.where(amax != 0, amax, np.float32(1))
    inv = np.where(amax != 0, np.float32(127) / safe, np.float32(0))  # id = 127.f / maxScalar, or 0
    codes = np.clip(np.rint(b * inv), -128, 127).astype(np.int8)  # _mm256_round_ps (ties to even), packs saturate
    return (codes.astype(np.float32) * d.astype(np.float32)).reshape(x.shape)


def _q8_k_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q8_K_ref, dequantised: per block of 256, codes * float32 d, the signed max's scale."""
    out = np.zeros(x.size, np.float32)
    for i, b in enumerate(x.astype(np.float32).reshape(-1, 256)):
        amax, top = np.float32(0), np.float32(0)
        for v in b:  # the first value of the largest magnitude, its sign kept
            if abs(v) > amax:
                amax, top = abs(v), v
        if amax == 0:
            continue
        iscale = np.float32(-127) / top
        codes = np.minimum(np.rint(iscale * b), 127).astype(np.int8)  # nearest_int: ties to even; MIN(127, v)
        out[i * 256 : (i + 1) * 256] = codes.astype(np.float32) * (np.float32(1) / iscale)
    return out.reshape(x.shape)


def _block_inputs(block: int) -> np.ndarray:
    """Random rows with blocks of very different magnitudes, an all-zero block, a tiny one and exact ties."""
    rng = np.random.default_rng(block)
    magnitudes = np.float32(10.0) ** rng.integers(-3, 3, (3, 4, 1)).astype(np.float32)
    x = (rng.standard_normal((3, 4, block)).astype(np.float32) * magnitudes).reshape(3, 4 * block)
    x[0, :block] = 0.0  # a block of zeros: scale 0, every value 0
    x[1, :block] *= np.float32(1e-6)  # float16's d is subnormal there
    ties = np.resize(np.arange(-63.5, 64.0, 1.0, dtype=np.float32), block - 1)  # with the block's max 127: codes at .5
    x[2, :block] = np.concatenate([[np.float32(127.0)], ties])
    return x


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("block", "reference"), [(32, _q8_0_reference), (256, _q8_k_reference)], ids=["Q8_0", "Q8_K"])
def test_block_inputs_equal_llamacpps_quantisation(block, reference, dtype):
    from stejax.lm import activation_quantiser

    x = jnp.asarray(_block_inputs(block)).astype(dtype)
    expected = reference(np.asarray(x.astype(jnp.float32))).astype(dtype)  # llama.cpp quantises float32 inputs
    q = activation_quantiser(8, block=block)
    for f in (q, jax.jit(q)):
        got = f(x)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), expected.astype(np.float32))
    assert not np.asarray(q(x)[0, :block]).any()
    if dtype is np.float32 and block == 32:  # the ties went to even codes: 0.5 -> 0, 1.5 -> 2, -62.5 -> -62
        codes = np.asarray(q(x))[2, 1:block]  # the block's d is float16(127/127) = 1: the values are the codes
        np.testing.assert_array_equal(codes, np.rint(_block_inputs(32)[2, 1:32]))
    # The declared straight-through derivative: 1 everywhere, through forward and reverse mode.
    ones = jax.grad(lambda v: jnp.sum(q(v).astype(jnp.float32)))(x)
    assert ones.dtype == x.dtype and np.all(np.asarray(ones.astype(jnp.float32)) == 1)


def test_block_input_quantiser_errors():
    from stejax.lm import activation_quantiser

    with pytest.raises(ValueError, match=r"block must be 32 \(llama.cpp's Q8_0\) or 256 \(Q8_K\), or None"):
        activation_quantiser(8, block=64)
    with pytest.raises(ValueError, match=r"blocks of 32 are llama.cpp's 8-bit inputs; bits must be 8, got 4"):
        activation_quantiser(4, block=32)
    with pytest.raises(ValueError, match=r"block 32 does not divide the last axis of an input of shape \(2, 48\)"):
        activation_quantiser(8, block=32)(jnp.ones((2, 48)))
    with pytest.raises(ValueError, match="inputs are float, expected 8-bit"):
        CONFIGS["float"].with_input_block(32)
    with pytest.raises(ValueError, match="inputs are 4-bit, expected 8-bit"):
        CONFIGS["w4a4"].with_input_block(32)
    with pytest.raises(ValueError, match=r"input_block must be 32 \(llama.cpp's Q8_0\), 256 \(Q8_K\) or None"):
        CONFIGS["w8a8"].with_input_block(16)


def test_input_block_is_a_field_that_older_manifests_lack():
    config = CONFIGS["w8a8"].with_input_block(32)
    assert config.name == "w8a8" and config.input_block == 32 and "per block of 32" in config.description
    assert LMQuant(**config.to_dict()) == config
    old = {k: v for k, v in CONFIGS["w8a8"].to_dict().items() if k != "input_block"}  # a manifest without the field
    assert LMQuant(**old) == CONFIGS["w8a8"] and LMQuant(**old).input_block is None
    assert config.with_input_block(None) == CONFIGS["w8a8"]
    assert config.quantisers()[1].__name__ == "int8_per_block32_q8_0"


def test_input_differences_name_the_tensors_and_what_would_match(tmp_path):
    from stejax.lm import input_differences

    wide = LMConfig(context=16, width=256, depth=1, heads=2, hidden=512, norms="llama")  # rows of 256: TQ2_0
    model = Transformer(wide, rngs=nnx.Rngs(params=1))
    per_token = export_gguf(model, tmp_path / "t.gguf", config="w1.58a8")
    (note,) = per_token.input_differences
    assert note.startswith("the inputs of 7 TQ2_0 tensors: llama.cpp quantises them to int8 per block of 256 values")
    assert "configuration 'w1.58a8' uses one int8 scale per token" in note and "with_input_block(256)" in note
    blocks = CONFIGS["w1.58a8"].with_input_block(32)
    tq = export_gguf(model, tmp_path / "b.gguf", config=blocks)
    (note,) = tq.input_differences
    assert "uses one int8 scale per block of 32 (Q8_0)" in note and "write them as Q4_0 (ternary='Q4_0')" in note
    q4 = export_gguf(model, tmp_path / "q.gguf", config=blocks, ternary="Q4_0")
    assert set(q4.types.values()) == {"F32", "Q4_0"} and q4.input_differences == ()
    assert input_differences(q4.types, "w1.58a8")[0].startswith("the inputs of 7 Q4_0 tensors")
    assert input_differences({"token_embd.weight": "F32"}, "float") == []


def test_a_run_trained_with_input_blocks_exports_them(tmp_path):
    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama")
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(Transformer(arch, rngs=nnx.Rngs(params=0)), run / "params.safetensors")
    config = {"model": arch.to_dict(), "config": "w8a8", "input_block": 32}
    (run / "config.json").write_text(json.dumps(config))
    result = export_gguf(run, tmp_path / "m.gguf")
    assert result.input_differences == ()
    from gguf import GGUFReader

    fields = GGUFReader(result.path).fields
    assert int(fields["stejax.input_block"].parts[-1][0]) == 32
    assert "per block of 32" in bytes(fields["stejax.description"].parts[-1]).decode()
    del config["input_block"]  # a run trained per token
    (run / "config.json").write_text(json.dumps(config))
    assert export_gguf(run, tmp_path / "t.gguf").input_differences[0].startswith("the inputs of 7 Q8_0 tensors")


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(max_bytes=600_000)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, corpus):
    """Float trained 200 steps; each quantised configuration fine-tuned 40 steps from it with llama.cpp's input
    blocks; artifacts and GGUFs."""
    root = tmp_path_factory.mktemp("gguf")
    train, val = corpus.data["train"], corpus.data["validation"]
    settings = TrainSettings(steps=200, batch_size=16, learning_rate=1e-2, warmup=20, eval_every=200, eval_windows=4)
    float_model = train_lm(
        Transformer(TRAIN, rngs=nnx.Rngs(params=0)), train, val, settings, key=jax.random.key(0)
    ).model
    finetune = TrainSettings(steps=40, batch_size=16, learning_rate=3e-3, warmup=4, eval_every=40, eval_windows=4)
    out = {}
    for i, name in enumerate(NAMES):
        model, config = float_model, _trained_config(name)
        if name != "float":
            model = train_lm(quantize_lm(float_model, config), train, val, finetune, key=jax.random.key(1 + i)).model
        wide = Transformer(MODEL, rngs=nnx.Rngs(params=0))
        nnx.update(wide, nnx.state(model, nnx.Param))
        export_lm(wide, config, root / name)
        out[name] = (root / name, export_gguf(root / name, root / f"{name}.gguf"))
    return out


@pytest.fixture(scope="module")
def windows(corpus):
    test = np.asarray(corpus.data["test"])
    starts = np.linspace(0, test.size - WINDOW - 2, WINDOWS).astype(int)
    return np.stack([test[s : s + WINDOW + 1] for s in starts])


def _bits(logits: np.ndarray, targets: np.ndarray) -> float:
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    picked = np.take_along_axis(np.asarray(logp), targets[..., None].astype(np.int64), axis=-1)
    return float(-picked.mean() / np.log(2))


@pytest.mark.parametrize("name", NAMES)
def test_reader_round_trip_is_stejax_weights_up_to_the_fp16_scale(exported, name):
    artifact, result = exported[name]
    read = read_gguf(result.path)
    source = _from_artifact(artifact)
    params = _flat_params(load_lm_artifact(artifact).float_model)
    assert set(read) == {gguf_name(n) for n in params}
    for stejax_name, value in params.items():
        got = read[gguf_name(stejax_name)]
        site = stejax_name.rsplit("/", 1)[0]
        if site not in source.codes:
            assert np.array_equal(got, value.T if stejax_name.endswith("kernel") else value), stejax_name
            continue
        codes, scale = source.codes[site]
        if name == "w1.58a8":
            d = np.float32(np.float16(np.float32(1) / scale.reshape(())))
            exact = codes.T.astype(np.float32) * d
        elif name == "w8a8":
            exact = codes.T.astype(np.float32) * scale.astype(np.float16).astype(np.float32)[:, None]
        else:  # groups of 32 along the contraction axis
            exact = codes.T.astype(np.float32) * np.repeat(scale, 32, axis=0).T.astype(np.float16).astype(np.float32)
        assert np.array_equal(got, exact), stejax_name  # the codes exactly, the scale in float16
        np.testing.assert_allclose(got, value.T, rtol=2.0**-11, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_llamacpp_logits_agree_with_the_integer_forward(exported, windows, name):
    artifact, result = exported[name]
    model = load_lm_artifact(artifact).model  # dequantised codes, the configuration's input quantisers
    ours = np.asarray(model(jnp.asarray(windows[:, :-1])))
    llm = load_llama(result.path, threads=THREADS, context=WINDOW, logits_all=True)
    theirs = np.stack([llamacpp_logits(llm, bytes(w[:-1])) for w in windows])
    llm.close()
    assert result.input_differences == ()  # llama.cpp quantises every product's input as the model does
    agree = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    bpb_ours, bpb_theirs = _bits(ours, windows[:, 1:]), _bits(theirs, windows[:, 1:])
    assert abs(bpb_theirs - bpb_ours) / bpb_ours <= BPB_RELATIVE, (name, bpb_ours, bpb_theirs)
    assert agree >= TOP1_AGREEMENT, (name, agree)
    if name == "float":  # the same float32 computation in another order
        np.testing.assert_allclose(theirs, ours, atol=2e-3 * np.abs(ours).max())


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decoding_agrees_on_the_first_32_bytes_of_every_prompt_or_up_to_a_near_tie(exported, name):
    """Byte for byte for at least 32 bytes after every prompt; an earlier first difference only at a near-tie:
    on the common prefix, stejax's two best bytes are within NEAR_TIE logits and llama.cpp takes the second."""
    artifact, result = exported[name]
    _assert_greedy_agrees(artifact, result.path, name, MODEL.context, tokens=128)


def _assert_greedy_agrees(artifact, path, name: str, context: int, *, tokens: int) -> None:
    model = load_lm_artifact(artifact).model
    llm = load_llama(path, threads=THREADS, context=context, logits_all=True)
    tie = NEAR_TIE["float" if name == "float" else "quantised"]
    agreed = []
    for prompt in PROMPTS:
        ours = generate(model, prompt, tokens=tokens, key=jax.random.key(0), temperature=0).tokens
        theirs = llamacpp_greedy(llm, prompt, tokens=tokens).tokens
        assert len(theirs) == tokens
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), tokens)
        agreed.append(first)
        if first < GREEDY_BYTES:
            prefix = np.frombuffer(prompt + bytes(ours[:first]), np.uint8)
            logits = np.asarray(model(jnp.asarray(prefix[None])))[0, -1]
            runner_up, best = np.argsort(logits)[-2:]
            assert (best, runner_up) == (ours[first], theirs[first]), (name, prompt, first)
            margin = float(logits[best] - logits[runner_up])
            assert margin <= tie, (name, prompt, first, margin)
            # llama.cpp's own logits on the same prefix see a near-tie between the two as well.
            theirs_logits = llamacpp_logits(llm, prefix)[-1]
            assert abs(theirs_logits[runner_up] - theirs_logits[best]) <= tie, (name, prompt, first)
    llm.close()
    assert sum(a >= GREEDY_BYTES for a in agreed) >= len(PROMPTS) // 2, (name, agreed)


def test_the_installed_llamacpp_has_no_amx_kernels_and_a_build_with_them_is_refused(tmp_path):
    """make setup builds llama.cpp without its AMX kernels (they stop the process on CPUs with AMX); load_llama
    refuses a build that has them on such a CPU, with the rebuild command, before llama.cpp runs anything."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    assert b"AVX" in info or b"NEON" in info, info  # the CPU backend's feature list, as the check reads it
    _refuse_amx_build(info, cpu_has_amx=True)
    amx_build = b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    with pytest.raises(RuntimeError, match=r"AMX_INT8 = 1.*CFLAGS=\"-mno-amx-tile -mno-amx-int8 -mno-amx-bf16\""):
        _refuse_amx_build(amx_build, cpu_has_amx=True)
    _refuse_amx_build(amx_build, cpu_has_amx=False)  # llama.cpp leaves its AMX kernels unused without AMX


def test_ternary_rows_of_256_become_tq2_0_or_tq1_0(tmp_path):
    wide = LMConfig(context=16, width=256, depth=1, heads=2, hidden=512, norms="llama")
    model = Transformer(wide, rngs=nnx.Rngs(params=1))
    export_lm(model, "w1.58a8", tmp_path / "a")
    params = _flat_params(load_lm_artifact(tmp_path / "a").float_model)
    sizes = {}
    for kind in ("TQ2_0", "TQ1_0"):
        result = export_gguf(tmp_path / "a", tmp_path / f"{kind}.gguf", ternary=kind)
        assert {t for g, t in result.types.items() if g.startswith("blk.") and "norm" not in g} == {kind}
        read = read_gguf(result.path)
        for stejax_name, value in params.items():
            np.testing.assert_allclose(
                read[gguf_name(stejax_name)],
                value.T if value.ndim == 2 and "kernel" in stejax_name else value,
                rtol=2.0**-11,
            )
        sizes[kind] = result.bytes
    assert sizes["TQ1_0"] < sizes["TQ2_0"]
    assert gguf_types(wide, "w8a8")["blk.0.ffn_down.weight"] == ("Q8_0", (512, 256))


# ----------------------------------------------------------------------------------------------- SubLN as bitnet

# BitNet's SubLN layout with a tied head: llama.cpp's bitnet. At width 64 ternary rows take Q4_0 (inputs per
# block of 32); at width 256 and hidden 512, TQ2_0 (inputs per block of 256).
SUBLN = LMConfig(context=64, width=64, depth=2, heads=2, hidden=160, norms="subln", tied=True)
SUBLN_WIDE = SUBLN.replace(width=256, depth=1, hidden=512)


def _subln_config(arch: LMConfig, name: str) -> LMQuant:
    """The configuration trained with the input block llama.cpp uses for the model's ternary type."""
    if name == "float":
        return CONFIGS[name]
    (block,) = llamacpp_input_blocks(arch, name)
    return CONFIGS[name].with_input_block(block)


@pytest.fixture(scope="module")
def subln_exported(tmp_path_factory, corpus):
    """SubLN models with tied heads: float trained briefly, w1.58a8 fine-tuned from it with llama.cpp's input
    block, at both widths; artifacts and their GGUF files (bitnet)."""
    root = tmp_path_factory.mktemp("bitnet")
    train, val = corpus.data["train"], corpus.data["validation"]
    out = {}
    for arch, steps in ((SUBLN, 150), (SUBLN_WIDE, 60)):
        settings = TrainSettings(
            steps=steps, batch_size=16, learning_rate=1e-2, warmup=15, eval_every=steps, eval_windows=4
        )
        float_model = train_lm(
            Transformer(arch, rngs=nnx.Rngs(params=0)), train, val, settings, key=jax.random.key(0)
        ).model
        for name in ("float", "w1.58a8"):
            model, config = float_model, _subln_config(arch, name)
            if name != "float":
                finetune = TrainSettings(
                    steps=30, batch_size=16, learning_rate=3e-3, warmup=3, eval_every=30, eval_windows=4
                )
                model = train_lm(quantize_lm(model, config), train, val, finetune, key=jax.random.key(1)).model
            key = f"{name}@{arch.width}"
            export_lm(model, config, root / key)
            out[key] = (root / key, export_gguf(root / key, root / f"{key}.gguf"))
    return out


SUBLN_CASES = ("float@64", "w1.58a8@64", "float@256", "w1.58a8@256")


def test_subln_models_export_as_llamacpps_bitnet(subln_exported):
    from gguf import GGUFReader

    expected = {
        "float@64": {"F32"},
        "w1.58a8@64": {"F32", "Q4_0"},
        "float@256": {"F32"},
        "w1.58a8@256": {"F32", "TQ2_0"},
    }
    for case in SUBLN_CASES:
        _, result = subln_exported[case]
        fields = GGUFReader(result.path).fields
        assert bytes(fields["general.architecture"].parts[-1]).decode() == "bitnet" == result.architecture
        assert float(fields["bitnet.attention.layer_norm_rms_epsilon"].parts[-1][0]) == pytest.approx(1e-6)
        assert set(result.types.values()) == expected[case], case
        assert result.input_differences == (), case  # llama.cpp quantises every input as the model was trained
    types = gguf_types(SUBLN, "w1.58a8")
    assert types["blk.1.attn_sub_norm.weight"] == ("F32", (64,)) and types["blk.1.ffn_sub_norm.weight"] == (
        "F32",
        (160,),
    )
    assert "output.weight" not in types  # bitnet's head is token_embd
    assert list(types)[:12] == [
        "token_embd.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",
        "blk.0.attn_sub_norm.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_norm.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight",
        "blk.0.ffn_sub_norm.weight",
        "blk.0.ffn_down.weight",
    ]
    assert gguf_architecture(SUBLN) == "bitnet" and gguf_architecture(TRAIN) == "llama"
    assert "SubLN norm placement (norms='subln')" in llama_differences(SUBLN)[-1]  # still not llama's computation
    assert gguf_types(TRAIN, "float")["output.weight"] == ("F32", (64, 256))  # llama's files are as they were


@pytest.mark.parametrize("case", SUBLN_CASES)
def test_bitnet_reader_round_trip_is_stejax_weights_with_q_and_k_in_neox_order(subln_exported, case):
    artifact, result = subln_exported[case]
    read = read_gguf(result.path)
    params = _flat_params(load_lm_artifact(artifact).float_model)
    assert set(read) == {gguf_name(n) for n in params}
    arch = SUBLN if case.endswith("@64") else SUBLN_WIDE
    order = neox_rows(arch.width, arch.heads)
    for stejax_name, value in params.items():
        expected = value.T if stejax_name.endswith("kernel") else value
        if stejax_name.endswith(("attn/q/kernel", "attn/k/kernel")):
            expected = expected[order]
        if case.startswith("float") or not stejax_name.startswith("blocks/") or "norm" in stejax_name:
            assert np.array_equal(read[gguf_name(stejax_name)], expected), stejax_name
        else:  # the ternary codes exactly, gamma rounded to float16
            np.testing.assert_allclose(read[gguf_name(stejax_name)], expected, rtol=2.0**-11, atol=0)


@pytest.mark.parametrize("case", SUBLN_CASES)
def test_bitnet_logits_agree_with_the_subln_forward(subln_exported, windows, case):
    """The existing llama bounds: top-1 at least 99% of the time, bits per byte within 1%, and float logits
    within 2e-3 of their largest magnitude (measured: about 1e-6 of it)."""
    artifact, result = subln_exported[case]
    model = load_lm_artifact(artifact).model
    ours = np.asarray(model(jnp.asarray(windows[:, :-1])))
    llm = load_llama(result.path, threads=THREADS, context=WINDOW, logits_all=True)
    theirs = np.stack([llamacpp_logits(llm, bytes(w[:-1])) for w in windows])
    llm.close()
    agree = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    bpb_ours, bpb_theirs = _bits(ours, windows[:, 1:]), _bits(theirs, windows[:, 1:])
    assert abs(bpb_theirs - bpb_ours) / bpb_ours <= BPB_RELATIVE, (case, bpb_ours, bpb_theirs)
    assert agree >= TOP1_AGREEMENT, (case, agree)
    if case.startswith("float"):
        np.testing.assert_allclose(theirs, ours, atol=2e-3 * np.abs(ours).max())


@pytest.mark.parametrize("case", ["float@64", "w1.58a8@64"])
def test_bitnet_greedy_decoding_agrees_as_llamas_does(subln_exported, case):
    """llama.cpp's key-value cache, one byte a step: the llama bound (32 bytes, or a near-tie), all 32 of the
    64-byte context that an 8-byte prompt leaves room for."""
    artifact, result = subln_exported[case]
    _assert_greedy_agrees(artifact, result.path, case.split("@")[0], SUBLN.context, tokens=GREEDY_BYTES)


@pytest.mark.parametrize(("arch", "ternary"), [(SUBLN, "Q4_0"), (SUBLN_WIDE, "TQ2_0")], ids=["Q4_0", "TQ2_0"])
def test_bitnet_computes_the_ternary_forward_where_gamma_is_exact_in_float16(tmp_path, arch, ternary):
    """With every kernel's gamma a power of two, float16 holds it exactly: the file's weights are stejax's, and
    the ternary logits agree as the float ones do, but for a position where a product's input lies within
    rounding of a code boundary (measured: 0 of 256 positions at width 64, 2 of 256 at width 256)."""
    model = Transformer(arch, rngs=nnx.Rngs(params=2))
    for block in model.blocks:
        for linear in (block.attn.q, block.attn.k, block.attn.v, block.attn.o, block.mlp.gate, block.mlp.up):
            w = linear.kernel[...]
            linear.kernel[...] = w * (2.0**-4 / jnp.mean(jnp.abs(w)))  # gamma (the absmean) = 2**-4
        w = block.mlp.down.kernel[...]
        block.mlp.down.kernel[...] = w * (2.0**-5 / jnp.mean(jnp.abs(w)))
    config = _subln_config(arch, "w1.58a8")
    export_lm(model, config, tmp_path / "a")
    result = export_gguf(tmp_path / "a", tmp_path / "m.gguf")
    assert result.architecture == "bitnet" and ternary in result.types.values() and result.input_differences == ()
    tokens = np.random.default_rng(0).integers(0, 256, (4, arch.context))
    ours = np.asarray(load_lm_artifact(tmp_path / "a").model(jnp.asarray(tokens)))
    llm = load_llama(result.path, threads=THREADS, context=arch.context, logits_all=True)
    theirs = np.stack([llamacpp_logits(llm, bytes(map(int, t))) for t in tokens])
    llm.close()
    close = np.abs(theirs - ours).max(-1) <= 2e-3 * np.abs(ours).max()
    assert close.mean() >= 0.98, (ternary, close.mean())
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= TOP1_AGREEMENT


@pytest.mark.parametrize(
    ("changes", "config", "needle"),
    [
        (
            {"tied": False},
            "w1.58a8",
            "an untied head (tied=False): llama.cpp's bitnet computes the logits with the "
            "token embedding (token_embd) and reads no output tensor, so a SubLN model needs a tied head (tied=True)",
        ),
        ({"positions": "learned"}, "float", "learned positions (positions='learned')"),
        ({"mlp": "gelu"}, "float", "a GELU MLP (mlp='gelu'): llama.cpp's bitnet MLP is SwiGLU"),
        ({}, "w4a4", "4-bit activations (configuration 'w4a4')"),
    ],
)
def test_a_subln_model_bitnet_does_not_compute_is_refused_by_name(tmp_path, changes, config, needle):
    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="subln", tied=True).replace(**changes)
    model = Transformer(arch, rngs=nnx.Rngs(params=0))
    expected = "this model is not the computation of llama.cpp's bitnet, the architecture that runs SubLN models"
    with pytest.raises(GGUFError, match=expected) as info:
        export_gguf(model, tmp_path / "m.gguf", config=config)
    assert needle in str(info.value)
    assert gguf_differences(arch, config) and os.listdir(tmp_path) == []
    with pytest.raises(GGUFError, match="untied head"):  # LMConfig()'s default: SubLN with its own head
        gguf_types(LMConfig(), "float")


# ----------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("changes", "config", "needle"),
    [
        ({"positions": "learned"}, "float", "learned positions (positions='learned')"),
        ({"mlp": "gelu"}, "float", "a GELU MLP (mlp='gelu')"),
        ({"tied": True}, "float", "a tied head (tied=True)"),
        ({}, "w4a4", "4-bit activations (configuration 'w4a4')"),
    ],
)
def test_a_model_llama_does_not_compute_is_refused_by_name(tmp_path, changes, config, needle):
    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama").replace(**changes)
    model = Transformer(arch, rngs=nnx.Rngs(params=0))
    with pytest.raises(GGUFError, match="not llama's computation") as info:
        export_gguf(model, tmp_path / "m.gguf", config=config)
    assert needle in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_shape_no_type_holds_names_the_tensor_the_multiple_and_what_fits(tmp_path):
    model = Transformer(LMConfig(context=16, width=48, depth=1, heads=2, hidden=64, norms="llama"), rngs=nnx.Rngs(0))
    expected = (
        r"blocks/0/attn/q \(blk.0.attn_q.weight\): kernel of shape \(48, 48\) has 48 inputs per output row; Q8_0 "
        r"stores rows in blocks of 32, so the input width must be a multiple of 32 \(48 is not; 32 or 64 would fit\)."
    )
    with pytest.raises(GGUFError, match=expected):
        export_gguf(model, tmp_path / "m.gguf", config="w8a8")
    with pytest.raises(GGUFError, match=r"ternary needs TQ2_0 \(blocks of 256\) or Q4_0, which stores rows"):
        export_gguf(model, tmp_path / "m.gguf", config="w1.58a8")
    assert os.listdir(tmp_path) == []


def test_a_scale_outside_float16_is_refused(tmp_path):
    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama")
    model = Transformer(arch, rngs=nnx.Rngs(0))
    q = model.blocks[0].attn.q
    q.kernel[...] = q.kernel[...] * 1e-6  # int8 channel scales near 1e-8: below float16's normal range
    with pytest.raises(GGUFError, match=r"blocks/0/attn/q \(blk.0.attn_q.weight\): a block scale of .* lies outside"):
        export_gguf(model, tmp_path / "m.gguf", config="w8a8")


def test_missing_or_tampered_artifacts_are_refused(exported, tmp_path):
    import shutil

    artifact, _ = exported["w4a8"]
    copy = tmp_path / "a"
    shutil.copytree(artifact, copy)
    data = bytearray((copy / "weights.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        export_gguf(copy, tmp_path / "t.gguf")
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["config"]["name"] = "w8a8"
    edited = tmp_path / "b"
    shutil.copytree(artifact, edited)
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="integrity"):
        export_gguf(edited, tmp_path / "t.gguf")
    with pytest.raises(ArtifactError, match="neither an LM artifact"):
        export_gguf(tmp_path, tmp_path / "t.gguf")
    assert not (tmp_path / "t.gguf").exists()


def test_the_write_is_atomic_and_never_overwrites(exported, tmp_path, monkeypatch):
    import gguf

    artifact, _ = exported["w8a8"]

    def fail(self, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        export_gguf(artifact, tmp_path / "m.gguf")
    assert os.listdir(tmp_path) == []  # no file, no hidden partial one
    monkeypatch.undo()
    (tmp_path / "m.gguf").write_bytes(b"keep")
    with pytest.raises(FileExistsError, match="never overwrites"):
        export_gguf(artifact, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == b"keep"


def test_cli_export_gguf(exported, tmp_path):
    from click.testing import CliRunner

    from stejax.cli import main

    artifact, reference = exported["w1.58a8"]
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(main, ["lm", "export", "--format", "gguf", str(artifact), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Q4_0" in result.output and out.read_bytes() == reference.path.read_bytes()
    assert "note:" not in result.output  # trained with llama.cpp's input blocks
    again = CliRunner().invoke(main, ["lm", "export", "--format", "gguf", str(artifact), "--out", str(out)])
    assert again.exit_code != 0 and "never overwrites" in again.output


def test_cli_notes_a_per_token_model_and_refuses_blocks_for_float(tmp_path):
    from click.testing import CliRunner

    from stejax.cli import main

    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama")
    export_lm(Transformer(arch, rngs=nnx.Rngs(params=0)), "w4a8", tmp_path / "a")
    result = CliRunner().invoke(
        main, ["lm", "export", "--format", "gguf", str(tmp_path / "a"), "--out", str(tmp_path / "m")]
    )
    assert result.exit_code == 0, result.output
    assert "note: the inputs of 7 Q4_0 tensors: llama.cpp quantises them" in " ".join(result.output.split())
    assert (
        "will not compute exactly what the model computes in llama.cpp; to match, train with `stejax lm train "
        "--input-block 32` (what the default, auto, picks here)." in " ".join(result.output.split())
    )
    refused = CliRunner().invoke(main, ["lm", "train", "--out", str(tmp_path / "r"), "--input-block", "32"])
    assert refused.exit_code == 2 and "--preset float has no quantised inputs" in refused.output
    assert not (tmp_path / "r").exists()


def test_lm_decode_rows_time_llamacpp_on_the_suites_models(tmp_path):
    import types

    from stejax.lm._llamacpp import lm_decode_rows

    bench_model = types.SimpleNamespace(
        name="tiny",
        params=1,
        config=LMConfig(context=48, width=32, depth=1, heads=2, hidden=64),  # SubLN: rebuilt with llama's norms
        artifacts={"float": None, "w1.58a8": None, "w4a4": None},
    )
    rows = lm_decode_rows([bench_model], [b"def f(x):"], tokens=8, repeats=1, warmup=0, workdir=tmp_path, threads=1)
    assert [(r["config"], r["path"], r["batch"]) for r in rows] == [
        ("float", "llama.cpp", 1),
        ("w1.58a8", "llama.cpp", 1),
    ]
    assert all(r["bytes_per_s"] > 0 and r["architecture"].startswith("norms='llama'") for r in rows)
    assert rows[1]["gguf_vs_float"] < 1


def test_lm_decode_rows_time_a_tied_subln_model_as_it_is(tmp_path):
    import types

    from stejax.lm._llamacpp import lm_decode_rows

    bench_model = types.SimpleNamespace(
        name="tiny",
        params=1,
        config=LMConfig(context=48, width=32, depth=1, heads=2, hidden=64, tied=True),  # bitnet
        artifacts={"w1.58a8": None},
    )
    (row,) = lm_decode_rows([bench_model], [b"def f(x):"], tokens=8, repeats=1, warmup=0, workdir=tmp_path, threads=1)
    assert row["architecture"] == "as measured by stejax" and row["bytes_per_s"] > 0
