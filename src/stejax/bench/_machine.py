"""The conditions of a measurement: the machine, its load, and the versions of everything that ran."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

import jax

__all__ = ["NOT_AVAILABLE", "PACKAGES", "cpu_model", "load_average", "machine_info", "versions"]

# The distributions whose versions a benchmark report records (None: not installed).
PACKAGES = ("stejax", "jax", "jaxlib", "numpy", "optax", "flax", "qwix", "aqtp", "matplotlib")

# What a record holds where the machine does not report a value (never a made-up "unknown" or 0.0).
NOT_AVAILABLE = "not available"
# Values that name no CPU: `uname -p` prints "unknown" on many Linux systems, and sandboxes fill fields with it.
_NO_NAME = {"", "unknown", "none", "n/a", "-"}
_CPUINFO = "/proc/cpuinfo"
_LOADAVG = "/proc/loadavg"


def _cpuinfo_fields() -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open(_CPUINFO, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the end of the first processor's block
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def _lscpu_model() -> str:
    if shutil.which("lscpu") is None:
        return ""
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"^Model name:\s*(.+)$", done.stdout, flags=re.M) if done.returncode == 0 else None
    return found.group(1).strip() if found else ""


def cpu_model() -> str:
    """The host CPU's model, or :data:`NOT_AVAILABLE` where the machine does not say.

    Read from /proc/cpuinfo's "model name", else its vendor, family and model numbers, else
    :func:`platform.processor`, else lscpu's "Model name"; a value of "unknown" counts as none.
    """
    fields = _cpuinfo_fields()
    vendor, family, model = (fields.get(k, "") for k in ("vendor_id", "cpu family", "model"))
    numbered = f"{vendor} family {family} model {model}" if vendor.lower() not in _NO_NAME and family and model else ""
    for candidate in (fields.get("model name", ""), numbered, platform.processor, _lscpu_model):
        name = (candidate() if callable(candidate) else candidate).strip()
        if name.lower() not in _NO_NAME:
            return name
    return NOT_AVAILABLE


def load_average() -> float | None:
    """The 1-minute load average, or None where the system does not report one.

    On Linux it is read from /proc/loadavg, whose fourth field counts the runnable and all scheduling
    entities: the reading process is one of the runnable, so a file that counts none was not written by a
    kernel that tracks load (a sandbox serving zeros), and its averages are not a reading.
    """
    try:
        with open(_LOADAVG, encoding="utf-8") as f:
            fields = f.read().split()
    except OSError:
        fields = None
    if fields is not None:
        try:
            running, total = (int(n) for n in fields[3].split("/"))
            one_minute = float(fields[0])
        except (IndexError, ValueError):
            return None
        return round(one_minute, 2) if running >= 1 and total >= 1 else None
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # no getloadavg on this platform, or no reading
        return None


def machine_info() -> dict[str, Any]:
    """The CPU model, its cores (all, and usable by this process), the JAX device, memory and load.

    The load average is read when called: on a shared machine it says how much
    else was running. Where the machine does not report them, the CPU model is
    :data:`NOT_AVAILABLE` and the load None (see :func:`cpu_model`, :func:`load_average`).
    """
    device = jax.devices()[0]
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "device": f"{device.platform}: {device.device_kind}",
        "device_count": jax.device_count(),
        "backend": jax.default_backend(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "memory_gib": _memory_gib(),
        "load_average_1m": load_average(),
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
