"""Helpers for exact comparisons shared by the test modules."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from flax import nnx

from stejax.verify import flush_subnormal_inputs, platform_contract


def no_persistent_cache() -> contextlib.AbstractContextManager[None]:
    """The run's persistent compilation cache (tests/conftest.py) off inside the block: every program compiles here.

    For a test that counts compilations, where a program read from the cache would not count.
    """
    from stejax._compile_cache import persistent_cache_off

    return persistent_cache_off()


def boundary_triplets(points, dtype) -> np.ndarray:
    """For each point: the float just below, the point itself and the float just above, in ``dtype``.

    ``np.nextafter`` is evaluated in float32 for bfloat16 (NumPy has no bfloat16
    nextafter), by stepping the bit pattern by one unit in the last place.
    """
    dtype = np.dtype(dtype)
    at = np.asarray(points, np.float64).astype(dtype)
    if dtype.itemsize == 2 and dtype.name == "bfloat16":
        bits = at.view(np.uint16).astype(np.int32)
        sign = np.where(bits & 0x8000, -1, 1)

        # Moving towards +inf: +1 ulp on the magnitude for positives, -1 for negatives.
        def step(direction):
            mag_step = direction * sign
            out = bits + mag_step
            # -0.0 moving up and +0.0 moving down cross zero.
            zero = (bits & 0x7FFF) == 0
            out = np.where(zero & (direction > 0), 0x0001, out)
            out = np.where(zero & (direction < 0), 0x8001, out)
            return out.astype(np.uint16).view(dtype)

        below, above = step(-1), step(1)
    else:
        below = np.nextafter(at, np.array(-np.inf, dtype))
        above = np.nextafter(at, np.array(np.inf, dtype))
    return np.stack([below, at, above], axis=-1).reshape(-1).astype(dtype)


def special_values(dtype) -> np.ndarray:
    """+-0, +-inf, NaN, the largest finite values and the smallest subnormals of ``dtype``."""
    dtype = np.dtype(dtype)
    info = _finfo(dtype)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny]
    out = np.array(vals, np.float64).astype(dtype)
    return out


def _finfo(dtype):
    import ml_dtypes

    return ml_dtypes.finfo(dtype)


def assert_bitwise_equal(actual, expected, *, context: str = "") -> None:
    """Equal bit for bit: signed zeros, infinities and NaN positions included."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{context}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{context}: shape {actual.shape} != {expected.shape}"
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.dtype.itemsize]
    a_nan = np.isnan(actual.astype(np.float64))
    e_nan = np.isnan(expected.astype(np.float64))
    ok_nan = a_nan == e_nan
    same_bits = actual.view(uint) == expected.view(uint)
    ok = ok_nan & (same_bits | (a_nan & e_nan))
    if not ok.all():
        idx = np.argwhere(~ok)[:5]
        rows = [f"at {tuple(i)}: got {actual[tuple(i)]!r}, expected {expected[tuple(i)]!r}" for i in idx]
        raise AssertionError(f"{context}: {int((~ok).sum())} element(s) differ bitwise; " + "; ".join(rows))


# The platform contract (stejax.verify.platform_contract): what the backend under test computes differently from
# XLA on CPU. On CPU every expectation below is the bitwise one.
CONTRACT = platform_contract()


def platform_reads(x) -> np.ndarray:
    """``x`` as the backend reads it: on a TPU, subnormal bfloat16 inputs become zeros of their sign."""
    return flush_subnormal_inputs(x, CONTRACT)


