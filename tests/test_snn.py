"""stejax.snn: neurons against a Python loop, gradients through time by hand, the reset switch, the verifier."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stejax import CATALOG
from stejax.snn import (
    SURROGATES,
    AdaptiveLeaky,
    Leaky,
    LeakyIntegrator,
    NetConfig,
    RecurrentLeaky,
    Spike,
    Synaptic,
    accuracy_first_spike,
    accuracy_rate,
    activity_regularizer,
    ce_mean_membrane,
    ce_per_step,
    ce_spike_count,
    delta,
    forward,
    init_net,
    latency,
    mse_count,
    rate,
    run,
    spike_stats,
)
from stejax.testing import assert_surrogate

from helpers import recurrence_allowance

N = 5  # neurons
B = 3  # batch
T = 7  # steps


def _neurons(spike="fast_sigmoid", reset="subtract", reset_grad=False):
    key = jax.random.key(1)
    out = {}
    lif = Leaky(spike, reset, reset_grad)
    out["leaky"] = (lif, lif.init_params(N, decay=0.8, threshold=0.7, per_neuron=True))
    syn = Synaptic(spike, reset, reset_grad)
    out["synaptic"] = (syn, syn.init_params(N, syn_decay=0.6, decay=0.85, threshold=0.9))
    rec = RecurrentLeaky(spike, reset, reset_grad)
    out["recurrent"] = (rec, rec.init_params(N, key=key, decay=0.7, threshold=0.8))
    alif = AdaptiveLeaky(spike, reset, reset_grad)
    out["adaptive"] = (alif, alif.init_params(N, decay=0.9, threshold=0.6, adapt_strength=0.5, per_neuron=True))
    li = LeakyIntegrator()
    out["integrator"] = (li, li.init_params(N, decay=0.75))
    return out


def _inputs(dtype=np.float32, seed=0):
    return jax.device_put(np.random.default_rng(seed).uniform(-0.5, 1.5, (T, B, N)).astype(dtype))


# ----------------------------------------------------------------------------- scan == Python loop


@pytest.mark.parametrize(
    ("name", "reset"),
    [(n, "subtract") for n in ("leaky", "synaptic", "recurrent", "adaptive", "integrator")]
    + [("leaky", "zero"), ("adaptive", "none")],
)
def test_scan_equals_python_loop_bit_for_bit(name, reset):
    neuron, params = _neurons(reset=reset)[name]
    xs = _inputs()
    xs_host = np.asarray(xs)  # each step's input handed over from the host (no slicing program per step)
    step = jax.jit(functools.partial(neuron.step, params))
    state = neuron.init_state((B, N))
    outs = []
    for t in range(T):
        state, out = step(state, jax.device_put(xs_host[t]))
        outs.append(np.asarray(out))
    loop_final, loop_outs = state, np.stack(outs)
    final, scanned = jax.jit(lambda xs: run(functools.partial(neuron.step, params), neuron.init_state((B, N)), xs))(xs)
    np.testing.assert_array_equal(np.asarray(scanned), loop_outs)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(loop_final)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if name != "integrator":
        assert 0 < float(loop_outs.mean()) < 1  # some spikes and some silences: the comparison means something


def test_outputs_and_gradients_keep_the_input_dtype(dtype):
    xs = _inputs(dtype)

    def everything(xs):
        # Every neuron in one program: its outputs, final state and input gradient.
        out = {}
        for name, (neuron, params) in _neurons().items():

            def total(xs, neuron=neuron, params=params):
                final, outs = run(functools.partial(neuron.step, params), neuron.init_state((B, N), dtype), xs)
                return outs.astype(jnp.float32).sum(), (final, outs)

            out[name] = jax.grad(total, has_aux=True)(xs)
        return out

    for name, (grads, (final, outs)) in jax.jit(everything)(xs).items():
        assert outs.dtype == dtype and outs.shape == (T, B, N), name
        assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(final)), name
        assert grads.dtype == dtype and np.isfinite(np.asarray(grads).astype(np.float32)).all(), name


def test_batch_major_unroll_and_checkpoint_change_nothing():
    neuron, params = _neurons()["synaptic"]
    xs = _inputs()
    step = functools.partial(neuron.step, params)
    state = neuron.init_state((B, N))

    def loss(xs, **kw):
        _, out = run(step, state, xs, **kw)
        return jnp.sum(out * jnp.arange(T, dtype=jnp.float32)[:, None, None])

    def everything(xs, xs_batch_major):  # one program for every variant
        return (
            run(step, state, xs)[1],
            run(step, state, xs_batch_major, time_axis=1)[1],
            run(step, state, xs, unroll=3)[1],
            run(step, state, xs, checkpoint=True)[1],
            jax.grad(loss)(xs),
            jax.grad(functools.partial(loss, checkpoint=True))(xs),
        )

    base_out, bm_out, unrolled, checkpointed, g, g_checkpointed = jax.jit(everything)(
        xs, jax.device_put(np.ascontiguousarray(np.swapaxes(np.asarray(xs), 0, 1)))
    )
    np.testing.assert_array_equal(np.swapaxes(np.asarray(bm_out), 0, 1), np.asarray(base_out))
    np.testing.assert_array_equal(np.asarray(unrolled), np.asarray(base_out))
    np.testing.assert_array_equal(np.asarray(checkpointed), np.asarray(base_out))
    # Checkpointing recomputes the forward inside the backward, a program of its own on a platform that fuses
    # float32 formulas in its own order (the contract's allowance over the T steps; 0 on CPU).
    g = np.asarray(g)
    np.testing.assert_allclose(np.asarray(g_checkpointed), g, rtol=1e-6, atol=recurrence_allowance(g, T))
    assert np.abs(np.asarray(g)).sum() > 0


def test_truncated_bptt_cuts_the_gradient_at_window_boundaries():
    neuron, params = _neurons(spike="atan")["leaky"]
    xs = _inputs()
    state = neuron.init_state((B, N))
    window = 3

    def last_output(xs):
        return run(functools.partial(neuron.step, params), state, xs, truncate=window)[1][T - 1].sum()

    def everything(xs):  # one program: both forwards and both gradients
        return (
            run(functools.partial(neuron.step, params), state, xs, truncate=window)[1],
            run(functools.partial(neuron.step, params), state, xs)[1],
            jax.grad(last_output)(xs),
            jax.grad(lambda xs: run(functools.partial(neuron.step, params), state, xs)[1][T - 1].sum())(xs),
        )

    truncated_out, full_out, g, full = (np.asarray(a) for a in jax.jit(everything)(xs))
    np.testing.assert_array_equal(truncated_out, full_out)
    start = (T - 1) // window * window  # 6: the last window is [6, 7)
    assert np.all(g[:start] == 0)
    assert np.any(g[start:] != 0)
    assert np.any(full[:start] != 0)  # without truncation the gradient reaches further back


def test_run_rejects_bad_arguments():
    neuron, params = _neurons()["leaky"]
    step = functools.partial(neuron.step, params)
    state = neuron.init_state((B, N))
    with pytest.raises(ValueError, match="time_axis must be 0"):
        run(step, state, _inputs(), time_axis=2)
    with pytest.raises(ValueError, match="truncate must be None or a positive int"):
        run(step, state, _inputs(), truncate=0)
    with pytest.raises(ValueError, match="unroll must be a positive int"):
        run(step, state, _inputs(), unroll=0)
    with pytest.raises(ValueError, match="same shape and dtype"):
        neuron.step(params, state, jnp.zeros((B, N + 1)))
    with pytest.raises(ValueError, match="one entry per neuron"):
        neuron.step(neuron.init_params(N + 1, per_neuron=True), state, jnp.zeros((B, N)))
    with pytest.raises(ValueError, match="reset must be one of"):
        Leaky(reset="hard")
    with pytest.raises(ValueError, match="unknown surrogate 'tanh'"):
        Spike("tanh")
    with pytest.raises(ValueError, match=r"decay must be a number in \(0, 1\)"):
        Leaky().init_params(3, decay=1.0)


# ----------------------------------------------------------------------------- gradients by hand


def _fast_sigmoid_prime(z, k=25.0):
    return 1.0 / (k * abs(z) + 1.0) ** 2


@pytest.mark.parametrize("reset_grad", [False, True])
def test_gradient_through_time_matches_the_chain_rule_by_hand(reset_grad):
    """Two steps, two neurons, LIF with reset by subtraction and the fast-sigmoid surrogate (k = 25).

    v1 = x1, s1 = H(v1 - th), u1 = v1 - r1 th (r1 = s1, or s1 without gradient)
    v2 = beta u1 + x2, s2 = H(v2 - th);  L = sum_i a_i s1_i + b_i s2_i
    dL/dx2 = b H'(v2 - th)
    dL/dx1 = a H'(v1 - th) + b H'(v2 - th) beta du1/dv1,  du1/dv1 = 1 (- th H'(v1 - th) with reset_grad)
    dL/dth = -a H'(v1 - th) + b H'(v2 - th) (beta du1/dth - 1),  du1/dth = -s1 (- th * -H'(v1 - th) with reset_grad)
    """
    beta, th = 0.5, 1.0
    lif = Leaky("fast_sigmoid", "subtract", reset_grad)
    x = np.array([[1.02, 0.7], [0.6, 0.95]], np.float32)  # (T=2, n=2): neuron 0 spikes at t=0 near threshold
    a = np.array([0.3, -0.7], np.float32)
    b = np.array([1.1, 0.4], np.float32)
    params = lif.init_params(2, decay=beta, threshold=th)

    def loss(x, threshold):
        p = params._replace(threshold=threshold)
        _, s = run(functools.partial(lif.step, p), lif.init_state((2,)), x)
        return jnp.sum(a * s[0]) + jnp.sum(b * s[1])

    gx, gth = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, np.float32(th))

    # The same in float64 by hand (beta as the float32 sigmoid of its logit rounds it).
    beta64 = float(jax.nn.sigmoid(params.decay_logit))
    x64 = x.astype(np.float64)
    v1 = x64[0]
    s1 = (v1 > th).astype(np.float64)
    d1 = _fast_sigmoid_prime(v1 - th)
    u1 = v1 - s1 * th
    v2 = beta64 * u1 + x64[1]
    d2 = _fast_sigmoid_prime(v2 - th)
    du1_dv1 = 1 - th * d1 if reset_grad else np.ones(2)
    du1_dth = -s1 + (th * d1 if reset_grad else 0)
    want_x = np.stack([a * d1 + b * d2 * beta64 * du1_dv1, b * d2])
    want_th = np.sum(-a * d1 + b * d2 * (beta64 * du1_dth - 1))
    np.testing.assert_allclose(np.asarray(gx), want_x, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(float(gth), want_th, rtol=2e-6)
    assert s1[0] == 1 and d1[0] > 0.1  # the reset happened where the surrogate is large: the switch matters


def test_reset_gradient_switch_does_what_it_says():
    """With reset_grad=False the membrane after a spike has d u / d v = 1; with True, 1 - th H'(v - th)."""
    th = 1.0
    x = np.array([1.01, 0.3, 2.0], np.float32)  # spikes: near threshold, no, far above

    def carried(reset_grad, x):
        lif = Leaky("triangular", "subtract", reset_grad)  # H'(z) = max(0, 1 - |z|)
        u, _ = lif.step(lif.init_params(3, threshold=th), lif.init_state((3,)), x)
        return u

    # u_i depends on x_i only, so the gradient of the sum is the elementwise derivative.
    detached, attached = jax.jit(
        lambda x: (jax.grad(lambda x: carried(False, x).sum())(x), jax.grad(lambda x: carried(True, x).sum())(x))
    )(x)
    h_prime = np.maximum(0, 1 - np.abs(np.asarray(x, np.float64) - th))
    np.testing.assert_allclose(np.asarray(detached), np.ones(3), rtol=0)
    np.testing.assert_allclose(np.asarray(attached), 1 - th * h_prime, rtol=1e-6)
    assert np.asarray(attached)[0] < 0.5  # the two really differ at the spike near threshold
    # Reset to zero: u = v (1 - s); d u / d v = 1 - s without gradient, 1 - s - v H' with it.
    lif0 = Leaky("triangular", "zero", False)
    lif1 = Leaky("triangular", "zero", True)
    g0, g1 = jax.jit(
        lambda v: tuple(
            jax.grad(lambda v, lif=lif: lif.step(lif.init_params(1), lif.init_state((1,)), v)[0].sum())(v)
            for lif in (lif0, lif1)
        )
    )(np.array([1.01], np.float32))
    np.testing.assert_allclose(np.asarray(g0), [0.0])
    np.testing.assert_allclose(np.asarray(g1), [-1.01 * 0.99], rtol=1e-5)


def test_gradients_stay_finite_far_below_threshold():
    """snnTorch's sigmoid surrogate overflows to NaN below about -3.5; none of ours may.

    The membrane is driven to -3.6, -100 and about -1e31 (far below, but not past
    float32's range: a membrane of -inf would make d v / d beta infinite, an
    overflow of the forward rather than of the surrogate).
    """
    xs = np.broadcast_to(np.array([-3.6, -100.0, -1e30], np.float32), (T, 2, 3))

    def grads(xs):
        out = {}
        for surrogate in (*SURROGATES, "identity"):
            lif = Leaky(surrogate)

            def loss(xs, params, lif=lif):
                return run(functools.partial(lif.step, params), lif.init_state((2, 3)), xs)[1].sum()

            out[surrogate] = jax.grad(loss, argnums=(0, 1))(xs, lif.init_params(3, threshold=1.0))
        return out

    for surrogate, g in jax.jit(grads)(xs).items():
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(g)), surrogate


def test_no_surrogate_passes_no_gradient_and_identity_passes_one():
    x = np.array([-2.0, 0.0, 0.3, 5.0], np.float32)
    g_none, g_identity, s_identity = jax.jit(
        lambda x: (
            jax.grad(lambda x: Spike("no_surrogate")(x).sum())(x),
            jax.grad(lambda x: Spike("identity")(x).sum())(x),
            Spike("identity")(x),
        )
    )(x)
    np.testing.assert_array_equal(np.asarray(g_none), np.zeros(4))
    np.testing.assert_array_equal(np.asarray(g_identity), np.ones(4))
    np.testing.assert_array_equal(np.asarray(s_identity), [0.0, 0.0, 1.0, 1.0])


# ----------------------------------------------------------------------------- the verifier


@pytest.mark.parametrize("surrogate", ["fast_sigmoid", "atan"])
def test_verifier_checks_the_spike_function_inside_the_neuron_step(surrogate):
    """check_surrogate runs the step's spike output under jit, vmap, grad, scan and checkpoint.

    From rest with threshold 0 the membrane is the input (beta * 0 + x), so the
    step's spikes are H(x) (subnormal x flushed to 0) and their derivative is the
    declared surrogate at x.
    """
    entry = CATALOG[f"heaviside_{surrogate}"]
    lif = Leaky(surrogate)
    params = lif.init_params(1, threshold=0.0)

    def spikes_of_step(x):
        return lif.step(params, jnp.zeros_like(x), x)[1]

    def reference(x):
        # The step flushes a subnormal distance to threshold to 0 (eager and jitted XLA
        # disagree on them otherwise), so a subnormal input does not spike.
        tiny = jnp.finfo(x.dtype).tiny
        return jnp.where(jnp.isnan(x), x, jnp.where(x >= tiny, jnp.ones_like(x), jnp.zeros_like(x)))

    report = assert_surrogate(
        spikes_of_step,
        reference=jax.jit(reference),  # exact operations (comparisons, selections): one program
        derivative=lambda x: entry.derivative(x),
        dtypes=[jnp.float32],
    )
    names = {name.split("[")[0] for name in report.names()}
    assert {"jit", "vmap", "grad", "scan"} <= names


# ----------------------------------------------------------------------------- encoders, losses, metrics


def test_rate_encoder_is_reproducible_and_checks_its_input():
    x = np.array([[0.0, 0.25, 1.0]], np.float32)
    encode = jax.jit(rate, static_argnums=1)  # the draws under jit; the input checks below are eager
    a = np.asarray(encode(x, 400, key=jax.random.key(3)))
    np.testing.assert_array_equal(a, np.asarray(encode(x, 400, key=jax.random.key(3))))
    counts = a.sum(axis=0)[0]
    assert counts[0] == 0 and counts[2] == 400 and 70 < counts[1] < 130
    with pytest.raises(ValueError, match=r"intensities in \[0, 1\].*got 1.5"):
        rate(np.array([0.2, 1.5], np.float32), 4, key=jax.random.key(0))
    with pytest.raises(ValueError, match="got nan"):
        rate(np.array([np.nan], np.float32), 4, key=jax.random.key(0))
    with pytest.raises(TypeError, match="typed PRNG key"):
        rate(x, 4, key=jax.random.PRNGKey(0))
    assert encode(x.astype(jnp.bfloat16), 2, key=jax.random.key(0)).dtype == jnp.bfloat16  # exact in bfloat16


def test_latency_and_delta_encoders():
    s = np.asarray(jax.jit(latency, static_argnums=1)(np.array([1.0, 0.75, 0.25, 0.005], np.float32), 5))
    assert s.sum(axis=0).tolist() == [1, 1, 1, 0]
    assert np.argmax(s, axis=0)[:3].tolist() == [0, 1, 3]  # round((1 - x) * 4)
    d = np.asarray(
        jax.jit(functools.partial(delta, threshold=0.3))(np.array([[0.0], [0.4], [0.45], [0.0]], np.float32))
    )
    assert d[:, 0].tolist() == [0.0, 1.0, 0.0, -1.0]
    d_on = np.asarray(
        jax.jit(functools.partial(delta, threshold=0.3, off_spikes=False))(np.array([[0.0], [0.4], [0.0]], np.float32))
    )
    assert d_on[:, 0].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="threshold must be a positive number"):
        delta(np.zeros((3, 1), np.float32), threshold=0)


