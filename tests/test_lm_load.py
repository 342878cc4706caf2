"""Streamed loading of LM artifacts: the same model, bit for bit, as reading everything at once; errors."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stejax.artifacts import ArtifactError, seal_manifest
from stejax.export import encode_safetensors
from stejax.lm import LMConfig, Transformer, load_lowbit
from stejax.lm._export import export_lm, iter_lm_tensors, load_lm_artifact, read_lm_manifest, read_lm_tensors
from stejax.lm._lowbit import _set_module, codes_from_stored, lowbit_linear, pack_groups
from stejax.lm._packing import CONTAINERS, pack, unpack

TINY = LMConfig(context=24, width=64, depth=1, heads=2, hidden=128)
CONFIGS = ("float", "w8a8", "w4a8", "w2a8", "w1.58a8")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    model = Transformer(TINY, rngs=nnx.Rngs(params=3))
    root = tmp_path_factory.mktemp("lm_load")
    return {c: export_lm(model, c, root / c) for c in CONFIGS}


def _all_at_once(path, ternary: str) -> nnx.Module:
    """The model as the whole file read at once gives it: the float32 model, then each quantised linear replaced."""
    loaded = load_lm_artifact(path)
    if loaded.config.weight_bits is None:
        return loaded.float_model
    manifest, tensors = read_lm_tensors(path)
    model = nnx.clone(loaded.float_model)
    for site, entry in sorted(manifest["quantised"].items()):
        shape = tuple(entry["shape"])
        codes = unpack(tensors[f"{site}/codes"], entry["container"], int(np.prod(shape))).reshape(shape)
        _set_module(model, site, lowbit_linear(codes, tensors[f"{site}/scale"], loaded.config, ternary=ternary))
    return model


@jax.jit
def _logits(state, tokens):
    return nnx.merge(*state)(tokens)


@pytest.mark.parametrize(
    ("config", "ternary"), [(c, "int8") for c in CONFIGS] + [("w1.58a8", "2bit")], ids=lambda v: str(v)
)
def test_streamed_load_is_bit_identical_to_reading_everything(artifacts, config, ternary):
    streamed = load_lowbit(artifacts[config], ternary=ternary).model
    whole = _all_at_once(artifacts[config], ternary)
    got_def, got = nnx.split(streamed)
    want_def, want = nnx.split(whole)
    assert got_def == want_def
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree_util.tree_flatten_with_path(want)[0]
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    for (path, a), (_, b) in zip(got_leaves, want_leaves, strict=True):
        assert a.dtype == b.dtype, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.uint8)
    np.testing.assert_array_equal(
        np.asarray(_logits((got_def, got), tokens)), np.asarray(_logits((want_def, want), tokens))
    )


def test_the_reference_is_the_artifacts_integer_forward(artifacts):
    loaded = load_lowbit(artifacts["w4a8"])
    assert "reference" not in vars(loaded)  # built on first use only
    want = load_lm_artifact(artifacts["w4a8"]).model
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, 12)), jnp.uint8)
    np.testing.assert_array_equal(
        np.asarray(_logits(nnx.split(loaded.reference), tokens)), np.asarray(_logits(nnx.split(want), tokens))
    )
    assert loaded.reference is loaded.reference


@pytest.mark.parametrize("container", sorted(CONTAINERS))
@pytest.mark.parametrize("n", [1, 7, 40, 1001])
def test_byte_unpacking_equals_unpack(container, n):
    _, low, high = CONTAINERS[container]
    codes = np.random.default_rng(n).integers(low, high + 1, n)
    stored = pack(codes, container)
    got = codes_from_stored(stored, container, n)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, unpack(stored, container, n))
    np.testing.assert_array_equal(got, codes)


def test_byte_unpacking_refuses_what_unpack_refuses():
    with pytest.raises(ValueError, match="not five trits"):
        codes_from_stored(np.array([243], np.uint8), "trit5", 5)
    with pytest.raises(ValueError, match="3 bytes hold 4 int4 codes only in 2"):
        codes_from_stored(np.zeros(3, np.uint8), "int4", 4)
    with pytest.raises(ValueError, match="unknown container 'int3'"):
        codes_from_stored(np.zeros(3, np.uint8), "int3", 4)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (2, 32), (2, 64), (4, 64)])
def test_pack_groups_lays_out_each_group_as_documented(bits, group):
    rng = np.random.default_rng(bits * group)
    codes = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (128, 3)).astype(np.int8)
    per = 8 // bits
    packed = pack_groups(codes, group, bits).view(np.uint8)
    assert packed.shape == (128 // group, group // per, 3)
    for g, j, o in np.ndindex(packed.shape):
        want = sum(
            (int(codes[g * group + k * (group // per) + j, o]) + (1 << (bits - 1))) << (bits * k) for k in range(per)
        )
        assert packed[g, j, o] == want


def test_tensors_come_one_at_a_time_and_the_sha256_is_checked_at_the_end(artifacts, tmp_path):
    art = shutil.copytree(artifacts["w8a8"], tmp_path / "art")
    manifest = read_lm_manifest(art)
    names = [name for name, _ in iter_lm_tensors(art, manifest)]
    assert sorted(names) == sorted(read_lm_tensors(art)[1])
    data = bytearray((art / "weights.safetensors").read_bytes())
    data[-1] ^= 1
    (art / "weights.safetensors").write_bytes(bytes(data))
    seen = []
    with pytest.raises(ArtifactError, match="the file was changed"):
        for name, _ in iter_lm_tensors(art, manifest):
            seen.append(name)
    assert seen == names  # every tensor was read before the refusal


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.__setitem__(9, d[9] ^ 1), "the file was changed"),  # inside the header
        (lambda d: d.__delitem__(slice(-4, None)), r"bytes; the manifest says \d+ \(truncated or extended\)"),
    ],
)
def test_a_changed_weights_file_is_refused_by_the_streamed_load(artifacts, tmp_path, edit, message):
    art = shutil.copytree(artifacts["w4a8"], tmp_path / "art")
    data = bytearray((art / "weights.safetensors").read_bytes())
    edit(data)
    (art / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=message):
        load_lowbit(art)


def test_an_unlisted_file_is_refused(artifacts, tmp_path):
    art = shutil.copytree(artifacts["w8a8"], tmp_path / "art")
    (art / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ArtifactError, match=r"notes.txt: not listed in the manifest"):
        load_lowbit(art)


def _rewrite(art, change) -> None:
    """Rewrite the weights with ``change(tensors)`` applied and the manifest sealed again (a consistent artifact)."""
    import hashlib

    manifest, tensors = read_lm_tensors(art)
    tensors = {k: np.array(v) for k, v in tensors.items()}
    change(tensors)
    data = encode_safetensors(tensors, {"format": manifest["format"]})
    (art / "weights.safetensors").write_bytes(data)
    manifest = {k: v for k, v in manifest.items() if k != "integrity"}
    manifest["files"] = {"weights.safetensors": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}
    (art / "manifest.json").write_text(json.dumps(seal_manifest(manifest)), encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("final_norm/scale"), "lacks 'final_norm/scale', a parameter of the model"),
        (lambda t: t.pop("blocks/0/mlp/up/codes"), "lacks 'blocks/0/mlp/up/codes', a quantised linear"),
        (lambda t: t.update({"head/kernel": t["head/kernel"][:-1]}), r"'head/kernel' has shape \(63, 256\); expected"),
        (lambda t: t.update({"blocks/0/attn/q/codes": t["blocks/0/attn/q/codes"][:-1]}), "bytes hold 4096 int8 codes"),
    ],
)
def test_a_tensor_that_does_not_fit_the_model_is_refused(artifacts, tmp_path, change, message):
    art = shutil.copytree(artifacts["w8a8"], tmp_path / "art")
    _rewrite(art, change)
    with pytest.raises(ArtifactError, match=message):
        load_lowbit(art)
