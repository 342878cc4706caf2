"""``stejax export``, ``stejax artifact`` and ``stejax regress``: integer export, verified artifacts, the registry.

Needs the extra ``stejax[train]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stejax.cli._common import (
    artifact_dir_argument,
    deprecated_argument,
    deprecated_option,
    directory,
    existing_file,
    out_dir_option,
    registry_option,
)

__all__ = ["artifact_group", "export_command", "regress_group"]


def _artifact_errors(run):
    """Run a library call; its refusals (bad artifact, failed gate, existing target) become clean CLI errors."""
    from stejax.cli._common import INPUT_ERRORS

    try:
        return run()
    except INPUT_ERRORS:  # an unreadable input file: the root group's one line, exit code 2
        raise
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None


def _existing_registry(registry_dir: Path) -> None:
    """A registry that commands only read must exist: a mistyped path is not an empty registry."""
    from stejax.cli._common import InputError

    if not registry_dir.is_dir():
        what = "a file, not a directory" if registry_dir.exists() else "no such directory"
        raise InputError(f"no registry at {registry_dir} ({what}); `stejax artifact promote --registry DIR` makes one.")


def _size_table(size) -> Table:
    table = Table(title="stored weights per layer")
    for column in ("layer", "shape", "stored as", "float32 B", "stored B", "ratio", "scales B", "bias B"):
        table.add_column(column, justify="left" if column in ("layer", "shape", "stored as") else "right")
    for row in size.layers:
        table.add_row(
            Text(str(row.index)),
            Text("x".join(map(str, row.weight_shape))),
            Text(row.container),
            Text(str(row.float32_bytes)),
            Text(str(row.weight_bytes)),
            Text(f"1/{round(1 / row.ratio)}" if row.ratio < 1 else "1"),
            Text(str(row.scale_bytes + row.step_bytes)),
            Text(str(row.bias_bytes)),
        )
    return table


def _parity_table(parity) -> Table:
    table = Table(title="parity with the fake-quantised model, per layer")
    for column in ("layer", "path", "codes differing", "outputs bitwise"):
        table.add_column(column, justify="left" if column in ("layer", "path") else "right")
    for row in parity.layers:
        table.add_row(
            Text(str(row.index)),
            Text(row.path),
            Text(f"{row.code_mismatches}/{row.input_codes}" if row.input_codes else "float input"),
            Text(f"{100 * row.output_bitwise:.1f}%"),
        )
    return table


def _checks_table(title: str, checks: Iterable[Any]) -> Table:
    table = Table(title=title)
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for check in checks:
        table.add_row(Text(check.name), Text("passed" if check.passed else "FAILED"), Text(check.detail))
    return table


def _method_line(method: str, quantization: dict) -> str:
    """How the weights were quantised, in words: ``gptq, 512 training rows, seed 0``."""
    calibration = quantization.get("calibration")
    if not isinstance(calibration, dict):
        return {"qat": "qat (trained through the quantisers)", "float": "nothing (float)"}.get(method, method)
    return f"{method}, {calibration.get('rows')} {calibration.get('split')} rows, seed {calibration.get('seed')}"


def _dtypes_option(function):
    return click.option(
        "--estimator-dtypes",
        default=None,
        metavar="DTYPE,...",
        help="The dtypes of the estimator checks (default: every dtype the verifier checks).",
    )(function)


def _split_dtypes(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(d.strip() for d in text.split(",") if d.strip())


@click.command("export", short_help="Export a run to an integer artifact or an ONNX file, checked.")
@click.argument("run_dir", metavar="RUN_OR_ARTIFACT", type=directory(exists=True))
@deprecated_argument("OUT", "out", required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    metavar="PATH",
    default=None,
    help="The artifact directory to write (with --format onnx: the ONNX file); it must not exist.",
)
@click.option("--parent", default=None, metavar="DIR|ID", help="The parent artifact (its directory or id).")
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["artifact", "onnx"]),
    default="artifact",
    show_default=True,
    help="artifact: --out is a verified stejax artifact directory; onnx: --out is an ONNX file for ONNX Runtime (QDQ).",
)
@click.option(
    "--float",
    "float_model",
    is_flag=True,
    help="With --format onnx: the float32 network (dequantised weights, float activations), for comparison.",
)
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=existing_file(),
    help="With --format onnx: a trusted PEM public key (repeatable); only an artifact it signed is exported.",
)
@deprecated_option("--trust-key", "public_keys", multiple=True, type=existing_file())
@click.option(
    "--conv",
    type=click.Choice(["qlinear", "integer"]),
    default=None,
    help="With --format onnx, how convolutions are written. qlinear (default): ORT's QLinearConv, its fast "
    "kernel; a code may differ by one near a rounding tie, so the logits are checked within 5% of the largest "
    "|logit| (the same class but at near ties). integer: ConvInteger, bit for bit stejax's integer forward, "
    "many times slower in ONNX Runtime.",
)
def export_command(
    run_dir: Path,
    out: Path,
    parent: str | None,
    export_format: str,
    float_model: bool,
    public_keys: tuple[Path, ...],
    conv: str | None,
) -> None:
    """Export a trained QAT run to integer weights and write the artifact --out PATH.

    Weights become int8, int4 or int2 codes packed two or four to a byte, or
    binary codes packed eight to a byte, with float32 scales. The exported model
    is compared with the fake-quantised one on the test split; the artifact is
    written (atomically) only when every prediction agrees and every logit is
    within the stated bound.

    With --format onnx, RUN_OR_ARTIFACT may also be a verified artifact, and PATH
    is an ONNX file (model.onnx) that ONNX Runtime runs on its integer kernels
    (a run is exported to an artifact first), written only after ONNX Runtime's
    logits on the artifact's test inputs agree with stejax's integer forward
    (bit for bit with --conv integer; within the stated tolerance with
    QLinearConv); --float writes the float32 network instead.
    """
    from stejax.artifacts import save_artifact
    from stejax.export import export_run

    if export_format == "onnx":
        _export_onnx(run_dir, out, float_model=float_model, public_keys=public_keys, conv=conv or "qlinear")
        return
    if float_model or public_keys or conv is not None:
        raise click.UsageError("--float, --public-key and --conv go with --format onnx.")
    if out.exists() or out.is_symlink():
        # Before minutes of export and parity: the artifact could not be written anyway.
        raise click.ClickException(f"{out} exists; artifacts are never overwritten. Nothing was exported.")
    console = Console()
    result = _artifact_errors(lambda: export_run(run_dir, require_parity=False))
    console.print(_size_table(result.size))
    size = result.size
    console.print(
        Text(
            f"weights {size.weight_bytes} B stored vs {size.float32_weight_bytes} B float32, "
            f"scales {size.scale_bytes} B; weights.safetensors predicted {size.predicted_file_bytes} B, "
            f"actual {size.actual_file_bytes} B ({'match' if size.matches else 'MISMATCH'}); the artifact also "
            f"ships parity.safetensors, {size.evidence_file_bytes} B of parity evidence (the test inputs)"
        )
    )
    console.print(_parity_table(result.parity))
    console.print(Text(result.parity.summary()))
    for flip in result.parity.flips:
        console.print(Text(f"  code flip: {flip}"))
    if not result.parity.passed:
        raise click.ClickException("parity failed; no artifact written.")
    artifact = _artifact_errors(lambda: save_artifact(result, out, parent=parent))
    on_disk = artifact.file_bytes()
    table = Table(title="artifact on disk")
    for column in ("file", "bytes", "holds"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    containers = {row.container for row in result.size.layers}
    if containers == {"float32"}:
        weights_holds = "the float32 weights (a float run: nothing is quantised)"
    elif "float32" in containers:
        weights_holds = "the integer weights and scales, and the float32 weights of unquantised layers"
    else:
        weights_holds = "the integer weights and scales"
    holds = {
        "weights.safetensors": weights_holds,
        "parity.safetensors": "parity evidence: the test inputs, fake-quant logits, bounds",
        "manifest.json": "contract, quantisation, hashes, metrics, verification",
    }
    for name, n in on_disk.items():
        table.add_row(Text(name), Text(str(n)), Text(holds.get(name, "")))
    console.print(table)
    total = sum(on_disk.values())
    console.print(Text(f"artifact {artifact.id} written to {artifact.path.resolve()}: {total} B on disk"))
    # The release gate (artifact promote, serve) needs the regression set; recording it is a separate
    # step so that it is visibly a file added after the export (and before any signature).
    console.print(
        Text(
            f"next: stejax regress record {out}   (stores the standard regression set; artifact promote and serve "
            "refuse an artifact without one)"
        )
    )


def _export_onnx(source: Path, out: Path, *, float_model: bool, public_keys: tuple[Path, ...], conv: str) -> None:
    from stejax.onnx import export_onnx, integer_op_count, optimized_ops

    result = _artifact_errors(
        lambda: export_onnx(source, out, float_model=float_model, trusted_keys=public_keys, conv=conv, time_it=True)
    )
    ops = optimized_ops(result.path)
    console = Console()
    console.print(
        Text(
            f"{result.path}: {result.weights} weights, {result.file_bytes} B, from artifact {result.source_id[:12]}; "
            f"ONNX Runtime (CPU) runs {integer_op_count(ops)} integer products "
            f"({', '.join(f'{k} x{v}' for k, v in sorted(ops.items()))})"
        )
    )
    if result.parity is not None:
        console.print(Text(result.parity.summary()))
    if result.speed is not None:
        slower = result.speed.float_over_quantised < 1
        console.print(Text(result.speed.summary() + ("; --float writes the float32 graph." if slower else ".")))
    if result.qlinear_convs:
        console.print(
            Text(
                f"{len(result.qlinear_convs)} convolution(s) run as ORT's QLinearConv, which requantises their "
                "outputs in its own integer arithmetic; --conv integer writes ConvInteger instead, bit for bit "
                "stejax's integer forward and many times slower in ONNX Runtime."
            )
        )


@click.group("artifact", short_help="Verify and sign artifacts; promote and roll back in a registry.")
def artifact_group() -> None:
    """Verify and sign artifacts, and keep a local registry of promoted ones.

    `verify` and `sign` take an artifact directory; `keygen` makes a key pair
    to try signing with. `promote`, `rollback`, `current` and `list` work on a
    registry (--registry DIR); `trust add`, `trust remove` and `trust list`
    manage its trusted keys.
    """


@artifact_group.command("verify", short_help="Check ARTIFACT's hashes, headers, contract and signature.")
@artifact_dir_argument()
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=existing_file(),
    help="A trusted PEM public key (repeatable): the artifact must be signed by one of them (needs stejax[sign]).",
)
@click.option(
    "--certificate-chain",
    "roots",
    multiple=True,
    type=existing_file(),
    help="A trusted root certificate (PEM, repeatable), for artifacts signed with a certificate.",
)
def artifact_verify(artifact_dir: Path, public_keys: tuple[Path, ...], roots: tuple[Path, ...]) -> None:
    """Verify ARTIFACT: every file's sha256, the safetensors headers, the contract; non-zero exit on any problem.

    With --public-key (or --certificate-chain), the signature model.sig is
    checked first: signed by a trusted key, every file exactly as signed.
    """
    from stejax.artifacts import load_artifact, verify_signature

    console = Console()
    signature = None
    if public_keys or roots:
        signature = _artifact_errors(lambda: verify_signature(artifact_dir, public_keys, roots=roots))
    artifact = _artifact_errors(lambda: load_artifact(artifact_dir))
    table = Table(title=f"artifact {artifact.short_id}")
    for column in ("file", "bytes", "sha256"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for name, entry in artifact.manifest["files"].items():
        table.add_row(Text(name), Text(str(entry["bytes"])), Text(entry["sha256"]))
    console.print(table)
    quant = artifact.manifest["quantization"]
    # describe() already starts with the preset's name ("w4a4: hidden layers ..."): say it once.
    describe = quant["describe"]
    what = describe if describe.startswith(f"{quant['preset']}:") else f"{quant['preset']}: {describe}"
    console.print(Text(f"verified: {artifact.id} ({what.rstrip('.')})"))
    console.print(Text(f"quantised by: {_method_line(artifact.method, quant)}"))
    if signature is not None:
        console.print(Text(f"signature: {signature.summary()}"))
    elif (artifact_dir / "model.sig").exists():
        console.print(Text("signature: model.sig present, not checked (give --public-key to check who signed it)"))
    else:
        console.print(Text("signature: none (unsigned)"))


@artifact_group.command("sign", short_help="Sign every file of ARTIFACT (writes ARTIFACT/model.sig).")
@artifact_dir_argument(exists=True)
@click.option(
    "--key",
    "private_key",
    type=existing_file(),
    required=True,
    help="The PEM elliptic-curve private key (P-256, P-384 or P-521).",
)
@click.option(
    "--certificate",
    type=existing_file(),
    default=None,
    help="The key's signing certificate (PEM); the signature then carries it and --certificate-chain.",
)
@click.option(
    "--certificate-chain",
    "chain",
    multiple=True,
    type=existing_file(),
    help="A certificate between --certificate and the root (PEM, repeatable).",
)
@deprecated_option("--chain", "chain", multiple=True, type=existing_file())
@click.option(
    "--key-password-file",
    type=existing_file(),
    default=None,
    help="A file holding the private key's password, if it is encrypted.",
)
@click.option("--replace", is_flag=True, help="Replace an existing signature.")
def artifact_sign(
    artifact_dir: Path,
    private_key: Path,
    certificate: Path | None,
    chain: tuple[Path, ...],
    key_password_file: Path | None,
    replace: bool,
) -> None:
    """Sign every file of ARTIFACT (OpenSSF model signing, offline); writes ARTIFACT/model.sig.

    The artifact is verified first. Sign last: anything written into the
    artifact afterwards (a regression set) is a file added after signing.
    Needs the extra stejax[sign].
    """
    from stejax.artifacts import sign_artifact

    if chain and certificate is None:
        raise click.UsageError("--certificate-chain needs --certificate.")
    password = key_password_file.read_bytes().rstrip(b"\r\n") if key_password_file is not None else None
    path = _artifact_errors(
        lambda: sign_artifact(
            artifact_dir, private_key, password=password, certificate=certificate, chain=chain, replace=replace
        )
    )
    Console().print(Text(f"signed: {path}"))


@artifact_group.command("keygen", short_help="Make a key pair to try signing (private.pem, public.pem).")
@out_dir_option("The directory to write the two PEM files to.")
@click.option(
    "--curve",
    type=click.Choice(["secp256r1", "secp384r1", "secp521r1"]),
    default="secp256r1",
    show_default=True,
    help="The elliptic curve: NIST P-256, P-384 or P-521.",
)
def artifact_keygen(out: Path, curve: str) -> None:
    """Make a key pair to try signing: OUT/private.pem (mode 0600, unencrypted) and OUT/public.pem."""
    from stejax.artifacts import keygen, public_key

    private, public = _artifact_errors(lambda: keygen(out, curve=curve))
    console = Console()
    console.print(Text(f"private key: {private} (mode 0600; keep it secret)"))
    console.print(Text(f"public key:  {public} ({public_key(public).short})"))


@artifact_group.group("trust", short_help="Trust public keys; a registry with one checks signatures.")
def artifact_trust() -> None:
    """The registry's trusted keys: once it has one, it accepts only artifacts they signed."""


