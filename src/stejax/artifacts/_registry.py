"""A local registry of verified artifacts: promote through the gate, roll back, never delete."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stejax.artifacts._gate import GateReport, gate
from stejax.artifacts._signing import SignatureCheck, SignatureError, TrustedKey, public_key, verify_signature
from stejax.artifacts._store import (
    Artifact,
    ArtifactError,
    fsync_dir,
    load_artifact,
    publish,
    read_json,
    write_file,
)

__all__ = ["Promotion", "Registry", "RegistryEntry", "RegistryError"]

STATE_FORMAT = "stejax-registry/1"
STATE = "state.json"
EVENTS = "events.jsonl"
ARTIFACTS = "artifacts"
LOCK = ".lock"
TRUSTED = "trusted"
UNTRUSTED = "trust-removed"


class RegistryError(ValueError):
    """A registry operation that cannot be done (a failed gate, an untrusted signature, nothing to roll back to).

    Attributes:
      report: the gate's report, when the gate refused.
      signature_error: the :class:`SignatureError`, when the trust policy refused.
    """

    def __init__(
        self, message: str, report: GateReport | None = None, *, signature_error: SignatureError | None = None
    ):
        super().__init__(message)
        self.report = report
        self.signature_error = signature_error


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What :meth:`Registry.promote` did.

    Attributes:
      artifact: the new current artifact (the registry's copy, verified).
      gate: the gate's report.
      previous_id: the artifact that was current before (None if none).
      signature: who signed it, when the registry trusts keys (None when it trusts none).
    """

    artifact: Artifact
    gate: GateReport
    previous_id: str | None
    signature: SignatureCheck | None = None


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
    """One stored artifact.

    Attributes:
      id: the artifact id.
      path: its directory in the registry.
      status: ``"current"``, ``"previous"`` (rollback goes back to it) or
        ``"retired"`` (rolled back from, or replaced and not in the rollback line).
      promoted: when it was last promoted (ISO 8601, UTC), or None.
      preset: the QAT preset, from its manifest.
      parent: its parent's id, from its manifest.
    """

    id: str
    path: Path
    status: str
    promoted: str | None
    preset: str | None
    parent: str | None


