"""The conditions of a measurement: the machine, its load, and the versions of everything that ran."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import jax

__all__ = ["PACKAGES", "machine_info", "versions"]

# The distributions whose versions a benchmark report records (None: not installed).
PACKAGES = ("stejax", "jax", "jaxlib", "numpy", "optax", "flax", "qwix", "aqtp", "matplotlib")


def machine_info() -> dict[str, Any]:
    """The CPU model, its cores (all, and usable by this process), the JAX device, memory and load.

    The load average is read when called: on a shared machine it says how much
    else was running.
    """
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = jax.devices()[0]
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "device": f"{device.platform}: {device.device_kind}",
        "device_count": jax.device_count(),
        "backend": jax.default_backend(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "memory_gib": _memory_gib(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    return info


def versions() -> dict[str, str | None]:
    """``{distribution: version}`` for :data:`PACKAGES`, None where not installed (nothing is imported)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None