def test_losses_match_numpy():
    rng = np.random.default_rng(0)
    traces = rng.normal(size=(4, 3, 5)).astype(np.float32)
    y = np.array([0, 4, 2], np.int32)

    def ce(logits):
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -logp[np.arange(3), y].mean()

    spikes = (traces > 0).astype(np.float32)

    def losses(traces, spikes, y):  # every loss in one program
        return (
            ce_mean_membrane(traces, y),
            ce_spike_count(traces, y),
            ce_per_step(traces, y),
            mse_count(spikes, y),
            accuracy_rate(traces, y),
        )

    mean_membrane, spike_count, per_step, mse, accuracy = jax.jit(losses)(traces, spikes, y)
    np.testing.assert_allclose(float(mean_membrane), ce(traces.mean(0)), rtol=1e-5)
    np.testing.assert_allclose(float(spike_count), ce(traces.sum(0)), rtol=1e-5)
    np.testing.assert_allclose(float(per_step), np.mean([ce(t) for t in traces]), rtol=1e-5)
    target = np.where(np.eye(5)[y] > 0, 0.8 * 4, 0.2 * 4)
    np.testing.assert_allclose(float(mse), ((spikes.sum(0) - target) ** 2).mean(), rtol=1e-6)
    assert float(accuracy) == np.mean(traces.sum(0).argmax(-1) == y)
    with pytest.raises(ValueError, match=r"labels must be integers of shape \(3,\)"):
        ce_mean_membrane(jnp.asarray(traces), y[:2])
    with pytest.raises(ValueError, match=r"time-major \(T, B, C\)"):
        ce_mean_membrane(jnp.asarray(traces[0]), y)


