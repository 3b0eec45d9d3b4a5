"""The errors every form of the client raises, and whether a failed call may
still have been counted by the server."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decision import Decision


class RateLimitError(Exception):
    """Base class of every error this package raises."""


class InvalidArgument(RateLimitError, ValueError):
    """A parameter the module would refuse, caught before sending.

    `param`: the parameter the error is about, as the server names it
    (`capacity`, `bucket_ms`, `window_ms / bucket_ms`, `span`, `period`,
    `zone`, ...); None when it is about no one parameter.
    """

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class ModuleMissing(RateLimitError):
    """The server answered `MODULE LIST` without the `ratelimit` module."""

    def __init__(self, server: str) -> None:
        super().__init__(
            f"the redis-ratelimit module is not loaded on {server}: start it with "
            "--loadmodule /path/to/libredis_ratelimit.so (a managed server that cannot "
            "load modules cannot run the RL.* commands)"
        )
        self.server = server


# The former names, kept for one release: the same class objects, so
# `except BadArgument` catches an `InvalidArgument` and the reverse.

#: Deprecated: use `InvalidArgument` (the same class); removed in the next release.
BadArgument = InvalidArgument
#: Deprecated: use `ModuleMissing` (the same class); removed in the next release.
ModuleNotLoaded = ModuleMissing


class WrongType(RateLimitError):
    """The key holds another Redis type or another algorithm's state."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"key {key!r}: {message}")
        self.key = key


class ServerError(RateLimitError):
    """Any other error reply (`ERR ...`), with the server's message."""


class ProtocolError(RateLimitError):
    """A reply that is not the shape the command answers."""


class Denied(RateLimitError):
    """A lease (or a blocking acquire inside `lease`) was not granted.

    `decision` is the denial: `retry_after` says when the same request could
    pass (leases may be released earlier), `never` that it cannot.
    """

    def __init__(self, key: str | bytes, decision: Decision) -> None:
        shown = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        wait = "never" if decision.never else f"retry after {decision.retry_after:.3f} s"
        super().__init__(f"key {shown!r}: denied ({wait})")
        self.key = key
        self.decision = decision


def not_sent(exc: BaseException) -> BaseException:
    """Marks a failure that happened before the command was written (the
    connection could not be opened): nothing can have been counted."""
    exc._rl_not_sent = True  # type: ignore[attr-defined]
    return exc


def answer_lost(exc: BaseException) -> bool:
    """Whether a failed call may still have been executed by the server: its
    command was (or may have been) sent, and its answer never came back. An
    error reply is an answer: the server applied nothing."""
    from redis.exceptions import BusyLoadingError, ResponseError

    if isinstance(exc, (ResponseError, BusyLoadingError, RateLimitError)):
        return False
    return not getattr(exc, "_rl_not_sent", False)
