"""Training the LM at scale, small: named sizes, mixed precision, orbax checkpoints and resume, the 8-device mesh.

The mesh part runs in the shared 8-CPU-device subprocess (:mod:`mesh_support`): :func:`mesh_work` trains a
tiny model for a few steps on one device and on the mesh (data parallel, then FSDP, then FSDP with int8
products), and the tests compare the losses and parameters.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from stejax.lm import (
    SIZES,
    LMConfig,
    TrainSettings,
    Transformer,
    gguf_architecture,
    gguf_differences,
    lm_size,
    parameter_count,
    quantize_lm,
    train_lm,
)

TINY = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64)


def _stream(seed: int, n: int) -> np.ndarray:
    # Text with structure (repeated words), so that a few steps lower the loss.
    words = [b"jax ", b"grad ", b"vmap ", b"jit ", b"scan ", b"\n"]
    rng = np.random.default_rng(seed)
    return np.frombuffer(b"".join(words[i] for i in rng.integers(0, len(words), n)), np.uint8)


def _params(model: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "config",
    [
        TINY,
        TINY.replace(norms="llama"),
        TINY.replace(tied=True, positions="learned", mlp="gelu"),
    ],
    ids=["subln", "llama", "tied-learned-gelu"],
)
def test_parameter_count_counts_the_built_model(config):
    model = Transformer(config, rngs=nnx.Rngs(params=0))
    assert parameter_count(config) == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("name", list(SIZES))
def test_named_sizes_hold_about_their_names_parameters(name):
    count = parameter_count(lm_size(name))
    nominal = float(name.removesuffix("M")) * 1e6
    assert 0.9 <= count / nominal <= 1.1, (name, count)
    config = lm_size(name)
    # Every quantised linear's rows fill llama.cpp's 256-value blocks.
    assert config.width % 256 == 0 and config.hidden % 256 == 0 and config.norms == "subln" and config.tied


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize("config", ["float", "w8a8", "w1.58a8"])
def test_named_sizes_export_exactly_to_llamacpp(name, config):
    # A SubLN model with a tied head is llama.cpp's bitnet computation; every size and preset exports exactly.
    assert gguf_architecture(lm_size(name)) == "bitnet"
    assert gguf_differences(lm_size(name), config) == []


def test_unknown_size_names_the_sizes():
    with pytest.raises(KeyError, match="expected one of 25M, 100M, 350M"):
        lm_size("1B")


# ----------------------------------------------------------------------------- mixed precision


def test_bfloat16_training_keeps_float32_master_weights_and_learns():
    text = _stream(0, 4000)
    model = Transformer(TINY, rngs=nnx.Rngs(params=1))
    common = dict(steps=12, batch_size=4, learning_rate=3e-3, warmup=2, eval_every=6, eval_windows=4)
    key = jax.random.key(5)
    mixed = train_lm(model, text, text, TrainSettings(**common, compute_dtype="bfloat16"), key=key)
    full = train_lm(model, text, text, TrainSettings(**common), key=jax.random.key(5))
    assert all(p.dtype == np.float32 for p in _params(mixed.model))
    # Same batches, bfloat16 arithmetic: the same curve to within bfloat16's rounding, and not bit-equal.
    mixed_loss = [r["train_loss"] for r in mixed.history]
    full_loss = [r["train_loss"] for r in full.history]
    np.testing.assert_allclose(mixed_loss, full_loss, rtol=2e-2)
    assert mixed_loss != full_loss
    assert mixed_loss[-1] < mixed_loss[0]


def test_an_unknown_compute_dtype_is_refused():
    with pytest.raises(ValueError, match="compute_dtype` must be one of"):
        TrainSettings(compute_dtype="float16")


def test_checkpoint_every_must_follow_an_evaluation():
    with pytest.raises(ValueError, match="multiple of `eval_every` \\(4\\)"):
        TrainSettings(steps=20, warmup=2, eval_every=4, checkpoint_every=6)


# ----------------------------------------------------------------------------- checkpoints and resume


class _Stop(Exception):
    pass


@pytest.mark.parametrize("config", ["float", "w1.58a8_int8"])
def test_a_stopped_run_resumed_from_its_checkpoint_ends_bit_for_bit_as_one_run(tmp_path, config):
    text = _stream(1, 6000)
    base = quantize_lm(Transformer(TINY, rngs=nnx.Rngs(params=2)), config)
    settings = TrainSettings(
        steps=8, batch_size=4, learning_rate=3e-3, warmup=2, eval_every=2, eval_windows=2, checkpoint_every=4
    )
    whole = train_lm(base, text, text, settings, key=jax.random.key(9), out_dir=tmp_path / "whole")

    def stop_after_five(record):
        if record["step"] == 5:
            raise _Stop

    with pytest.raises(_Stop):
        train_lm(base, text, text, settings, key=jax.random.key(9), out_dir=tmp_path / "cut", on_step=stop_after_five)
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["4"]
    resumed = train_lm(base, text, text, settings, key=jax.random.key(9), out_dir=tmp_path / "cut", resume=True)
    for a, b in zip(_params(whole.model), _params(resumed.model), strict=True):
        np.testing.assert_array_equal(a, b)
    # The resumed run's metrics continue the stopped one's: every evaluation once, the same values.
    lines = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [2, 4, 6, 8]
    np.testing.assert_array_equal([r["val_bpb"] for r in lines], [r["val_bpb"] for r in whole.history])
    assert resumed.history[0]["step"] == 6


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path):
    text = _stream(2, 4000)
    model = Transformer(TINY, rngs=nnx.Rngs(params=2))
    settings = TrainSettings(steps=4, batch_size=4, warmup=1, eval_every=2, eval_windows=2, checkpoint_every=2)
    train_lm(model, text, text, settings, key=jax.random.key(1), out_dir=tmp_path)
    other = TrainSettings(
        steps=4, batch_size=4, warmup=1, eval_every=2, eval_windows=2, checkpoint_every=2, learning_rate=1e-3
    )
    with pytest.raises(ValueError, match=r"learning_rate: 0\.003, now 0\.001"):
        train_lm(model, text, text, other, key=jax.random.key(1), out_dir=tmp_path, resume=True)


def test_resume_needs_a_run_directory():
    text = _stream(3, 2000)
    with pytest.raises(ValueError, match="resume=True needs the out_dir"):
        train_lm(
            Transformer(TINY, rngs=nnx.Rngs(params=0)),
            text,
            text,
            TrainSettings(steps=2, batch_size=2, warmup=1, eval_every=1, eval_windows=1),
            key=jax.random.key(0),
            resume=True,
        )


# ----------------------------------------------------------------------------- the 8-device mesh

MESH_STEPS = 4
# The runs on the mesh, by configuration: FSDP for every one (data parallel with split parameters), and the
# replicated layout for float and ternary. w8a8's statistics are maxima, which no order of summation changes;
# ternary's per-tensor absmean is a sum.
MESH_RUNS = {"float": ("replicated", "sharded"), "w8a8_int8": ("sharded",), "w1.58a8_int8": ("replicated", "sharded")}


def mesh_work(out: dict) -> None:
    """Run in the 8-device subprocess: one device against the mesh, replicated and FSDP, float and int8."""
    import jax.numpy as jnp

    from stejax.train import data_mesh, param_shardings, place

    text = _stream(4, 8000)
    settings = TrainSettings(steps=MESH_STEPS, batch_size=8, learning_rate=3e-3, warmup=1, eval_every=2, eval_windows=8)
    for config, modes in MESH_RUNS.items():
        model = quantize_lm(Transformer(TINY, rngs=nnx.Rngs(params=7)), config)
        runs = {"single": train_lm(model, text, text, settings, key=jax.random.key(3))}
        for mode in modes:
            runs[mode] = train_lm(
                model, text, text, settings, key=jax.random.key(3), mesh=data_mesh(8), param_sharding=mode
            )
        out[config] = {
            name: {
                "train_loss": [r["train_loss"] for r in run.history],
                "val_bpb": [r["val_bpb"] for r in run.history],
                "params": [np.asarray(x).ravel()[:64].tolist() for x in _params(run.model)],
            }
            for name, run in runs.items()
        }
        out[config]["sharded_specs"] = [
            str(x.sharding.spec) for x in jax.tree.leaves(nnx.state(runs["sharded"].model, nnx.Param))
        ]
    # The ternary scale of the model's kernels split over the mesh: the same mean, summed in another order.
    absmean = jax.jit(lambda w: jnp.mean(jnp.abs(w)))
    out["absmean"] = []
    for _, module in nnx.iter_modules(Transformer(TINY, rngs=nnx.Rngs(params=7))):
        if isinstance(module, nnx.Linear):
            kernel = np.asarray(module.kernel[...])
            split = place(kernel, param_shardings(kernel, data_mesh(8), "sharded"))
            out["absmean"].append([float(absmean(kernel)), float(absmean(split)), kernel.size])


@pytest.fixture(scope="module")
def mesh_runs() -> dict:
    from mesh_support import mesh_results

    return mesh_results("test_lm_train_scale")


@pytest.mark.needs_cpu("the 8-CPU-device mesh (a subprocess with XLA's host device count)")
@pytest.mark.parametrize(("config", "mode"), [(config, mode) for config, modes in MESH_RUNS.items() for mode in modes])
def test_the_mesh_gives_the_one_device_run(mesh_runs, config, mode):
    runs = mesh_runs[config]
    if (config, mode) == ("w1.58a8_int8", "sharded"):
        # The per-tensor absmean of a split kernel is summed in another order and comes out a float32 rounding
        # or two away (the next test); every dequantised weight moves with the scale, and the int8 activation
        # quantisers downstream round some of their inputs to the neighbouring code, a whole step of their
        # grid. So this run is another run of the same recipe: it must train as the one-device run does, not
        # equal it.
        np.testing.assert_allclose(runs[mode]["train_loss"], runs["single"]["train_loss"], rtol=1e-2)
        np.testing.assert_allclose(runs[mode]["val_bpb"], runs["single"]["val_bpb"], rtol=1e-2)
        assert runs[mode]["train_loss"][-1] < runs[mode]["train_loss"][0]
        return
    # The same batches and updates; only the order of the gradient's sums over devices differs (float32).
    np.testing.assert_allclose(runs[mode]["train_loss"], runs["single"]["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(runs[mode]["val_bpb"], runs["single"]["val_bpb"], rtol=1e-5)
    for a, b in zip(runs[mode]["params"], runs["single"]["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.needs_cpu("the 8-CPU-device mesh (a subprocess with XLA's host device count)")
def test_a_split_kernels_ternary_scale_differs_only_in_float32_rounding(mesh_runs):
    # Two orders of one float32 sum of n non-negative terms differ by at most about 2 n eps of the sum (the
    # recursive-summation bound, twice): a statistic computed per shard instead would be off by percents.
    for single, sharded, n in mesh_runs["absmean"]:
        assert abs(sharded - single) <= 2 * n * np.finfo(np.float32).eps * single


@pytest.mark.needs_cpu("the 8-CPU-device mesh (a subprocess with XLA's host device count)")
def test_fsdp_splits_the_parameters_over_the_mesh(mesh_runs):
    specs = mesh_runs["float"]["sharded_specs"]
    assert sum("data" in s for s in specs) >= len(specs) // 2, specs