def assert_platform_equal(actual, expected, *, context: str = "") -> None:
    """Equal bit for bit where the contract says so (CPU); elsewhere within the contract's ulps of the dtype.

    For elementwise float functions (declared derivatives, transcendental formulas). NaN positions, dtype and
    shape are checked either way; the bound is ``ulps * eps * |expected| + tiny``.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    ulps = CONTRACT.ulps(actual.dtype)
    if not ulps:
        assert_bitwise_equal(actual, expected, context=context)
        return
    assert actual.dtype == expected.dtype, f"{context}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{context}: shape {actual.shape} != {expected.shape}"
    info = _finfo(actual.dtype)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    nan = np.isnan(a) & np.isnan(e)
    with np.errstate(invalid="ignore"):
        close = (a == e) | (np.abs(a - e) <= ulps * float(info.eps) * np.abs(e) + float(info.tiny))
    ok = nan | (close & ~np.isnan(a) & ~np.isnan(e))
    if not ok.all():
        idx = np.argwhere(~ok)[:5]
        rows = [f"at {tuple(i)}: got {actual[tuple(i)]!r}, expected {expected[tuple(i)]!r}" for i in idx]
        raise AssertionError(
            f"{context}: {int((~ok).sum())} element(s) beyond the {CONTRACT.platform} contract's {ulps} ulp; "
            + "; ".join(rows)
        )


@jax.jit
def apply_split(state: Any, x: Any) -> Any:
    """A split model or layer (``nnx.split``) on its input, compiled: one program a structure and shapes, the
    weights arguments. Both sides of a comparison that run through it are the same kind of program."""
    return nnx.merge(*state)(x)


@jax.jit
def apply_splits(states: Any, x: Any) -> list[Any]:
    """Several split models or layers on one input, as one compiled program (one per structure and shapes): a
    list of their outputs."""
    return [nnx.merge(*state)(x) for state in states]


_GREEDY_LOOPS: dict[tuple[str, int], tuple[bytes, ...]] = {}


def per_byte_greedy(path: Any, reference: Any, prompts: tuple[bytes, ...], tokens: int) -> tuple[bytes, ...]:
    """The per-byte loop's (``stejax.lm.generate``) greedy ``tokens`` bytes after each prompt, key 0, by
    ``reference``: computed once per artifact ``path`` and length, for every test that compares with it."""
    from stejax.lm import generate

    if (str(path), tokens) not in _GREEDY_LOOPS:
        key = jax.random.key(0)
        with jax.debug_key_reuse(False):
            loops = tuple(generate(reference, p, tokens=tokens, key=key, temperature=0).tokens for p in prompts)
        _GREEDY_LOOPS[str(path), tokens] = loops
    return _GREEDY_LOOPS[str(path), tokens]


def recurrence_allowance(expected, steps: int) -> float:
    """The absolute difference the contract allows between two programs computing one ``steps``-step recurrence.

    A platform that rounds a float32 formula differently in each program it is fused into (the contract's
    derivative ulps; 0 on CPU, where the bound is 0) may do so at every step, and each step's difference is
    carried into every later one: ``steps**2 * ulps * eps * max|expected|``. Absolute, not relative, because the
    recurrence's sums may cancel (a spike's reset subtracts).
    """
    expected = np.asarray(expected)
    ulps = CONTRACT.ulps(expected.dtype)
    return float(steps**2 * ulps * float(_finfo(expected.dtype).eps) * np.abs(expected.astype(np.float64)).max())


# Modules whose every test needs what only the CPU test machine gives (marked here, so that the modules stay as
# they are); a single test says it with @pytest.mark.needs_cpu("what").
CPU_ONLY_MODULES = {
    "test_sharding.py": "the 8-CPU-device mesh (a subprocess with XLA's host device count)",
    "test_sharding_nonfinite.py": "the 8-CPU-device mesh (a subprocess with XLA's host device count)",
    "test_multiprocess.py": "subprocesses of JAX's multi-process runtime on the CPU",
    "test_serve.py": "sockets (a served HTTP process)",
    "test_serve_cli.py": "sockets (a served HTTP process)",
    "test_serve_swap.py": "sockets (a served HTTP process)",
    "test_signing_serve.py": "sockets (a served HTTP process)",
    "test_lm_gguf.py": "llama.cpp (llama-cpp-python on the CPU)",
    "test_onnx.py": "ONNX Runtime (its CPU execution provider)",
    "test_docs.py": "subprocesses that build the documentation and run its pages",
}


def selected_out_reason(module: str, markers: dict, contract) -> str | None:
    """Why a test of ``module`` with ``markers`` (name -> args) cannot run under ``contract``; None if it can."""
    if contract.platform == "cpu":
        return None
    if "needs_float64" in markers and not contract.float64:
        return f"needs float64 programs, which {contract.platform} cannot compile"
    needs = markers["needs_cpu"][0] if markers.get("needs_cpu") else CPU_ONLY_MODULES.get(module)
    if "needs_cpu" in markers and needs is None:
        needs = "the CPU test machine"
    if needs is not None:
        return f"needs {needs}, which the {contract.platform} suite does not run"
    return None


@functools.cache
def digits_400() -> Any:
    """400 digits (a seeded choice), split 280 / 60 / 60: the tiny data of the training pipeline's tests."""
    from stejax.data import load_digits, split

    digits = load_digits()
    rows = np.sort(np.random.default_rng(0).choice(len(digits), 400, replace=False))
    small = dataclasses.replace(digits, x=digits.x[rows], y=digits.y[rows], name="digits-400")
    return split(small, seed=0)


def benchmark_script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` imported as a module (the scripts are not a package), for testing its functions."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
