"""What the observability tests share: a scrape read back with
prometheus_client's own parser, `promtool check metrics`, a real `_bulk`
HTTP endpoint, and a sink that never answers."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: A sample's identity: (name as scraped, its labels).
SampleKey = tuple[str, frozenset[tuple[str, str]]]


def scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def samples(text: str) -> dict[SampleKey, float]:
    """Every sample of a scrape, parsed by prometheus_client's parser."""
    out: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0 when the scrape has none."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def decisions(text: str) -> dict[tuple[str, str, str], float]:
    """`ratelimit_decisions_total` by (rule, level, outcome)."""
    out = {}
    for (name, labels), v in samples(text).items():
        if name == "ratelimit_decisions_total":
            d = dict(labels)
            out[(d["rule"], d["level"], d["outcome"])] = v
    return out


def promtool_check(text: str) -> None:
    """`promtool check metrics` on a scrape: it must pass (skipped, saying
    so, only where promtool is not installed)."""
    if not shutil.which(PROMTOOL):
        pytest.skip(f"promtool absent ({PROMTOOL}): install Debian's prometheus (setup.sh)")
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"promtool check metrics failed:\n{done.stdout}{done.stderr}"


class BulkServer:
    """An Elasticsearch `_bulk` endpoint for the tests: parses each POST's
    NDJSON, checks it is action/event pairs, keeps the events per request,
    and answers `{"errors": false, "items": [...]}` (or `errors: true`, or
    a status, as told)."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.problems: list[str] = []
        self.content_types: list[str] = []
        self.paths: list[str] = []
        self.errors = False
        self.status = 200
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                events, items = outer.parse(raw.decode("utf-8"))
                with outer.lock:
                    outer.paths.append(self.path)
                    outer.content_types.append(self.headers.get("Content-Type", ""))
                    outer.batches.append(events)
                body = json.dumps({"took": 1, "errors": outer.errors, "items": items}).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def parse(self, text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        lines = text.split("\n")
        if lines[-1] != "":
            self.problems.append("the body does not end with a newline")
        lines = lines[:-1]
        if len(lines) % 2:
            self.problems.append(f"{len(lines)} lines: not action/event pairs")
        events, items = [], []
        for action, event in zip(lines[::2], lines[1::2]):
            if json.loads(action) != {"index": {"_index": "ratelimit-deny"}}:
                self.problems.append(f"action line {action!r}")
            # The fields' order as sent, kept by json.loads.
            events.append(json.loads(event))
            items.append({"index": {"_index": "ratelimit-deny", "status": 201}})
        return events, items

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for b in self.batches for e in b]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HangingServer:
    """Accepts connections and never answers, until `release()`."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.released = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.released.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)  # held open, never read, never answered

    def release(self) -> None:
        self.released.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def refused_url() -> str:
    """An http:// URL on which nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
