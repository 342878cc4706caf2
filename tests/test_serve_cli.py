"""`stejax serve` on the command line: options to a ServeConfig and a source, uvicorn on 127.0.0.1 by default.

uvicorn.run is replaced by a recorder: the real server is exercised over HTTP
in test_serve.py and by benchmarks/serve.py, which runs this command.
"""

from __future__ import annotations

import pytest
import uvicorn
from click.testing import CliRunner

from stejax.cli import main


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append((app, kwargs)))
    monkeypatch.delenv("STEJAX_ADMIN_TOKEN", raising=False)
    return calls


def _service(app):
    return app.state.service


def test_defaults_bind_loopback_with_admin_off(tmp_path, recorded):
    result = CliRunner().invoke(main, ["serve", str(tmp_path)])
    assert result.exit_code == 0, result.output
    ((app, kwargs),) = recorded
    assert kwargs["host"] == "127.0.0.1" and kwargs["port"] == 8000 and kwargs["limit_concurrency"] == 256
    config = _service(app).config
    assert config.buckets == (1, 8, 32, 128) and config.admin_token is None and config.micro_batching
    assert "admin off" in result.output and str(tmp_path) in result.output
    assert not any(route.path.startswith("/admin") for route in app.routes)


def test_options_reach_the_config(tmp_path, recorded):
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    args = ["serve", str(tmp_path), "--buckets", "2,16", "--oversize", "refuse", "--port", "0"]
    args += [
        "--batch-wait-ms",
        "0.5",
        "--no-micro-batching",
        "--max-body-bytes",
        "1000",
        "--admin-token-file",
        str(token),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ((app, kwargs),) = recorded
    config = _service(app).config
    assert config.buckets == (2, 16) and config.oversize == "refuse" and config.max_rows == 16
    assert config.batch_wait_ms == 0.5 and not config.micro_batching and config.max_body_bytes == 1000
    assert config.admin_token == "from-a-file" and "from-a-file" not in result.output
    assert any(route.path == "/admin/reload" for route in app.routes)


def test_the_token_may_come_from_the_environment(tmp_path, recorded, monkeypatch):
    monkeypatch.setenv("STEJAX_ADMIN_TOKEN", "from-the-env")
    result = CliRunner().invoke(main, ["serve", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert _service(recorded[0][0]).config.admin_token == "from-the-env"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of ARTIFACT or --registry DIR"),
        (["{tmp}", "--registry", "{tmp}"], "give exactly one of ARTIFACT or --registry DIR"),
        (["{tmp}", "--buckets", "1,x"], "expected comma-separated ints, e.g. 1,8,32,128; got '1,x'"),
        (["{tmp}", "--buckets", "8,1"], "buckets must be strictly increasing; got (8, 1)"),
        (["{tmp}", "--max-rows", "4"], "max_rows must be at least the largest bucket (128); got 4"),
        (["{tmp}", "--admin-token-file", "{tmp}/empty"], "is empty"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path, recorded, args, message):
    (tmp_path / "empty").write_text("\n")
    result = CliRunner().invoke(main, ["serve", *(a.format(tmp=tmp_path) for a in args)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not recorded
