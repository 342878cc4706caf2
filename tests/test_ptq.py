"""stejax.ptq against its definitions: each method beside a NumPy float64 implementation written from its paper."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stejax
from stejax.export import pack_codes, unpack_codes
from stejax.flax import Quant, Rule, quantize_model, summary
from stejax.ptq import (
    awq,
    gptq,
    hadamard,
    hessian,
    quantize_ptq,
    rotate_inputs,
    rotate_kernel,
    round_to_nearest,
    smooth,
    smoothquant_scales,
    symmetric_grid,
)

TINY = float(np.finfo(np.float32).tiny)


def _layer(seed: int = 0, n_in: int = 64, n_out: int = 16, n: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """A random layer and correlated calibration inputs (a random mixing of Gaussian features)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n_in, n_out)).astype(np.float32)
    mix = np.eye(n_in) + 0.3 * rng.normal(size=(n_in, n_in))
    x = (rng.normal(size=(n, n_in)) @ mix).astype(np.float32)
    return w, x


def _error(x: np.ndarray, w: np.ndarray, w_hat) -> float:
    """||XW - XŴ||² in float64."""
    d = x.astype(np.float64) @ (w.astype(np.float64) - np.asarray(w_hat, np.float64))
    return float(np.sum(d * d))


# ----------------------------------------------------------------------------- GPTQ


def gptq_reference(kernel, x, *, bits, group=None, act_order=False, damp=0.01):
    """GPTQ in float64, one input feature at a time (Frantar et al. 2022, Algorithm 1, without lazy blocks).

    In the paper's layout: W is (out, in) and column j is input feature j. The grid is stejax's: a scale
    max|w| / q_max per output channel (from the weights as given) or per group of consecutive input features
    (from the group's current weights when its first feature is reached; with act-order, from the weights as
    given), codes in [-q_max, q_max].
    """
    W = kernel.T.astype(np.float64).copy()
    n_out, n_in = W.shape
    X = x.reshape(-1, n_in).astype(np.float64)
    H = 2.0 / X.shape[0] * X.T @ X
    q_max = 2 ** (bits - 1) - 1
    g = n_in if group is None else group

    def scale(columns):  # per row (output channel)
        return np.maximum(np.abs(columns).max(axis=1) / q_max, TINY)

    scales = np.stack([scale(W[:, k : k + g]) for k in range(0, n_in, g)])  # (groups, out), as given
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(n_in)
    W, H = W[:, perm], H[np.ix_(perm, perm)]
    H = H + damp * np.mean(np.diag(H)) * np.eye(n_in)
    Hinv = np.linalg.inv(H)
    U = np.linalg.cholesky(Hinv).T  # upper: Hinv = U^T U
    codes = np.zeros_like(W)
    for j in range(n_in):
        k = perm[j] // g
        if group is not None and not act_order and j % g == 0:
            scales[k] = scale(W[:, j : j + g])
        s = scales[k]
        q = np.clip(np.round(W[:, j] / s), -q_max, q_max)
        codes[:, j] = q
        err = (W[:, j] - q * s) / U[j, j]
        W[:, j:] -= np.outer(err, U[j, j:])
    codes = codes[:, np.argsort(perm)]
    return codes.T, scales


@pytest.mark.parametrize(
    "options",
    [{}, {"group": 16}, {"act_order": True}, {"group": 16, "act_order": True}, {"group": 8, "block_size": 20}],
    ids=["per-channel", "group16", "act-order", "group16-act-order", "group8-ragged-blocks"],
)
@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_equals_the_published_algorithm_in_float64(options, bits):
    w, x = _layer()
    out = gptq(w, x, bits=bits, **options)
    options.pop("block_size", None)
    codes, scales = gptq_reference(w, x, bits=bits, **options)
    np.testing.assert_array_equal(np.asarray(out.codes, np.float64), codes)
    np.testing.assert_allclose(np.asarray(out.scales, np.float64), scales, rtol=1e-6)
    assert out.codes.dtype == jnp.int8 and out.scales.dtype == jnp.float32 and out.kernel.dtype == jnp.float32
    g = options.get("group") or w.shape[0]
    np.testing.assert_array_equal(out.kernel, out.codes.astype(jnp.float32) * jnp.repeat(out.scales, g, axis=0))


