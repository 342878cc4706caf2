"""AWQ and SmoothQuant folded into the language model's norms (stejax.lm.smooth_lm)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.lm import LMConfig, Transformer, quantize_lm, smooth_lm, smoothing_groups
from stejax.ptq import awq, smooth

CONFIG = LMConfig(context=16, width=64, depth=2, heads=2, hidden=128)


@pytest.fixture(scope="module")
def model_and_windows():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    windows = jax.random.randint(jax.random.key(1), (4, 16), 0, 256).astype(jnp.uint8)
    return model, windows


def test_groups_follow_the_norm_placement():
    subln = smoothing_groups(Transformer(CONFIG, rngs=nnx.Rngs(0)))
    llama = smoothing_groups(Transformer(LMConfig(**{**CONFIG.to_dict(), "norms": "llama"}), rngs=nnx.Rngs(0)))
    assert len(subln) == 4 * CONFIG.depth and len(llama) == 2 * CONFIG.depth
    assert [g.norm for g in llama[:2]] == ["blocks/0/attn_norm", "blocks/0/mlp_norm"]
    assert subln[1] == ("blocks/0/attn/o_norm", ("blocks/0/attn/o",))


@pytest.mark.parametrize("method", ["awq", "smoothquant"])
def test_the_smoothed_copy_computes_the_same_logits_and_the_original_is_unchanged(model_and_windows, method):
    model, windows = model_and_windows
    before = np.asarray(model(windows))
    kernel = np.asarray(model.blocks[0].attn.q.kernel[...])
    smoothed, chosen = smooth_lm(model, windows, method=method, bits=4, group_size=32)
    np.testing.assert_allclose(np.asarray(smoothed(windows)), before, rtol=0, atol=1e-5 * np.abs(before).max())
    np.testing.assert_array_equal(np.asarray(model.blocks[0].attn.q.kernel[...]), kernel)
    assert set(chosen) == {g.norm for g in smoothing_groups(model)}
    # The linears that read one norm share its scales: every row of q, k and v moved by the same factor, the
    # inverse of the norm's.
    block, new = model.blocks[0], smoothed.blocks[0]
    s = np.asarray(block.attn_norm.scale[...]) / np.asarray(new.attn_norm.scale[...])
    assert not np.allclose(s, 1.0)  # random calibration inputs: the scales are not all 1
    for name in ("q", "k", "v"):
        old, got = (np.asarray(getattr(m.attn, name).kernel[...]) for m in (block, new))
        np.testing.assert_allclose(got, old * s[:, None], rtol=1e-5)


def test_awq_chooses_what_awq_chooses_on_the_norms_outputs(model_and_windows):
    model, windows = model_and_windows
    _, chosen = smooth_lm(model, windows, method="awq", bits=4, group_size=32)
    block = model.blocks[0]
    x = block.attn_norm(model.embed(windows.astype(jnp.int32)))
    w = jnp.concatenate([block.attn.q.kernel[...], block.attn.k.kernel[...], block.attn.v.kernel[...]], axis=1)
    expected = awq(w, x.reshape(-1, CONFIG.width), bits=4, group=32)
    assert chosen["blocks/0/attn_norm"] == pytest.approx(float(expected.alpha))
    # SmoothQuant's scales are smooth()'s of the same inputs.
    smoothed, _ = smooth_lm(model, windows, method="smoothquant", alpha=0.5)
    s = np.asarray(block.attn_norm.scale[...]) / np.asarray(smoothed.blocks[0].attn_norm.scale[...])
    np.testing.assert_allclose(s, np.asarray(smooth(w, x.reshape(-1, CONFIG.width)).scales), rtol=1e-5)


def test_bad_requests_are_refused_with_what_was_expected(model_and_windows):
    model, windows = model_and_windows
    with pytest.raises(ValueError, match="method must be one of"):
        smooth_lm(model, windows, method="gptq")
    with pytest.raises(ValueError, match="give bits"):
        smooth_lm(model, windows, method="awq")
    quantised = quantize_lm(Transformer(CONFIG, rngs=nnx.Rngs(0)), "w8a8")
    with pytest.raises(ValueError, match=r"blocks/0/attn/q is a .*expected the float model.s nnx\.Linear"):
        smooth_lm(quantised, windows, method="smoothquant")
