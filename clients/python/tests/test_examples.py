"""The examples a user pastes, served for real against the module."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import redis
from conftest import Server, has_block, running, serve_asgi, serve_wsgi

from redis_ratelimit_client.request import Request

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str, server: Server, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("RL_REDIS", f"127.0.0.1:{server.port}")
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def burst(base: str, n: int, headers: dict[str, str] | None = None) -> list[int]:
    with httpx.Client(base_url=base) as http:
        return [http.get("/", headers=headers or {}).status_code for _ in range(n)]


def test_flask_example(server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    app = load("flask_app", server, monkeypatch).app
    with running(serve_wsgi(app)) as web:
        codes = burst(web.base, 7)
    assert codes.count(200) == 5 and codes[-1] == 429


def test_slowapi_example(server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    app = load("fastapi_slowapi", server, monkeypatch).app
    with running(serve_asgi(app)) as web:
        codes = burst(web.base, 7)
    assert codes.count(200) == 5 and codes[-1] == 429


def test_middleware_example(
    server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INSTANCES", "1")
    monkeypatch.setenv("RL_DEADLINE", "0.5")
    app = load("asgi_middleware", server, monkeypatch).app
    with running(serve_asgi(app)) as web:
        codes = burst(web.base, 7, {"x-user": "alice"})
    assert codes[:5] == [200] * 5 and codes[-1] == 429
    assert os.environ["RL_REDIS"].endswith(str(server.port))


def test_report_workers_example(
    server: Server,
    r: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not has_block(r):
        pytest.skip("the module has no BLOCK yet")
    module = load("report_workers", server, monkeypatch)
    assert module.main() == 0
    assert capsys.readouterr().out.strip() == "6 reports, at most 2 at once"
    assert module.rl.concurrency("rl:reports", 2, 10_000, Request.cost(0)).remaining == 2
