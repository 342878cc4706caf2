"""The service's Prometheus metrics, in a registry of its own, and the process-wide compile counter.

Aggregates only: counts, durations and ratios. No label or sample ever holds an
input value.
"""

from __future__ import annotations

import threading

import jax
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

__all__ = ["COMPILE_EVENT", "Metrics", "compilations", "install_compile_listener"]

# jax._src.dispatch.BACKEND_COMPILE_EVENT: jax records its duration once per XLA
# compilation (a persistent-cache hit included), whoever asked for it: jit, an
# eager op on a new shape, .lower().compile().
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_count = 0
_installed = False


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
    global _count
    if event == COMPILE_EVENT:
        with _lock:
            _count += 1


def install_compile_listener() -> None:
    """Start counting XLA compilations in this process (idempotent; jax has no way to remove it safely twice)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _installed = True


def compilations() -> int:
    """XLA compilations in this process since :func:`install_compile_listener` was first called."""
    with _lock:
        return _count


class _CompilationsCollector:
    def collect(self):
        yield CounterMetricFamily(
            "stejax_compilations",
            "XLA compilations in this process (jax.monitoring backend compile events), any caller.",
            value=compilations(),
        )

    def describe(self):
        return [CounterMetricFamily("stejax_compilations", "", value=0)]


# Request latencies run from well under a millisecond (one row, warm) to seconds (a split 1024-row batch).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_FILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


class Metrics:
    """The metrics of one service, in their own :class:`prometheus_client.CollectorRegistry`.

    Attributes:
      registry: what ``GET /metrics`` renders.
      latency: ``stejax_request_latency_seconds``, a histogram of ``/v1/predict``
        latencies (arrival to response body).
      requests: ``stejax_requests_total{status}``, ``/v1/predict`` requests by HTTP status.
      invalid_inputs: ``stejax_invalid_inputs_total``, requests refused for their
        body (400, 413, 415, 422 other than a non-finite output).
      nonfinite_outputs: ``stejax_nonfinite_outputs_total``, rows whose logits or
        probabilities were NaN or infinite (refused with 422).
      batch_fill: ``stejax_batch_fill_ratio``, a histogram of rows over bucket
        size per execution.
      model_info: ``stejax_model_info{version}``, 1 for the live version.
      reloads: ``stejax_reloads_total{outcome}``, admin reloads and rollbacks:
        ``swapped``, ``refused``, ``untrusted`` (the signature check refused the
        candidate), ``rolled_back``, ``rollback_refused``.
    """

    def __init__(self) -> None:
        install_compile_listener()
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram(
            "stejax_request_latency_seconds", "/v1/predict latency.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.requests = Counter("stejax_requests", "/v1/predict requests by HTTP status.", ["status"], registry=r)
        self.invalid_inputs = Counter("stejax_invalid_inputs", "Requests refused for their body.", registry=r)
        self.nonfinite_outputs = Counter("stejax_nonfinite_outputs", "Rows with non-finite outputs.", registry=r)
        self.batch_fill = Histogram(
            "stejax_batch_fill_ratio", "Rows over bucket size per execution.", buckets=_FILL_BUCKETS, registry=r
        )
        self.model_info = Gauge("stejax_model_info", "The live model version (value 1).", ["version"], registry=r)
        self.reloads = Counter("stejax_reloads", "Admin reloads and rollbacks by outcome.", ["outcome"], registry=r)
        r.register(_CompilationsCollector())
        self._version: str | None = None
        self._version_lock = threading.Lock()

    def set_version(self, version: str) -> None:
        """Make ``version`` the one ``stejax_model_info`` shows."""
        with self._version_lock:
            if self._version is not None:
                self.model_info.remove(self._version)
            self.model_info.labels(version=version).set(1)
            self._version = version
