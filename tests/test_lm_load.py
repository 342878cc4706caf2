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
from stejax.lm._configs import CONFIGS as LM_CONFIGS
from stejax.lm._export import (
    _codes_and_scale,
    _flat_params,
    export_lm,
    iter_lm_tensors,
    load_lm_artifact,
    read_lm_manifest,
    read_lm_tensors,
)
from stejax.lm._lowbit import _set_module, lowbit_linear
from stejax.lowbit import OFFSET_CONTAINERS as CONTAINERS
from stejax.lowbit import pack, pack_groups, unpack
from stejax.lowbit.nnx import LowBitLinear

TINY = LMConfig(context=24, width=64, depth=1, heads=2, hidden=128)
CONFIGS = ("float", "w8a8", "w4a8", "w2a8", "w1.58a8")


@pytest.fixture(scope="module")
def exported_model():
    return Transformer(TINY, rngs=nnx.Rngs(params=3))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, exported_model):
    root = tmp_path_factory.mktemp("lm_load")
    return {c: export_lm(exported_model, c, root / c) for c in CONFIGS}


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
    streamed = load_lowbit(artifacts[config], ternary=ternary, fuse_projections=False).model
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


def _widened_unpack(stored: np.ndarray, container: str, n: int) -> np.ndarray:
    """An independent reading of the documented layout: every byte widened to int64, its base-``b`` digits."""
    per, low, _ = CONTAINERS[container]
    values = np.asarray(stored).reshape(-1).astype(np.int64) % 256
    if container == "int8":
        return (values - 256 * (values > 127)).astype(np.int8)
    base = 3 if container == "trit5" else 1 << (8 // per)
    digits = (values[:, None] // base ** np.arange(per, dtype=np.int64)) % base
    return (digits.reshape(-1)[:n] + low).astype(np.int8)


@pytest.mark.parametrize("container", sorted(CONTAINERS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 9, 40, 1001])
def test_unpack_reads_every_form_as_documented(container, n):
    per, low, high = CONTAINERS[container]
    rng = np.random.default_rng(n)
    codes = rng.integers(low, high + 1, n)
    stored = pack(codes, container)
    got = unpack(stored, container, n)
    assert got.dtype == np.int8 and got.shape == (n,)
    np.testing.assert_array_equal(got, codes)
    np.testing.assert_array_equal(pack(got, container), stored)
    # Any stored bytes, the padding's digits included (not only the zero code pack writes there).
    top = 242 if container == "trit5" else 255
    noise = rng.integers(0, top + 1, stored.size).astype(stored.dtype)
    np.testing.assert_array_equal(unpack(noise, container, n), _widened_unpack(noise, container, n))
    # A wider integer array of the same byte values reads the same.
    np.testing.assert_array_equal(unpack(noise.astype(np.int64), container, n), _widened_unpack(noise, container, n))
    if container == "int8":
        assert np.shares_memory(got, stored)  # no copy of an int8 tensor


def test_every_byte_of_every_form_reads_as_the_widened_reference():
    for container, (per, _, _) in CONTAINERS.items():
        stored = np.arange(243 if container == "trit5" else 256).astype(np.int8 if container == "int8" else np.uint8)
        n = stored.size * per
        np.testing.assert_array_equal(unpack(stored, container, n), _widened_unpack(stored, container, n))


def _module_at(model: nnx.Module, site: str) -> nnx.Module:
    module = model
    for part in site.split("/"):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def _ungrouped(packed: np.ndarray, bits: int, group: int) -> np.ndarray:
    """:func:`pack_groups`'s bytes ``(in // group, group // per, out)`` back to codes ``(in, out)``."""
    per = 8 // bits
    fields = [((packed.view(np.uint8) >> (bits * k)) & ((1 << bits) - 1)).astype(np.int8) for k in range(per)]
    blocks = np.stack(fields, axis=1) - np.int8(1 << (bits - 1))  # (in // group, per, group // per, out)
    return blocks.reshape(-1, packed.shape[-1])


@pytest.mark.parametrize(
    ("config", "ternary"), [(c, "int8") for c in CONFIGS[1:]] + [("w1.58a8", "2bit")], ids=lambda v: str(v)
)
def test_the_streamed_load_holds_the_codes_the_exporter_packed(artifacts, exported_model, config, ternary):
    # Against the exporter's own codes of the original kernels (not against another reading of the file): the
    # ternary kernels' sizes are not multiples of five, so the last byte's padding is read too.
    quant = LM_CONFIGS[config]
    kernels = _flat_params(exported_model)
    loaded = load_lowbit(artifacts[config], ternary=ternary, fuse_projections=False).model
    sites = sorted(read_lm_manifest(artifacts[config])["quantised"])
    assert sites
    for site in sites:
        layer = _module_at(loaded, site)
        assert isinstance(layer, LowBitLinear), site
        resident = np.asarray(layer.codes[...])
        if layer.form in ("int8", "ternary-int8"):
            got = resident
        else:
            bits = 2 if layer.form in ("int2", "ternary-2bit") else 4
            got = _ungrouped(resident, bits, layer.in_features if layer.form == "ternary-2bit" else quant.group)
        want, _ = _codes_and_scale(kernels[f"{site}/kernel"], quant)
        np.testing.assert_array_equal(got, want, err_msg=site)


@pytest.mark.parametrize(
    ("stored", "container", "n", "message"),
    [
        (np.array([243], np.uint8), "trit5", 5, r"unpack: byte 243 is not five trits \(at offset 0 of 1\); expected"),
        (np.array([1, 250], np.uint8), "trit5", 6, r"byte 250 is not five trits \(at offset 1 of 2\)"),
        (np.zeros(3, np.uint8), "int4", 4, r"unpack: 3 bytes; expected 2 for 4 int4 codes \(2 a byte\)"),
        (np.zeros(3, np.uint8), "int3", 4, r"unpack: unknown container 'int3'; expected one of \['int2'"),
        (np.zeros(2, np.float32), "int8", 2, r"unpack: stored codes of dtype float32; expected bytes"),
        (np.array([1, 300]), "int4", 4, r"unpack: stored value 300 is not a byte; expected values in \[-128, 255\]"),
    ],
)
def test_unpack_refuses_bytes_that_are_not_the_form(stored, container, n, message):
    with pytest.raises(ValueError, match=message):
        unpack(stored, container, n)


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
        (
            lambda t: t.update({"blocks/0/attn/q/codes": t["blocks/0/attn/q/codes"][:-1]}),
            r"^load_lowbit: \S+weights.safetensors: tensor 'blocks/0/attn/q/codes': 4095 bytes; expected 4096 for 4096 "
            r"int8 codes \(1 a byte\)\.$",
        ),
    ],
)
def test_a_tensor_that_does_not_fit_the_model_is_refused(artifacts, tmp_path, change, message):
    art = shutil.copytree(artifacts["w8a8"], tmp_path / "art")
    _rewrite(art, change)
    with pytest.raises(ArtifactError, match=message):
        load_lowbit(art)


def _bad_trit(t) -> None:
    codes = t["blocks/0/mlp/up/codes"]
    codes[7] = 255


@pytest.mark.parametrize("name", ["load_lowbit", "load_lm_artifact"])
def test_a_stored_byte_that_is_not_five_trits_is_refused_by_name_and_place(artifacts, tmp_path, name):
    load = {"load_lowbit": load_lowbit, "load_lm_artifact": load_lm_artifact}[name]
    art = shutil.copytree(artifacts["w1.58a8"], tmp_path / "art")
    _rewrite(art, _bad_trit)
    size = read_lm_tensors(art)[1]["blocks/0/mlp/up/codes"].size
    message = (
        rf"^{name}: \S+weights.safetensors: tensor 'blocks/0/mlp/up/codes': byte 255 is not five trits "
        rf"\(at offset 7 of {size}\); expected at most 3\*\*5 - 1 = 242\.$"
    )
    with pytest.raises(ArtifactError, match=message):
        load(art)