def test_first_spike_accuracy_spike_stats_and_regularizer():
    s = np.zeros((4, 2, 3), np.float32)
    s[2, 0, 1] = 1  # example 0: class 1 first at t=2
    s[3, 0, 0] = 1
    s[1, 1, 2] = s[1, 1, 0] = 1  # example 1: tie at t=1 between 0 and 2 -> class 0
    zeros, ones, third = (np.full((4, 2, 3), v, np.float32) for v in (0.0, 1.0, 0.3))

    def metrics(s, zeros, ones, third):  # every metric in one program
        return (
            accuracy_first_spike(s, jnp.array([1, 0])),
            accuracy_first_spike(s, jnp.array([0, 2])),
            spike_stats(s),
            spike_stats(zeros),
            activity_regularizer([zeros], low=0.1),
            activity_regularizer([ones], high=0.5),
            activity_regularizer([third], low=0.1, high=0.5),
        )

    right, wrong, stats, silent, low, high, between = jax.jit(metrics)(s, zeros, ones, third)
    assert float(right) == 1.0
    assert float(wrong) == 0.0
    assert float(stats["rate"]) == pytest.approx(s.mean())
    assert float(stats["silent_fraction"]) == 0.0
    assert float(silent["silent_fraction"]) == 1.0
    # A silent layer is penalised by the low bound; a layer above the high bound by the high bound.
    assert float(low) == pytest.approx(0.01)
    assert float(high) == pytest.approx(0.25)
    assert float(between) == 0.0