@pytest.mark.parametrize("block_size", [None, 1, 7, 128])
def test_lazy_blocks_change_nothing_but_speed(block_size):
    w, x = _layer(1, n_in=48, n_out=8, n=96)
    ref = gptq(w, x, bits=4, block_size=None)
    out = gptq(w, x, bits=4, block_size=block_size)
    np.testing.assert_array_equal(out.codes, ref.codes)


@pytest.mark.parametrize("options", [{}, {"group": 16}, {"act_order": True}, {"group": 16, "act_order": True}], ids=str)
def test_gptq_beats_round_to_nearest_on_a_random_layer(options):
    w, x = _layer(2)
    out = gptq(w, x, bits=4, **options)
    rtn = round_to_nearest(w, bits=4, group=options.get("group"))
    assert _error(x, w, out.kernel) < 0.9 * _error(x, w, rtn.kernel)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n_out=st.integers(1, 4),
    n=st.integers(2, 24),
    bits=st.sampled_from([2, 3, 4, 8]),
    correlation=st.floats(-0.95, 0.95),
)
def test_gptq_on_two_features_is_never_worse_than_round_to_nearest(seed, n_out, n, bits, correlation):
    # GPTQ rounds feature 1 as round-to-nearest does, then rounds feature 2 at the optimum given feature 1's
    # error: the best in-range code for that one-dimensional quadratic, so never worse than the code
    # round-to-nearest picks (damp=0: the objective itself, undampened). This dominance holds for two features;
    # with three or more correlated ones the greedy order can lose to round-to-nearest (a random search finds
    # such layers), which is why the guarantee tested here stops at two.
    # Slack: the compensated weight is computed in float32; at an exact tie between two codes its rounding can
    # pick the other code, whose objective differs from the best by a few float32 ulps of the values: a
    # relative 1e-6 of the error, plus 1e-12 for errors that are themselves (nearly) zero.
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(2, n_out)).astype(np.float32)
    z = rng.normal(size=(n, 2))
    x = np.stack([z[:, 0], correlation * z[:, 0] + np.sqrt(1 - correlation**2) * z[:, 1]], axis=1)
    x = x.astype(np.float32)
    try:
        out = gptq(w, x, bits=bits, damp=0.0)
    except ValueError:
        return  # a rank-deficient sample: no Hessian to invert (tested below)
    rtn = round_to_nearest(w, bits=bits)
    assert _error(x, w, out.kernel) <= _error(x, w, rtn.kernel) * (1 + 1e-6) + 1e-12


def test_a_singular_hessian_names_the_layer_and_the_dampening():
    w, x = _layer(3, n_in=8, n_out=4, n=32)
    x[:, 5] = 0.0
    with pytest.raises(ValueError, match=r"gptq\('mlp/fc1'\): the Hessian .* \(damp=0.0 of the mean diagonal"):
        gptq(w, x, bits=4, damp=0.0, name="mlp/fc1")
    gptq(w, x, bits=4, damp=0.01)  # the dampening makes it positive definite


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bits": 1}, r"bits must be an int in \[2, 8\]"),
        ({"bits": 4, "group": 5}, r"group must be a positive int that divides the kernel's input features \(16\)"),
        ({"bits": 4, "damp": -1.0}, r"damp must be a finite number >= 0"),
        ({"bits": 4, "block_size": 0}, r"block_size must be a positive int or None"),
    ],
)
def test_gptq_refuses_bad_arguments(kwargs, message):
    w, x = _layer(4, n_in=16, n_out=4, n=32)
    with pytest.raises(ValueError, match=message):
        gptq(w, x, **kwargs)


def test_gptq_takes_a_hessian_instead_of_inputs():
    w, x = _layer(5, n_in=16, n_out=4, n=32)
    np.testing.assert_array_equal(gptq(w, hessian_matrix=hessian(x), bits=4).codes, gptq(w, x, bits=4).codes)
    with pytest.raises(ValueError, match="give inputs or hessian_matrix, one of them"):
        gptq(w, bits=4)
    with pytest.raises(ValueError, match=r"inputs must be \(\.\.\., 16\)"):
        gptq(w, x[:, :8], bits=4)


