"""flask-limiter and slowapi apps on redis+rl://, served over real HTTP."""

# No `from __future__ import annotations` here: FastAPI reads the endpoints'
# annotations at run time (Request, Response).

import httpx
import redis
from conftest import Server, running, serve_asgi, serve_wsgi

import redis_ratelimit_client  # noqa: F401  (the one import: registers redis+rl://)


def flask_app(uri: str, **limiter_options: object) -> object:
    from flask import Flask
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = Flask("rl-test")
    limiter = Limiter(
        get_remote_address,
        app=app,
        storage_uri=uri,
        strategy="moving-window",
        headers_enabled=True,
        **limiter_options,
    )
    shared = limiter.shared_limit("3/minute", scope="orders")

    @app.route("/hello")
    @limiter.limit("2/minute")
    def hello() -> str:
        return "hello"

    @app.route("/orders/a")
    @shared
    def orders_a() -> str:
        return "a"

    @app.route("/orders/b")
    @shared
    def orders_b() -> str:
        return "b"

    return app


def test_flask_limiter_on_redis_rl(server: Server, r: redis.Redis) -> None:
    with running(serve_wsgi(flask_app(f"redis+rl://127.0.0.1:{server.port}"))) as web:
        with httpx.Client(base_url=web.base) as http:
            first = http.get("/hello")
            assert first.status_code == 200
            assert first.headers["X-RateLimit-Limit"] == "2"
            assert first.headers["X-RateLimit-Remaining"] == "1"
            assert http.get("/hello").status_code == 200
            denied = http.get("/hello")
            assert denied.status_code == 429
            assert denied.headers["X-RateLimit-Remaining"] == "0"
            assert 1 <= int(denied.headers["Retry-After"]) <= 60
            # A shared limit: three requests across two routes.
            codes = [
                http.get(p).status_code
                for p in ("/orders/a", "/orders/b", "/orders/a", "/orders/b")
            ]
            assert codes == [200, 200, 200, 429]
    assert {r.type(k) for k in r.keys("*")} == {b"rl-slilog"}


def test_flask_limiter_swallow_errors_when_redis_dies(own_server: Server) -> None:
    app = flask_app(
        f"redis+rl://127.0.0.1:{own_server.port}",
        swallow_errors=True,
        storage_options={"socket_timeout": 1, "socket_connect_timeout": 1},
    )
    with running(serve_wsgi(app)) as web:
        with httpx.Client(base_url=web.base, timeout=10) as http:
            assert http.get("/hello").status_code == 200
            own_server.kill()
            # The storage raises; flask-limiter logs it and lets the request through.
            assert [http.get("/hello").status_code for _ in range(3)] == [200, 200, 200]


def slowapi_app(uri: str) -> object:
    from fastapi import FastAPI, Request, Response
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(
        key_func=get_remote_address, storage_uri=uri, strategy="moving-window", headers_enabled=True
    )
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)
    shared = limiter.shared_limit("3/minute", scope="orders")

    @app.get("/hello")
    @limiter.limit("2/minute")
    async def hello(request: Request, response: Response) -> dict[str, str]:
        return {"hello": "world"}

    @app.get("/orders/a")
    @shared
    async def orders_a(request: Request, response: Response) -> dict[str, str]:
        return {"a": "a"}

    @app.get("/orders/b")
    @shared
    async def orders_b(request: Request, response: Response) -> dict[str, str]:
        return {"b": "b"}

    return app


def test_slowapi_on_redis_rl(server: Server, r: redis.Redis) -> None:
    with running(serve_asgi(slowapi_app(f"redis+rl://127.0.0.1:{server.port}"))) as web:
        with httpx.Client(base_url=web.base) as http:
            first = http.get("/hello")
            assert first.status_code == 200
            assert first.headers["X-RateLimit-Limit"] == "2"
            assert first.headers["X-RateLimit-Remaining"] == "1"
            assert http.get("/hello").status_code == 200
            denied = http.get("/hello")
            assert denied.status_code == 429
            assert 1 <= int(denied.headers["Retry-After"]) <= 60
            codes = [
                http.get(p).status_code
                for p in ("/orders/a", "/orders/b", "/orders/a", "/orders/b")
            ]
            assert codes == [200, 200, 200, 429]
    assert {r.type(k) for k in r.keys("*")} == {b"rl-slilog"}