# ----------------------------------------------------------------------------- the network


def _input_spikes(intensity):
    """The networks' input spikes (T=6, B=4, 8), inside the program that uses them (the encoder is tested above)."""
    return rate(jnp.full((4, 8), intensity, jnp.float32), 6, key=jax.random.key(1))


def test_network_trains_a_step_with_finite_gradients_under_jit():
    net = NetConfig(8, 3, hidden=(6, 5), spike="sigmoid")
    plain = NetConfig(8, 3, hidden=(6, 5), spike="no_surrogate")
    ann = NetConfig(8, 3, hidden=(6,), spike=None)
    y = np.array([0, 1, 2, 0], np.int32)

    def everything(key):  # one program: the parameters, the input, both forwards and both gradients
        params = init_net(net, key=key)
        x = _input_spikes(0.5)
        return (
            params,
            x,
            forward(net, params, x),
            jax.grad(lambda p: ce_mean_membrane(forward(net, p, x).traces, y))(params),
            # Without a surrogate no gradient crosses a spiking layer: only the readout (a leaky
            # integrator, no spike function between it and the loss) can learn.
            jax.grad(lambda p: ce_mean_membrane(forward(plain, p, x).traces, y))(params),
            forward(ann, init_net(ann, key=key), x),
        )

    params, x, out, g, g_plain, out_ann = jax.jit(everything)(jax.random.key(0))
    assert out.traces.shape == (6, 4, 3) and [s.shape for s in out.spikes] == [(6, 4, 6), (6, 4, 5)]
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(g))
    assert all(np.abs(np.asarray(leaf)).max() == 0 for leaf in jax.tree.leaves((g_plain.layers, g_plain.neurons)))
    assert np.abs(np.asarray(g_plain.readout.w)).max() > 0
    assert np.all(np.asarray(out_ann.spikes[0]) >= 0)
    with pytest.raises(ValueError, match=r"time-major \(T, B, 8\)"):
        forward(net, params, np.asarray(x)[0])


