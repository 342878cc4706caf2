"""The command line of signing: artifact keygen, sign, verify --public-key, trust, promote; serve --public-key."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from artifact_runs import copy_artifact
from signing_support import CASES, make_key, signed_copy, weight_byte_changed
from stejax.artifacts import Registry, load_artifact, public_key
from stejax.cli import main


class _Ran:
    """A CliRunner result with its output's whitespace folded (rich wraps lines at the terminal width)."""

    def __init__(self, result):
        self.exit_code = result.exit_code
        self.output = " ".join(result.output.split())


def _run(*args):
    # A wide console: rich breaks a long path mid-word at the width, which folding cannot undo.
    runner = CliRunner(env={"COLUMNS": "1000"})
    return _Ran(runner.invoke(main, [str(a) for a in args], catch_exceptions=False))


def test_keygen_sign_verify_the_whole_flow(tmp_path):
    keys = tmp_path / "keys"
    made = _run("artifact", "keygen", "--out", keys)
    assert made.exit_code == 0, made.output
    ours = public_key(keys / "public.pem")
    assert f"public key: {keys / 'public.pem'} ({ours.short})" in made.output
    assert stat.S_IMODE(os.stat(keys / "private.pem").st_mode) == 0o600
    again = _run("artifact", "keygen", "--out", keys)
    assert again.exit_code == 1 and "exists; keys are never overwritten" in again.output

    art = copy_artifact("w4a4", tmp_path / "art")
    unsigned = _run("artifact", "verify", art)
    assert unsigned.exit_code == 0 and "signature: none (unsigned)" in unsigned.output
    refused = _run("artifact", "verify", art, "--public-key", keys / "public.pem")
    assert refused.exit_code == 1 and f"{art}: model.sig: no signature" in refused.output

    signed = _run("artifact", "sign", art, "--key", keys / "private.pem")
    assert signed.exit_code == 0 and f"signed: {art / 'model.sig'}" in signed.output
    _, theirs = make_key(tmp_path / "other", "theirs")
    verified = _run("artifact", "verify", art, "--public-key", theirs, "--public-key", keys / "public.pem")
    assert verified.exit_code == 0, verified.output
    assert f"verified: {load_artifact(art).id}" in verified.output
    assert f"signature: signed by the key {ours.short} ({keys / 'public.pem'}); 5 files as signed" in verified.output
    unchecked = _run("artifact", "verify", art)
    assert "model.sig present, not checked" in unchecked.output

    untrusted = _run("artifact", "verify", art, "--public-key", theirs)
    assert untrusted.exit_code == 1
    assert f"SignatureError: {art}: model.sig: signed by the key {ours.short}, which this policy does not trust" in (
        untrusted.output
    )
    weight_byte_changed(art, {}, tmp_path)
    changed = _run("artifact", "verify", art, "--public-key", keys / "public.pem")
    assert changed.exit_code == 1 and f"{art}: weights.safetensors: changed after signing" in changed.output
    resign = _run("artifact", "sign", art, "--key", keys / "private.pem", "--replace")
    assert resign.exit_code == 1 and "weights.safetensors: sha256" in resign.output


@pytest.mark.parametrize("case", list(CASES))
def test_verify_exits_non_zero_naming_the_file_and_the_reason(tmp_path, case):
    tamper, _, file, fragment = CASES[case]
    keys = {name: make_key(tmp_path / "keys", name) for name in ("ours", "theirs")}
    art = signed_copy(tmp_path / "art", keys["ours"][0])
    tamper(art, keys, tmp_path)
    result = _run("artifact", "verify", art, "--public-key", keys["ours"][1])
    assert result.exit_code == 1, result.output
    assert f"SignatureError: {art}: {file}: " in result.output and fragment in result.output


def test_trust_add_list_remove_and_promote_under_the_policy(tmp_path):
    private, public = make_key(tmp_path / "keys", "ours")
    registry = tmp_path / "registry"
    empty = _run("artifact", "trust", "list", "--registry", registry)
    assert empty.exit_code == 0 and "no trusted key; signatures are not checked" in empty.output
    added = _run("artifact", "trust", "add", public, "--registry", registry)
    key = public_key(public)
    assert added.exit_code == 0 and f"trusted: {key.short} (secp256r1)" in added.output
    listed = _run("artifact", "trust", "list", "--registry", registry)
    assert key.fingerprint in listed.output

    art = copy_artifact("w4a4", tmp_path / "art")
    refused = _run("artifact", "promote", art, "--registry", registry, "--estimator-dtypes", "float32")
    assert refused.exit_code == 1 and f"promote refused: {art}: model.sig: no signature" in refused.output
    assert _run("artifact", "sign", art, "--key", private).exit_code == 0
    promoted = _run("artifact", "promote", art, "--registry", registry, "--estimator-dtypes", "float32")
    assert promoted.exit_code == 0, promoted.output
    assert f"signature: signed by the key {key.short}" in promoted.output

    removed = _run("artifact", "trust", "remove", public, "--registry", registry)
    assert removed.exit_code == 0 and f"no longer trusted: {key.short}" in removed.output
    assert Registry(registry).trusted_keys() == ()
    assert [e["event"] for e in Registry(registry).events()] == ["trust", "refused", "promote", "untrust"]
    unknown = _run("artifact", "trust", "remove", "0123456789abcdef", "--registry", registry)
    assert unknown.exit_code == 1 and "matches none of the trusted keys" in unknown.output


def test_serve_refuses_a_public_key_that_is_a_private_key(tmp_path):
    private, _ = make_key(tmp_path / "keys", "ours")
    art = copy_artifact("w4a4", tmp_path / "art")
    result = _run("serve", art, "--public-key", private)
    assert result.exit_code == 2
    assert "Invalid value for --public-key" in result.output and "that is a private key" in result.output