@pytest.mark.parametrize("group", [None, 16])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_the_codes_pack_for_export_and_the_kernel_lies_on_the_grid(bits, group):
    w, x = _layer(6, n_in=64, n_out=16, n=128)
    out = gptq(w, x, bits=bits, group=group, act_order=True)
    codes = np.asarray(out.codes)
    container = {2: "int2x4", 4: "int4x2", 8: "int8"}[bits]
    stored = pack_codes(codes, container)
    np.testing.assert_array_equal(unpack_codes(jnp.asarray(stored), container, codes.shape), codes)
    # stejax.fake_quant with GPTQ's scales (one per channel, or per group as rows of g features) gives the
    # kernel back bit for bit: it is on the grid the exported codes and scales describe.
    if group is None:
        again = stejax.fake_quant(out.kernel, out.scales[0], bits=bits, axis=1)
    else:
        rows = out.kernel.T.reshape(-1, group)  # (out * in // g, g): one group of one channel per row
        again = stejax.fake_quant(rows, out.scales.T.reshape(-1), bits=bits, axis=0).reshape(out.kernel.T.shape).T
    np.testing.assert_array_equal(again, out.kernel)


def test_round_to_nearest_is_the_dynamic_weight_quantiser():
    from stejax.flax import Quant

    w, _ = _layer(7, n_in=32, n_out=8)
    for quant, group in [(Quant("fake_quant", bits=4, axis=-1), None), (Quant("fake_quant", bits=4, group_size=8), 8)]:
        expected = quant.apply(jnp.asarray(w), {}, role="weights", key=None, contraction_axis=0)
        np.testing.assert_array_equal(round_to_nearest(w, bits=4, group=group).kernel, expected)
    np.testing.assert_array_equal(symmetric_grid(w, bits=4)[0], stejax.absmax_scale(jnp.asarray(w), bits=4, axis=1))


def test_gptq_is_compiled_once_per_configuration():
    w, x = _layer(8, n_in=16, n_out=4, n=32)
    from stejax.ptq import _gptq

    gptq(w, x, bits=4)

    before = _gptq._gptq._cache_size()
    gptq(w + 1.0, x, bits=4)
    assert _gptq._gptq._cache_size() == before
    gptq(w, x, bits=8)  # the width is an argument of the program
    gptq(w, x, bits=2)
    assert _gptq._gptq._cache_size() == before


# ----------------------------------------------------------------------------- AWQ


def _outlier_inputs(seed: int, n: int, n_in: int, outliers: tuple[int, ...] = (3, 17, 40)) -> np.ndarray:
    """Gaussian inputs whose few outlier channels are 30 times larger than the rest."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_in))
    x[:, list(outliers)] *= 30.0
    return x.astype(np.float32)


def awq_reference(kernel, x, *, bits, group=None, n_grid=20):
    """AWQ's search in float64 (Lin et al. 2023): every alpha on the grid, the output error, the argmin."""
    W = kernel.astype(np.float64)
    X = x.reshape(-1, W.shape[0]).astype(np.float64)
    q_max = 2 ** (bits - 1) - 1
    g = W.shape[0] if group is None else group
    a = np.abs(X).mean(axis=0)
    a = np.maximum(a / (a.max() + 1e-8), 1e-4)
    losses = []
    for alpha in np.linspace(0.0, 1.0, n_grid):
        s = np.maximum(a**alpha, 1e-4)
        s = s / np.sqrt(s.max() * s.min())
        ws = W * s[:, None]
        step = np.repeat(np.abs(ws).reshape(-1, g, W.shape[1]).max(axis=1) / q_max, g, axis=0)
        w_hat = np.clip(np.round(ws / step), -q_max, q_max) * step
        d = X @ W - (X / s) @ w_hat
        losses.append(np.mean(np.sum(d * d, axis=1)))
    return int(np.argmin(losses)), np.array(losses)


