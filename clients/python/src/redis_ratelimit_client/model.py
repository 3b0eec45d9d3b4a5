"""Decisions, rules and errors: what every form of the client shares.

Rules can only be built valid: a bad parameter raises `BadArgument` before
anything is sent, so nothing is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
from collections.abc import Sequence
from typing import Literal, Union

#: The largest numeric parameter the module accepts (2^40).
MAX_PARAM = 1 << 40
#: The largest lease id (lease ids are positive integers below 2^63).
MAX_LEASE = (1 << 63) - 1
#: The largest `limit` of `RL.CONCURRENCY`.
MAX_CONCURRENCY = (1 << 24) - 1
#: The largest `limit` of `RL.SLIDING` (a log of at most 2^24 - 1 entries).
MAX_SLIDING = (1 << 24) - 1
#: The longest a limiter may take to get back to idle, in ms (2^50): a
#: bucket's `capacity * refill_ms / refill_count` at most.
MAX_SPAN_MS = 1 << 50
#: The most buckets of a hash window (`window_ms / bucket_ms`).
MAX_BUCKETS = 1_000_000
#: The module's name in `MODULE LIST`.
MODULE_NAME = "ratelimit"


class RateLimitError(Exception):
    """Base class of every error this package raises."""


class BadArgument(RateLimitError, ValueError):
    """A parameter the module would refuse, caught before sending.

    `param`: the parameter the error is about, as the server names it
    (`capacity`, `bucket_ms`, `window_ms / bucket_ms`, `span`, `period`,
    `zone`, ...); None when it is about no one parameter.
    """

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class ModuleNotLoaded(RateLimitError):
    """The server answered `MODULE LIST` without the `ratelimit` module."""

    def __init__(self, server: str) -> None:
        super().__init__(
            f"the redis-ratelimit module is not loaded on {server}: start it with "
            "--loadmodule /path/to/libredis_ratelimit.so (a managed server that cannot "
            "load modules cannot run the RL.* commands)"
        )
        self.server = server


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


def _check_int(name: str, value: object, low: int, high: int = MAX_PARAM) -> int:
    # bool is an int in Python; True as a capacity is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgument(f"{name} must be an integer, not {type(value).__name__}", param=name)
    if not low <= value <= high:
        raise BadArgument(
            f"{name} must be an integer from {low} to {high}, not {value}", param=name
        )
    return value


def _check_span(capacity: int, count: int, per_ms: int, what: str) -> None:
    """The server's bound on a bucket: `capacity * per_ms / count` (the time
    from empty to full, or from full to empty) at most `MAX_SPAN_MS`."""
    if capacity * per_ms > MAX_SPAN_MS * count:
        raise BadArgument(
            f"span: {what} is too long: a limiter may take at most {MAX_SPAN_MS} ms to get "
            "back to idle",
            param="span",
        )


@dataclasses.dataclass(frozen=True)
class TokenBucket:
    capacity: int
    refill_count: int
    refill_ms: int
    ALGORITHM = "TOKENBUCKET"

    def __post_init__(self) -> None:
        _check_int("capacity", self.capacity, 1)
        _check_int("refill_count", self.refill_count, 1)
        _check_int("refill_ms", self.refill_ms, 1)
        _check_span(
            self.capacity,
            self.refill_count,
            self.refill_ms,
            "capacity * refill_ms / refill_count (the time to fill the bucket)",
        )

    def params(self) -> list[int]:
        return [self.capacity, self.refill_count, self.refill_ms]

    def window_s(self) -> int:
        """`w` of `RateLimit-Policy`: the time to refill the whole bucket."""
        return -(-self.capacity * self.refill_ms // (self.refill_count * 1000))


@dataclasses.dataclass(frozen=True)
class LeakyBucket:
    capacity: int
    leak_count: int
    leak_ms: int
    ALGORITHM = "LEAKYBUCKET"

    def __post_init__(self) -> None:
        _check_int("capacity", self.capacity, 1)
        _check_int("leak_count", self.leak_count, 1)
        _check_int("leak_ms", self.leak_ms, 1)
        _check_span(
            self.capacity,
            self.leak_count,
            self.leak_ms,
            "capacity * leak_ms / leak_count (the time to drain a full queue)",
        )

    def params(self) -> list[int]:
        return [self.capacity, self.leak_count, self.leak_ms]

    def window_s(self) -> int:
        return -(-self.capacity * self.leak_ms // (self.leak_count * 1000))


@dataclasses.dataclass(frozen=True)
class Sliding:
    limit: int
    window_ms: int
    ALGORITHM = "SLIDING"

    def __post_init__(self) -> None:
        _check_int("limit", self.limit, 1, MAX_SLIDING)
        _check_int("window_ms", self.window_ms, 1)

    def params(self) -> list[int]:
        return [self.limit, self.window_ms]

    def window_s(self) -> int:
        return -(-self.window_ms // 1000)


@dataclasses.dataclass(frozen=True)
class HashWindow:
    limit: int
    window_ms: int
    bucket_ms: int
    ALGORITHM = "HASHWINDOW"

    def __post_init__(self) -> None:
        _check_int("limit", self.limit, 1)
        _check_int("window_ms", self.window_ms, 1)
        _check_int("bucket_ms", self.bucket_ms, 1)
        if self.window_ms % self.bucket_ms:
            raise BadArgument("bucket_ms must divide window_ms", param="bucket_ms")
        if self.window_ms // self.bucket_ms > MAX_BUCKETS:
            raise BadArgument(
                f"window_ms / bucket_ms must be an integer from 1 to {MAX_BUCKETS}, "
                f"not {self.window_ms // self.bucket_ms}",
                param="window_ms / bucket_ms",
            )

    def params(self) -> list[int]:
        return [self.limit, self.window_ms, self.bucket_ms]

    def window_s(self) -> int:
        return -(-self.window_ms // 1000)


@dataclasses.dataclass(frozen=True)
class FixedWindow:
    limit: int
    window_ms: int
    ALGORITHM = "FIXEDWINDOW"

    def __post_init__(self) -> None:
        _check_int("limit", self.limit, 1)
        _check_int("window_ms", self.window_ms, 1)

    def params(self) -> list[int]:
        return [self.limit, self.window_ms]

    def window_s(self) -> int:
        return -(-self.window_ms // 1000)


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """At most `limit` units held at once, by leases that end at a release or
    `lease_ms` after they were granted or last renewed (`RL.CONCURRENCY`)."""

    limit: int
    lease_ms: int
    ALGORITHM = "CONCURRENCY"

    def __post_init__(self) -> None:
        _check_int("limit", self.limit, 1, MAX_CONCURRENCY)
        _check_int("lease_ms", self.lease_ms, 1)

    def params(self) -> list[int]:
        return [self.limit, self.lease_ms]

    def window_s(self) -> int | None:
        """No `w` in `RateLimit-Policy`: concurrency has no window."""
        return None


class Period(str, enum.Enum):
    """A calendar period of `RL.QUOTA`: a day, an ISO week (from Monday), a
    month, a year. A plain string (`"DAY"`, `"day"`, ...) is taken too."""

    DAY = "DAY"
    WEEK = "WEEK"
    MONTH = "MONTH"
    YEAR = "YEAR"


#: What a period may be given as.
PeriodLike = Union[Period, Literal["DAY", "WEEK", "MONTH", "YEAR", "day", "week", "month", "year"]]

#: `w` of `RateLimit-Policy` for a quota: the period's nominal length in
#: seconds (a month is 30 days, a year 365).
PERIOD_NOMINAL_S = {
    Period.DAY: 86_400,
    Period.WEEK: 604_800,
    Period.MONTH: 2_592_000,
    Period.YEAR: 31_536_000,
}

_OFFSET = re.compile(r"[+-]([0-9]{2}):([0-9]{2})\Z")
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9/_+-]{0,63}\Z")


def check_period(period: object) -> Period:
    """A `Period` from itself or its word in any case; `BadArgument` naming `period`."""
    if isinstance(period, Period):
        return period
    if isinstance(period, str) and period.upper() in Period.__members__:
        return Period[period.upper()]
    raise BadArgument(
        f"period must be one of DAY, WEEK, MONTH, YEAR, not {period!r}", param="period"
    )


def check_zone(zone: object) -> str | None:
    """A quota's zone as the module takes it: None or `UTC` (the default), a
    fixed offset `+HH:MM`/`-HH:MM` from -18:00 to +18:00, or an IANA name such as
    `America/New_York` (whether the server knows the name is its answer).
    None for UTC; `BadArgument` naming `zone`."""
    if zone is None:
        return None
    bad = BadArgument(
        "zone: TZ must be UTC, a fixed offset such as +05:30, or a time zone name "
        f"such as America/New_York, not {zone!r}",
        param="zone",
    )
    if not isinstance(zone, str):
        raise bad
    if zone.upper() in ("UTC", "Z"):
        return None
    if zone and zone[0] in "+-":
        m = _OFFSET.match(zone)
        if not m or int(m.group(2)) > 59 or int(m.group(1)) * 60 + int(m.group(2)) > 18 * 60:
            raise bad
        return zone
    if not _ZONE_NAME.match(zone) or ".." in zone:
        raise bad
    return zone


def _tzinfo(zone: str | None) -> datetime.tzinfo:
    if zone is None:
        return datetime.timezone.utc
    m = _OFFSET.match(zone)
    if m:
        minutes = int(m.group(1)) * 60 + int(m.group(2))
        sign = -1 if zone[0] == "-" else 1
        return datetime.timezone(datetime.timedelta(minutes=sign * minutes))
    import zoneinfo  # Python 3.9+; the system's tz database, or the tzdata package

    return zoneinfo.ZoneInfo(zone)


@dataclasses.dataclass(frozen=True)
class Quota:
    """At most `limit` units per calendar `period` in `zone` (`RL.QUOTA`).

    `zone`: None (UTC), a fixed offset (`"+05:30"`) or an IANA name
    (`"America/New_York"`, with its 23- and 25-hour days). A policy keeps
    its zone (`RL.POLICY SET ... TZ`); `RL.ALL`'s inline specs count in UTC
    only, so a zoned inline quota is applied with its own `RL.QUOTA ... TZ`.
    """

    limit: int
    period: PeriodLike
    zone: str | None = None
    ALGORITHM = "QUOTA"

    def __post_init__(self) -> None:
        _check_int("limit", self.limit, 1)
        object.__setattr__(self, "period", check_period(self.period))
        object.__setattr__(self, "zone", check_zone(self.zone))

    def params(self) -> list[str | int]:
        """`limit PERIOD`, as policies and `RL.ALL` take them (without the zone)."""
        return [self.limit, Period(self.period).value]

    def command_args(self) -> list[str | int]:
        """`limit PERIOD [TZ zone]`, as `RL.QUOTA` takes them after the key."""
        return [*self.params(), *(["TZ", self.zone] if self.zone is not None else [])]

    def window_s(self) -> int:
        """`w` of `RateLimit-Policy`: the period's nominal length in seconds
        (86400 a day, 604800 a week, 2592000 a month, 31536000 a year)."""
        return PERIOD_NOMINAL_S[Period(self.period)]

    def period_end(self, now: float) -> float:
        """The end (Unix seconds) of the period that contains `now` in the zone:
        the first instant of the next day, Monday, month or year there."""
        tz = _tzinfo(self.zone)
        date = datetime.datetime.fromtimestamp(now, tz).date()
        period = Period(self.period)
        if period is Period.DAY:
            nxt = date + datetime.timedelta(days=1)
        elif period is Period.WEEK:
            nxt = date + datetime.timedelta(days=7 - date.weekday())
        elif period is Period.MONTH:
            nxt = (date.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)
        else:
            nxt = datetime.date(date.year + 1, 1, 1)
        midnight = datetime.datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz)
        # A zone that skips midnight: its first instant is the skip's end (fold
        # and the gap are resolved by the round trip through UTC).
        return midnight.astimezone(datetime.timezone.utc).timestamp()


def check_lease(lease: object) -> int:
    """A lease id as `RL.RELEASE`/`RL.RENEW` take it (0 to 2^63 - 1)."""
    return _check_int("lease", lease, 0, MAX_LEASE)


def check_lease_ms(lease_ms: object) -> int:
    return _check_int("lease_ms", lease_ms, 1)


def block_args(timeout_ms: object) -> list[str | int]:
    """`BLOCK timeout_ms` (0: wait without a limit); checked before sending."""
    return ["BLOCK", _check_int("timeout_ms", timeout_ms, 0)]


def acquire_deadline(timeout_ms: int) -> float | None:
    """The socket timeout of a blocking acquire, in seconds: the BLOCK timeout
    plus a margin of max(1 s, 10 %); None (no limit) for BLOCK 0."""
    if timeout_ms == 0:
        return None
    return timeout_ms / 1000.0 + max(1.0, timeout_ms / 10_000.0)


def check_policy_name(name: object) -> str:
    if not isinstance(name, str):
        raise BadArgument(f"policy name must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= 256 or any(not "!" <= c <= "~" for c in name):
        raise BadArgument(
            f"policy name must be 1 to 256 bytes of printable ASCII without spaces, not {name!r}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Policy:
    """A rule kept in the server (`RL.POLICY SET`), applied by name."""

    name: str

    def __post_init__(self) -> None:
        check_policy_name(self.name)


#: An algorithm with its parameters.
Algorithm = Union[TokenBucket, LeakyBucket, Sliding, HashWindow, FixedWindow, Concurrency, Quota]
#: What a limiter key is checked against: an algorithm, or a policy name.
Spec = Union[Algorithm, Policy]
#: The algorithm classes, for isinstance.
ALGORITHMS = (TokenBucket, LeakyBucket, Sliding, HashWindow, FixedWindow, Concurrency, Quota)


def utc_only(spec: object, where: str) -> None:
    """`RL.ALL`'s inline specs count quotas in UTC only (a policy's quota
    counts in the policy's zone)."""
    if isinstance(spec, Quota) and spec.zone is not None:
        raise BadArgument(
            f"zone: {where} counts a quota in UTC only, not in {spec.zone!r}: apply a zoned "
            "quota with its own RL.QUOTA call"
        )


