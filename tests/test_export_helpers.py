"""The public helpers other artifact kinds build on (stejax.lm's): safetensors and durable, sealed directories."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stejax import artifacts, export
from stejax.artifacts import _store
from stejax.export import _safetensors


def test_safetensors_helpers_round_trip_and_refuse_a_truncated_file():
    tensors = {"w": np.arange(6, dtype=np.int8).reshape(2, 3), "s": np.float32(0.5)}
    data = export.encode_safetensors(tensors, {"format": "mine/1"})
    table = {k: (np.shape(v), np.asarray(v).dtype) for k, v in tensors.items()}
    assert export.safetensors_file_size(table, {"format": "mine/1"}) == len(data)
    arrays, meta = export.decode_safetensors(data, "mine.safetensors")
    assert meta == {"format": "mine/1"} and arrays["w"].tolist() == tensors["w"].tolist()
    with pytest.raises(export.SafetensorsError, match=r"mine\.safetensors"):
        export.decode_safetensors(data[:20], "mine.safetensors")


def test_a_sealed_directory_is_published_whole_and_checked(tmp_path):
    target = tmp_path / "thing"
    staging = artifacts.staging_dir(target, "save")
    artifacts.write_file_durably(staging / "data.bin", b"abc")
    manifest = artifacts.seal_manifest(
        {"files": {"data.bin": {"sha256": _store.sha256_file(staging / "data.bin"), "bytes": 3}}}
    )
    artifacts.write_file_durably(staging / "manifest.json", json.dumps(manifest).encode())
    artifacts.publish_dir(staging, target)
    assert not staging.exists() and sorted(p.name for p in target.iterdir()) == ["data.bin", "manifest.json"]
    loaded = artifacts.read_json_object(target / "manifest.json")
    assert artifacts.check_manifest_integrity(loaded, target / "manifest.json") == loaded["integrity"]["sha256"]
    assert artifacts.check_listed_files(target, loaded["files"]) == {"data.bin": b"abc"}
    (target / "data.bin").write_bytes(b"abd")
    with pytest.raises(artifacts.ArtifactError, match="the file was changed"):
        artifacts.check_listed_files(target, loaded["files"])
    with pytest.raises(FileExistsError):
        artifacts.publish_dir(artifacts.staging_dir(target, "save"), target)


def test_the_old_private_names_still_work():
    # stejax.lm._export imports these until it switches to the public names.
    assert _store.sign is artifacts.seal_manifest and _store.check_files is artifacts.check_listed_files
    assert _store.temp_dir_beside is artifacts.staging_dir and _store.publish is artifacts.publish_dir
    assert _store.write_file is artifacts.write_file_durably and _store.read_json is artifacts.read_json_object
    assert _store.check_integrity is artifacts.check_manifest_integrity
    assert _safetensors.encode is export.encode_safetensors and _safetensors.decode is export.decode_safetensors
    assert _safetensors.file_size is export.safetensors_file_size