@artifact_trust.command("add", short_help="Trust a PEM public key.")
@click.argument("public_key_file", type=existing_file())
@registry_option()
def artifact_trust_add(public_key_file: Path, registry_dir: Path) -> None:
    """Trust PUBLIC_KEY_FILE (a PEM public key); logged in the registry's events."""
    from stejax.artifacts import Registry

    key = _artifact_errors(lambda: Registry(registry_dir).trust(public_key_file))
    Console().print(Text(f"trusted: {key.short} ({key.curve}), stored as {key.path}"))


@artifact_trust.command("remove", short_help="Stop trusting a key; what it signed stops being eligible.")
@click.argument("key")
@registry_option()
def artifact_trust_remove(key: str, registry_dir: Path) -> None:
    """Stop trusting KEY (its PEM file, or 16+ hex digits of its fingerprint); what it signed stops being eligible."""
    from stejax.artifacts import Registry

    removed = _artifact_errors(lambda: Registry(registry_dir).untrust(key))
    Console().print(Text(f"no longer trusted: {removed.short}"))


@artifact_trust.command("list", short_help="List the trusted keys.")
@registry_option()
def artifact_trust_list(registry_dir: Path) -> None:
    """List the trusted keys (none: the registry does not check signatures)."""
    from stejax.artifacts import Registry

    keys = _artifact_errors(lambda: Registry(registry_dir).trusted_keys())
    if not keys:
        Console().print(Text(f"{registry_dir}: no trusted key; signatures are not checked."))
        return
    table = Table(title=f"trusted keys of {registry_dir}")
    for column in ("fingerprint (sha256 of the PEM)", "curve"):
        table.add_column(column)
    for key in keys:
        table.add_row(Text(key.fingerprint), Text(key.curve))
    Console().print(table)


