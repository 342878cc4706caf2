"""Projections loaded side by side (``load_lowbit(fuse_projections=True)``, the default): the same logits and bytes
as one call per kernel, bit for bit, for every low-bit form and both products; four product calls a block."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.lm import LMConfig, Transformer, decode, load_lowbit
from stejax.lm._configs import CONFIGS as LM_CONFIGS
from stejax.lm._decode import _step
from stejax.lm._lowbit import side_by_side
from stejax.lm._model import init_cache
from stejax.lowbit.kernels import supports
from stejax.lowbit.kernels._fused import fused_grouped_fits, fused_kernel_fits, fused_linear, multiplier
from stejax.lowbit.kernels._skeleton import Blocks
from stejax.lowbit.nnx import LowBitLinear, SplitLinear

from helpers import apply_split, apply_splits

TINY = LMConfig(context=48, width=64, depth=1, heads=2, hidden=128)  # SwiGLU: q, k, v, o, gate, up, down
PROMPTS = (b"def main():", b"x = y + 1\n")
# (configuration, ternary form): int8, grouped int4 and int2, ternary resident as int8 and as 2-bit.
CASES = [("w8a8", "int8"), ("w4a8", "int8"), ("w2a8", "int8"), ("w1.58a8", "int8"), ("w1.58a8", "2bit")]
IDS = [f"{c}-{f}" for c, f in CASES]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from stejax.lm._export import export_lm

    model = nnx.jit(lambda: Transformer(TINY, rngs=nnx.Rngs(params=11)))()
    root = tmp_path_factory.mktemp("lm_fused")
    return {c: export_lm(model, c, root / c) for c in sorted({c for c, _ in CASES})}


def _loaded(path, form: str, implementation: str, fuse: bool) -> nnx.Module:
    """The model as ``load_lowbit`` gives it; ``"pallas"``: its low-bit layers' kernels in interpret mode."""
    model = load_lowbit(
        path, ternary=form, implementation="xla" if implementation == "xla" else "pallas", fuse_projections=fuse
    ).model
    if implementation == "pallas":
        for _, module in nnx.iter_modules(model):
            if isinstance(module, LowBitLinear):
                module.interpret = True
    return model


def test_the_loaded_blocks_hold_the_projections_side_by_side(artifacts):
    model = load_lowbit(artifacts["w1.58a8"]).model
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    assert isinstance(attn.qkv, SplitLinear) and attn.qkv.widths == (64, 64, 64)
    assert isinstance(mlp.gate_up, SplitLinear) and mlp.gate_up.widths == (128, 128)
    assert not any(hasattr(attn, name) for name in ("q", "k", "v")) and not any(
        hasattr(mlp, name) for name in ("gate", "up")
    )
    assert isinstance(attn.o, LowBitLinear) and isinstance(mlp.down, LowBitLinear)
    separate = load_lowbit(artifacts["w1.58a8"], fuse_projections=False).model
    assert isinstance(separate.blocks[0].attn.q, LowBitLinear) and not hasattr(separate.blocks[0].attn, "qkv")


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
@pytest.mark.parametrize(("config", "form"), CASES, ids=IDS)
def test_fused_projections_give_the_separate_calls_logits_bit_for_bit(artifacts, config, form, implementation):
    separate = _loaded(artifacts[config], form, implementation, fuse=False)
    fused = _loaded(artifacts[config], form, implementation, fuse=True)
    x = jax.device_put(np.random.default_rng(2).normal(size=(2, 3, TINY.width)).astype(np.float32))
    # Each part of each fused layer against its own layer, in one program.
    attn_s, attn_f = separate.blocks[0].attn, fused.blocks[0].attn
    mlp_s, mlp_f = separate.blocks[0].mlp, fused.blocks[0].mlp
    layers = [attn_f.qkv, attn_s.q, attn_s.k, attn_s.v, mlp_f.gate_up, mlp_s.gate, mlp_s.up]
    outputs = apply_splits([nnx.split(layer) for layer in layers], x)
    qkv, q, k, v, gate_up, gate, up = (jax.tree.map(np.asarray, o) for o in outputs)
    for got, want in zip((*qkv, *gate_up), (q, k, v, gate, up), strict=True):
        np.testing.assert_array_equal(got, want)
    tokens = jax.device_put(np.random.default_rng(3).integers(0, 256, (2, 7)).astype(np.uint8))
    np.testing.assert_array_equal(
        np.asarray(apply_split(nnx.split(fused), tokens)), np.asarray(apply_split(nnx.split(separate), tokens))
    )


@pytest.mark.parametrize(
    ("config", "form", "implementation"),
    [("w8a8", "int8", "xla"), ("w1.58a8", "2bit", "xla"), ("w4a8", "int8", "pallas")],
    ids=["w8a8-int8-xla", "w1.58a8-2bit-xla", "w4a8-int8-pallas"],
)  # every form's logits, both products: above; decoding adds the step's wiring, the same for every product
# (per-channel scales, a ternary tensor's scale repeated per column, and grouped scales through the kernel)
def test_fused_projections_decode_the_separate_calls_bytes(artifacts, config, form, implementation):
    # Sampled, not greedy: a byte drawn at temperature 1 follows every logit, not only the largest.
    got, want = (
        decode(
            _loaded(artifacts[config], form, implementation, fuse=fuse),
            list(PROMPTS),
            tokens=8,
            key=jax.random.key(5),
            temperature=1.0,
        ).texts
        for fuse in (True, False)
    )
    assert got == want


