"""Authenticity: artifacts signed with OpenSSF model signing, and verified against named trusted keys.

The signature is the OpenSSF model signing format, written by the
``model-signing`` library (sigstore's ``model_signing``; the optional extra
``stejax[sign]``): a sigstore bundle holding a DSSE envelope whose in-toto
statement lists the sha256 of every file of the artifact directory (weights,
parity evidence, manifest, regression set) and is signed with an elliptic-curve
private key (P-256, P-384 or P-521), offline. It is written beside the files as
``model.sig`` (the library's default name, left out of what it signs), so the
upstream tool verifies it as well::

    model_signing verify key ART --signature ART/model.sig --public_key public.pem

Verifying reads the bundle, finds the trusted key that signed it (the bundle
names its key by the sha256 of the key's PEM, the key's *fingerprint* here),
checks the signature with that key, then re-hashes the directory with the same
fixed settings (sha256 per file, no link followed, only ``model.sig`` left out,
whatever the bundle says) and compares file by file, so that every refusal
names the artifact, the file and the reason.

Keyless sigstore signing (an OIDC identity, a Fulcio certificate and a Rekor
entry) needs the network and is not used here; see ``docs/artifacts.md`` for how
it plugs in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stejax.artifacts._store import MANIFEST, SIGNATURE_FILE, ArtifactError, fsync_dir

__all__ = [
    "SIGNATURE_FILE",
    "SignatureCheck",
    "SignatureError",
    "TrustedKey",
    "keygen",
    "public_key",
    "sign_artifact",
    "verify_signature",
]

_CURVES = ("secp256r1", "secp384r1", "secp521r1")
_HINT = "pip install 'stejax[sign]'"


class SignatureError(ArtifactError):
    """An artifact whose signature does not establish who made it.

    Attributes:
      artifact: the artifact directory.
      file: the file the problem is in (``model.sig``, or the file added,
        removed or changed after signing).
      reason: one of ``"unsigned"``, ``"malformed"``, ``"untrusted"``,
        ``"bad-signature"``, ``"changed"``, ``"added"``, ``"removed"``,
        ``"other-artifact"``.
    """

    def __init__(self, artifact: Path, file: str, reason: str, message: str):
        super().__init__(f"{artifact}: {file}: {message}")
        self.artifact = artifact
        self.file = file
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class TrustedKey:
    """A public key trusted to sign artifacts.

    Attributes:
      fingerprint: the sha256 (hex) of the key's PEM (SubjectPublicKeyInfo),
        as the signature bundle names its key.
      path: the PEM file.
      curve: the elliptic curve.
    """

    fingerprint: str
    path: Path
    curve: str

    @property
    def short(self) -> str:
        """``sha256:`` and the first 16 hex digits of the fingerprint."""
        return f"sha256:{self.fingerprint[:16]}"


@dataclasses.dataclass(frozen=True)
class SignatureCheck:
    """A signature that verified.

    Attributes:
      artifact: the artifact directory.
      fingerprint: the sha256 (hex) of the signing key's PEM (for a certificate: its key's).
      signer: who signed, in words: ``key sha256:<16 hex> (<path>)`` or
        ``certificate <subject> (key sha256:<16 hex>)``.
      files: every signed file, by path relative to the directory, with its sha256.
    """

    artifact: Path
    fingerprint: str
    signer: str
    files: dict[str, str]

    def summary(self) -> str:
        return f"signed by the {self.signer}; {len(self.files)} files as signed"


def _require():
    try:
        from cryptography.hazmat.primitives import serialization
        from model_signing import hashing
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"signing artifacts needs the extra 'sign': {_HINT} (missing module: {e.name})", name=e.name
        ) from None
    return serialization, hashing


def _hashing_config():
    """The one hashing setting used to sign and to verify: sha256 per file, links refused, model.sig left out."""
    _, hashing = _require()
    return (
        hashing.Config()
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
        .set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=False)
    )


def _fingerprint(key: Any) -> str:
    serialization, _ = _require()
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def public_key(path: str | os.PathLike) -> TrustedKey:
    """Read a PEM public key (an elliptic-curve key on P-256, P-384 or P-521) as a :class:`TrustedKey`.

    Raises:
      ValueError: the file is not a PEM public key, or the key is not on a supported curve.
      FileNotFoundError: no such file.
    """
    serialization, _ = _require()
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path)
    data = path.read_bytes()
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as e:
        hint = " (that is a private key; trust its public half)" if b"PRIVATE KEY" in data else ""
        raise ValueError(f"{path}: expected a PEM public key{hint}; it does not parse ({e}).") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
        got = key.curve.name if isinstance(key, ec.EllipticCurvePublicKey) else type(key).__name__
        raise ValueError(f"{path}: expected an elliptic-curve public key on one of {list(_CURVES)}; got {got}.")
    return TrustedKey(fingerprint=_fingerprint(key), path=path, curve=key.curve.name)


def keygen(out: str | os.PathLike, *, curve: str = "secp256r1") -> tuple[Path, Path]:
    """Make a key pair for trying signing out: ``OUT/private.pem`` (mode 0600) and ``OUT/public.pem``.

    The private key is PKCS#8 PEM, unencrypted; keep real keys in a key store
    or an HSM. Neither file is ever overwritten.

    Args:
      out: the directory (created if missing).
      curve: ``"secp256r1"`` (P-256, default), ``"secp384r1"`` or ``"secp521r1"``.

    Returns:
      ``(private_path, public_path)``.

    Raises:
      FileExistsError: either file exists.
      ValueError: an unsupported curve.
    """
    serialization, _ = _require()
    from cryptography.hazmat.primitives.asymmetric import ec

    if curve not in _CURVES:
        raise ValueError(f"keygen: curve {curve!r}; expected one of {list(_CURVES)}.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    private_path, public_path = out / "private.pem", out / "public.pem"
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"keygen: {path} exists; keys are never overwritten.")
    key = ec.generate_private_key(getattr(ec, curve.upper())())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # Created with mode 0600 (and O_EXCL: never an existing file), so no one else can read it even for a moment;
    # the chmod makes it exactly 0600 whatever the umask took away.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(private_path, 0o600)
    with open(public_path, "xb") as f:
        f.write(public)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(out)
    return private_path, public_path


def sign_artifact(
    path: str | os.PathLike,
    private_key: str | os.PathLike,
    *,
    password: str | bytes | None = None,
    certificate: str | os.PathLike | None = None,
    chain: Sequence[str | os.PathLike] = (),
    replace: bool = False,
) -> Path:
    """Sign every file of a verified artifact with ``private_key``; write ``ARTIFACT/model.sig``.

    The artifact is loaded first (:func:`stejax.artifacts.load_artifact`: every
    hash, header and the contract), so only an artifact that verifies is signed.
    Sign last: a regression set recorded after signing is a file added after
    signing. The signature is written to a hidden file beside the directory and
    renamed into it, so a crash leaves no half signature.

    Args:
      path: the artifact directory.
      private_key: a PEM elliptic-curve private key.
      password: its password, if it is encrypted (a str is encoded as UTF-8).
      certificate: a signing certificate for ``private_key`` (PEM); with it the
        bundle carries the certificate and ``chain`` instead of the key's fingerprint.
      chain: the certificates between ``certificate`` and a root (PEM files).
      replace: replace an existing signature (default: refuse).

    Returns:
      The signature's path.

    Raises:
      ArtifactError: the artifact does not verify.
      FileExistsError: it is signed already and ``replace`` is false.
      ValueError: the key cannot be read, or does not match the certificate.
    """
    from stejax.artifacts._store import load_artifact

    _require()
    from model_signing import signing

    root = Path(path)
    load_artifact(root)
    target = root / SIGNATURE_FILE
    if (target.exists() or target.is_symlink()) and not replace:
        raise FileExistsError(f"{target}: the artifact is signed already; pass replace=True (--replace) to re-sign.")
    config = signing.Config().set_hashing_config(_hashing_config())
    try:
        if certificate is None:
            # model-signing annotates the password as str, but cryptography needs bytes.
            secret: Any = password.encode() if isinstance(password, str) else password
            config.use_elliptic_key_signer(private_key=Path(private_key), password=secret)
        else:
            config.use_certificate_signer(
                private_key=Path(private_key), signing_certificate=Path(certificate), certificate_chain=list(chain)
            )
    except (ValueError, TypeError) as e:
        raise ValueError(f"sign: {private_key}: {e}") from None
    tmp = root.parent / f".{root.name}.sig-partial-{secrets.token_hex(6)}"
    try:
        config.sign(root, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(root)
    return target


def _read_bundle(root: Path):
    from model_signing._signing import sign_sigstore_pb

    target = root / SIGNATURE_FILE
    if not (target.exists() or target.is_symlink()):
        raise SignatureError(
            root, SIGNATURE_FILE, "unsigned", "no signature; the trust policy accepts only signed artifacts."
        )
    if target.is_symlink() or not target.is_file():
        raise SignatureError(root, SIGNATURE_FILE, "malformed", "expected a regular file (a link is not followed).")
    try:
        return sign_sigstore_pb.Signature.read(target)
    except Exception as e:  # the bundle parser raises whatever the JSON or the protobuf model raise
        raise SignatureError(
            root, SIGNATURE_FILE, "malformed", f"not a model-signing bundle ({type(e).__name__}: {e})."
        ) from None


def _signer_of(root: Path, signature: Any, keys: Sequence[TrustedKey], roots: Sequence[Path]) -> tuple[str, str, Any]:
    """(fingerprint, who, signed manifest) of the trusted signer; refuses an untrusted or broken signature."""
    from cryptography import exceptions
    from cryptography.x509 import load_der_x509_certificate
    from model_signing._signing import sign_certificate, sign_ec_key

    material = signature.bundle.verification_material
    trusted = ", ".join([f"{k.short} ({k.path})" for k in keys] + [f"certificates chained to {r}" for r in roots])
    broken = (exceptions.InvalidSignature, ValueError, KeyError, IndexError, TypeError)
    chain = material.x509_certificate_chain
    if chain is not None and chain.certificates:
        leaf = load_der_x509_certificate(chain.certificates[0].raw_bytes)
        fingerprint = _fingerprint(leaf.public_key())
        who = f"certificate {leaf.subject.rfc4514_string()} (key sha256:{fingerprint[:16]})"
        if not roots:
            raise SignatureError(
                root,
                SIGNATURE_FILE,
                "untrusted",
                f"signed with the {who}; certificates are trusted only through root certificates "
                f"(--certificate-chain), and none were given; trusted: {trusted or 'nothing'}.",
            )
        try:
            return fingerprint, who, sign_certificate.Verifier(list(roots)).verify(signature)
        except broken as e:
            raise SignatureError(
                root, SIGNATURE_FILE, "untrusted", f"the {who} does not verify against {trusted}: {e}."
            ) from None
        except Exception as e:  # pyOpenSSL's X509StoreContextError: the chain does not reach a trusted root
            raise SignatureError(
                root, SIGNATURE_FILE, "untrusted", f"the {who} does not chain to a trusted root ({trusted}): {e}."
            ) from None
    hint = material.public_key.hint if material.public_key is not None else None
    if not hint:
        raise SignatureError(
            root, SIGNATURE_FILE, "untrusted", f"names neither a key nor a certificate; trusted: {trusted}."
        )
    for key in keys:
        if key.fingerprint != hint:
            continue
        try:
            return key.fingerprint, f"key {key.short} ({key.path})", sign_ec_key.Verifier(key.path).verify(signature)
        except broken as e:
            raise SignatureError(
                root,
                SIGNATURE_FILE,
                "bad-signature",
                f"names the trusted key {key.short} but does not verify under it ({type(e).__name__}: {e}): the "
                "signature file was altered.",
            ) from None
    raise SignatureError(
        root,
        SIGNATURE_FILE,
        "untrusted",
        f"signed by the key sha256:{hint[:16]}, which this policy does not trust; trusted: {trusted or 'nothing'}.",
    )


def _compare(root: Path, signed: dict[str, str]) -> dict[str, str]:
    """The directory's files and sha256s, if they are exactly the signed ones; refuses naming the first difference."""
    try:
        actual = {r.identifier: r.digest.digest_hex for r in _hashing_config().hash(root).resource_descriptors()}
    except ValueError as e:  # a link, or a path the serializer refuses
        raise SignatureError(root, ".", "changed", f"cannot be hashed as it was signed ({e}).") from None
    changed = [name for name in sorted(set(signed) & set(actual)) if signed[name] != actual[name]]
    if MANIFEST in changed:
        # The manifest names every file and the artifact's id: another manifest is another artifact.
        raise SignatureError(
            root,
            SIGNATURE_FILE,
            "other-artifact",
            f"the signature was made for another artifact: it signs a {MANIFEST} with sha256 "
            f"{signed[MANIFEST][:16]}, this one's is {actual[MANIFEST][:16]} (a signature copied from another "
            "artifact, or this one rewritten after signing).",
        )
    if changed:
        name = changed[0]
        raise SignatureError(
            root,
            name,
            "changed",
            f"changed after signing: sha256 {actual[name][:16]}, the signature says {signed[name][:16]}.",
        )
    added, removed = sorted(set(actual) - set(signed)), sorted(set(signed) - set(actual))
    if added:
        raise SignatureError(root, added[0], "added", "added after signing; the signature does not cover it.")
    if removed:
        raise SignatureError(root, removed[0], "removed", "removed after signing; the signature covers it.")
    return actual


