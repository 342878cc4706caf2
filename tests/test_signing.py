"""Signed artifacts (OpenSSF model signing): sign, verify against trusted keys, and the registry's trust policy.

Keys are made in the tests (``cryptography``); artifacts are the tiny trained
runs of :mod:`artifact_runs`. Each way an artifact can fail to prove who made
it is refused, with the artifact, the file and the reason, by
:func:`verify_signature` and by :meth:`Registry.promote`; a key removed from the
registry's trust store makes ``current`` and ``rollback`` refuse what it signed.
The running service's refusals are in ``test_signing_serve.py``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from artifact_runs import copy_artifact
from signing_support import CASES, make_key, signed_copy, weight_byte_changed
from stejax.artifacts import (
    ArtifactError,
    Registry,
    RegistryError,
    SignatureError,
    keygen,
    load_artifact,
    public_key,
    sign_artifact,
    verify_signature,
)

DTYPES = ("float32",)


@pytest.fixture
def keys(tmp_path):
    """Two key pairs: ``ours`` (trusted) and ``theirs`` (not)."""
    return {name: make_key(tmp_path / "keys", name) for name in ("ours", "theirs")}


# ------------------------------------------------------------------------------ keys


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path):
    private, public = keygen(tmp_path / "k")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in private.read_bytes() and b"BEGIN PUBLIC KEY" in public.read_bytes()
    loaded = serialization.load_pem_private_key(private.read_bytes(), None)
    assert public_key(public).fingerprint == public_key_fingerprint(loaded.public_key())
    assert public_key(public).curve == "secp256r1"
    with pytest.raises(FileExistsError, match=r"private\.pem exists; keys are never overwritten"):
        keygen(tmp_path / "k")
    with pytest.raises(ValueError, match=r"curve 'ed25519'; expected one of"):
        keygen(tmp_path / "k2", curve="ed25519")


def public_key_fingerprint(key) -> str:

    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def test_public_key_refuses_a_private_key_and_other_curves(tmp_path, keys):
    with pytest.raises(ValueError, match=r"ours\.pem: expected a PEM public key \(that is a private key"):
        public_key(keys["ours"][0])
    _, odd = make_key(tmp_path / "odd", "k1", curve=ec.SECP256K1)
    with pytest.raises(ValueError, match=r"expected an elliptic-curve public key on one of .*; got secp256k1"):
        public_key(odd)


# ------------------------------------------------------------------------------ sign and verify


def test_a_signed_artifact_verifies_and_names_its_key(tmp_path, keys):
    root = copy_artifact("w4a4", tmp_path / "a")
    signature = sign_artifact(root, keys["ours"][0])
    assert signature == root / "model.sig"
    check = verify_signature(root, [keys["theirs"][1], keys["ours"][1]])
    ours = public_key(keys["ours"][1])
    assert check.fingerprint == ours.fingerprint
    assert check.signer == f"key {ours.short} ({keys['ours'][1]})"
    assert set(check.files) == {
        "manifest.json",
        "weights.safetensors",
        "parity.safetensors",
        "regression/regression.json",
        "regression/regression.safetensors",
    }
    # The signature sits beside the files: the artifact still loads, with the same id.
    assert load_artifact(root).id == load_artifact(copy_artifact("w4a4", tmp_path / "b")).id
    # The upstream verifier accepts it as it is (the format is the library's own).
    from model_signing import hashing, verifying

    verifying.Config().use_elliptic_key_verifier(public_key=keys["ours"][1]).set_hashing_config(
        hashing.Config().set_ignored_paths(paths=["model.sig"], ignore_git_paths=False)
    ).verify(root, root / "model.sig")


@pytest.mark.parametrize("case", list(CASES))
def test_verify_refuses_with_the_artifact_the_file_and_the_reason(tmp_path, keys, case):
    tamper, reason, file, fragment = CASES[case]
    root = signed_copy(tmp_path / "a", keys["ours"][0])
    verify_signature(root, [keys["ours"][1]])
    tamper(root, keys, tmp_path)
    with pytest.raises(SignatureError, match=rf"^{root}: {file}: .*{fragment}") as e:
        verify_signature(root, [keys["ours"][1]])
    assert (e.value.reason, e.value.file, e.value.artifact) == (reason, file, root)


@pytest.mark.parametrize("content", [b"not json", b"{}", b'{"mediaType": "x"}'])
def test_verify_refuses_a_signature_file_that_is_not_a_bundle(tmp_path, keys, content):
    root = signed_copy(tmp_path / "a", keys["ours"][0])
    (root / "model.sig").write_bytes(content)
    with pytest.raises(SignatureError, match=rf"^{root}: model\.sig: not a model-signing bundle") as e:
        verify_signature(root, [keys["ours"][1]])
    assert e.value.reason == "malformed"


def test_verify_names_an_untrusted_signer_by_its_fingerprint(tmp_path, keys):
    root = signed_copy(tmp_path / "a", keys["theirs"][0])
    theirs = public_key(keys["theirs"][1])
    with pytest.raises(SignatureError, match=rf"signed by the key {theirs.short}, which this policy does not trust"):
        verify_signature(root, [keys["ours"][1]])
    assert verify_signature(root, [keys["theirs"][1]]).fingerprint == theirs.fingerprint
    with pytest.raises(ValueError, match="nothing is trusted"):
        verify_signature(root, [])


def test_sign_refuses_an_artifact_that_does_not_verify_and_an_existing_signature(tmp_path, keys):
    root = copy_artifact("w4a4", tmp_path / "a")
    sign_artifact(root, keys["ours"][0])
    before = (root / "model.sig").read_bytes()
    with pytest.raises(FileExistsError, match=r"model\.sig: the artifact is signed already"):
        sign_artifact(root, keys["theirs"][0])
    assert (root / "model.sig").read_bytes() == before
    weight_byte_changed(root, keys, tmp_path)
    with pytest.raises(ArtifactError, match=r"weights\.safetensors: sha256 .* \(the file was changed\)"):
        sign_artifact(root, keys["ours"][0], replace=True)
    assert (root / "model.sig").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if "sig-partial" in p.name]


def test_an_encrypted_private_key_signs_with_its_password(tmp_path, keys):
    key = ec.generate_private_key(ec.SECP384R1())
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
        )
    )
    public = tmp_path / "encrypted.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    root = copy_artifact("w4a4", tmp_path / "a")
    with pytest.raises(ValueError, match=r"sign: .*encrypted\.pem: "):
        sign_artifact(root, encrypted, password="wrong")
    assert not (root / "model.sig").exists()
    sign_artifact(root, encrypted, password="pw")
    assert verify_signature(root, [public]).fingerprint == public_key(public).fingerprint
    assert public_key(public).curve == "secp384r1"


def _certificate(subject: str, key, issuer_name: str, issuer_key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return builder.sign(issuer_key, hashes.SHA256())


def test_a_certificate_signature_verifies_against_its_root_and_only_then(tmp_path, keys):
    root_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("stejax test root", root_key, "stejax test root", root_key, ca=True)
    leaf = _certificate("release signer", leaf_key, "stejax test root", root_key, ca=False)
    pem = serialization.Encoding.PEM
    (tmp_path / "root.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "leaf.pem").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "leaf-key.pem").write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    art = copy_artifact("w4a4", tmp_path / "a")
    sign_artifact(art, tmp_path / "leaf-key.pem", certificate=tmp_path / "leaf.pem", chain=[tmp_path / "root.pem"])
    check = verify_signature(art, roots=[tmp_path / "root.pem"])
    assert check.signer.startswith("certificate CN=release signer (key sha256:")
    with pytest.raises(SignatureError, match=r"certificates are trusted only through root certificates") as e:
        verify_signature(art, [keys["ours"][1]])
    assert e.value.reason == "untrusted"
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("another root", other_key, "another root", other_key, ca=True)
    (tmp_path / "other-root.pem").write_bytes(other.public_bytes(pem))
    with pytest.raises(SignatureError, match=r"does not chain to a trusted root"):
        verify_signature(art, roots=[tmp_path / "other-root.pem"])


# ------------------------------------------------------------------------------ the registry's trust policy


def test_trust_add_list_remove_are_events_and_nothing_is_deleted(tmp_path, keys):
    registry = Registry(tmp_path / "registry")
    assert registry.trusted_keys() == ()
    added = registry.trust(keys["ours"][1])
    assert added.fingerprint == public_key(keys["ours"][1]).fingerprint
    assert [k.fingerprint for k in registry.trusted_keys()] == [added.fingerprint]
    with pytest.raises(RegistryError, match=r"is trusted already"):
        registry.trust(keys["ours"][1])
    registry.trust(keys["theirs"][1])
    with pytest.raises(RegistryError, match=r"untrust: abc matches none of the trusted keys"):
        registry.untrust("abc")
    removed = registry.untrust(f"sha256:{added.fingerprint[:16]}")
    assert removed.fingerprint == added.fingerprint
    assert [k.fingerprint for k in registry.trusted_keys()] == [public_key(keys["theirs"][1]).fingerprint]
    assert [p.name.split(".")[0] for p in (registry.root / "trust-removed").iterdir()] == [added.fingerprint]
    events = registry.events()
    assert [e["event"] for e in events] == ["trust", "trust", "untrust"]
    assert events[0]["key"] == added.fingerprint and "BEGIN PUBLIC KEY" in events[0]["public_key"]


def test_a_registry_without_trusted_keys_accepts_unsigned_artifacts(tmp_path):
    registry = Registry(tmp_path / "registry")
    promotion = registry.promote(copy_artifact("w4a4", tmp_path / "a"), estimator_dtypes=DTYPES)
    assert promotion.signature is None and "signed_by" not in registry.events()[-1]


def test_a_signed_artifact_promotes_and_the_log_names_its_key(tmp_path, keys):
    registry = Registry(tmp_path / "registry")
    registry.trust(keys["ours"][1])
    root = signed_copy(tmp_path / "a", keys["ours"][0])
    promotion = registry.promote(root, estimator_dtypes=DTYPES)
    ours = public_key(keys["ours"][1]).fingerprint
    assert promotion.signature.fingerprint == ours
    assert registry.events()[-1]["event"] == "promote" and registry.events()[-1]["signed_by"] == ours
    assert (promotion.artifact.path / "model.sig").read_bytes() == (root / "model.sig").read_bytes()
    assert registry.current().id == promotion.artifact.id


@pytest.mark.parametrize("case", list(CASES))
def test_promote_refuses_before_the_gate_and_logs_it(tmp_path, keys, case, monkeypatch):
    tamper, reason, file, fragment = CASES[case]
    registry = Registry(tmp_path / "registry")
    registry.trust(keys["ours"][1])
    current = registry.promote(signed_copy(tmp_path / "cur", keys["ours"][0], n=1), estimator_dtypes=DTYPES)
    root = signed_copy(tmp_path / "a", keys["ours"][0])
    tamper(root, keys, tmp_path)
    from stejax.artifacts import _registry

    monkeypatch.setattr(_registry, "gate", lambda *a, **k: pytest.fail("the gate ran on an untrusted artifact"))
    with pytest.raises(RegistryError, match=rf"^promote refused: {root}: {file}: .*{fragment}") as e:
        registry.promote(root, estimator_dtypes=DTYPES)
    assert e.value.signature_error.reason == reason and e.value.report is None
    assert registry.current_id() == current.artifact.id
    refused = registry.events()[-1]
    assert refused["event"] == "refused" and refused["failed"] == ["signature"] and file in refused["reason"]


def test_a_removed_key_makes_current_and_rollback_refuse_what_it_signed(tmp_path, keys):
    registry = Registry(tmp_path / "registry")
    registry.trust(keys["ours"][1])
    registry.trust(keys["theirs"][1])
    first = registry.promote(signed_copy(tmp_path / "a", keys["theirs"][0]), estimator_dtypes=DTYPES)
    second = registry.promote(signed_copy(tmp_path / "b", keys["ours"][0], n=1), estimator_dtypes=DTYPES)
    assert registry.current().id == second.artifact.id

    registry.untrust(keys["theirs"][1])
    # The current artifact, signed by a key still trusted, still serves; the previous one is no longer eligible.
    assert registry.current().id == second.artifact.id
    with pytest.raises(RegistryError, match=r"rollback refused: the previous artifact .* is not eligible") as e:
        registry.rollback()
    assert e.value.signature_error.reason == "untrusted" and "which this policy does not trust" in str(e.value)
    assert registry.current_id() == second.artifact.id

    # Re-trusting makes it eligible again; removing the current one's key makes current() refuse.
    registry.trust(keys["theirs"][1])
    assert registry.rollback().id == first.artifact.id
    registry.untrust(keys["theirs"][1])
    with pytest.raises(SignatureError, match=rf"{first.artifact.id}: model\.sig: signed by the key .* does not trust"):
        registry.current()


def test_current_refuses_a_registry_copy_changed_after_signing(tmp_path, keys):
    registry = Registry(tmp_path / "registry")
    registry.trust(keys["ours"][1])
    promoted = registry.promote(signed_copy(tmp_path / "a", keys["ours"][0]), estimator_dtypes=DTYPES)
    (promoted.artifact.path / "regression" / "extra.json").write_text("{}")
    with pytest.raises(SignatureError, match=r"regression/extra\.json: added after signing") as e:
        registry.current()
    assert e.value.reason == "added"
