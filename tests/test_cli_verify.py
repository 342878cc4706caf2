"""`stejax verify`: a catalog member, a user's estimator, a broken one."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from stejax.cli import main

USER_MODULE = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def my_round(x):
        return jnp.round(x)

    @my_round.defjvp
    def _my_round_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return my_round(x), t

    @jax.custom_jvp
    def scaled_round(x):
        return jnp.round(x)

    @scaled_round.defjvp
    def _scaled_round_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return scaled_round(x), 2 * t

    def reference(x):
        return jnp.round(x)

    def derivative(x):
        return jnp.ones_like(x)
    """
)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "user_estimators.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _invoke(*args):
    return CliRunner().invoke(main, ["verify", *args])


@pytest.fixture(scope="module")
def catalog_member(tmp_path_factory):
    """``stejax verify floor_ste --out DIR``, run once: (the result, DIR)."""
    out = tmp_path_factory.mktemp("verify")
    return _invoke("floor_ste", "--out", str(out)), out


def test_verify_a_catalog_member_writes_the_reports(catalog_member):
    result, out = catalog_member
    assert result.exit_code == 0, result.output
    report = json.loads((out / "verify-report.json").read_text(encoding="utf-8"))
    assert report["ok"] is True
    assert "forward_bitwise" in (out / "verify-report.md").read_text(encoding="utf-8")


def test_verify_a_user_estimator(user_dir):
    args = ["--reference", "user_estimators:reference", "--derivative", "user_estimators:derivative"]
    ok = _invoke("user_estimators:my_round", *args, "--boundary", "0.5", "--boundary", "1.5")
    assert ok.exit_code == 0, ok.output
    # Without --out the summary is printed and nothing is written (not even into the working directory).
    assert "passed" in ok.output and "wrote" not in ok.output
    assert not (user_dir / "verify-report.json").exists() and not (user_dir / "verify-report.md").exists()
    broken = _invoke("user_estimators:scaled_round", *args, "--boundary", "0.5")
    assert broken.exit_code == 1, broken.output
    # The first failing check of each dtype, on that dtype's one line.
    assert "my_round" not in broken.output and "FAILED: tangent[float32]: " in " ".join(broken.output.split())


def test_verify_usage_errors(user_dir):
    assert _invoke().exit_code == 2
    assert _invoke("user_estimators:my_round").exit_code == 2
    unknown = _invoke("round_sté")
    assert unknown.exit_code == 2 and "round_ste" in unknown.output


def test_verify_prints_one_line_per_dtype(catalog_member):
    result, _ = catalog_member
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    per_dtype = [line for line in lines if line.startswith("floor_ste, ")]
    assert [line.split(":")[0] for line in per_dtype] == [
        f"floor_ste, {where}" for where in ("float16", "bfloat16", "float32", "checks tied to no dtype")
    ]
    assert all(line.endswith(" passed") and " of " in line for line in per_dtype), per_dtype
    wrote = next(i for i, line in enumerate(lines) if line.startswith("wrote "))  # a long path may wrap
    assert wrote == len(per_dtype) + 2  # then the summary and the platform
    assert "tangent[" not in result.output


def test_verify_long_prints_one_table_per_dtype():
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["verify", "floor_ste", "--long"])
    assert result.exit_code == 0, result.output
    for dtype in ("float16", "bfloat16", "float32"):
        assert f"floor_ste, {dtype}: " in result.output
        # The check names keep their dtype (rich markup would have eaten "[float16]").
        assert f"tangent[{dtype}]" in result.output


def test_verify_a_user_estimator_from_a_file(user_dir):
    args = ["--reference", "./user_estimators.py:reference", "--derivative", "./user_estimators.py:derivative"]
    ok = _invoke("./user_estimators.py:my_round", *args, "--boundary", "0.5")
    assert ok.exit_code == 0, ok.output
    missing = _invoke("./nothere.py:f", *args)
    assert missing.exit_code == 2 and "nothere.py: does not exist" in missing.output


@pytest.mark.parametrize(
    "extra", [["--reference", "m:f"], ["--derivative", "m:f"], ["--boundary", "0.5"], ["--reference", "m:f", "--all"]]
)
def test_user_estimator_options_with_a_catalog_name_are_an_error(extra, tmp_path):
    args = ["--out", str(tmp_path), *extra] if "--all" in extra else ["round_ste", "--out", str(tmp_path), *extra]
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    assert "apply to a user's estimator (MODULE:FUNC) only" in result.output
    assert not (tmp_path / "verify-report.json").exists()