def verify_signature(
    path: str | os.PathLike,
    keys: Iterable[str | os.PathLike | TrustedKey] = (),
    *,
    roots: Iterable[str | os.PathLike] = (),
) -> SignatureCheck:
    """Check that the artifact at ``path`` is signed by a trusted signer and is exactly what was signed.

    In order: ``model.sig`` is present and a model-signing bundle; its signer is
    trusted (a key signature: the key it names is one of ``keys`` and the
    signature verifies under it; a certificate signature: the certificate chains
    to one of ``roots``, checked by model-signing's certificate verifier, and the
    signature verifies under it); the directory's files (every regular file but
    ``model.sig``, re-hashed with sha256) are the signed files with the signed
    digests. It runs before anything in the artifact is parsed, and says nothing
    about the artifact's own manifest: pair it with
    :func:`stejax.artifacts.load_artifact` (the registry and the service do both).

    Args:
      path: the artifact directory.
      keys: the trusted public keys (PEM paths or :class:`TrustedKey`).
      roots: trusted root certificates (PEM paths), for certificate signatures.

    Returns:
      A :class:`SignatureCheck` naming the signer.

    Raises:
      SignatureError: unsigned; a malformed bundle; an untrusted signer; a
        signature that does not verify; a file changed, added or removed after
        signing; a signature made for another artifact. The message names the
        artifact, the file and the reason.
      ValueError: neither a key nor a root is given, or a key is not an EC public key.
    """
    trusted = [k if isinstance(k, TrustedKey) else public_key(k) for k in keys]
    root_paths = [Path(r) for r in roots]
    if not trusted and not root_paths:
        raise ValueError("verify_signature: nothing is trusted; expected a PEM public key or a root certificate.")
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory; an artifact is a directory with a manifest.json.")
    signature = _read_bundle(root)
    fingerprint, who, manifest = _signer_of(root, signature, trusted, root_paths)
    signed = {r.identifier: r.digest.digest_hex for r in manifest.resource_descriptors()}
    files = _compare(root, signed)
    return SignatureCheck(artifact=root, fingerprint=fingerprint, signer=who, files=files)
