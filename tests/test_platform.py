"""The platform contract: declared per backend, measured on the backend under test, and used by the verifier."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from stejax.verify import measure_platform, platform_contract
from stejax.verify._compare import Expected, mismatches, unequal
from stejax.verify._tolerance import Tolerance

from helpers import CONTRACT, selected_out_reason


@pytest.fixture(scope="module")
def measured():
    return measure_platform()


def test_the_backend_under_test_keeps_its_contract(measured):
    assert measured["platform"] == CONTRACT.platform
    declared = CONTRACT.function_ulps
    assert declared is not None, f"the {CONTRACT.platform} contract declares no function ulps"
    for dtype, row in measured["function_ulps"].items():
        for function, ulps in row.items():
            assert ulps <= declared[dtype][function], (
                f"{function} in {dtype}: {ulps} ulp from XLA:CPU, the {CONTRACT.platform} contract states "
                f"{declared[dtype][function]}"
            )
    assert set(measured["subnormal_inputs_read_as_zero"]) == set(CONTRACT.subnormal_inputs_read_as_zero)


def test_matmul_precision_is_as_declared(measured):
    errors = measured["matmul_relative_error"]
    assert errors["default"] <= CONTRACT.matmul_relative_error, errors
    # "highest" is float32 accuracy everywhere: what the device suite runs under.
    assert errors["highest"] <= 1e-5, errors


def test_cpu_is_the_bitwise_reference_and_tpu_declares_its_differences():
    cpu, tpu = platform_contract("cpu"), platform_contract("tpu")
    assert cpu.bitwise and cpu.float64 and cpu.tested
    assert not tpu.bitwise and not tpu.float64 and tpu.tested
    assert tpu.subnormal_inputs_read_as_zero == ("bfloat16",)
    assert tpu.ulps(np.float32) == 4 and tpu.ulps(ml_dtypes.bfloat16) == tpu.ulps(np.float16) == 1
    # tanh's worst absolute error on results up to 1: 1211 ulps of float32.
    assert tpu.function_error("tanh") == 1211 * 2.0**-23 and cpu.function_error("tanh") == 0.0
    with pytest.raises(ValueError, match="no 'cosh' in float32 in the tpu contract"):
        tpu.function_error("cosh")
    with pytest.raises(ValueError, match="the gpu contract has no measured function ulps"):
        platform_contract("gpu").function_error("tanh")
    assert platform_contract("cuda") is platform_contract("gpu") and not platform_contract("gpu").tested


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match=r"no platform contract for backend 'ipu': expected one of \['cpu', 'gpu'"):
        platform_contract("ipu")


def _declared(value, dtype):
    v = np.asarray(value, np.float64)
    return Expected(value=v, magnitude=np.abs(v), exact=np.ones(v.shape, bool), ulps=4, floor=0.0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_verifier_takes_its_allowance_from_the_contract(dtype):
    dtype = np.dtype(dtype)
    eps = float(ml_dtypes.finfo(dtype).eps)
    exact = np.array([1.5, -0.75])
    ulp = eps * 2.0 ** np.floor(np.log2(np.abs(exact)))  # one unit in the last place of each value
    one_ulp, far = exact + np.sign(exact) * ulp, exact + np.sign(exact) * 8 * ulp
    cpu, tpu = Tolerance.of(dtype, platform_contract("cpu")), Tolerance.of(dtype, platform_contract("tpu"))
    assert cpu.platform_ulps == 0 and tpu.platform_ulps == platform_contract("tpu").ulps(dtype)
    # On CPU a representable declared value must be met exactly; under the TPU contract within its ulps.
    assert mismatches(one_ulp.astype(dtype), _declared(exact, dtype), dtype, cpu).all()
    assert not mismatches(one_ulp.astype(dtype), _declared(exact, dtype), dtype, tpu).any()
    # Beyond the contract is still a failure: the allowance is the contract's, not a blanket tolerance.
    assert mismatches(far.astype(dtype), _declared(exact, dtype), dtype, tpu).all()
    assert unequal(one_ulp, exact, cpu).all() and not unequal(one_ulp, exact, tpu).any()
    assert unequal(far, exact, tpu).all()
    assert tpu.to_dict()["platform"] == "tpu" and "the tpu contract" in tpu.to_dict()["tangent"]


def test_what_an_accelerator_selects_out_names_what_it_needs():
    tpu, cpu = platform_contract("tpu"), platform_contract("cpu")
    assert selected_out_reason("test_binary.py", {"needs_float64": ()}, tpu) == (
        "needs float64 programs, which tpu cannot compile"
    )
    assert selected_out_reason("test_serve.py", {}, tpu) == (
        "needs sockets (a served HTTP process), which the tpu suite does not run"
    )
    assert selected_out_reason("test_x.py", {"needs_cpu": ("ONNX Runtime",)}, tpu).startswith("needs ONNX Runtime")
    assert selected_out_reason("test_binary.py", {}, tpu) is None
    # The GPU contract has float64; on the CPU nothing is selected out.
    assert selected_out_reason("test_binary.py", {"needs_float64": ()}, platform_contract("gpu")) is None
    assert selected_out_reason("test_serve.py", {"needs_float64": ()}, cpu) is None


def test_the_device_suite_counts_each_test_once_and_names_its_failures():
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device_suite.py"
    spec = importlib.util.spec_from_file_location("device_suite", path)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)

    def report(nodeid, when, outcome, longrepr=None):
        return pytest.TestReport(nodeid, (nodeid, 0, nodeid), {}, outcome, longrepr, when, duration=0.5)

    crash = SimpleNamespace(reprcrash=SimpleNamespace(message="assert 4.3646 ==\n 4.3645 ± 4e-06"))
    counter = suite.Counter()
    collected = ["tests/test_a.py::ok", "tests/test_a.py::bad", "tests/test_b.py::f64", "tests/test_c.py::late"]
    counter.pytest_collection_finish(SimpleNamespace(items=[SimpleNamespace(nodeid=n) for n in collected]))
    for r in (
        report("tests/test_a.py::ok", "setup", "passed"),
        report("tests/test_a.py::ok", "call", "passed"),
        report("tests/test_a.py::ok", "teardown", "passed"),
        report("tests/test_a.py::bad", "setup", "passed"),
        report("tests/test_a.py::bad", "call", "failed", crash),
        report("tests/test_a.py::bad", "teardown", "passed"),
        report("tests/test_b.py::f64", "setup", "skipped", ("x.py", 1, "Skipped: needs float64")),
        report("tests/test_b.py::f64", "teardown", "passed"),
    ):
        counter.pytest_runtest_logreport(r)
    rows = {r["module"]: r for r in counter.rows()}
    assert {k: rows["tests/test_a.py"][k] for k in ("tests", "passed", "failed", "selected_out", "not_run")} == {
        "tests": 2,
        "passed": 1,
        "failed": 1,
        "selected_out": 0,
        "not_run": 0,
    }
    # A module the run never reached (stopped at its time limit) is a row of tests not run.
    assert {k: rows["tests/test_c.py"][k] for k in ("tests", "not_run", "run_share")} == {
        "tests": 1,
        "not_run": 1,
        "run_share": 0.0,
    }
    assert rows["tests/test_a.py"]["failures"] == {"tests/test_a.py::bad": "call: assert 4.3646 == 4.3645 ± 4e-06"}
    assert rows["tests/test_b.py"]["selected_out"] == 1 and rows["tests/test_b.py"]["run_share"] == 0.0
    assert counter.reason == {"tests/test_b.py::f64": "Skipped: needs float64"}
