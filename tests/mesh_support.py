"""One subprocess with 8 host CPU devices, shared by the test modules that need a mesh, run once per process.

XLA's device count is fixed when JAX starts, so work on a mesh of 8 host devices runs in a subprocess
started with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``: this file run as a script. Each
module in :data:`MODULES` defines ``mesh_work(out: dict) -> None``, which fills ``out`` with plain JSON
values; the subprocess runs them all in order (one JAX start-up, one data load, and the compiled programs
they share), prints one JSON document ``{module: out}``, and :func:`mesh_results` hands a module its part.

The conftest scheduler keeps every importer of this helper on one worker, so the subprocess runs once.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

N_DEVICES = 8
# The modules whose ``mesh_work`` the subprocess runs, in this order.
MODULES = ("test_sharding", "test_sharding_nonfinite", "test_lm_train_scale")
# A real hang fails rather than waits forever; the work takes about 100 CPU-s.
TIMEOUT_S = 900


@functools.cache
def _all_results() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={N_DEVICES}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def mesh_results(module: str) -> dict:
    """What ``module``'s ``mesh_work`` wrote, from the one shared 8-device subprocess."""
    if module not in MODULES:
        raise ValueError(f"mesh_results: expected a module of {MODULES}; got {module!r}")
    return _all_results()[module]


def main() -> None:
    import jax

    # The suite's strict settings (tests/conftest.py), in the subprocess too.
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    results = {}
    for name in MODULES:
        out: dict = {"device_count": jax.device_count()}
        importlib.import_module(name).mesh_work(out)
        results[name] = out
    print(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
