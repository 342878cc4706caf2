"""Artifacts (stejax.artifacts): the directory format, atomic saves, and loading that refuses tampering.

Each tampering case has its own test. Where the point is the safetensors header
check rather than the hash, the test re-hashes the file into the manifest and
re-signs it (as a writer that hashes whatever it is given would), so that only
the header validation stands between the bytes and the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle  # only to write the hostile file the loader must refuse
import struct
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from artifact_runs import copy_artifact, exported, kill_at, pristine, resign, rewrite_header, run_dir, splits
from stejax.artifacts import ArtifactError, gate, load_artifact, manifest_digest, save_artifact
from stejax.artifacts import _store as store_module
from stejax.export import _safetensors
from stejax.model import preset


def test_save_and_load_round_trip(tmp_path):
    result = exported("w4a4")
    artifact = save_artifact(result, tmp_path / "a")
    assert sorted(os.listdir(artifact.path)) == ["manifest.json", "parity.safetensors", "weights.safetensors"]
    again = load_artifact(artifact.path)
    assert again.id == artifact.id == manifest_digest(json.loads((artifact.path / "manifest.json").read_text()))
    x = jnp.asarray(splits().test.x)
    before = np.asarray(jax.jit(result.model.apply)(result.model.weights, x))
    after = np.asarray(jax.jit(again.model.apply)(again.model.weights, x))
    np.testing.assert_array_equal(before.view(np.uint32), after.view(np.uint32))
    assert again.model.weights["layers"][1]["w"].dtype == jnp.uint8  # int4 codes, packed
    m = again.manifest
    assert m["format"] == "stejax-artifact/1" and m["parent"] is None
    assert set(m["files"]) == {"weights.safetensors", "parity.safetensors"}
    for name, entry in m["files"].items():
        data = (artifact.path / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert {"backend", "device", "jax", "jaxlib"} <= set(m["environment"])
    assert m["environment"]["jax"] == jax.__version__
    assert m["contract"]["input"]["shape"] == [64] and m["contract"]["output"]["shape"] == [10]
    assert m["contract"]["tensors"]["layers/1/w"] == {
        "shape": [32 * 32 // 2],
        "dtype": "uint8",
        "role": m["contract"]["tensors"]["layers/1/w"]["role"],
    }
    assert m["quantization"]["preset"] == "w4a4"
    assert m["training"]["report"]["test_accuracy"] == pytest.approx(m["training"]["report"]["test_accuracy"])
    assert m["training"]["best_epoch_record"]["epoch"] == m["training"]["report"]["best_epoch"]
    assert m["verification"]["parity"]["passed"] is True
    size = m["verification"]["size"]
    assert size["predicted_file_bytes"] == size["file_bytes_on_disk"] == m["files"]["weights.safetensors"]["bytes"]
    assert size["evidence_file_bytes"] == m["files"]["parity.safetensors"]["bytes"]


def test_file_bytes_are_the_whole_artifact_on_disk(tmp_path):
    artifact = save_artifact(exported("w4a4"), tmp_path / "a")
    sizes = artifact.file_bytes()
    assert list(sizes) == ["manifest.json", "parity.safetensors", "weights.safetensors"]
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(artifact.path) for f in fs)
    assert sum(sizes.values()) == on_disk
    assert sizes["weights.safetensors"] == artifact.manifest["verification"]["size"]["actual_file_bytes"]
    assert sizes["parity.safetensors"] == artifact.manifest["verification"]["size"]["evidence_file_bytes"]
    # The evidence is the bulk of the artifact: the size report must not hide it.
    assert sizes["parity.safetensors"] > 5 * sizes["weights.safetensors"]


def test_parent_id_is_recorded_and_the_id_follows_the_content(tmp_path):
    parent = pristine("w8a8")
    child = save_artifact(exported("w4a4"), tmp_path / "child", parent=parent.path)
    assert child.manifest["parent"] == parent.id
    by_id = save_artifact(exported("w4a4"), tmp_path / "by-id", parent=parent.id)
    assert by_id.manifest["parent"] == parent.id
    assert len({parent.id, child.id}) == 2


def test_weights_are_standard_safetensors_both_ways(tmp_path):
    from safetensors.numpy import load_file, save_file

    artifact = pristine("w2a2")
    theirs = load_file(str(artifact.path / "weights.safetensors"))
    ours, _ = _safetensors.decode((artifact.path / "weights.safetensors").read_bytes(), "weights")
    assert list(theirs) != [] and set(theirs) == set(ours)
    for name, value in ours.items():
        np.testing.assert_array_equal(theirs[name], value)
        assert theirs[name].dtype == value.dtype
    # The predicted layout is the library's, byte for byte.
    rng = np.random.default_rng(0)
    z = rng.integers(0, 255, (3, 5), dtype=np.uint8)
    tensors = {"z": z, "a": np.ones(4, np.float32), "m": np.zeros(2, np.int8), "s": np.float32(1.5)}
    # One tensor of every stored dtype, with names against the dtype order.
    tensors.update({f"{i}": np.arange(3, dtype=d) for i, d in enumerate(_safetensors.DTYPES.values())})
    written = _safetensors.encode(tensors, {"k": "v"})
    table = {name: (a.shape, a.dtype) for name, a in tensors.items()}
    assert written[8 : 8 + len(_safetensors.header(table, {"k": "v"}))] == _safetensors.header(table, {"k": "v"})
    assert len(written) == _safetensors.file_size(table, {"k": "v"})
    # And our reader accepts what the reference writer writes.
    save_file({"a": np.arange(6, dtype=np.int8), "b": np.ones((2, 3), np.float32)}, str(tmp_path / "ref.st"))
    back, _ = _safetensors.decode((tmp_path / "ref.st").read_bytes(), "ref")
    np.testing.assert_array_equal(back["a"], np.arange(6, dtype=np.int8))
    np.testing.assert_array_equal(back["b"], np.ones((2, 3), np.float32))


def test_save_refuses_an_existing_directory(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(FileExistsError, match="exists; artifacts are never overwritten"):
        save_artifact(exported("w4a4"), tmp_path / "a")


def test_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    real = store_module.write_file_durably
    calls = []

    def fail_second(path, data):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(store_module, "write_file_durably", fail_second)
    with pytest.raises(OSError, match="disk full"):
        save_artifact(exported("w4a4"), tmp_path / "a")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------ tampering, one case each


def test_refuses_a_flipped_byte(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    data = bytearray((root / "weights.safetensors").read_bytes())
    data[-5] ^= 0x01
    (root / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"weights\.safetensors: sha256 [0-9a-f]{64}; the manifest says .*changed"):
        load_artifact(root)


def test_refuses_a_truncated_file(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    data = (root / "weights.safetensors").read_bytes()
    (root / "weights.safetensors").write_bytes(data[:-100])
    with pytest.raises(ArtifactError, match=rf"{len(data) - 100} bytes; the manifest says {len(data)} \(truncated"):
        load_artifact(root)


def test_refuses_a_truncated_file_even_when_rehashed(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    data = (root / "weights.safetensors").read_bytes()
    (root / "weights.safetensors").write_bytes(data[:-100])
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"tensor '[^']+': data_offsets \[\d+, \d+\] lie outside the data"):
        load_artifact(root)


def test_refuses_an_edited_manifest(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["training"]["report"]["test_accuracy"] = 0.999
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    with pytest.raises(ArtifactError, match=r"manifest\.json: the content's sha256 is .* edited after it was written"):
        load_artifact(root)


def test_refuses_a_resigned_manifest_whose_contract_lies(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["quantization"]["preset"] = "w2a2"  # the weights are 4-bit
    manifest["quantization"]["qat"] = preset("w2a2").to_dict()
    (root / "manifest.json").write_text(json.dumps(store_module.sign(manifest)))
    with pytest.raises(ArtifactError, match=r"contract layer 1 is .*'bits': 4.*preset 'w2a2' give .*'bits': 2"):
        load_artifact(root)


def test_refuses_a_resigned_manifest_whose_configuration_and_preset_disagree(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["quantization"]["preset"] = "w2a2"
    (root / "manifest.json").write_text(json.dumps(store_module.sign(manifest)))
    with pytest.raises(ArtifactError, match=r"quantization.qat is named 'w4a4' but quantization.preset is 'w2a2'"):
        load_artifact(root)


def test_refuses_header_offsets_outside_the_file(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def beyond(header):
        begin, end = header["layers/0/w"]["data_offsets"]
        header["layers/0/w"]["data_offsets"] = [begin + 10**6, end + 10**6]
        return header

    rewrite_header(root / "weights.safetensors", beyond)
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"tensor 'layers/0/w': data_offsets \[\d+, \d+\] lie outside the data sec"):
        load_artifact(root)


def test_refuses_overlapping_offsets(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def overlap(header):
        # The second tensor in the data starts 4 bytes inside the first (same length as before).
        spans = sorted((entry["data_offsets"], name) for name, entry in header.items() if name != "__metadata__")
        (begin, end), name = spans[1]
        header[name]["data_offsets"] = [begin - 4, end - 4]
        return header

    rewrite_header(root / "weights.safetensors", overlap)
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"tensor '.*' at \[\d+, \d+\] overlaps tensor '.*', which ends at \d+"):
        load_artifact(root)


def test_refuses_a_hole_and_a_wrong_byte_count(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")

    def shrink(header):
        begin, _ = header["layers/2/b"]["data_offsets"]
        header["layers/2/b"]["data_offsets"] = [begin, begin + 4]
        return header

    rewrite_header(root / "weights.safetensors", shrink)
    resign(root, files=("weights.safetensors",))
    with pytest.raises(
        ArtifactError,
        match=r"'layers/2/b': data_offsets \[\d+, \d+\] span 4 bytes; shape \[10\] of F32 "
        r"needs 40",
    ):
        load_artifact(root)


def test_refuses_an_oversized_header(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    data = (root / "weights.safetensors").read_bytes()
    (root / "weights.safetensors").write_bytes(struct.pack("<Q", 2**40) + data[8:])
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"the header length is 1099511627776 bytes; at most 1048576 are accepted"):
        load_artifact(root)


def test_refuses_a_pickle_in_place_of_the_weights(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    hostile = pickle.dumps({"layers/0/w": np.zeros(3)}, protocol=4)
    (root / "weights.safetensors").write_bytes(hostile)
    with pytest.raises(ArtifactError, match=rf"{len(hostile)} bytes; the manifest says \d+ \(truncated or extended"):
        load_artifact(root)
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"this is a pickle \(protocol 4\), not safetensors; .* never read"):
        load_artifact(root)


def test_refuses_a_file_the_manifest_does_not_list(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    (root / "weights.pkl").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ArtifactError, match=r"weights\.pkl: not listed in the manifest"):
        load_artifact(root)


def test_refuses_a_zero_step(tmp_path):
    root = copy_artifact("w4a4", tmp_path / "a")
    path = root / "weights.safetensors"
    tensors, meta = _safetensors.decode(path.read_bytes(), "w")
    tensors = dict(tensors)
    tensors["layers/1/a_step"] = np.array(0.0, np.float32)
    path.write_bytes(_safetensors.encode(tensors, meta))
    resign(root, files=("weights.safetensors",))
    with pytest.raises(ArtifactError, match=r"tensor 'layers/1/a_step' must be non-zero \(a step divides\); got 0\.0"):
        load_artifact(root)


# ------------------------------------------------------------------------------ a save killed part-way

_KILLED_SAVE = textwrap.dedent(
    """
    import sys, time
    import jax
    from stejax.artifacts import _store, save_artifact
    from stejax.export import export_run
    real = _store.write_file_durably

    def pause_after_first(path, data):
        real(path, data)
        print("WROTE", path.name, flush=True)
        time.sleep(120)

    result = export_run(sys.argv[1], splits=None)
    _store.write_file_durably = pause_after_first
    save_artifact(result, sys.argv[2])
    """
)


def test_a_save_killed_part_way_leaves_the_current_artifact_loadable(tmp_path):
    current = copy_artifact("w4a4", tmp_path / "current")
    kill_at(_KILLED_SAVE, [str(run_dir("w8a8")), str(tmp_path / "next")], "WROTE weights.safetensors")
    # Nothing half-written under the target name; the partial directory is hidden beside it.
    assert not (tmp_path / "next").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".next.save-partial-")]
    assert len(leftovers) == 1
    assert (tmp_path / leftovers[0] / "weights.safetensors").exists()
    assert not (tmp_path / leftovers[0] / "manifest.json").exists()
    with pytest.raises(ArtifactError, match="not a directory"):
        load_artifact(tmp_path / "next")
    # The current artifact still loads and passes the gate.
    assert load_artifact(current).id == pristine("w4a4").id
    report = gate(current, estimator_dtypes=("float32",))
    assert report.passed, report.summary()


def test_a_header_length_that_starts_like_a_pickle_is_still_read():
    # 1152 = 0x480 is stored as 80 04 00 ..., the bytes a pickle of protocol 4 starts with.
    text = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    text += b" " * (1152 - len(text))
    data = struct.pack("<Q", 1152) + text + np.float32(2.5).tobytes()
    assert data[:2] == b"\x80\x04"
    arrays, _ = _safetensors.decode(data, "x")
    assert arrays["a"].tolist() == [2.5]
