"""Where the served model comes from, and how a candidate is verified before it may replace it.

A source turns a path into a verified :class:`ServedModel` or refuses it with
the reasons. :class:`ArtifactSource` serves one artifact directory and runs
every candidate through the release gate; :class:`RegistrySource` serves a
registry's current artifact, promotes candidates through the registry (whose
promote runs the same gate) and rolls back through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from stejax.serve._model import ServedModel, served_model_from_artifact

__all__ = ["ArtifactSource", "ModelSource", "Refused", "RegistrySource"]


class Refused(Exception):
    """A model the gate or the loader turned down; ``failures`` says why, one line each.

    ``outcome`` labels the refusal in ``stejax_reloads_total``: ``"refused"``, or
    ``"untrusted"`` when the signature check refused it.
    """

    def __init__(self, subject: str, failures: list[str], *, outcome: str = "refused"):
        self.subject = subject
        self.failures = list(failures) or ["refused without a stated reason"]
        self.outcome = outcome
        super().__init__(f"{subject}: refused: " + "; ".join(self.failures))


class ModelSource(Protocol):
    """What the service asks of a model source. Every method may block (it runs off the event loop)."""

    description: str

    def first(self) -> ServedModel:
        """The model to serve at start-up, verified; raises :class:`Refused`."""

    def candidate(self, path: Path) -> ServedModel:
        """``path`` verified and loaded, to replace the live model; raises :class:`Refused`."""

    def rollback(self, live: ServedModel, history: list[ServedModel]) -> ServedModel:
        """The previous verified model to make live again; raises :class:`Refused` if there is none."""


def _failure_lines(report: Any) -> list[str]:
    failures = getattr(report, "failures", None) or []
    return [f"{f.name}: {f.detail}" if hasattr(f, "name") and hasattr(f, "detail") else str(f) for f in failures]


def _default_load(path: Path) -> ServedModel:
    from stejax.artifacts import load_artifact

    return served_model_from_artifact(load_artifact(path))


def _default_gate(path: Path) -> Any:
    from stejax.artifacts import gate

    return gate(path)


def _trusted(keys: Sequence[str | os.PathLike]) -> tuple[Any, ...]:
    """The trusted keys, read and checked now (a file that is not a public key fails at start-up, not at reload)."""
    if not keys:
        return ()
    from stejax.artifacts import TrustedKey, public_key

    return tuple(k if isinstance(k, TrustedKey) else public_key(k) for k in keys)


def _check_signature(path: Path, keys: tuple[Any, ...]) -> None:
    """Refuse ``path`` (outcome ``untrusted``) unless a trusted key signed exactly what is there; no-op without keys."""
    if not keys:
        return
    from stejax.artifacts import verify_signature

    try:
        verify_signature(path, keys)
    except (ValueError, OSError) as error:  # SignatureError, or an unreadable directory
        raise Refused(str(path), [f"signature: {error}"], outcome="untrusted") from None


class ArtifactSource:
    """One artifact directory; candidates pass the release gate, rollback returns to the previous live model.

    A candidate is loaded (which re-hashes every file and validates the
    weights' header and the contract), gated (the checks ``stejax artifact
    promote`` runs) and loaded again: if its id changed while the gate ran, it
    is refused, so what goes live is exactly what was verified. With trusted
    keys, its signature is checked first, before anything is parsed, and again
    after the gate (:func:`stejax.artifacts.verify_signature`); a refusal there
    has the outcome ``untrusted``.

    Args:
      path: the artifact to serve at start-up (it passes the gate too).
      load: ``path -> ServedModel`` (default: :func:`stejax.artifacts.load_artifact`).
      gate: ``path -> report`` with ``passed`` and ``failures`` (default:
        :func:`stejax.artifacts.gate`).
      trusted_keys: PEM public keys; when given, only artifacts one of them
        signed are served (``stejax serve --public-key``).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        load: Callable[[Path], ServedModel] = _default_load,
        gate: Callable[[Path], Any] = _default_gate,
        trusted_keys: Sequence[str | os.PathLike] = (),
    ) -> None:
        self.path = Path(path)
        self.description = f"artifact {self.path}"
        self._load = load
        self._gate = gate
        self._keys = _trusted(trusted_keys)

    def first(self) -> ServedModel:
        return self.candidate(self.path)

    def candidate(self, path: Path) -> ServedModel:
        path = Path(path)
        _check_signature(path, self._keys)
        before = self._checked_load(path)
        try:
            report = self._gate(path)
        except Exception as error:  # a gate that cannot run has not passed
            raise Refused(str(path), [f"the gate failed to run: {type(error).__name__}: {error}"]) from None
        if not getattr(report, "passed", False):
            raise Refused(str(path), _failure_lines(report))
        after = self._checked_load(path)
        if after.version != before.version:
            raise Refused(str(path), [f"changed while it was verified: {before.version} became {after.version}"])
        _check_signature(path, self._keys)  # what was loaded is still what was signed
        return after

    def rollback(self, live: ServedModel, history: list[ServedModel]) -> ServedModel:
        if not history:
            raise Refused("rollback", [f"no previous verified artifact: {live.version} is the first served"])
        return history[-1]

    def _checked_load(self, path: Path) -> ServedModel:
        try:
            return self._load(path)
        except (ValueError, OSError, KeyError, TypeError) as error:
            raise Refused(str(path), [f"{type(error).__name__}: {error}"]) from None


