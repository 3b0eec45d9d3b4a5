"""The kit's own circuit breaker: closed, open, or forced open.

The application wraps its downstream calls in it (`call`, `call_async`, or
`allow` then `record_success` / `record_failure`); it opens after
`failures` failures in a row and lets one trial call through after
`open_for` seconds. The protection loop (`protection.py`) forces the
breaker a policy names open while the policy's stage is 2 (break), and
releases it when the stage falls: the server, which sees every instance's
traffic, decides for all of them at once.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Awaitable
from typing import Callable, TypeVar

from .errors import InvalidArgument, RateLimitError

T = TypeVar("T")


class BreakerState(str, enum.Enum):
    """What a breaker lets through: everything, nothing until its time is up
    (then one trial), or nothing until it is released."""

    CLOSED = "closed"
    OPEN = "open"
    FORCED_OPEN = "forced_open"


class BreakerOpen(RateLimitError):
    """A call a breaker did not let through."""

    def __init__(self, name: str, state: BreakerState) -> None:
        super().__init__(f"circuit breaker {name!r} is {state.value.replace('_', ' ')}")
        self.name = name
        self.state = state


class CircuitBreaker:
    """A breaker around a downstream dependency; threads and tasks may share it.

    `failures`: failures in a row that open it; `open_for`: the seconds it
    stays open before one trial call (its success closes it, its failure
    opens it again). `force_open()` keeps it open whatever the calls do
    until `release()`, which closes it.
    """

    def __init__(
        self,
        name: str,
        *,
        failures: int = 5,
        open_for: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
            raise InvalidArgument("failures must be an integer of at least 1", param="failures")
        if not open_for >= 0:
            raise InvalidArgument("open_for must be 0 s or more", param="open_for")
        self.name = name
        self.failures = failures
        self.open_for = open_for
        self._clock = clock
        self._lock = threading.Lock()
        self._failed = 0
        self._open_until: float | None = None
        self._forced = False
        self._trial = False
        #: Calls refused (`allow()` answered False).
        self.refused = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._forced:
                return BreakerState.FORCED_OPEN
            return BreakerState.CLOSED if self._open_until is None else BreakerState.OPEN

    def allow(self) -> bool:
        """Whether a call may go through now. Open and its time up: this
        one call goes, as the trial; the others wait for its answer."""
        with self._lock:
            if self._forced:
                self.refused += 1
                return False
            if self._open_until is None:
                return True
            if not self._trial and self._clock() >= self._open_until:
                self._trial = True
                return True
            self.refused += 1
            return False

    def record_success(self) -> None:
        with self._lock:
            self._failed = 0
            self._trial = False
            if not self._forced:
                self._open_until = None

    def record_failure(self) -> None:
        with self._lock:
            self._failed += 1
            if self._trial or self._failed >= self.failures:
                self._open_until = self._clock() + self.open_for
            self._trial = False

    def _abandoned(self) -> None:
        """A call cut short (a cancellation, an interrupt) is neither a
        success nor a failure; a trial's turn goes to the next call (it
        would refuse every call for ever otherwise)."""
        with self._lock:
            self._trial = False

    def force_open(self) -> None:
        """Open until `release()`, whatever the calls do."""
        with self._lock:
            self._forced = True

    def release(self) -> None:
        """Ends a `force_open()`: the breaker closes."""
        with self._lock:
            self._forced = False
            self._failed = 0
            self._trial = False
            self._open_until = None

    def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` through the breaker: raises `BreakerOpen`
        without calling it when the breaker is open; an exception of `fn`
        counts as a failure and is raised."""
        if not self.allow():
            raise BreakerOpen(self.name, self.state)
        try:
            out = fn(*args, **kwargs)
        except Exception:
            self.record_failure()
            raise
        except BaseException:
            self._abandoned()
            raise
        self.record_success()
        return out

    async def call_async(
        self, fn: Callable[..., Awaitable[T]], *args: object, **kwargs: object
    ) -> T:
        """As `call`, awaiting `fn(*args, **kwargs)`."""
        if not self.allow():
            raise BreakerOpen(self.name, self.state)
        try:
            out = await fn(*args, **kwargs)
        except Exception:
            self.record_failure()
            raise
        except BaseException:
            self._abandoned()
            raise
        self.record_success()
        return out

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self.state.value})"