@artifact_group.command("promote", short_help="Gate ARTIFACT and make it the registry's current artifact.")
@artifact_dir_argument()
@registry_option()
@_dtypes_option
def artifact_promote(artifact_dir: Path, registry_dir: Path, estimator_dtypes: str | None) -> None:
    """Run the gate on ARTIFACT and, if every check passes, make it the registry's current artifact."""
    from stejax.artifacts import Registry, RegistryError

    console = Console()
    try:
        promotion = Registry(registry_dir).promote(artifact_dir, estimator_dtypes=_split_dtypes(estimator_dtypes))
    except RegistryError as error:
        if error.report is not None:
            console.print(_checks_table("release gate", error.report.checks))
        raise click.ClickException(str(error)) from None
    except (ValueError, OSError) as error:
        raise click.ClickException(f"{type(error).__name__}: {error}") from None
    console.print(_checks_table("release gate", promotion.gate.checks))
    if promotion.signature is not None:
        console.print(Text(f"signature: {promotion.signature.summary()}"))
    previous = promotion.previous_id[:12] if promotion.previous_id else "none"
    console.print(Text(f"current: {promotion.artifact.id} (previous: {previous})"))


@artifact_group.command("rollback", short_help="Make the previous artifact current again.")
@registry_option()
def artifact_rollback(registry_dir: Path) -> None:
    """Make the previous verified artifact current again (nothing is deleted)."""
    from stejax.artifacts import Registry

    artifact = _artifact_errors(lambda: Registry(registry_dir).rollback())
    Console().print(Text(f"current: {artifact.id} (rolled back)"))