@pytest.mark.parametrize("group", [None, 16])
@pytest.mark.parametrize("bits", [3, 4])
def test_awq_picks_the_brute_force_argmin_over_the_same_grid(bits, group):
    w, _ = _layer(10)
    x = _outlier_inputs(10, 256, 64)
    out = awq(w, x, bits=bits, group=group)
    best, losses = awq_reference(w, x, bits=bits, group=group)
    assert out.alpha == pytest.approx(np.linspace(0.0, 1.0, 20)[best])
    np.testing.assert_allclose(out.losses, losses, rtol=1e-4)
    assert 0 < best  # the outliers make scaling worth it: not plain round-to-nearest
    # The result is the scaled kernel on the grid, and the transformed product approximates the original.
    np.testing.assert_array_equal(
        out.kernel, round_to_nearest(w * np.asarray(out.input_scales)[:, None], bits=bits, group=group).kernel
    )
    d = x @ w - (x / np.asarray(out.input_scales)) @ np.asarray(out.kernel)
    assert float(np.mean(np.sum(d * d, axis=1))) == pytest.approx(float(losses[best]), rel=1e-4)


def test_awq_refuses_inputs_of_the_wrong_width():
    w, _ = _layer(11, n_in=16, n_out=4)
    with pytest.raises(ValueError, match=r"awq\('fc'\): inputs must be floating \(\.\.\., 16\)"):
        awq(w, np.ones((4, 8), np.float32), bits=4, name="fc")


# ----------------------------------------------------------------------------- SmoothQuant


@pytest.mark.parametrize("alpha", [0.25, 0.5, 0.8])
def test_smoothquant_keeps_the_product_and_shrinks_the_outlier_channels(alpha):
    w, _ = _layer(12)
    x = _outlier_inputs(12, 256, 64)
    out = smooth(w, x, alpha=alpha)
    expected = np.maximum(np.abs(x).max(axis=0).astype(np.float64) ** alpha, 0) / np.maximum(
        np.abs(w).max(axis=1).astype(np.float64), 1e-5
    ) ** (1 - alpha)
    np.testing.assert_allclose(out.scales, expected, rtol=1e-5)
    x_smooth = x / np.asarray(out.scales)
    np.testing.assert_allclose(x_smooth @ np.asarray(out.kernel), x @ w, rtol=1e-4, atol=1e-3)
    before, after = np.abs(x).max(axis=0), np.abs(x_smooth).max(axis=0)
    outliers = [3, 17, 40]
    assert np.all(after[outliers] < before[outliers])
    assert after.max() / np.median(after) < before.max() / np.median(before)  # the outliers stand out less


def test_smoothquant_at_one_half_gives_both_operands_the_same_channel_ranges():
    w, _ = _layer(13)
    x = _outlier_inputs(13, 128, 64)
    out = smooth(w, x)
    np.testing.assert_allclose(
        np.abs(x / np.asarray(out.scales)).max(axis=0), np.abs(out.kernel).max(axis=1), rtol=1e-5
    )
    assert smoothquant_scales(jnp.abs(jnp.asarray(x)).max(axis=0), w).shape == (64,)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]; got 1.5"):
        smoothquant_scales(jnp.ones(64), w, alpha=1.5)


# ----------------------------------------------------------------------------- Hadamard rotation


@pytest.mark.parametrize(("n", "block"), [(1, None), (2, None), (64, None), (96, 32)])
def test_hadamard_is_orthonormal_with_entries_of_one_size(n, block):
    h = np.asarray(hadamard(n, block=block), np.float64)
    np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-6)
    b = n if block is None else block
    nonzero = h[np.abs(h) > 0]
    np.testing.assert_allclose(np.abs(nonzero), 1 / np.sqrt(b), rtol=1e-6)
    assert nonzero.size == n * b


def test_a_rotated_layer_computes_the_same_product_with_smaller_outliers():
    w, _ = _layer(14)
    x = _outlier_inputs(14, 256, 64)
    r = hadamard(64)
    y = np.asarray(rotate_inputs(x, r), np.float64) @ np.asarray(rotate_kernel(w, r), np.float64)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)

    def outlier_ratio(a):  # the largest |value| over the root mean square, per token, averaged
        a = np.asarray(a, np.float64)
        return float(np.mean(np.abs(a).max(axis=1) / np.sqrt(np.mean(a * a, axis=1))))

    assert outlier_ratio(rotate_inputs(x, r)) < 0.5 * outlier_ratio(x)


