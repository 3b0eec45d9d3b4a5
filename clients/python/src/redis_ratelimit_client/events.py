"""Deny events: every denial a limiter answers, shipped in batches to a sink
the user picks (the contract's `observability.deny_events`).

A denial is appended to a bounded ring buffer under a short lock, as a plain
tuple of what the decision gave (its time a float: nothing else happens on
the request's path, sync or asyncio); a daemon thread, the flusher, ships
the buffer every `flush_interval` seconds, or as soon as `flush_events`
events wait (or the buffer is full), in batches of at most `flush_events`,
to:

- `FileSink(path)`: the batch appended to the file as JSON lines;
- `BulkSink(url)`: `POST <url>/_bulk` in Elasticsearch's format (per event an
  action line `{"index":{"_index":"ratelimit-deny"}}` then the event's
  line), accepted on a 2xx whose JSON body has `"errors": false`;
- any callable: given the batch (a list of `DenyEvent`), on the flusher.

A full buffer drops its oldest events (`dropped`). A flush that fails,
is refused or takes longer than `timeout` loses its batch: `dropped += n`,
`sink_errors += 1`, never retried, never held. The sink is called on a
thread of the shipper's own (one for its life, started with the flusher:
CPython 3.12 starts no thread at the interpreter's exit), which the flusher
waits for at most `timeout`: a sink that hangs costs counts, not a
request's time; while such a call has not returned, the next batches are
refused at once (counted) rather than queued. `close()` (and the
interpreter's exit) ships what is left, bounded by `timeout` in all, a
flush under way included.

After `os.fork()` (a pre-forking server's workers), the child's shipper
starts empty (what waited is the parent's to ship) with fresh locks and, if
the parent's flusher ran, a flusher of its own.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple, Union

from .errors import InvalidArgument
from .metrics import Metrics, metrics_of

log = logging.getLogger("redis_ratelimit_client")

#: The contract's `observability.deny_events` defaults.
BUFFER_EVENTS = 10_000
FLUSH_EVENTS = 1000
FLUSH_INTERVAL_MS = 5000
SINK_TIMEOUT_MS = 2000
BULK_INDEX = "ratelimit-deny"
#: An event's fields, in the order of its JSON line; the last two are left
#: out when unknown.
FIELDS = (
    "timestamp",
    "key",
    "rule",
    "level",
    "outcome",
    "limit",
    "remaining",
    "retry_after_ms",
    "client_ip",
    "user_agent",
)
OPTIONAL = ("client_ip", "user_agent")
#: The most UTF-8 bytes of an event's `client_ip` and `user_agent`: a longer
#: one is cut at a character boundary (`cut_header`), so a flood of requests
#: with huge headers cannot fill the buffer's memory.
MAX_HEADER_BYTES = 512
#: The outcomes a deny event has.
OUTCOMES_DENIED = ("denied", "shadow_denied")


class DenyEvent(NamedTuple):
    """One denial. `at`: Unix time in seconds; `retry_after_ms`: the
    decision's `wait_ms` (-1: the request can never pass); `client_ip` and
    `user_agent` from HTTP, None when unknown. (A named tuple: made on the
    request's path, it must cost next to nothing; it is turned into JSON on
    the flusher.)"""

    at: float
    key: str
    rule: str
    level: str
    outcome: str
    limit: int
    remaining: int
    retry_after_ms: int
    client_ip: str | None = None
    user_agent: str | None = None

    @property
    def timestamp(self) -> str:
        """RFC 3339 in UTC with milliseconds: `2026-12-02T10:00:00.123Z`."""
        ms = int(self.at * 1000)
        return f"{_second(ms // 1000)}.{ms % 1000:03d}Z"

    def as_dict(self) -> dict[str, object]:
        """The event's fields in the contract's order, the unknown optional
        ones left out."""
        out: dict[str, object] = {
            "timestamp": self.timestamp,
            "key": self.key,
            "rule": self.rule,
            "level": self.level,
            "outcome": self.outcome,
            "limit": self.limit,
            "remaining": self.remaining,
            "retry_after_ms": self.retry_after_ms,
        }
        if self.client_ip is not None:
            out["client_ip"] = self.client_ip
        if self.user_agent is not None:
            out["user_agent"] = self.user_agent
        return out

    def to_json(self) -> str:
        """The event's JSON line (without the newline): `as_dict()` as
        `json.dumps(..., ensure_ascii=False, separators=(",", ":"))` writes
        it, built by hand (the flusher writes thousands a second)."""
        line = (
            f'{{"timestamp":"{self.timestamp}","key":{_str(self.key)},"rule":{_str(self.rule)},'
            f'"level":{_str(self.level)},"outcome":{_str(self.outcome)},"limit":{int(self.limit)},'
            f'"remaining":{int(self.remaining)},"retry_after_ms":{int(self.retry_after_ms)}'
        )
        if self.client_ip is not None:
            line += f',"client_ip":{_str(self.client_ip)}'
        if self.user_agent is not None:
            line += f',"user_agent":{_str(self.user_agent)}'
        return line + "}"


_str = json.JSONEncoder(ensure_ascii=False).encode
_seconds_cache: tuple[int, str] = (-1, "")


def _second(s: int) -> str:
    """`YYYY-MM-DDTHH:MM:SS` of Unix second `s` in UTC (the last one kept)."""
    global _seconds_cache
    last, text = _seconds_cache
    if s != last:
        text = f"{datetime.fromtimestamp(s, tz=timezone.utc):%Y-%m-%dT%H:%M:%S}"
        _seconds_cache = (s, text)
    return text


#: A sink: called with a batch; an exception (or a return of False) refuses it.
Sink = Callable[[list[DenyEvent]], Any]


class _Job:
    """One batch for the sink's thread: `ok` once `done` is set (True:
    accepted; False or the exception: refused)."""

    __slots__ = ("sink", "batch", "done", "ok")

    def __init__(self, sink: Sink, batch: list[DenyEvent]) -> None:
        self.sink = sink
        self.batch = batch
        self.done = threading.Event()
        self.ok: object = None

    def run(self) -> None:
        try:
            self.ok = self.sink(self.batch) is not False
        except BaseException as e:
            self.ok = e
        self.done.set()

    def is_alive(self) -> bool:
        """Whether the sink is still on this batch."""
        return not self.done.is_set()


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The sink's thread: each job in turn, until a None."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()


class SinkError(Exception):
    """A sink refused a batch."""


class FileSink:
    """Appends each batch to `path` as JSON lines (UTF-8)."""

    def __init__(self, path: str) -> None:
        if not isinstance(path, str) or not path:
            raise InvalidArgument("path must be a non-empty str", param="path")
        self.path = path

    def __call__(self, batch: list[DenyEvent]) -> None:
        text = "".join(e.to_json() + "\n" for e in batch)
        # A lone surrogate (only ever inside a JSON string) as JSON's own
        # escape `\udc80`: UTF-8 cannot encode it, and it cost the batch.
        with open(self.path, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)

    def __repr__(self) -> str:
        return f"FileSink({self.path!r})"


class BulkSink:
    """`POST <url>/_bulk` in Elasticsearch's format (`Content-Type:
    application/x-ndjson`), on the standard library's urllib: per event an
    action line `{"index":{"_index":<index>}}` then the event's line.
    Accepted on a 2xx whose JSON body has `"errors": false`; anything else
    raises `SinkError`. `timeout`: seconds to connect and for each read."""

    def __init__(
        self,
        url: str,
        *,
        index: str = BULK_INDEX,
        timeout: float = SINK_TIMEOUT_MS / 1000,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument("url must be an http:// or https:// URL", param="url")
        if not isinstance(index, str) or not index:
            raise InvalidArgument("index must be a non-empty str", param="index")
        timeout = _seconds("timeout", timeout)
        if headers is not None and (
            not isinstance(headers, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise InvalidArgument("headers must be a dict of str to str", param="headers")
        self.url = url.rstrip("/") + "/_bulk"
        self.index = index
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._action = json.dumps({"index": {"_index": index}}, separators=(",", ":"))

    def body(self, batch: list[DenyEvent]) -> bytes:
        """The batch as `_bulk`'s NDJSON (each line ends with a newline)."""
        text = "".join(f"{self._action}\n{e.to_json()}\n" for e in batch)
        return text.encode("utf-8", "backslashreplace")  # a lone surrogate: as FileSink

    def __call__(self, batch: list[DenyEvent]) -> None:
        req = urllib.request.Request(
            self.url,
            data=self.body(batch),
            method="POST",
            headers={**self.headers, "Content-Type": "application/x-ndjson"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            raise SinkError(f"{self.url} answered {e.code}") from e
        if not 200 <= status < 300:  # pragma: no cover - urllib raises for these
            raise SinkError(f"{self.url} answered {status}")
        try:
            reply = json.loads(raw)
        except ValueError as e:
            raise SinkError(f"{self.url} answered no JSON") from e
        if not isinstance(reply, dict) or reply.get("errors") is not False:
            raise SinkError(f"{self.url} answered errors (or no 'errors': false)")

    def __repr__(self) -> str:
        return f"BulkSink({self.url!r}, index={self.index!r})"


def _text(name: str, value: object, optional: bool = False) -> None:
    if isinstance(value, str) or (optional and value is None):
        return
    what = "a str or None" if optional else "a str"
    raise InvalidArgument(f"{name} must be {what}, not {type(value).__name__}", param=name)


def _integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, not {type(value).__name__}", param=name)


def cut_header(value: str | None) -> str | None:
    """`value` cut to at most `MAX_HEADER_BYTES` in UTF-8, at a character
    boundary (a character is never split); None stays None."""
    # A code point is at most 4 bytes: a short value costs one len().
    if value is None or len(value) <= MAX_HEADER_BYTES // 4:
        return value
    # surrogatepass: a lone surrogate (a str from surrogateescape) is cut,
    # not an error on the request's path.
    b = value.encode("utf-8", "surrogatepass")
    if len(b) <= MAX_HEADER_BYTES:
        return value
    end = MAX_HEADER_BYTES
    while end > 0 and b[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
        end -= 1
    return b[:end].decode("utf-8", "surrogatepass")


def check_http(client_ip: object, user_agent: object) -> None:
    """A decision's `client_ip` and `user_agent`: each a str or None (any
    other value would cost its whole batch on the flusher)."""
    _text("client_ip", client_ip, optional=True)
    _text("user_agent", user_agent, optional=True)


#: The longest `flush_interval` and `timeout`: a year (threading's waits
#: refuse more than `threading.TIMEOUT_MAX`, and infinity: the flusher died).
MAX_SECONDS = 365 * 86400


def _seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= MAX_SECONDS
    ):
        raise InvalidArgument(
            f"{name} must be a number of seconds above 0, at most {MAX_SECONDS} (a year)",
            param=name,
        )
    return float(value)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an integer of at least 1", param=name)
    return value


_LIVE: weakref.WeakSet[DenyEvents] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - at the interpreter's exit
    for events in list(_LIVE):
        events.close()


def _after_fork() -> None:
    """In a forked child: each shipper's locks may have been held by a
    thread the child does not have, and its flusher is gone."""
    for events in list(_LIVE):
        events._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

#: What the buffer holds: `DenyEvent`'s fields as a plain tuple (made on
#: the request's path: a plain tuple of strings and numbers costs the least,
#: and the garbage collector stops tracking it).
_Row = tuple[Any, ...]
#: A row as its `DenyEvent` (`tuple.__new__`: `_make` without its Python
#: frame; every row has the ten fields, as `_push`'s callers build them).
_event: Callable[[type[DenyEvent], _Row], DenyEvent] = tuple.__new__


class DenyEvents:
    """The deny events' shipper: give it to a `Limiter`, `AsyncLimiter` or
    `RateLimitMiddleware` (`deny_events=`), which records every denial.

    `sink`: a `FileSink`, a `BulkSink`, or a callable given each batch.
    `capacity` (10,000): the ring buffer's size; a full buffer drops the
    oldest. `flush_interval` (5 s) and `flush_events` (1,000): the flusher
    ships the buffer at that interval, or as soon as that many wait, in
    batches of at most `flush_events`. `timeout` (2 s): the longest a
    batch's sink call is waited for. `metrics`: the registry (or `True`, or
    a `Metrics`) of `ratelimit_deny_events_*`; a limiter with metrics gives
    it its own when this has none. `start=False`: no flusher until
    `start()` (`flush()` ships by hand).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        capacity: int = BUFFER_EVENTS,
        flush_interval: float = FLUSH_INTERVAL_MS / 1000,
        flush_events: int = FLUSH_EVENTS,
        timeout: float = SINK_TIMEOUT_MS / 1000,
        metrics: object = None,
        start: bool = True,
    ) -> None:
        if not callable(sink):
            raise InvalidArgument(
                "sink must be a FileSink, a BulkSink or a callable taking a batch", param="sink"
            )
        self.sink = sink
        self.capacity = _count("capacity", capacity)
        self.flush_interval = _seconds("flush_interval", flush_interval)
        self.flush_events = _count("flush_events", flush_events)
        self.timeout = _seconds("timeout", timeout)
        self.metrics: Metrics | None = metrics_of(metrics)
        #: The flusher is woken as this many wait: `flush_events`, or a full
        #: buffer when it is smaller (else it would drop until the interval).
        self._wake_at = min(self.flush_events, self.capacity)
        #: Events lost (the oldest of a full buffer, a refused batch's),
        #: events a sink accepted, and flushes a sink refused or failed.
        self.dropped = 0
        self.shipped = 0
        self.sink_errors = 0
        self._buf: collections.deque[_Row] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._shipping = threading.Lock()
        #: The sink's thread and its jobs; the job a sink hangs on.
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._stuck: _Job | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: close()'s deadline (monotonic): a flush under way stops there.
        self._close_by: float | None = None
        self.closed = False
        _LIVE.add(self)
        if start:
            self.start()

    # -- the request's side: a short lock, nothing else -----------------------

    def record(self, event: DenyEvent) -> None:
        """Appends `event` (dropping the oldest when the buffer is full) and
        wakes the flusher when `flush_events` wait."""
        if not isinstance(event, DenyEvent):
            raise InvalidArgument(
                f"event must be a DenyEvent, not {type(event).__name__}", param="event"
            )
        self._push((*event[:8], cut_header(event.client_ip), cut_header(event.user_agent)))

    def _push(self, row: _Row) -> None:
        """`record` of a `DenyEvent`'s fields as a plain tuple (a limiter's
        path: no named tuple made there). Below the capacity, one append
        (atomic under the GIL: no lock; threads racing at the brim may hold
        a few more than `capacity` for a moment); a full buffer or a closed
        shipper takes the lock to drop and count exactly."""
        buf = self._buf
        if len(buf) < self.capacity and not self.closed:
            buf.append(row)
            # The flusher is woken as the count reaches `_wake_at` (it checks
            # the count after each flush itself): `>=`, as racing threads may
            # pass it together; an Event already set is not set again.
            if len(buf) >= self._wake_at and not self._wake.is_set():
                self._wake.set()
            return
        with self._lock:
            if self.closed:
                dropped = 1
            else:
                dropped = 0
                if len(buf) >= self.capacity:  # still full (the flusher may have taken some)
                    buf.popleft()
                    dropped = 1
                buf.append(row)
            self.dropped += dropped
        if dropped and self.metrics is not None:
            self.metrics.events(dropped=1)

    def deny(
        self,
        *,
        key: str,
        rule: str,
        level: str,
        limit: int,
        remaining: int,
        retry_after_ms: int,
        outcome: str = "denied",
        client_ip: str | None = None,
        user_agent: str | None = None,
    ) -> None:
        """Records a denial taken now. Each field is checked (an error names
        it): one the flusher could not write would cost its whole batch."""
        for name, text in (("key", key), ("rule", rule), ("level", level)):
            _text(name, text)
        if outcome not in OUTCOMES_DENIED:
            raise InvalidArgument(
                f"outcome must be one of {', '.join(OUTCOMES_DENIED)}, not {outcome!r}",
                param="outcome",
            )
        for name, n in (("limit", limit), ("remaining", remaining)):
            _integer(name, n)
        _integer("retry_after_ms", retry_after_ms)
        check_http(client_ip, user_agent)
        self._push(
            (
                time.time(),
                key,
                rule,
                level,
                outcome,
                limit,
                remaining,
                retry_after_ms,
                cut_header(client_ip),
                cut_header(user_agent),
            )
        )

    @property
    def pending(self) -> int:
        """The events waiting in the buffer."""
        with self._lock:
            return len(self._buf)

    def buffered(self) -> list[DenyEvent]:
        """A copy of the events waiting, oldest first."""
        with self._lock:
            rows = list(self._buf)
        return [_event(DenyEvent, r) for r in rows]

    # -- the flusher ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> DenyEvents:
        """Starts the flusher (a daemon thread)."""
        if self.closed:
            raise InvalidArgument("this DenyEvents is closed", param="start")
        if not self.running:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="rl-deny-events", daemon=True)
            self._thread.start()
            self._sink_worker()
        return self

    def _run(self) -> None:
        due = time.monotonic() + self.flush_interval
        while not self._stopping:
            if self.pending < self._wake_at:
                self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            if time.monotonic() >= due or self.pending >= self._wake_at:
                try:
                    self._flush(None)
                except Exception:  # pragma: no cover - a flusher that died would drop all
                    log.exception("redis-ratelimit: a flush of deny events failed")
                due = time.monotonic() + self.flush_interval

    def flush(self) -> int:
        """Ships what waits now, on this thread, in batches of at most
        `flush_events` (each waited for at most `timeout`): the events a
        sink accepted."""
        return self._flush(None)

    def _flush(self, deadline: float | None) -> int:
        shipped = 0
        with self._shipping:
            # What waits now, not what comes meanwhile: a flood never keeps
            # a flush (or a close) going.
            left = self.pending
            while left > 0:
                # Under the lock: a full buffer drops its oldest under it. A
                # request's append takes no lock (a deque's append and popleft
                # are atomic), so the deque is never swapped for another.
                with self._lock:
                    buf = self._buf
                    n = min(len(buf), self.flush_events, left)
                    rows = list(itertools.starmap(buf.popleft, itertools.repeat((), n)))
                if not rows:
                    break
                left -= len(rows)
                # Named tuples, their timestamps and JSON: made here, off the request's path.
                batch = [_event(DenyEvent, r) for r in rows]
                wait = self.timeout
                # close()'s deadline bounds a flush under way on the flusher too.
                for by in (deadline, self._close_by):
                    if by is not None:
                        wait = min(wait, by - time.monotonic())
                shipped += self._ship(batch, wait)
        return shipped

    def _ship(self, batch: list[DenyEvent], wait: float) -> int:
        """One batch to the sink, waited for at most `wait` seconds."""
        if wait <= 0:
            return self._lost(batch, error=False)
        if self._stuck is not None:
            if self._stuck.is_alive():
                return self._lost(batch, error=True)  # the sink still hangs
            self._stuck = None
        job = _Job(self.sink, batch)
        if self._sink_worker():
            self._jobs.put(job)
            if not job.done.wait(wait):
                self._stuck = job
                return self._lost(batch, error=True)
        else:  # pragma: no cover - no thread could be started: call it here
            job.run()
        if job.ok is not True:
            return self._lost(batch, error=True)
        with self._lock:
            self.shipped += len(batch)
        if self.metrics is not None:
            self.metrics.events(shipped=len(batch))
        return len(batch)

    def _sink_worker(self) -> bool:
        """The thread the sink is called on, one for the shipper's life
        (started with the flusher, so that it is there at the interpreter's
        exit, where CPython 3.12 starts no new thread): whether it runs."""
        w = self._worker
        if w is not None and w.is_alive():
            return True
        jobs = self._jobs
        w = threading.Thread(target=_serve, args=(jobs,), name="rl-deny-sink", daemon=True)
        try:
            w.start()
        except RuntimeError:  # pragma: no cover - at the interpreter's exit
            return False
        self._worker = w
        return True

    def _lost(self, batch: Sequence[DenyEvent], error: bool) -> int:
        with self._lock:
            self.dropped += len(batch)
            self.sink_errors += int(error)
        if self.metrics is not None:
            self.metrics.events(dropped=len(batch), sink_errors=int(error))
        return 0

    def close(self) -> None:
        """Stops the flusher and ships what is left, `timeout` in all; what
        does not fit is dropped and counted. Later events are dropped."""
        if self.closed:
            return
        deadline = time.monotonic() + self.timeout
        self._close_by = deadline
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 1)
            self._thread = None
        with self._lock:
            self.closed = True
        self._flush(deadline)
        # An append that raced with `closed` (it takes no lock): dropped, counted.
        with self._lock:
            late = len(self._buf)
            self._buf.clear()
            self.dropped += late
        if late and self.metrics is not None:
            self.metrics.events(dropped=late)
        self._jobs.put(None)  # the sink's thread ends (after a hung call returns)
        _LIVE.discard(self)

    def _forked(self) -> None:
        """In a forked child (`_after_fork`): fresh locks; the buffer's
        events are the parent's to ship (shipped twice otherwise); a flusher
        of its own if the parent's ran."""
        ran = self._thread is not None and not self._stopping and not self.closed
        self._lock = threading.Lock()
        self._shipping = threading.Lock()
        self._wake = threading.Event()
        self._buf = collections.deque()
        self._jobs = queue.SimpleQueue()
        self._worker = None
        self._stuck = None
        self._thread = None
        if ran:
            self.start()

    def __enter__(self) -> DenyEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DenyEvents({self.sink!r}, pending={self.pending}, shipped={self.shipped}, "
            f"dropped={self.dropped}, sink_errors={self.sink_errors})"
        )


#: What a `deny_events=` argument is: a shipper, or None for none.
DenyEventsArg = Union[DenyEvents, None]


__all__ = [
    "BULK_INDEX",
    "BUFFER_EVENTS",
    "FIELDS",
    "FLUSH_EVENTS",
    "FLUSH_INTERVAL_MS",
    "MAX_SECONDS",
    "OPTIONAL",
    "SINK_TIMEOUT_MS",
    "BulkSink",
    "DenyEvent",
    "DenyEvents",
    "DenyEventsArg",
    "FileSink",
    "Sink",
    "SinkError",
]
