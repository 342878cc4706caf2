"""The verifier: correct estimators pass, the whole catalog passes, reports are plain data.

The broken estimators, one per class of bug, are in test_verify_broken.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from stejax.estimators.catalog import CATALOG
from stejax.testing import assert_surrogate
from stejax.verify import (
    CHECK_KINDS,
    COMPOSITION_CHECKS,
    CatalogReport,
    Check,
    Report,
    check_catalog,
    check_estimator,
    check_surrogate,
    load_callable,
    write_report,
)
from stejax.verify._catalog import compile_workers

ROUND_TIES = (-2.5, -1.5, -0.5, 0.5, 1.5, 2.5)
DEFAULT_DTYPES = ("float16", "bfloat16", "float32")


def on_device(a: np.ndarray) -> jax.Array:
    # A transfer of the host array as it is (jnp.asarray of a host array compiles a program).
    return jax.device_put(a)


def failures(report: Report) -> str:
    return "\n".join(f"{c.name}: {c.detail}" for c in report.failures)


# --- estimators a user would write ---------------------------------------------------------------


@jax.custom_jvp
def readme_round(x):
    return jnp.round(x)


@readme_round.defjvp
def _readme_round_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return readme_round(x), x_dot


def _clip_forward(x):
    return jnp.clip(jnp.round(x), -1, 1)


def _clip_derivative(x):
    return (jnp.abs(x) <= 1).astype(x.dtype)


clip_round = stejax.surrogate(_clip_forward, _clip_derivative, name="clip_round")


def _step_forward(x, step):
    return jnp.clip(jnp.round(x / step), -7, 7) * step


def _step_derivative(x, step):
    v = x / step
    inside = jnp.abs(v) <= 7
    return inside.astype(x.dtype), jnp.where(inside, jnp.round(v) - v, jnp.clip(v, -7, 7))


step_quant = stejax.surrogate(_step_forward, _step_derivative, name="step_quant", diff_argnums=(0, 1))


def _centred_tangent(x, *, tangents):
    (t,) = tangents
    return t - jnp.mean(t, axis=-1, keepdims=True)


centred_round = stejax.surrogate(jnp.round, tangent=_centred_tangent, name="centred_round")


def centred_map(args, tangents):
    return _centred_tangent(*args, tangents=tangents)


# The reports of the estimators above, made once for the module: several at once where check_catalog would
# compile several at once (one at a time on two cores), each the report the call makes alone.
SURROGATE_CALLS = {
    "readme": lambda: check_surrogate(
        readme_round, reference=jnp.round, derivative=jnp.ones_like, boundaries=ROUND_TIES
    ),
    "clip_round": lambda: check_surrogate(
        clip_round,
        reference=_clip_forward,
        derivative=_clip_derivative,
        boundaries=(-1.0, 0.0, 1.0),
        invalid=[((on_device(np.arange(4, dtype=np.int32)),), TypeError), ((on_device(np.ones(3, bool)),), TypeError)],
    ),
    # diff_argnums comes from the estimator (surrogate sets it); the step keeps its value in every dtype.
    "step_quant": lambda: check_surrogate(
        step_quant,
        reference=_step_forward,
        derivative=_step_derivative,
        args=(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4), np.float32(0.25)),
        boundaries=tuple((k + 0.5) * 0.25 for k in range(-8, 8)),
        composition_dtypes="widest",
    ),
    "centred_round": lambda: check_surrogate(
        centred_round, reference=jnp.round, tangent_map=centred_map, args=(np.zeros((2, 8), np.float32),)
    ),
    # The rule passes the tangent straight through; the declaration centres it.
    "round_ste with a centring map": lambda: check_surrogate(
        stejax.round_ste,
        reference=jnp.round,
        tangent_map=centred_map,
        args=(np.zeros((2, 8), np.float32),),
        dtypes=("float32",),
    ),
}


@pytest.fixture(scope="module")
def surrogate_reports():
    workers = compile_workers()
    if workers == 1:
        return {name: call() for name, call in SURROGATE_CALLS.items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(call) for name, call in SURROGATE_CALLS.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def readme_report(surrogate_reports):
    return surrogate_reports["readme"]


# --- correct estimators pass ---------------------------------------------------------------------


def test_readme_custom_jvp_round_passes(readme_report):
    assert readme_report.ok, failures(readme_report)
    names = set(readme_report.names())
    for dtype in DEFAULT_DTYPES:
        for kind in CHECK_KINDS:
            assert f"{kind}[{dtype}]" in names
    assert readme_report.subject == "readme_round"


def test_estimator_made_with_surrogate_passes_and_rejects_integers(surrogate_reports):
    report = surrogate_reports["clip_round"]
    assert report.ok, failures(report)
    assert report["invalid[0]"].dtype is None
    assert "raised TypeError" in report["invalid[0]"].detail


def test_two_differentiable_arguments_with_example_args(surrogate_reports):
    report = surrogate_reports["step_quant"]
    assert report.ok, failures(report)
    assert report.environment["diff_argnums"] == (0, 1)
    assert report.environment["composition_dtypes"] == ("float32",)
    assert "vmap[float32]" in report.names() and "vmap[bfloat16]" not in report.names()
    assert "argument 1" in report["tangent[bfloat16]"].detail


def test_tangent_map_declaration(surrogate_reports):
    report = surrogate_reports["centred_round"]
    assert report.ok, failures(report)
    assert report.environment["declaration"] == "tangent_map"


def test_tangent_map_that_the_rule_ignores_is_caught(surrogate_reports):
    report = surrogate_reports["round_ste with a centring map"]
    assert "tangent[float32]" in {c.name for c in report.failures}


@pytest.mark.needs_float64
def test_float64_under_x64():
    with jax.enable_x64(True):
        report = check_surrogate(readme_round, reference=jnp.round, derivative=jnp.ones_like, boundaries=ROUND_TIES)
    assert report.ok, failures(report)
    assert report.environment["x64"] is True
    assert "forward_bitwise[float64]" in report.names()
    assert report.environment["tolerances"]["float64"]["eps"] == 2.0**-52


# --- check_surrogate never raises because fn misbehaves ---------------------------------------------


def _raises(x):
    raise ValueError("this estimator is broken")


def _wrong_shape(x):
    return jnp.round(x)[1:]


def _returns_tuple(x):
    return jnp.round(x), jnp.round(x)


@pytest.mark.parametrize(
    ("fn", "words"),
    [(_raises, "raised ValueError: this estimator is broken"), (_wrong_shape, "shape"), (_returns_tuple, "tuple")],
    ids=["raises", "wrong shape", "tuple"],
)
def test_misbehaving_function_gives_failed_checks_not_exceptions(fn, words):
    report = check_surrogate(fn, reference=jnp.round, derivative=jnp.ones_like, dtypes=("float32",))
    assert not report.ok
    assert len(report.checks) == len(CHECK_KINDS)
    forward = report["forward_bitwise[float32]"]
    assert not forward.passed and words in forward.detail, forward.detail
    assert all(c.detail for c in report.checks)


def test_invalid_cases_that_do_not_raise_fail():
    report = check_surrogate(
        lambda x: jnp.round(x),
        reference=jnp.round,
        derivative=jnp.ones_like,
        dtypes=("float32",),
        invalid=[
            ((on_device(np.arange(3, dtype=np.int32)),), TypeError),
            ((on_device(np.ones(2, np.float32)),), KeyError),
        ],
    )
    assert not report["invalid[0]"].passed
    assert "returned int32[3]; expected TypeError" in report["invalid[0]"].detail
    assert "expected KeyError" in report["invalid[1]"].detail


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(derivative=jnp.ones_like, tangent_map=centred_map), ValueError, "exactly one of"),
        (dict(), ValueError, "exactly one of"),
        (dict(derivative=jnp.ones_like, dtypes=("int32",)), ValueError, "must be floating"),
        (dict(derivative=jnp.ones_like, dtypes=("float64",)), ValueError, "float64 needs 64-bit JAX"),
        (dict(derivative=1.0), TypeError, "`derivative` must be callable"),
        (dict(derivative=jnp.ones_like, invalid=[(1, 2)]), TypeError, r"\(arguments, exception type\)"),
        (dict(derivative=jnp.ones_like, boundaries=["a"]), TypeError, "`boundaries` must be numbers"),
    ],
)
def test_misuse_of_the_verifier_raises(kwargs, error, match):
    with pytest.raises(error, match=match):
        check_surrogate(jnp.round, reference=jnp.round, **kwargs)


# --- reports ----------------------------------------------------------------------------------------


def test_report_is_frozen_plain_data(readme_report):
    with pytest.raises(dataclasses.FrozenInstanceError):
        readme_report.subject = "other"  # type: ignore[misc]
    check = readme_report["tangent[bfloat16]"]
    assert isinstance(check, Check) and check.kind == "tangent" and check.dtype == "bfloat16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        check.passed = False  # type: ignore[misc]
    with pytest.raises(KeyError, match="no check named 'nope'"):
        readme_report["nope"]
    with pytest.raises(TypeError):
        readme_report.environment["x64"] = True  # type: ignore[index]


def test_report_environment_and_serialisations(readme_report):
    env = readme_report.environment
    for key in ("platform", "device_kind", "jax", "jaxlib", "x64", "tolerances", "dtypes", "seed"):
        assert key in env
    assert env["jax"] == jax.__version__
    assert env["tolerances"]["bfloat16"]["eps"] == 2.0**-7
    assert env["tolerances"]["float16"]["tangent_ulps"] == 4
    data = json.loads(readme_report.to_json())
    assert data == readme_report.to_dict()
    assert data["ok"] is True and len(data["checks"]) == len(readme_report.checks)
    md = readme_report.to_markdown()
    assert md.startswith("# stejax verify: readme_round")
    assert "| `tangent[bfloat16]` | pass |" in md
    assert "### Tolerances" in md


def test_failed_report_markdown_shows_the_failure():
    report = check_surrogate(_raises, reference=jnp.round, derivative=jnp.ones_like, dtypes=("float32",))
    md = report.to_markdown()
    assert "**FAIL**" in md and "| FAIL |" in md and "ValueError" in md
    assert json.loads(report.to_json())["ok"] is False


# --- the catalog -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalog_report():
    start = time.perf_counter()
    report = check_catalog()
    report_seconds = time.perf_counter() - start
    print(f"\ncheck_catalog: {len(report)} estimators in {report_seconds:.1f} s")
    return report


@pytest.mark.parametrize("name", list(CATALOG))
def test_catalog_member_has_no_false_alarm(catalog_report, name):
    report = catalog_report[name]
    assert report.ok, failures(report)
    assert report["invalid[0]"].passed and report["invalid[1]"].passed
    # At the defaults every check runs in every dtype, the compositions in the widest.
    for dtype in DEFAULT_DTYPES:
        for kind in CHECK_KINDS:
            expected = dtype == "float32" or kind not in COMPOSITION_CHECKS
            assert (f"{kind}[{dtype}]" in report.names()) == expected, (kind, dtype)


def test_catalog_report_writes_json_and_markdown(catalog_report, tmp_path):
    assert isinstance(catalog_report, CatalogReport)
    assert list(catalog_report) == list(CATALOG)
    json_path, md_path = write_report(catalog_report, tmp_path / "out")
    assert json_path.name == "verify-report.json" and md_path.name == "verify-report.md"
    data = json.loads(json_path.read_text())
    assert set(data["estimators"]) == set(CATALOG)
    assert data["ok"] is catalog_report.ok
    md = md_path.read_text()
    for name in CATALOG:
        assert f"| `{name}` |" in md


def test_check_estimator_accepts_an_entry_and_one_parameter_set():
    entry = CATALOG["round_ste"]
    report = check_estimator(entry, dtypes=("bfloat16",), params={})
    assert report.ok, failures(report)
    assert report.subject == "round_ste"
    assert report.environment["family"] == "rounding"


def test_check_estimator_catches_an_untruthful_entry():
    entry = dataclasses.replace(CATALOG["round_ste"], derivative=lambda x: 2 * jnp.ones_like(x))
    report = check_estimator(entry, dtypes=("float32",))
    assert "tangent[float32]" in {c.name for c in report.failures}


def test_check_estimator_reports_metadata_that_raises():
    def broken_boundaries(**_):
        raise RuntimeError("no boundaries here")

    entry = dataclasses.replace(CATALOG["floor_ste"], boundaries=broken_boundaries)
    report = check_estimator(entry, dtypes=("float32",))
    assert not report.ok
    assert "RuntimeError: no boundaries here" in report["metadata[defaults]"].detail


def test_check_estimator_unknown_name():
    with pytest.raises(KeyError, match="no estimator named 'nope'"):
        check_estimator("nope")


# --- loading MODULE:FUNC and the pytest helper --------------------------------------------------------


def test_load_callable():
    assert load_callable("stejax:round_ste") is stejax.round_ste
    assert load_callable("os.path:join").__name__ == "join"
    assert load_callable("stejax.verify:Report.to_json") is Report.to_json


def test_load_callable_from_a_directory(tmp_path):
    (tmp_path / "my_estimators_for_stejax.py").write_text("def f(x):\n    return x\n")
    f = load_callable("my_estimators_for_stejax:f", path=tmp_path)
    assert f(3) == 3
    assert str(tmp_path) not in __import__("sys").path


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("stejax.round_ste", ValueError, "expected MODULE:FUNC"),
        ("stejax:", ValueError, "expected MODULE:FUNC"),
        ("no_such_module_stejax:f", ImportError, "cannot import module 'no_such_module_stejax'"),
        ("stejax:no_such_name", AttributeError, "has no attribute 'no_such_name'"),
        ("stejax:__version__", TypeError, "names a str, not a callable"),
    ],
)
def test_load_callable_errors(spec, error, match):
    with pytest.raises(error, match=match):
        load_callable(spec)


def test_assert_surrogate_passes_and_fails():
    report = assert_surrogate(
        stejax.floor_ste, reference=jnp.floor, derivative=jnp.ones_like, boundaries=(0.0, 1.0), dtypes=("float32",)
    )
    assert report.ok

    def double(x):
        return 2 * jnp.ones_like(x)

    with pytest.raises(AssertionError, match=r"(?s)checks failed.*tangent\[float32\]: .*differ"):
        assert_surrogate(stejax.floor_ste, reference=jnp.floor, derivative=double, dtypes=("float32",))


# Run in a fresh process: compilations are counted from empty caches, and clearing the caches of the suite's own
# process (jax.clear_caches) would make every later test there compile its programs again.
_WARM_UP_CHILD = """
import collections, json, threading
import jax
jax.config.update("jax_enable_compilation_cache", False)  # a program read from a cache is not compiled
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
import stejax.verify._catalog as catalog