def test_hadamard_says_which_sizes_it_builds():
    with pytest.raises(ValueError, match=r"n must be a power of two; got 12\. For other sizes give block="):
        hadamard(12)
    with pytest.raises(ValueError, match=r"block must be a power of two that divides n=12; got 8"):
        hadamard(12, block=8)
    assert hadamard(12, block=4).shape == (12, 12)


# ----------------------------------------------------------------------------- by rules, on an NNX model

W4 = Quant("fake_quant", bits=4, axis=-1, scale="static")


def _mlp_and_batches(seed: int = 0):
    """A 2-layer MLP (32 -> 64 -> 8) and correlated calibration batches."""
    from flax import nnx

    mlp = nnx.Sequential(nnx.Linear(32, 64, rngs=nnx.Rngs(seed)), nnx.relu, nnx.Linear(64, 8, rngs=nnx.Rngs(seed + 1)))
    rng = np.random.default_rng(seed)
    mix = np.eye(32) + 0.5 * rng.normal(size=(32, 32))
    batches = [jnp.asarray((rng.normal(size=(64, 32)) @ mix).astype(np.float32)) for _ in range(4)]
    return mlp, batches


def _output_error(reference, model, batches) -> float:
    return sum(float(jnp.sum((reference(b) - model(b)) ** 2)) for b in batches)


@pytest.mark.parametrize("weights", [W4, Quant("fake_quant", bits=4, group_size=16, scale="static")], ids=repr)
def test_gptq_by_rules_beats_round_to_nearest_by_rules_on_an_mlp(weights):
    mlp, batches = _mlp_and_batches()
    rules = [Rule(weights=weights)]
    rtn = quantize_model(mlp, rules, batches[0])
    rtn_ptq = quantize_ptq(mlp, rules, batches, method="rtn")
    gptq_model = quantize_ptq(mlp, rules, batches)
    for b in batches:  # round-to-nearest through quantize_ptq is quantize_model's own forward
        np.testing.assert_allclose(rtn_ptq(b), rtn(b), rtol=1e-6, atol=1e-6)
    assert _output_error(mlp, gptq_model, batches) < 0.8 * _output_error(mlp, rtn, batches)


def test_the_quantised_forward_uses_the_gptq_kernel_and_the_float_model_is_kept():
    mlp, batches = _mlp_and_batches(1)
    kernels = [np.asarray(mlp.layers[i].kernel[...]) for i in (0, 2)]
    qmodel = quantize_ptq(mlp, [Rule(weights=W4)], batches)
    for i, kernel in zip((0, 2), kernels, strict=True):
        np.testing.assert_array_equal(mlp.layers[i].kernel[...], kernel)  # the model passed in is unchanged
    # The first layer's inputs are the batches themselves: its kernel is gptq() of them, bit for bit.
    direct = gptq(kernels[0], np.concatenate([np.asarray(b) for b in batches]), bits=4, name="layers/0")
    layer = qmodel.layers[0]
    np.testing.assert_array_equal(layer.kernel[...], direct.kernel)
    np.testing.assert_array_equal(layer.stejax_quant.p0.weight_scale[...], direct.scales[0])
    # The quantised layer multiplies by that kernel as it is (the static scale keeps it on its grid).
    x = batches[0]
    expected = jnp.matmul(x, direct.kernel) + layer.bias[...][None, :]
    np.testing.assert_array_equal(layer(x), expected)
    assert [row.bits for row in summary(qmodel)] == ["w4a32", "w4a32"]


