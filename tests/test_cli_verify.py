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


def test_verify_a_catalog_member_writes_the_reports(tmp_path):
    result = _invoke("round_ste", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "verify-report.json").read_text(encoding="utf-8"))
    assert report["ok"] is True
    assert "forward_bitwise" in (tmp_path / "verify-report.md").read_text(encoding="utf-8")


def test_verify_a_user_estimator(user_dir):
    args = ["--reference", "user_estimators:reference", "--derivative", "user_estimators:derivative"]
    ok = _invoke("user_estimators:my_round", *args, "--boundary", "0.5", "--boundary", "1.5")
    assert ok.exit_code == 0, ok.output
    assert (user_dir / "verify-report.json").exists()
    broken = _invoke("user_estimators:scaled_round", *args, "--boundary", "0.5")
    assert broken.exit_code == 1, broken.output
    assert "tangent" in broken.output


def test_verify_usage_errors(user_dir):
    assert _invoke().exit_code == 2
    assert _invoke("user_estimators:my_round").exit_code == 2
    unknown = _invoke("round_sté")
    assert unknown.exit_code == 2 and "round_ste" in unknown.output