catalog.compile_workers = lambda: 2
calling, threads = threading.get_ident(), collections.Counter()

def listen(event, duration_secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        threads["calling" if threading.get_ident() == calling else "worker"] += 1

jax.monitoring.register_event_duration_secs_listener(listen)
reports = catalog.check_catalog(names=["magnitude_aware_sign", "ternary"], dtypes=("float16",))
print(json.dumps({"ok": reports.ok, "threads": threads}))
"""


@pytest.mark.needs_cpu("a fresh process (it counts the programs compiled from empty caches)")
def test_check_catalog_compiles_the_eager_checks_operations_in_its_workers():
    # Each worker runs the estimator and its reference once eagerly after compiling its program, so the calling
    # thread finds the single operations of the eager checks compiled.
    done = subprocess.run([sys.executable, "-c", _WARM_UP_CHILD], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["ok"], got
    assert got["threads"].get("worker", 0) > 2 and got["threads"].get("calling", 0) == 0, got


def test_check_catalog_compiles_several_programs_at_once_in_catalog_order(monkeypatch):
    assert [compile_workers(n) for n in (1, 2, 3, 5, 8, 13, 64)] == [1, 1, 1, 2, 3, 4, 4]
    monkeypatch.setattr("stejax.verify._catalog.compile_workers", lambda: 2)
    names = ["ceil_ste", "round_ste", "floor_ste"]
    reports = check_catalog(names=names, dtypes=("bfloat16",))
    assert list(reports) == names
    for name in names:
        assert reports[name].ok, failures(reports[name])
        assert reports[name].subject == name