def test_qat_starts_from_the_ptq_model():
    import optax
    from flax import nnx

    mlp, batches = _mlp_and_batches(2)
    qmodel = quantize_ptq(mlp, [Rule(weights=W4, inputs=Quant("fake_quant", bits=8))], batches)
    optimizer = nnx.Optimizer(qmodel, optax.sgd(1e-2), wrt=nnx.Param)
    scale = np.asarray(qmodel.layers[0].stejax_quant.p0.weight_scale[...])

    def loss(model):
        return sum((jnp.mean((model(b) - mlp(b)) ** 2) for b in batches), start=jnp.float32(0))

    before = float(loss(qmodel))
    for _ in range(3):
        grads = nnx.grad(loss)(qmodel)
        optimizer.update(qmodel, grads)
    assert float(loss(qmodel)) < before
    np.testing.assert_array_equal(qmodel.layers[0].stejax_quant.p0.weight_scale[...], scale)  # scales kept


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (Quant("fake_quant", bits=4, axis=-1), r"PTQ sets the scales of a static fake_quant weight quantiser"),
        (Quant("lsq", bits=4), r"PTQ sets the scales of a static fake_quant weight quantiser"),
        (Quant("fake_quant", bits=4, scale="static"), r"PTQ needs a scale per output channel \(axis=-1\)"),
    ],
)
def test_quantize_ptq_says_which_weight_quantisers_it_fills(weights, message):
    mlp, batches = _mlp_and_batches(3)
    with pytest.raises(ValueError, match=r"quantize_ptq: rule 0 \('\.\*'\) at 'layers/0': " + message):
        quantize_ptq(mlp, [Rule(weights=weights)], batches)


def test_quantize_ptq_refuses_an_unknown_method_and_no_batches():
    mlp, batches = _mlp_and_batches(4)
    with pytest.raises(ValueError, match=r"method must be one of \['gptq', 'rtn'\]; got 'awq'"):
        quantize_ptq(mlp, [Rule(weights=W4)], batches, method="awq")
    with pytest.raises(ValueError, match="batches gave no batch"):
        quantize_ptq(mlp, [Rule(weights=W4)], [])
    with pytest.raises(ValueError, match=r"input_calibration must be one of \['absmax', 'percentile', 'mse'\]"):
        quantize_ptq(mlp, [Rule(weights=W4)], batches, input_calibration="max")
    with pytest.raises(TypeError, match=r"expected an nnx\.Module; got list"):
        quantize_ptq([mlp], [Rule(weights=W4)], batches)


def test_a_layer_whose_hessian_is_singular_is_named():
    mlp, batches = _mlp_and_batches(5)
    batches = [b.at[:, 7].set(0.0) for b in batches]
    with pytest.raises(ValueError, match=r"gptq\('layers/0'\): the Hessian"):
        quantize_ptq(mlp, [Rule(weights=W4)], batches, damp=0.0)


@pytest.mark.needs_cpu  # a subprocess
def test_the_per_layer_methods_import_without_flax():
    import subprocess
    import sys

    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'flax':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import jax.numpy as jnp, stejax.ptq\n"
        "print(stejax.ptq.gptq(jnp.eye(4), jnp.eye(4), bits=4).codes[0].tolist())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[7, 0, 0, 0]"


def test_each_layer_is_rounded_on_inputs_through_the_layers_rounded_before_it():
    from flax import nnx

    mlp, batches = _mlp_and_batches(6)
    qmodel = quantize_ptq(mlp, [Rule(weights=W4)], batches)
    first = qmodel.layers[0]
    # The second layer's inputs: the batches through the rounded first layer (eagerly, here).
    inputs = np.concatenate([np.asarray(nnx.relu(first(b))) for b in batches])
    direct = gptq(np.asarray(mlp.layers[2].kernel[...]), inputs, bits=4, name="layers/2")
    np.testing.assert_allclose(qmodel.layers[2].kernel[...], direct.kernel, rtol=0, atol=1e-7)


def test_one_compiled_pass_serves_the_layers_whose_inputs_are_independent():
    from flax import nnx

    from stejax.lm import LMConfig, Transformer, ptq_rules
    from stejax.ptq._model import _Gatherer

    config = LMConfig(context=8, width=32, depth=2, heads=2, hidden=64)
    model = Transformer(config, rngs=nnx.Rngs(params=0))
    batches = [(jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 8)), jnp.uint8),)]
    qmodel = quantize_model(model, ptq_rules("w4a8"), *batches[0])
    paths = [row.path for row in summary(qmodel) if row.kind == "linear" and row.rule is not None]
    gatherer = _Gatherer(qmodel, [(p, p) for p in paths], batches)
    waves = [[paths[i].split("/", 2)[2] for i in wave] for wave in gatherer.waves()]
    # k first (o reads q, k and v); o, q and v together; the MLP's three after the attention output.
    assert waves == [["attn/k"], ["attn/o", "attn/q", "attn/v"], ["mlp/down", "mlp/gate", "mlp/up"]] * 2