class RegistrySource:
    """A registry's current artifact; candidates are promoted through it, rollback goes through it.

    ``registry.promote(path)`` runs the gate and refuses a candidate that fails
    it (the refusal is logged in the registry too); only then is the registry's
    copy of the new current artifact loaded (hashes, header and contract
    verified again) and compiled. ``registry.rollback()`` makes the previous
    verified artifact current again, and that one is served. The registry
    deletes nothing, so what the service served stays on disk.

    Args:
      registry: a :class:`stejax.artifacts.Registry` (or anything with
        ``current()``, ``promote(path)`` and ``rollback()`` returning or holding
        artifacts with a ``path``).
      load: ``path -> ServedModel`` (default: :func:`stejax.artifacts.load_artifact`).
      gate: run on the registry's current artifact at start-up (default:
        :func:`stejax.artifacts.gate`).
      trusted_keys: PEM public keys the service trusts, checked on the current
        artifact at start-up and on every candidate before it is promoted, on
        top of the registry's own trust policy (a registry refusal for the
        signature has the outcome ``untrusted`` too).
    """

    def __init__(
        self,
        registry: Any,
        *,
        load: Callable[[Path], ServedModel] = _default_load,
        gate: Callable[[Path], Any] = _default_gate,
        trusted_keys: Sequence[str | os.PathLike] = (),
    ) -> None:
        self.registry = registry
        self.description = f"registry {getattr(registry, 'root', registry)}"
        self._load = load
        self._gate = gate
        self._keys = _trusted(trusted_keys)

    def first(self) -> ServedModel:
        try:
            current = self.registry.current()
        except (ValueError, OSError) as error:
            raise Refused(self.description, [f"{type(error).__name__}: {error}"]) from None
        if current is None:
            raise Refused(self.description, ["the registry has no current artifact; promote one first"])
        return ArtifactSource(current.path, load=self._load, gate=self._gate, trusted_keys=self._keys).first()

    def candidate(self, path: Path) -> ServedModel:
        _check_signature(Path(path), self._keys)
        try:
            promotion = self.registry.promote(Path(path))
        except (ValueError, OSError) as error:
            signature_error = getattr(error, "signature_error", None)
            if signature_error is not None:
                raise Refused(str(path), [f"signature: {signature_error}"], outcome="untrusted") from None
            report = getattr(error, "report", None)
            failures = _failure_lines(report) if report is not None and not report.passed else []
            raise Refused(str(path), failures or [f"{type(error).__name__}: {error}"]) from None
        return self._checked_load(promotion.artifact.path)

    def rollback(self, live: ServedModel, history: list[ServedModel]) -> ServedModel:
        try:
            artifact = self.registry.rollback()
        except (ValueError, OSError) as error:
            raise Refused("rollback", [f"{type(error).__name__}: {error}"]) from None
        return self._checked_load(artifact.path)

    def _checked_load(self, path: Path) -> ServedModel:
        try:
            return self._load(Path(path))
        except (ValueError, OSError, KeyError, TypeError) as error:
            raise Refused(str(path), [f"{type(error).__name__}: {error}"]) from None