@artifact_group.command("current", short_help="Print the current artifact's id and directory.")
@registry_option()
def artifact_current(registry_dir: Path) -> None:
    """Print the current artifact's id and directory (verified on the way)."""
    from stejax.artifacts import Registry

    _existing_registry(registry_dir)
    artifact = _artifact_errors(lambda: Registry(registry_dir).current())
    if artifact is None:
        raise click.ClickException(f"{registry_dir}: nothing promoted yet.")
    Console().print(Text(f"{artifact.id} {artifact.path}"))


@artifact_group.command("list", short_help="List the registry's artifacts and their status.")
@registry_option()
def artifact_list(registry_dir: Path) -> None:
    """List the registry's artifacts: id, status, when promoted, preset, parent.

    A torn last line of the event log (a crash mid-append) is named and ignored;
    the state does not depend on the log.
    """
    from stejax.artifacts import Registry

    _existing_registry(registry_dir)
    registry = Registry(registry_dir)
    entries = _artifact_errors(registry.list)
    torn = _artifact_errors(registry.torn_tail)
    table = Table(title=f"registry {registry_dir}")
    for column in ("id", "status", "promoted", "preset", "parent"):
        table.add_column(column)
    for entry in entries:
        table.add_row(
            Text(entry.id[:12]),
            Text(entry.status),
            Text(entry.promoted or "-"),
            Text(entry.preset or "-"),
            Text(entry.parent[:12] if entry.parent else "-"),
        )
    Console().print(table)
    if torn is not None:
        Console().print(Text(f"note: {torn}"))


@click.group("regress", short_help="Record and check an artifact's regression set.")
def regress_group() -> None:
    """Record and check an artifact's regression set."""


@regress_group.command("record", short_help="Store ARTIFACT's regression set: fixed inputs and outputs.")
@artifact_dir_argument()
def regress_record(artifact_dir: Path) -> None:
    """Store ARTIFACT/regression: fixed inputs (a batch, one example, zeros, ties, a bad shape) and outputs."""
    from stejax.regress import record

    path = _artifact_errors(lambda: record(artifact_dir))
    Console().print(Text(f"regression set written to {path.resolve()}"))


@regress_group.command("check", short_help="Recompute ARTIFACT's regression set and compare it.")
@artifact_dir_argument()
def regress_check(artifact_dir: Path) -> None:
    """Recompute ARTIFACT's regression set and compare at the stated per-dtype tolerances."""
    from stejax.regress import check

    report = _artifact_errors(lambda: check(artifact_dir))
    console = Console()
    console.print(_checks_table("regression set", report.cases))
    for problem in report.problems:
        console.print(Text(f"problem: {problem}"))
    console.print(Text(report.summary()))
    if not report.passed:
        raise SystemExit(1)
