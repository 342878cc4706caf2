"""The service's bounds and behaviour as one frozen record."""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from typing import Any

__all__ = ["OVERSIZE_POLICIES", "ServeConfig"]

OVERSIZE_POLICIES = ("split", "refuse")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"ServeConfig: {name} must be an int >= 1; got {value!r}.")
    return int(value)


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How ``stejax serve`` bounds shapes, bodies and waiting.

    Every request is padded to the smallest bucket that holds it; each bucket is
    compiled once, ahead of time, so the set of shapes the process ever runs is
    ``buckets`` and nothing else.

    Attributes:
      buckets: the batch sizes compiled at start-up, strictly increasing
        (default ``(1, 8, 32, 128)``).
      oversize: what a request with more rows than the largest bucket gets:
        ``"split"`` (default: run in chunks of the largest bucket, the remainder
        padded to its own bucket) or ``"refuse"`` (413).
      max_rows: the most rows one request may carry (default 1024); more is
        refused with 413. With ``oversize="refuse"`` it is the largest bucket.
      max_body_bytes: the largest request body read (default 4 MiB); a larger
        body is refused with 413 before it is read in full.
      micro_batching: gather concurrent requests into one bucket (default True).
      batch_wait_ms: the longest a request waits for others to join its batch,
        counted from its arrival (default 2.0 ms).
      max_queued_rows: the most rows waiting for the device; a request beyond it
        gets 503 with ``Retry-After``; at least ``max_rows`` (default: 16 times
        the largest bucket, or ``max_rows`` if more).
      admin_token: the bearer token of ``/admin/*``; None (default) turns the
        admin endpoints off. Compared in constant time; never shown in ``repr``.

    Example:
      >>> from stejax.serve import ServeConfig
      >>> config = ServeConfig(buckets=(1, 8, 32), max_rows=100)
      >>> config.bucket_for(5), config.chunks(70)
      (8, [32, 32, 6])
      >>> ServeConfig(buckets=(1, 8), oversize="refuse").max_rows
      8
    """

    buckets: tuple[int, ...] = (1, 8, 32, 128)
    oversize: str = "split"
    max_rows: int = 1024
    max_body_bytes: int = 4 * 1024 * 1024
    micro_batching: bool = True
    batch_wait_ms: float = 2.0
    max_queued_rows: int | None = None
    admin_token: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        set_ = object.__setattr__
        if not isinstance(self.buckets, (tuple, list)) or not self.buckets:
            raise ValueError(f"ServeConfig: buckets must be a non-empty tuple of ints; got {self.buckets!r}.")
        buckets = tuple(_positive_int(f"buckets[{i}]", b) for i, b in enumerate(self.buckets))
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            raise ValueError(f"ServeConfig: buckets must be strictly increasing; got {buckets}.")
        set_(self, "buckets", buckets)
        if self.oversize not in OVERSIZE_POLICIES:
            raise ValueError(f"ServeConfig: oversize must be one of {list(OVERSIZE_POLICIES)}; got {self.oversize!r}.")
        max_rows = _positive_int("max_rows", self.max_rows)
        if self.oversize == "refuse":
            max_rows = buckets[-1]
        elif max_rows < buckets[-1]:
            raise ValueError(
                f"ServeConfig: max_rows must be at least the largest bucket ({buckets[-1]}); got {max_rows}."
            )
        set_(self, "max_rows", max_rows)
        set_(self, "max_body_bytes", _positive_int("max_body_bytes", self.max_body_bytes))
        if not isinstance(self.micro_batching, bool):
            raise ValueError(f"ServeConfig: micro_batching must be a bool; got {self.micro_batching!r}.")
        wait = self.batch_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, numbers.Real) or not (math.isfinite(wait) and wait >= 0):
            raise ValueError(f"ServeConfig: batch_wait_ms must be a finite float >= 0; got {wait!r}.")
        set_(self, "batch_wait_ms", float(wait))
        queued = max(16 * buckets[-1], max_rows) if self.max_queued_rows is None else self.max_queued_rows
        queued = _positive_int("max_queued_rows", queued)
        if queued < max_rows:
            raise ValueError(f"ServeConfig: max_queued_rows must be at least max_rows ({max_rows}); got {queued}.")
        set_(self, "max_queued_rows", queued)
        if self.admin_token is not None and (not isinstance(self.admin_token, str) or not self.admin_token.strip()):
            raise ValueError("ServeConfig: admin_token must be a non-empty string or None.")

    @property
    def max_bucket(self) -> int:
        """The largest bucket: the most rows one execution runs."""
        return self.buckets[-1]

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket that holds ``rows`` (1 <= rows <= the largest bucket)."""
        for bucket in self.buckets:
            if rows <= bucket:
                return bucket
        raise ValueError(f"bucket_for: {rows} rows exceed the largest bucket ({self.max_bucket}).")

    def chunks(self, rows: int) -> list[int]:
        """How ``rows`` (1 <= rows <= max_rows) are cut: full largest buckets, then the remainder."""
        full, rest = divmod(rows, self.max_bucket)
        return [self.max_bucket] * full + ([rest] if rest else [])