def test_lif_readout_puts_every_weight_behind_a_spike():
    # The comparison's network: a spiking output layer read by its counts. Without a
    # surrogate no parameter at all gets gradient (the integrator readout above still learns).
    y = np.array([0, 1, 2, 0], np.int32)
    plain = NetConfig(8, 3, hidden=(6, 5), spike="no_surrogate", readout="lif", readout_drive=4.0)
    surrogate = NetConfig(8, 3, hidden=(6, 5), spike="fast_sigmoid", readout="lif")
    # The output bias starts at the drive that holds a neuron at threshold: b = d * theta * (1 - beta).
    drive = NetConfig(8, 3, hidden=(6,), readout="lif", readout_drive=0.5, threshold=0.8, readout_decay=0.75)
    integrator = NetConfig(8, 3, hidden=(6,))

    def everything(key):  # one program: the parameters, the input, the forward and every gradient
        params = init_net(plain, key=key)
        x = _input_spikes(0.6)
        return (
            forward(plain, params, x),
            [
                jax.grad(lambda p, loss=loss: loss(forward(plain, p, x).traces, y))(params)
                for loss in (mse_count, ce_spike_count)
            ],
            jax.grad(lambda p: mse_count(forward(surrogate, p, x).traces, y))(params),
            init_net(drive, key=key).readout.b,
            init_net(integrator, key=key).readout.b,
        )

    out, g_plain, g, drive_b, integrator_b = jax.jit(everything)(jax.random.key(0))
    assert out.traces.shape == (6, 4, 3) and set(np.unique(np.asarray(out.traces))) <= {0.0, 1.0}
    # Every layer fires, so a zero gradient below is the missing surrogate, not silence.
    assert all(np.asarray(s).sum() > 0 for s in (*out.spikes, out.traces))
    for g_loss in g_plain:
        assert all(np.abs(np.asarray(leaf)).max() == 0 for leaf in jax.tree.leaves(g_loss))
    assert np.abs(np.asarray(g.layers[0].w)).max() > 0 and np.abs(np.asarray(g.readout.w)).max() > 0
    np.testing.assert_allclose(np.asarray(drive_b), 0.5 * 0.8 * 0.25, rtol=1e-6)
    assert np.abs(np.asarray(integrator_b)).max() == 0
    with pytest.raises(ValueError, match="readout must be one of"):
        NetConfig(8, 3, readout="softmax")
    with pytest.raises(ValueError, match="non-spiking reference"):
        NetConfig(8, 3, spike=None, readout="lif")


