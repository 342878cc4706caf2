"""The catalog: every estimator's facts as data, read by the verifier, the CLI and the docs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from stejax.estimators import absmean, binary, latent, rounding, spiking, uniform
from stejax.estimators._entry import Entry

__all__ = ["CATALOG", "FAMILIES", "Catalog", "get"]

FAMILIES = ("rounding", "binary", "uniform", "latent", "spiking")


class Catalog(Mapping[str, Entry]):
    """An immutable, ordered mapping from estimator name to its :class:`Entry`."""

    def __init__(self, entries: tuple[Entry, ...]):
        names = [e.name for e in entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"catalog: duplicate estimator names {duplicates}.")
        self._entries = {e.name: e for e in entries}

    def __getitem__(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no estimator named {name!r} in the catalog; known: {', '.join(self._entries)}.") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def family(self, family: str) -> tuple[Entry, ...]:
        """The entries of one family, in catalog order."""
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}.")
        return tuple(e for e in self._entries.values() if e.family == family)


CATALOG = Catalog(
    rounding.ENTRIES + binary.ENTRIES + absmean.ENTRIES + uniform.ENTRIES + latent.ENTRIES + spiking.ENTRIES
)


def get(name: str) -> Entry:
    """The catalog entry for ``name``; a KeyError lists the known names."""
    return CATALOG[name]
