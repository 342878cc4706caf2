"""Shared by the test_signing* modules: keys made in the test, signed artifacts, and the ways to tamper with one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from artifact_runs import copy_artifact, exported
from stejax.artifacts import save_artifact, sign_artifact
from stejax.regress import record


def make_key(folder: Path, name: str, curve=ec.SECP256R1) -> tuple[Path, Path]:
    """A fresh EC key pair as PEM files ``name.pem`` (private) and ``name.pub.pem``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(curve())
    private = folder / f"{name}.pem"
    public = folder / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def variant(dest: Path, n: int) -> Path:
    """Another artifact of the w4a4 export (another parent id: another manifest and id), with its regression set."""
    save_artifact(exported("w4a4"), dest, parent=hashlib.sha256(f"variant {n}".encode()).hexdigest())
    record(dest)
    return dest


def signed_copy(dest: Path, private: Path, n: int = 0) -> Path:
    """Artifact ``n`` (0: the shared w4a4 artifact, else a :func:`variant`) at ``dest``, signed with ``private``."""
    root = copy_artifact("w4a4", dest) if n == 0 else variant(dest, n)
    sign_artifact(root, private)
    return root


# ------------------------------------------------------------------------------ the tampering cases


def resigned_by_another_key(root: Path, keys, tmp_path) -> None:
    sign_artifact(root, keys["theirs"][0], replace=True)


def weight_byte_changed(root: Path, keys, tmp_path) -> None:
    weights = root / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))


def file_added(root: Path, keys, tmp_path) -> None:
    (root / "regression" / "notes.txt").write_text("added after signing\n")


def file_removed(root: Path, keys, tmp_path) -> None:
    (root / "regression" / "regression.safetensors").unlink()


def signature_removed(root: Path, keys, tmp_path) -> None:
    (root / "model.sig").unlink()


def signature_copied_from_another_artifact(root: Path, keys, tmp_path) -> None:
    other = signed_copy(tmp_path / "other", keys["ours"][0], n=9)
    shutil.copyfile(other / "model.sig", root / "model.sig")


def signature_altered(root: Path, keys, tmp_path) -> None:
    bundle = json.loads((root / "model.sig").read_text())
    sig = bundle["dsseEnvelope"]["signatures"][0]["sig"]
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:]
    (root / "model.sig").write_text(json.dumps(bundle))


# (tamper, the reason, the file named, a fragment of the message)
CASES = {
    "re-signed by another key": (
        resigned_by_another_key,
        "untrusted",
        "model.sig",
        "which this policy does not trust",
    ),
    "one weight byte changed": (weight_byte_changed, "changed", "weights.safetensors", "changed after signing"),
    "a file added": (file_added, "added", "regression/notes.txt", "added after signing"),
    "a file removed": (file_removed, "removed", "regression/regression.safetensors", "removed after signing"),
    "the signature removed": (signature_removed, "unsigned", "model.sig", "no signature"),
    "the signature of another artifact": (
        signature_copied_from_another_artifact,
        "other-artifact",
        "model.sig",
        "the signature was made for another artifact",
    ),
    "the signature altered": (signature_altered, "bad-signature", "model.sig", "does not verify under it"),
}
