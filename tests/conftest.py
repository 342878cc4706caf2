"""Shared test setup: strict JAX numerics, helpers for exact comparisons, and shared work kept on one worker.

Under ``pytest -n 2 --dist loadgroup`` (the ``--dist`` is set in pyproject.toml) a test goes to whichever
worker is free, so a module-scoped fixture would be built once on every worker that runs one of its
module's tests, and a helper's per-process cache (the trained runs of ``artifact_runs``, the served
artifacts of ``serve_support``) once on every worker that uses it. :func:`pytest_xdist_make_scheduler`
sends such a module's tests, and all the users of one such helper, to one worker as one unit, largest
unit first; every other test is a unit of its own and goes to whichever worker is free.

(pytest-xdist's own ``loadgroup`` reads ``xdist_group`` marks by renaming each test's node id, which
pytest 9 no longer allows, so the units are computed here, from the node ids the controller sees.)
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from stejax.verify import platform_contract

from helpers import no_persistent_cache, selected_out_reason

# As equinox does: no silent dtype or rank promotion anywhere in the suite.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
# The command line turns JAX's persistent compilation cache on by default; in the suite the command line leaves it
# alone (nothing is written to the user's cache directory). The test of the option itself checks it.
os.environ["STEJAX_COMPILE_CACHE"] = "0"

# Instead the run has one persistent compilation cache of its own, in a temporary directory that the first
# process (the xdist controller, or the only process without -n) creates and removes at exit. The test workers and
# every process they start (the docs pages, the 8-device mesh, the command line's worker processes) inherit it
# through the environment, so a program that several tests or processes compile is compiled once. A program read
# from it is not a compilation: a test that counts compilations is marked ``counts_compilations`` and runs with
# the cache off (see ``_no_persistent_cache``). JAX writes an entry in place, so a process reading it at that
# instant can find it cut short: JAX then warns ("Error reading persistent compilation cache entry") and compiles
# the program itself, which pyproject.toml's filterwarnings and the docs pages' -W options let pass.
if "PYTEST_XDIST_WORKER" not in os.environ and "STEJAX_TEST_COMPILE_CACHE" not in os.environ:
    os.environ["STEJAX_TEST_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="stejax-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["STEJAX_TEST_COMPILE_CACHE"], ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["STEJAX_TEST_COMPILE_CACHE"]
    # Programs that compile in under 20 ms are not worth an entry (most of them are single operations).
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.02"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
)
jax.config.update(
    "jax_persistent_cache_min_entry_size_bytes", int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"])
)

FLOAT_DTYPES = (np.float16, ml_dtypes.bfloat16, np.float32)

# On an accelerator (``make test-device``): the platform contract decides what runs and what is expected.
CONTRACT = platform_contract()
if CONTRACT.platform != "cpu":
    # float32 references (NumPy, the exported integer forward, cached against uncached decoding) hold at float32
    # products; the backend's default precision is another contract entry, tested in test_platform.py.
    jax.config.update("jax_default_matmul_precision", "highest")
    # One process holds the device: no other process reads the run's cache, and on a TPU compressing each large
    # executable for it costs more than compiling it.
    jax.config.update("jax_enable_compilation_cache", False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Select out, with a reason that names it, what the backend under test cannot give a test."""
    if CONTRACT.platform == "cpu":
        return
    for item in items:
        reason = selected_out_reason(item.path.name, {m.name: m.args for m in item.iter_markers()}, CONTRACT)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


# Helper modules of tests/ whose results are cached per process -> the unit their users share
# (signing_support builds on artifact_runs). A module that imports several goes with the first listed.
SHARED_CACHES = {
    "artifact_runs": "artifact_runs",
    "signing_support": "artifact_runs",
    "serve_support": "serve_support",
    "mesh_support": "mesh_support",
}
_IMPORTS = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(SHARED_CACHES) + r")\b", re.MULTILINE)
_SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](?:module|class|package)["']""")


@functools.cache
def shared_unit(path: str, root: str) -> str | None:
    """The unit of the test module at ``path`` (relative to ``root``): a helper's name, itself, or None.

    None when the module builds nothing that outlives one test (no module-, class- or package-scoped
    fixture, no helper with a per-process cache): its tests are then scheduled one by one.
    """
    if not path.endswith(".py") or not Path(path).name.startswith("test_"):
        return None  # a doctest of src/stejax: nothing shared
    try:
        source = (Path(root) / path).read_text(encoding="utf-8")
    except OSError:
        return None
    helpers = _IMPORTS.findall(source)
    if helpers:
        return min((SHARED_CACHES[h] for h in helpers), key=list(SHARED_CACHES.values()).index)
    return path if _SHARED_FIXTURE.search(source) else None


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; only called by its controller
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    root = str(config.rootpath)

    class SharedWorkScheduling(LoadGroupScheduling):
        """``loadgroup`` whose groups are the shared units of :func:`shared_unit`."""

        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # an xdist_group mark, should xdist's renaming work again
                return super()._split_scope(nodeid)
            return shared_unit(nodeid.split("::", 1)[0], root) or nodeid

    return SharedWorkScheduling(config, log)


@pytest.fixture(autouse=True)
def _no_persistent_cache(request):
    if request.node.get_closest_marker("counts_compilations") is None:
        yield
        return
    with no_persistent_cache():
        yield


@pytest.fixture(params=FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    """float16, bfloat16 and float32, one test each."""
    return np.dtype(request.param)