def spec_args(spec: Spec) -> list[str | int]:
    if isinstance(spec, Policy):
        return ["POLICY", spec.name]
    if isinstance(spec, ALGORITHMS):
        return [spec.ALGORITHM, *spec.params()]
    raise BadArgument(f"a spec must be an algorithm or a Policy, not {type(spec).__name__}")


class PolicyMode(str, enum.Enum):
    ENFORCE = "ENFORCE"
    SHADOW = "SHADOW"
    OFF = "OFF"


def check_key(key: object, what: str = "key") -> str | bytes:
    if not isinstance(key, (str, bytes)) or len(key) == 0:
        raise BadArgument(f"{what} must be a non-empty str or bytes, not {key!r}")
    return key


def request_args(
    cost: int = 1, *, force: bool = False, refund: int | None = None
) -> list[str | int]:
    """`COST n [FORCE]` or `REFUND n`; checked before sending."""
    if refund is not None:
        if force:
            raise BadArgument("REFUND cannot be given with FORCE")
        if cost != 1:
            raise BadArgument("REFUND cannot be given with COST")
        return ["REFUND", _check_int("REFUND", refund, 0)]
    _check_int("COST", cost, 0)
    args: list[str | int] = []
    if cost != 1 or force:
        args += ["COST", cost]
    if force:
        args.append("FORCE")
    return args