def _copy_durably(source: Path, target: Path) -> None:
    """Copy the regular files and directories under ``source`` into the existing ``target``, each file fsynced."""
    for path in sorted(source.iterdir()):
        if path.is_symlink():
            raise RegistryError(f"{path}: a link; artifacts hold regular files only.")
        if path.is_dir():
            (target / path.name).mkdir()
            _copy_durably(path, target / path.name)
            fsync_dir(target / path.name)
        else:
            write_file(target / path.name, path.read_bytes())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def tree_digest(root: Path) -> str:
    """The sha256 of every regular file under ``root`` (relative paths and contents, sorted)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _event_problem(event: Any) -> str:
    """Why ``event`` is not a well-formed event ("" when it is)."""
    if not isinstance(event, dict):
        return f"expected a JSON object; got {type(event).__name__}"
    for key in ("event", "time") + (("id",) if event.get("event") == "promote" else ()):
        if not isinstance(event.get(key), str):
            return f"{key!r} must be a string; got {event.get(key)!r}"
    return ""


class Registry:
    """A directory of verified artifacts with one current, and the line to roll back along.

    Layout: ``ROOT/artifacts/<id>/`` (copies of promoted artifacts, with their
    regression sets), ``ROOT/state.json`` (``{"current": id, "previous": [ids]}``,
    replaced atomically), ``ROOT/events.jsonl`` (every promote, refusal and
    rollback, appended and fsynced; a torn last line from a crash mid-append is
    reported by :meth:`torn_tail` and ignored, any other bad line is an error). Nothing is ever deleted. Operations that
    change the state hold an exclusive ``flock`` on ``ROOT/.lock``; readers need
    none (the state file is replaced by a rename).

    The trust policy: ``ROOT/trusted/<fingerprint>.pem``, the public keys the
    registry trusts (:meth:`trust`, :meth:`untrust`, :meth:`trusted_keys`; a
    removed key moves to ``ROOT/trust-removed/``, and both are events in the
    log). Once it trusts a key, every artifact it accepts must be signed by a
    trusted key (:func:`stejax.artifacts.verify_signature`): :meth:`promote`
    refuses any other before the gate runs, and :meth:`current` and
    :meth:`rollback` check the signature again on every read, so an artifact
    signed by a key removed since stops being served or rolled back to. With no
    trusted key, signatures are not checked.

    Example:
      >>> from stejax.artifacts import Registry
      >>> Registry("no-registry-here").current() is None  # reading creates nothing
      True
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ---------------------------------------------------------------- reading

    def _state(self) -> dict[str, Any]:
        path = self.root / STATE
        if not path.exists():
            return {"format": STATE_FORMAT, "current": None, "previous": []}
        state = read_json(path)
        if (
            state.get("format") != STATE_FORMAT
            or not (state.get("current") is None or isinstance(state.get("current"), str))
            or not isinstance(state.get("previous"), list)
        ):
            raise RegistryError(
                f"{path}: expected {{format: {STATE_FORMAT!r}, current, previous: [...]}}; got {state}."
            )
        return state

    def current_id(self) -> str | None:
        """The current artifact's id, without loading it."""
        return self._state()["current"]

    def path_of(self, artifact_id: str) -> Path:
        return self.root / ARTIFACTS / artifact_id

    def current(self) -> Artifact | None:
        """The current artifact, loaded and verified (None when nothing was promoted).

        Raises:
          SignatureError: the registry trusts keys and the current artifact is not
            signed by one of them, or changed since it was signed.
          ArtifactError: the current artifact no longer verifies, or verifies under
            another id than the one promoted (it was rewritten and re-signed).
        """
        current = self.current_id()
        if current is None:
            return None
        self.check_signature(self.path_of(current))
        artifact = load_artifact(self.path_of(current))
        if artifact.id != current:
            raise ArtifactError(
                f"{artifact.path}: the registry promoted artifact {current}, but the directory now holds a "
                f"consistent artifact with id {artifact.id}: it was rewritten and re-signed after promotion."
            )
        return artifact

    def events(self) -> tuple[dict[str, Any], ...]:
        """Every recorded event, oldest first; a torn last line is left out (see :meth:`torn_tail`).

        Raises:
          RegistryError: a complete line of ``events.jsonl`` is not a JSON event
            (the message names the file and the line).
        """
        return self._read_events()[0]

    def torn_tail(self) -> str | None:
        """A note on ``events.jsonl``'s torn last line, or None when the log ends with a complete line.

        A last line without its newline is a write cut short (a crash mid-append).
        It is ignored for reading: the registry's state lives in ``state.json``,
        never in the log. The next append starts on a fresh line and first
        records a ``torn`` event naming that line, so the fragment stays (nothing
        is deleted) and is skipped from then on.
        """
        return self._read_events()[1]

    def _read_events(self) -> tuple[tuple[dict[str, Any], ...], str | None]:
        path = self.root / EVENTS
        if not path.exists():
            return (), None
        pieces = path.read_bytes().split(b"\n")
        tail = pieces.pop()  # empty when the log ends with a newline
        torn = (
            f"{path}: line {len(pieces) + 1} ({len(tail)} bytes, no newline) is torn, a write cut short; it is ignored."
            if tail
            else None
        )
        parsed: list[tuple[int, dict[str, Any] | None, str]] = []
        for number, raw in enumerate(pieces, 1):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                parsed.append((number, None, f"not valid JSON ({e})"))
                continue
            problem = _event_problem(event)
            parsed.append((number, None if problem else event, problem))
        events = []
        for i, (number, event, problem) in enumerate(parsed):
            following = parsed[i + 1][1] if i + 1 < len(parsed) else None
            if following is not None and following.get("event") == "torn" and following.get("line") == number:
                continue  # a torn line, acknowledged by the append that came after it
            if event is None:
                raise RegistryError(
                    f"{path}: line {number}: {problem}; expected one JSON object per line with string 'event' and "
                    "'time' (and 'id' for a promote)."
                )
            events.append(event)
        return tuple(events), torn

    def list(self) -> tuple[RegistryEntry, ...]:
        """Every stored artifact, in the order first promoted."""
        state = self._state()
        promoted: dict[str, str] = {}
        for event in self.events():
            if event.get("event") == "promote":
                promoted[event["id"]] = event["time"]
        store = self.root / ARTIFACTS
        ids = [p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")] if store.exists() else []
        ids.sort(key=lambda i: (promoted.get(i) is None, list(promoted).index(i) if i in promoted else 0, i))
        out = []
        for artifact_id in ids:
            status = (
                "current"
                if artifact_id == state["current"]
                else "previous"
                if artifact_id in state["previous"]
                else "retired"
            )
            manifest: dict[str, Any] = {}
            with contextlib.suppress(ArtifactError):
                manifest = read_json(self.path_of(artifact_id) / "manifest.json")
            out.append(
                RegistryEntry(
                    id=artifact_id,
                    path=self.path_of(artifact_id),
                    status=status,
                    promoted=promoted.get(artifact_id),
                    preset=(manifest.get("quantization") or {}).get("preset"),
                    parent=manifest.get("parent"),
                )
            )
        return tuple(out)

    def trusted_keys(self) -> tuple[TrustedKey, ...]:
        """The public keys the registry trusts, by fingerprint (empty: signatures are not checked).

        Raises:
          RegistryError: a file in ``ROOT/trusted/`` is not a public key named by its own fingerprint.
        """
        folder = self.root / TRUSTED
        if not folder.is_dir():
            return ()
        keys = []
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):
                continue  # a trust being added, not yet renamed into place
            try:
                key = public_key(path)
            except (ValueError, OSError) as e:
                raise RegistryError(f"{path}: the trust store holds something that is not a public key: {e}") from None
            if path.name != f"{key.fingerprint}.pem":
                raise RegistryError(
                    f"{path}: a trusted key must be named <its fingerprint>.pem; this key's is {key.fingerprint}."
                )
            keys.append(key)
        return tuple(keys)

    def check_signature(self, path: str | os.PathLike) -> SignatureCheck | None:
        """Check ``path``'s signature under the registry's trust policy (None when it trusts no key).

        Raises:
          SignatureError: see :func:`stejax.artifacts.verify_signature`.
        """
        keys = self.trusted_keys()
        return verify_signature(path, keys) if keys else None

    def trust(self, key: str | os.PathLike) -> TrustedKey:
        """Trust the PEM public key at ``key``: from now on every artifact promoted, served or rolled back to
        must be signed by a trusted key. Logged as a ``trust`` event.

        Raises:
          RegistryError: the key is trusted already.
          ValueError: not an elliptic-curve PEM public key.
        """
        new = public_key(key)
        with self._locked():
            if any(k.fingerprint == new.fingerprint for k in self.trusted_keys()):
                raise RegistryError(f"trust: the key {new.short} ({key}) is trusted already.")
            folder = self.root / TRUSTED
            folder.mkdir(exist_ok=True)
            pem = Path(key).read_bytes()
            tmp = folder / f".{new.fingerprint}.partial-{secrets.token_hex(6)}"
            write_file(tmp, pem)
            os.replace(tmp, folder / f"{new.fingerprint}.pem")
            fsync_dir(folder)
            self._log({"event": "trust", "key": new.fingerprint, "source": str(key), "public_key": pem.decode()})
        return TrustedKey(new.fingerprint, folder / f"{new.fingerprint}.pem", new.curve)

    def untrust(self, key: str | os.PathLike) -> TrustedKey:
        """Stop trusting a key, named by its PEM file or its fingerprint (at least 16 hex digits).

        The key file moves to ``ROOT/trust-removed/`` (nothing is deleted) and an
        ``untrust`` event is logged. Artifacts it signed stop verifying under the
        policy: :meth:`current` refuses one that is current, :meth:`rollback` one
        it would go back to.

        Raises:
          RegistryError: no trusted key matches, or the fingerprint prefix is ambiguous.
        """
        with self._locked():
            trusted = self.trusted_keys()
            text = str(key)
            if Path(key).is_file():
                wanted = public_key(key).fingerprint
                matches = [k for k in trusted if k.fingerprint == wanted]
            elif len(text.removeprefix("sha256:")) >= 16:
                matches = [k for k in trusted if k.fingerprint.startswith(text.removeprefix("sha256:").lower())]
            else:
                matches = []
            if len(matches) != 1:
                found = "matches several" if matches else "matches none"
                raise RegistryError(
                    f"untrust: {text} {found} of the trusted keys {[k.short for k in trusted]}; expected a PEM "
                    "public key or at least 16 hex digits of one fingerprint."
                )
            (match,) = matches
            removed = self.root / UNTRUSTED
            removed.mkdir(exist_ok=True)
            target = removed / f"{match.fingerprint}.{_now().replace(':', '')}.{secrets.token_hex(3)}.pem"
            os.rename(match.path, target)
            fsync_dir(match.path.parent)
            fsync_dir(removed)
            self._log({"event": "untrust", "key": match.fingerprint, "moved_to": str(target)})
        return match

    # ---------------------------------------------------------------- writing

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _write_state(self, current: str | None, previous: builtins.list[str]) -> None:
        tmp = self.root / f".{STATE}.partial-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        write_file(
            tmp, (json.dumps({"format": STATE_FORMAT, "current": current, "previous": previous}) + "\n").encode()
        )
        os.replace(tmp, self.root / STATE)
        fsync_dir(self.root)

    def _log(self, event: dict[str, Any]) -> None:
        with open(self.root / EVENTS, "a+b") as f:
            f.seek(0)
            log = f.read()
            lines = [{"time": _now(), **event}]
            if log and not log.endswith(b"\n"):
                # A torn last line: start afresh and say which line it was, so readers skip it.
                tail = len(log) - log.rfind(b"\n") - 1
                torn = {"time": _now(), "event": "torn", "line": log.count(b"\n") + 1, "bytes": tail}
                lines.insert(0, torn)
            f.write(("\n" if len(lines) > 1 else "").encode() + "".join(json.dumps(e) + "\n" for e in lines).encode())
            f.flush()
            os.fsync(f.fileno())

    def _store_copy(self, source: Path, artifact_id: str, digest: str) -> Path:
        target = self.path_of(artifact_id)
        if target.exists():
            if tree_digest(target) != digest:
                raise RegistryError(
                    f"{target}: the stored artifact {artifact_id[:12]} differs from {source} (its regression set or "
                    "its signature, probably); nothing is overwritten."
                )
            return target
        store = self.root / ARTIFACTS
        store.mkdir(parents=True, exist_ok=True)
        tmp = store / f".{artifact_id}.copy-partial-{secrets.token_hex(6)}"
        tmp.mkdir()
        _copy_durably(source, tmp)
        publish(tmp, target)
        return target

    def promote(self, path: str | os.PathLike, *, estimator_dtypes: Iterable[Any] | None = None) -> Promotion:
        """Make the artifact at ``path`` current, if it passes the gate.

        The gate (:func:`gate`) runs on ``path``; on success the directory is
        copied into ``ROOT/artifacts/<id>`` (a hidden copy, fsynced, then renamed)
        and the copy must hold exactly the bytes that were gated (the same tree
        digest before the gate, after it, and in the copy). Then the state file
        is replaced: the new artifact is current and the old current heads the
        rollback line.

        When the registry trusts keys, the artifact's signature is checked first
        (:meth:`check_signature`), before the gate runs; a refusal is logged.

        Returns:
          A :class:`Promotion`.

        Raises:
          RegistryError: the signature is refused (``error.signature_error`` says
            why), the gate failed (``error.report`` names the failed checks), the
            artifact changed while being gated, or it is current already.
        """
        source = Path(path)
        with self._locked():
            before = tree_digest(source) if source.is_dir() else ""
            try:
                signature = self.check_signature(source)
            except SignatureError as e:
                self._log(
                    {"event": "refused", "id": None, "source": str(source), "failed": ["signature"], "reason": str(e)}
                )
                raise RegistryError(f"promote refused: {e}", signature_error=e) from None
            report = gate(source, estimator_dtypes=estimator_dtypes)
            if not report.passed:
                self._log(
                    {
                        "event": "refused",
                        "id": report.artifact_id,
                        "source": str(source),
                        "failed": [c.name for c in report.failures],
                    }
                )
                raise RegistryError(f"promote refused: {source}: {report.summary()}", report)
            assert report.artifact_id is not None
            state = self._state()
            if state["current"] == report.artifact_id:
                raise RegistryError(f"promote: {report.artifact_id[:12]} is current already.", report)
            if tree_digest(source) != before:
                raise RegistryError(f"promote refused: {source} changed while the gate ran.", report)
            target = self._store_copy(source, report.artifact_id, before)
            if tree_digest(target) != before:
                raise RegistryError(f"promote refused: the copy {target} differs from the gated {source}.", report)
            artifact = load_artifact(target)
            previous = state["previous"] + ([state["current"]] if state["current"] else [])
            self._write_state(artifact.id, previous)
            self._log(
                {
                    "event": "promote",
                    "id": artifact.id,
                    "source": str(source),
                    "previous": state["current"],
                    "gate": report.to_dict(),
                    **({"signed_by": signature.fingerprint} if signature is not None else {}),
                }
            )
        return Promotion(artifact=artifact, gate=report, previous_id=state["current"], signature=signature)

    def rollback(self) -> Artifact:
        """Make the previous verified artifact current again; the one rolled back from is kept (retired).

        The previous artifact is loaded and verified before the switch, its
        signature first when the registry trusts keys: an artifact signed by a
        key removed since is not eligible, and the rollback is refused saying so.

        Returns:
          The artifact now current.

        Raises:
          RegistryError: nothing to roll back to, or the previous artifact's
            signature does not verify under the trust policy (nothing changes).
          ArtifactError: the previous artifact no longer verifies (nothing changes).
        """
        with self._locked():
            state = self._state()
            if not state["previous"]:
                raise RegistryError(
                    f"rollback: {self.root} has no previous artifact to go back to (current: {state['current']})."
                )
            target = state["previous"][-1]
            try:
                self.check_signature(self.path_of(target))
            except SignatureError as e:
                raise RegistryError(
                    f"rollback refused: the previous artifact {target[:12]} is not eligible under the trust policy: "
                    f"{e}",
                    signature_error=e,
                ) from None
            artifact = load_artifact(self.path_of(target))
            self._write_state(target, state["previous"][:-1])
            self._log({"event": "rollback", "id": target, "from": state["current"]})
        return artifact