def _calls(jaxpr: jax.core.Jaxpr, wanted) -> int:
    """Equations of ``jaxpr`` and of every jaxpr inside it that ``wanted(equation)`` accepts."""
    count = 0
    for eqn in jaxpr.eqns:
        count += bool(wanted(eqn))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _calls(sub, wanted)
    return count


def _step_jaxpr(model: nnx.Module) -> jax.core.Jaxpr:
    """The jaxpr of one decoding step of one row (the computation inside the decode loop)."""
    graphdef, state = nnx.split(model)
    cache = init_cache(TINY, 1, 16)

    def step(state, cache):
        return _step(
            nnx.merge(graphdef, state),
            jnp.zeros((1,), jnp.uint8),
            jnp.zeros((1,), jnp.int32),
            0,
            jnp.zeros((1, 16), jnp.int32),
            cache,
        )

    return jax.make_jaxpr(step)(state, cache).jaxpr


@pytest.mark.parametrize(("config", "form"), CASES, ids=IDS)
def test_a_decoding_step_issues_four_kernel_calls_a_block_not_seven(artifacts, config, form):
    def pallas(eqn):
        return eqn.primitive.name == "pallas_call"

    for fuse, per_block in ((False, 7), (True, 4)):
        model = _loaded(artifacts[config], form, "pallas", fuse=fuse)
        assert _calls(_step_jaxpr(model), pallas) == per_block * TINY.depth, (fuse, per_block)


def test_a_decoding_step_issues_four_integer_products_a_block_on_xla(artifacts):
    def integer_dot(eqn):
        return eqn.primitive.name == "dot_general" and eqn.invars[0].aval.dtype == jnp.int8

    for fuse, per_block in ((False, 7), (True, 4)):
        model = _loaded(artifacts["w8a8"], "int8", "xla", fuse=fuse)
        assert _calls(_step_jaxpr(model), integer_dot) == per_block * TINY.depth, (fuse, per_block)


@pytest.fixture(params=[jax.default_backend() != "tpu"], ids=lambda i: "interpret" if i else "compiled")
def interpret(request):
    """The kernel test runs compiled on a TPU and in Pallas interpret mode elsewhere."""
    return request.param


def test_ternary_columns_with_their_own_scales_equal_one_call_per_scale(interpret):
    # The fused kernel over three ternary kernels side by side, one scale per column, on a 2 x 3 grid of blocks
    # whose column blocks cross the parts' boundaries: each part's columns equal its own call with its one scale.
    rng = np.random.default_rng(7)
    k, widths = 256, (128, 64, 192)
    x = jax.device_put(rng.normal(size=(3, k)).astype(np.float32))
    parts = [(rng.integers(-1, 2, (k, n)).astype(np.int8), np.float32(rng.uniform(0.5, 4.0))) for n in widths]
    codes, scale = side_by_side(parts, LM_CONFIGS["w1.58a8"])
    assert codes.shape == (k, sum(widths)) and scale.shape == (sum(widths),)
    got = fused_linear(
        x,
        jnp.asarray(codes),
        jnp.asarray(multiplier(scale, "ternary", 8)),
        form="ternary-int8",
        blocks=Blocks(128, 128),
        interpret=interpret,
    )
    ends = np.cumsum(widths)
    for (c, s), end, n in zip(parts, ends, widths, strict=True):
        want = fused_linear(
            x, jnp.asarray(c), jnp.asarray(multiplier(s, "ternary", 8)), form="ternary-int8", interpret=interpret
        )
        np.testing.assert_array_equal(np.asarray(got)[:, end - n : end], np.asarray(want))


@pytest.mark.parametrize("form", ["int8", "ternary-int8", "ternary-2bit", "int4", "int2"])
def test_the_kernels_take_the_fused_widths_of_the_bench_models(form):
    # The 1B model (width 2048, SwiGLU hidden 5632) and the 25M one (512, 1376): q, k, v side by side (3 d
    # columns), gate and up (2 h). Without grouped-query attention k and v are as wide as q.
    group = 32 if form in ("int4", "int2") else None
    for d, h in ((2048, 5632), (512, 1376)):
        for n in (3 * d, 2 * h):
            assert supports(form, rows=1, k=d, n=n, group=group), (form, d, n)
            if group is None:
                assert fused_kernel_fits(1, d, n, form), (form, d, n)
            else:
                assert fused_grouped_fits(1, d, n, group, form), (form, d, n)


def test_split_linear_refuses_widths_that_do_not_cover_the_layer():
    layer = LowBitLinear(
        "int8",
        np.zeros((32, 96), np.int8),
        np.ones((96,), np.float32),
        in_features=32,
        out_features=96,
        input_bits=8,
    )
    with pytest.raises(ValueError, match=r"^SplitLinear: widths \(32, 32\) sum to 64; expected the layer's 96 output"):
        SplitLinear(layer, (32, 32))
    with pytest.raises(ValueError, match=r"^SplitLinear: widths must be ints >= 1; got \(96, 0\)\.$"):
        SplitLinear(layer, (96, 0))


def test_side_by_side_refuses_parts_of_different_contractions():
    parts = [(np.zeros((32, 8), np.int8), np.ones((8,), np.float32)), (np.zeros((64, 8), np.int8), np.ones((8,)))]
    with pytest.raises(ValueError, match=r"^side_by_side: the parts must share the contraction axis; got codes of"):
        side_by_side(parts, LM_CONFIGS["w8a8"])
