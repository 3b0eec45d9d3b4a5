"""Every storage URI that `limits` has for plain Redis, with `+rl`: TLS, a
Unix socket, Sentinel in asyncio; each against a real server with the module.
A URI without a host says so."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Sentinel, Server, free_port
from limits import parse, strategies
from limits.aio import strategies as aio_strategies
from limits.errors import ConfigurationError
from limits.storage import storage_from_string

import redis_ratelimit_client  # noqa: F401  (registers the schemes)
from redis_ratelimit_client import AsyncRLStorage, RLStorage


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[Server, int]]:
    """A server with the module on a TLS port too (a self-signed certificate)."""
    tls_port = free_port()
    certs = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rl-py-tls-{tls_port}")
    os.makedirs(certs, exist_ok=True)
    cert, key = os.path.join(certs, "cert.pem"), os.path.join(certs, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
    )
    s = Server(
        args=["--tls-port", str(tls_port), "--tls-cert-file", cert, "--tls-key-file", key]
        + ["--tls-auth-clients", "no"]
    )
    yield s, tls_port
    s.stop()


@pytest.fixture
def unix_server() -> Iterator[tuple[Server, str]]:
    sock = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rl-py-{free_port()}.sock")
    s = Server(args=["--unixsocket", sock, "--unixsocketperm", "700"])
    yield s, sock
    s.stop()


def one_per_minute(storage: Any) -> list[bool]:
    limiter = strategies.MovingWindowRateLimiter(storage)
    return [limiter.hit(parse("1/minute"), "k") for _ in range(2)]


def one_per_minute_async(storage: Any) -> list[bool]:
    async def go() -> list[bool]:
        limiter = aio_strategies.MovingWindowRateLimiter(storage)
        return [await limiter.hit(parse("1/minute"), "k") for _ in range(2)]

    return asyncio.run(go())


def native_keys(server: Server) -> list[bytes]:
    """The storage's keys on `server` that hold the native sliding log (then deleted)."""
    c = server.client()
    keys = [k for k in c.keys("LIMITS:*") if c.type(k) == b"rl-slilog"]
    if keys:
        c.delete(*keys)
    return keys


def test_rediss_rl_over_tls(tls_server: tuple[Server, int]) -> None:
    server, port = tls_server
    uri = f"rediss+rl://127.0.0.1:{port}/0?ssl_cert_reqs=none"
    s = storage_from_string(uri)
    assert isinstance(s, RLStorage) and s.check()
    assert one_per_minute(s) == [True, False]
    assert len(native_keys(server)) == 1
    a = storage_from_string("async+" + uri)
    assert isinstance(a, AsyncRLStorage)
    assert one_per_minute_async(a) == [True, False]
    assert len(native_keys(server)) == 1


def test_redis_rl_unix_over_a_socket(unix_server: tuple[Server, str]) -> None:
    server, sock = unix_server
    s = storage_from_string(f"redis+rl+unix://{sock}?db=0")
    assert isinstance(s, RLStorage) and s.check()
    assert one_per_minute(s) == [True, False]
    assert len(native_keys(server)) == 1
    a = storage_from_string(f"async+redis+rl+unix://{sock}")
    assert one_per_minute_async(a) == [True, False]
    assert len(native_keys(server)) == 1


def test_async_redis_rl_sentinel(sentinel: Sentinel) -> None:
    uri = f"async+redis+rl+sentinel://127.0.0.1:{sentinel.port}/rlmaster"
    a = storage_from_string(uri)
    assert isinstance(a, AsyncRLStorage)
    assert one_per_minute_async(a) == [True, False]
    assert len(native_keys(sentinel.master)) == 1


@pytest.mark.parametrize(
    "uri",
    ["redis+rl://", "redis+rl:///0", "rediss+rl://", "async+redis+rl://", "async+rediss+rl://:pw@"],
)
def test_a_uri_without_a_host_says_so(uri: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"missing host in '{uri}'")):
        storage_from_string(uri)


@pytest.mark.parametrize("uri", ["redis+rl+unix://", "async+redis+rl+unix://"])
def test_a_unix_uri_without_a_path_says_so(uri: str) -> None:
    with pytest.raises(ConfigurationError, match="missing socket path"):
        storage_from_string(uri)