@dataclasses.dataclass(frozen=True)
class Decision:
    """One limiter reply.

    `retry_after` and `reset_after` are seconds as floats (`wait_ms / 1000`,
    `reset_ms / 1000`); the raw milliseconds are kept beside them.
    `retry_after` is 0.0 when the request can never pass (`wait_ms == -1`,
    see `never`).
    """

    allowed: bool
    limit: int
    remaining: int
    wait_ms: int
    reset_ms: int
    #: `RL.ALL`: the 0-based position of the first rule that denied.
    denied_by: int | None = None
    #: `RL.CONCURRENCY` (or `RL.HIT` on a concurrency policy): the id of the
    #: lease granted; None when none was (a denial, `COST 0`, a refund).
    lease: int | None = None

    @property
    def retry_after(self) -> float:
        return max(self.wait_ms, 0) / 1000.0

    @property
    def reset_after(self) -> float:
        return self.reset_ms / 1000.0

    @property
    def never(self) -> bool:
        """Denied, and can never pass: its cost exceeds the limit."""
        return self.wait_ms < 0

    @property
    def retry_after_s(self) -> int | None:
        """`Retry-After` in whole seconds, `ceil(wait_ms / 1000)`; None if never."""
        return None if self.wait_ms < 0 else -(-self.wait_ms // 1000)

    @classmethod
    def from_reply(cls, reply: object, *, all_reply: bool = False) -> Decision:
        """Five integers; a sixth is `denied_by` for `RL.ALL` (`all_reply`),
        else the lease id of `RL.CONCURRENCY`."""
        if not isinstance(reply, (list, tuple)) or len(reply) not in (5, 6):
            raise ProtocolError(f"a limiter reply is 5 or 6 integers, not {reply!r}")
        ints = [int(x) for x in reply]
        sixth = ints[5] if len(ints) == 6 and ints[5] > 0 else None
        if all_reply:
            denied_by = None if sixth is None else sixth - 1
            return cls(bool(ints[0]), ints[1], ints[2], ints[3], ints[4], denied_by)
        return cls(bool(ints[0]), ints[1], ints[2], ints[3], ints[4], lease=sixth)


def policy_set_args(name: str, spec: Algorithm, mode: PolicyMode, rollout: int) -> list[str | int]:
    check_policy_name(name)
    if isinstance(spec, Policy):
        raise BadArgument("a policy is an algorithm, not another Policy")
    _check_int("ROLLOUT", rollout, 0, 100)
    # A quota's zone is an option of the policy: RL.HIT and RL.ALL ... POLICY
    # count in it (a module whose policies take TZ).
    zone = ["TZ", spec.zone] if isinstance(spec, Quota) and spec.zone is not None else []
    return [
        "RL.POLICY",
        "SET",
        name,
        *spec_args(spec),
        "MODE",
        PolicyMode(mode).value,
        "ROLLOUT",
        rollout,
        *zone,
    ]


def all_args(
    limits: Sequence[tuple[str | bytes, Spec]], cost: int, force: bool
) -> list[str | bytes | int]:
    if not 1 <= len(limits) <= 16:
        raise BadArgument("RL.ALL takes 1 to 16 limiters")
    keys = [check_key(k) for k, _ in limits]
    if len(set(keys)) != len(keys):
        raise BadArgument("RL.ALL: a key is given twice")
    args: list[str | bytes | int] = ["RL.ALL", len(keys), *keys]
    for i, (_, spec) in enumerate(limits):
        if isinstance(spec, Concurrency):
            raise BadArgument(
                f"RL.ALL spec {i + 1}: CONCURRENCY cannot be used here "
                "(a lease must be released on its own key)"
            )
        utc_only(spec, f"RL.ALL (spec {i + 1})")
        args += spec_args(spec)
    args += request_args(cost, force=force)
    return args


def decode(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def parse_policy(reply: object) -> dict[str, object] | None:
    """`RL.POLICY GET`'s field/value pairs as a dict (None when missing)."""
    if reply is None:
        return None
    items = decode(reply)
    if isinstance(items, dict):
        return {str(k): v for k, v in items.items()}
    if not isinstance(items, list) or len(items) % 2:
        raise ProtocolError(f"RL.POLICY GET answered {reply!r}")
    return {str(items[i]): items[i + 1] for i in range(0, len(items), 2)}


@dataclasses.dataclass(frozen=True)
class LogEntry:
    """One denial of `RL.LOG GET`."""

    id: int
    unix_ms: int
    key: str
    source: str
    cost: int
    wait_ms: int


def parse_log(reply: object) -> list[LogEntry]:
    items = decode(reply)
    if not isinstance(items, list):
        raise ProtocolError(f"RL.LOG GET answered {reply!r}")
    out = []
    for e in items:
        if not isinstance(e, list) or len(e) != 6:
            raise ProtocolError(f"RL.LOG GET entry {e!r}")
        out.append(LogEntry(int(e[0]), int(e[1]), str(e[2]), str(e[3]), int(e[4]), int(e[5])))
    return out


def module_version(reply: object) -> int | None:
    """The `ratelimit` module's version in a `MODULE LIST` reply, None if absent."""
    for mod in reply if isinstance(reply, list) else []:
        if isinstance(mod, dict):
            fields: dict[object, object] = {decode(k): decode(v) for k, v in mod.items()}
        elif isinstance(mod, list):
            pairs = decode(mod)
            assert isinstance(pairs, list)
            fields = dict(zip(pairs[::2], pairs[1::2]))
        else:
            continue
        if fields.get("name") == MODULE_NAME:
            return int(str(fields.get("ver", 0)))
    return None


def module_loaded(reply: object) -> bool:
    """Whether a `MODULE LIST` reply names the `ratelimit` module."""
    return module_version(reply) is not None