@pytest.mark.parametrize("name", ["leaky", "synaptic", "recurrent", "adaptive", "integrator"])
def test_bound_step_equals_step_bit_for_bit(name):
    neuron, params = _neurons()[name]
    xs = _inputs()
    state = neuron.init_state((B, N))
    bound = jax.jit(lambda xs: run(neuron.bind(params, (B, N), xs.dtype), state, xs))(xs)
    plain = jax.jit(lambda xs: run(functools.partial(neuron.step, params), state, xs))(xs)
    for a, b in zip(jax.tree.leaves(bound), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    weights = np.broadcast_to(np.arange(N, dtype=xs.dtype), xs.shape)

    def grad(f):
        return jax.grad(lambda p: jnp.sum(run(f(p), state, xs)[1] * weights))(params)

    # Both gradients in one program (compared to a tolerance, not bit for bit).
    g_bound, g_plain = jax.jit(
        lambda: (grad(lambda p: neuron.bind(p, (B, N), xs.dtype)), grad(lambda p: functools.partial(neuron.step, p)))
    )()
    for a, b in zip(jax.tree.leaves(g_bound), jax.tree.leaves(g_plain), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_nnx_modules_delegate_to_the_pure_steps():
    from flax import nnx

    from stejax.snn import nnx as snn_nnx

    xs = _inputs()
    x0 = jax.device_put(np.asarray(xs)[0])  # the first step's input, handed over from the host
    modules = {
        "leaky": (snn_nnx.Leaky(N, decay=0.8, threshold=0.7, per_neuron=True), "leaky"),
        "synaptic": (snn_nnx.Synaptic(N, syn_decay=0.6, decay=0.85, threshold=0.9), "synaptic"),
        "recurrent": (snn_nnx.RecurrentLeaky(N, rngs=nnx.Rngs(0), decay=0.7, threshold=0.8), None),
        "adaptive": (snn_nnx.AdaptiveLeaky(N, threshold=0.6, adapt_strength=0.5, per_neuron=True), "adaptive"),
        "integrator": (snn_nnx.LeakyIntegrator(N, decay=0.75), "integrator"),
    }
    for name, (module, pure) in modules.items():
        # One program per module: its run over the sequence and its first step.
        out, step_out = nnx.jit(lambda m, xs, x0: (m.run(xs)[1], m(m.init_state((B, N)), x0)[1]))(module, xs, x0)
        if pure is not None:  # the same parameters as the pure neuron of _neurons(): the same outputs, bit for bit
            neuron, params = _neurons()[pure]
            _, expected = jax.jit(
                lambda xs, neuron=neuron, params=params: run(
                    functools.partial(neuron.step, params), neuron.init_state((B, N)), xs
                )
            )(xs)
            # Bit for bit on CPU; two programs of the same recurrence elsewhere (the contract's allowance).
            expected = np.asarray(expected)
            atol = recurrence_allowance(expected, T)
            np.testing.assert_allclose(np.asarray(out), expected, rtol=0, atol=atol, err_msg=name)
        np.testing.assert_array_equal(np.asarray(step_out), np.asarray(out)[0], err_msg=name)
    trained = {name: sorted(nnx.state(m, nnx.Param).keys()) for name, (m, _) in modules.items()}
    assert trained["recurrent"] == ["decay_logit", "recurrent", "threshold"]
    assert trained["adaptive"] == ["adapt_decay_logit", "adapt_strength", "decay_logit", "threshold"]
    assert trained["integrator"] == ["decay_logit"]
    frozen = snn_nnx.AdaptiveLeaky(N, learn_decay=False)
    assert sorted(nnx.state(frozen, nnx.Param).keys()) == ["adapt_strength", "threshold"]
    assert sorted(nnx.state(frozen, snn_nnx.Fixed).keys()) == ["adapt_decay_logit", "decay_logit"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'syn_decay'"):
        snn_nnx.Leaky(N, syn_decay=0.5)


def test_train_step_flat_optimiser_matches_the_tree_one_and_reports_non_finite_gradients():
    from stejax.snn import SNNTrainConfig, make_optimizer, make_train_step

    net = NetConfig(8, 3, hidden=(6,), spike="fast_sigmoid")
    config = SNNTrainConfig(n_steps=4, batch_size=4)
    params = jax.jit(lambda key: init_net(net, key=key))(jax.random.key(0))
    x, y = np.linspace(0.0, 1.0, 32, dtype=np.float32).reshape(4, 8), np.array([0, 1, 2, 0], np.int32)
    results, steps = {}, {}
    for flatten in (True, False):
        optimizer = make_optimizer(config, 1, flatten=flatten)
        state = jax.jit(optimizer.init)(params)
        step = jax.jit(make_train_step(net, config, optimizer))
        steps[flatten] = optimizer, step
        p = params
        for i in range(3):
            p, state, loss, finite = step(p, state, x, y, jax.random.key(i))
            assert bool(finite) and np.isfinite(float(loss))
        results[flatten] = (p, state)
    # Flat moments: two vectors over all the parameters instead of two arrays per parameter array.
    n = sum(int(a.size) for a in jax.tree.leaves(params))
    assert sorted(a.size for a in jax.tree.leaves(results[True][1]) if a.ndim == 1) == [n, n]
    assert len(jax.tree.leaves(results[False][1])) > 2 * len(jax.tree.leaves(params))
    for a, b in zip(jax.tree.leaves(results[True][0]), jax.tree.leaves(results[False][0]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    # One non-finite gradient entry anywhere is reported.
    bad_b = np.array(params.readout.b)
    bad_b[1] = np.nan
    bad = params._replace(readout=params.readout._replace(b=jax.device_put(bad_b)))
    optimizer, step = steps[True]  # the default optimiser (flat), its step compiled above
    _, _, _, finite = step(bad, jax.jit(optimizer.init)(bad), x, y, jax.random.key(0))
    assert not bool(finite)
