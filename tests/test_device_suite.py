"""The device suite's runner (benchmarks/device_suite.py): programs compiled once per run, compilations counted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import compiler

from stejax.bench import CompileCounter


def _suite():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device_suite.py"
    spec = importlib.util.spec_from_file_location("device_suite", path)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    return suite


def _fresh(k):
    return jax.jit(lambda x: jnp.sin(x) * 3 + k)  # a new function each call, the same program for the same k


def test_a_program_built_again_is_compiled_once_and_gives_the_same_result():
    suite = _suite()
    counter = suite.Counter()
    counter.pytest_runtest_logstart("tests/test_x.py::t", None)
    x = jnp.linspace(-2.0, 2.0, 11, dtype=jnp.float32)
    alone = np.asarray(_fresh(0.25)(x))
    original = compiler.compile_or_get_cached
    with suite.SharedPrograms(counter) as shared:
        assert compiler.compile_or_get_cached is not original
        with CompileCounter() as programs:
            outs = [np.asarray(_fresh(0.25)(x)) for _ in range(3)]
            other = np.asarray(_fresh(0.5)(x))  # another constant: another program
    assert compiler.compile_or_get_cached is original
    for out in outs:
        np.testing.assert_array_equal(out, alone)
    np.testing.assert_array_equal(other, np.asarray(_fresh(0.5)(x)))
    assert programs.count == 4 and shared.shared == 2 and counter.shared == {"tests/test_x.py": 2}
    assert not shared.executables  # nothing outlives the block
    with CompileCounter() as after:
        _fresh(0.25)(x).block_until_ready()
    assert after.count == 1


def test_a_program_with_a_host_callback_is_compiled_every_time():
    suite = _suite()
    x = jnp.arange(4, dtype=jnp.float32)

    def fresh():
        return jax.jit(lambda x: jax.pure_callback(np.negative, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1)

    with suite.SharedPrograms() as shared:
        outs = [np.asarray(fresh()(x)) for _ in range(2)]
    assert shared.shared == 0
    np.testing.assert_array_equal(outs[0], 1 - np.arange(4))
    np.testing.assert_array_equal(outs[1], outs[0])


def test_the_counter_gives_each_module_its_compilations():
    suite = _suite()
    counter = suite.Counter()
    counter.listen(suite.COMPILE_EVENT, 0.5)
    counter.pytest_runtest_logstart("tests/test_a.py::one", None)
    counter.listen(suite.COMPILE_EVENT, 0.25)
    counter.listen(suite.COMPILE_EVENT, 0.25)
    counter.listen("/jax/some/other/event", 3.0)
    counter.listen_event(suite.CACHE_HIT_EVENT)
    counter.pytest_collection_finish(type("S", (), {"items": [type("I", (), {"nodeid": "tests/test_a.py::one"})]}))
    (row,) = counter.rows()
    assert counter.programs == {"(collection)": 1, "tests/test_a.py": 2}
    assert {k: row[k] for k in ("programs", "compiles", "cache_hits", "shared", "compile_seconds")} == {
        "programs": 2,
        "compiles": 1,
        "cache_hits": 1,
        "shared": 0,
        "compile_seconds": 0.5,
    }
