"""The algorithms with their parameters, policies and the middleware's rules.

Specs can only be built valid: a bad parameter raises `InvalidArgument` before
anything is sent, so nothing is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
from typing import Literal, Union

from .errors import InvalidArgument

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


def _check_int(name: str, value: object, low: int, high: int = MAX_PARAM) -> int:
    # bool is an int in Python; True as a capacity is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, not {type(value).__name__}", param=name)
    if not low <= value <= high:
        raise InvalidArgument(
            f"{name} must be an integer from {low} to {high}, not {value}", param=name
        )
    return value


def _check_span(capacity: int, count: int, per_ms: int, what: str) -> None:
    """The server's bound on a bucket: `capacity * per_ms / count` (the time
    from empty to full, or from full to empty) at most `MAX_SPAN_MS`."""
    if capacity * per_ms > MAX_SPAN_MS * count:
        raise InvalidArgument(
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
            raise InvalidArgument("bucket_ms must divide window_ms", param="bucket_ms")
        if self.window_ms // self.bucket_ms > MAX_BUCKETS:
            raise InvalidArgument(
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
    """A `Period` from itself or its word in any case; `InvalidArgument` naming `period`."""
    if isinstance(period, Period):
        return period
    if isinstance(period, str) and period.upper() in Period.__members__:
        return Period[period.upper()]
    raise InvalidArgument(
        f"period must be one of DAY, WEEK, MONTH, YEAR, not {period!r}", param="period"
    )


def check_zone(zone: object) -> str | None:
    """A quota's zone as the module takes it: None or `UTC` (the default), a
    fixed offset `+HH:MM`/`-HH:MM` from -18:00 to +18:00, or an IANA name such as
    `America/New_York` (whether the server knows the name is its answer).
    None for UTC; `InvalidArgument` naming `zone`."""
    if zone is None:
        return None
    bad = InvalidArgument(
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


def check_policy_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"policy name must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= 256 or any(not "!" <= c <= "~" for c in name):
        raise InvalidArgument(
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


#: `RL.POLICY SET ... ADAPT ERRORS pct`'s defaults (the contract's
#: `protection.defaults`) and the policy's window when none is given.
ADAPT_FACTOR = 80
ADAPT_MIN = 50
ADAPT_RECOVER = 5
ADAPT_MINCALLS = 100
LOOP_WINDOW_MS = 10_000
#: The longest `WINDOW` of a policy's loop: a day.
MAX_LOOP_WINDOW_MS = 86_400_000


@dataclasses.dataclass(frozen=True)
class Adapt:
    """`ADAPT ERRORS errors [FACTOR] [MIN] [RECOVER] [MINCALLS]` of a
    policy: when a window with at least `mincalls` outcomes has more than
    `errors` % errors, the scale becomes max(`min`, scale x `factor` / 100);
    at most `errors` / 2 %, it climbs by `recover` (up to 100)."""

    errors: int
    factor: int = ADAPT_FACTOR
    min: int = ADAPT_MIN
    recover: int = ADAPT_RECOVER
    mincalls: int = ADAPT_MINCALLS

    def __post_init__(self) -> None:
        _check_int("ERRORS", self.errors, 0, 100)
        _check_int("FACTOR", self.factor, 1, 100)
        _check_int("MIN", self.min, 1, 100)
        _check_int("RECOVER", self.recover, 0, 100)
        _check_int("MINCALLS", self.mincalls, 0)

    def args(self) -> list[str | int]:
        return [
            "ADAPT",
            "ERRORS",
            self.errors,
            "FACTOR",
            self.factor,
            "MIN",
            self.min,
            "RECOVER",
            self.recover,
            "MINCALLS",
            self.mincalls,
        ]


@dataclasses.dataclass(frozen=True)
class Stages:
    """`STAGES degrade_pct break_pct` of a policy: at a window's end its
    stage becomes 2 (break) above `break_pct` % denied, else 1 (degrade)
    above `degrade_pct` %, else one lower."""

    degrade_pct: int
    break_pct: int

    def __post_init__(self) -> None:
        _check_int("degrade_pct", self.degrade_pct, 0, 100)
        _check_int("break_pct", self.break_pct, self.degrade_pct, 100)

    def args(self) -> list[str | int]:
        return ["STAGES", self.degrade_pct, self.break_pct]


def loop_args(
    adapt: Adapt | Literal["OFF"] | None, stages: Stages | None, window_ms: int | None
) -> list[str | int]:
    """A policy's loop options: `ADAPT ...` or `ADAPT OFF`, `STAGES`, `WINDOW`."""
    out: list[str | int] = []
    if adapt == "OFF":
        out += ["ADAPT", "OFF"]
    elif adapt is not None:
        if not isinstance(adapt, Adapt):
            raise InvalidArgument('adapt is an Adapt, "OFF" or None', param="ADAPT")
        out += adapt.args()
    if stages is not None:
        out += stages.args()
    if window_ms is not None:
        out += ["WINDOW", _check_int("WINDOW", window_ms, 1, MAX_LOOP_WINDOW_MS)]
    return out


class PolicyMode(str, enum.Enum):
    ENFORCE = "ENFORCE"
    SHADOW = "SHADOW"
    OFF = "OFF"


def scaled(param: int, scale: int) -> int:
    """A size or rate parameter at `scale` percent: `max(1, floor(param x
    scale / 100))`, as the server runs it."""
    return max(1, param * min(max(scale, 0), 100) // 100)


def scaled_algorithm(algo: Algorithm, scale: int) -> Algorithm:
    """`algo` with its size and rate parameters at `scale` percent: the
    capacity and the refill (leak) count of the buckets, the limit of the
    others (the server's `Spec::scaled`)."""
    if scale >= 100:
        return algo
    if isinstance(algo, TokenBucket):
        return dataclasses.replace(
            algo,
            capacity=scaled(algo.capacity, scale),
            refill_count=scaled(algo.refill_count, scale),
        )
    if isinstance(algo, LeakyBucket):
        return dataclasses.replace(
            algo, capacity=scaled(algo.capacity, scale), leak_count=scaled(algo.leak_count, scale)
        )
    if isinstance(algo, (Sliding, HashWindow, FixedWindow, Concurrency, Quota)):
        return dataclasses.replace(algo, limit=scaled(algo.limit, scale))
    raise InvalidArgument(f"unknown algorithm {algo!r}", param="algorithm")


def _limit_of(spec: Algorithm) -> int:
    return spec.capacity if isinstance(spec, (TokenBucket, LeakyBucket)) else spec.limit


@dataclasses.dataclass(frozen=True)
class Rule:
    """A named limit: an algorithm inline, or a `Policy` kept in the server.

    The limiter key is `key_prefix + identity` (default prefix
    `rl:<name>:`), or `fixed_key` for a limit shared by everyone.

    `global_`: a limit shared by every instance (a hot key): a `Limiter`
    admits from this instance's share of it in process first (the local
    level), and asks Redis only for what the share admitted.

    A global inline rule of a token bucket, fixed window, sliding log, hash
    window or quota may also be (`grants.py`, the README's "One limit larger
    than one node"):

    - `batched`: the limiter takes units with `UPTO b` and spends them in
      process (never over the limit; at most `instances x b` units unused,
      each for `hold_ms`); units held longer than `hold_ms` (1 to 60000,
      default 50) go back with `REFUND`, and all of them at close. `b` is
      about `hold_ms` of the instance's rate, at most `max_share_pct` % (1
      to 100, default 10) of the limit.
    - `striped` = N (2 to 64; 1: not striped): the limit kept in N keys on
      different masters, each with `limit / N` of every size and rate
      parameter; an instance uses its own stripe, and on a denial the next.
    """

    spec: Spec
    name: str
    key_prefix: str | None = None
    fixed_key: str | None = None
    global_: bool = False
    batched: bool = False
    hold_ms: int = 50
    max_share_pct: int = 10
    striped: int = 1

    def __post_init__(self) -> None:
        if self.global_ and isinstance(self.spec, Concurrency):
            raise InvalidArgument(
                f"rule {self.name!r}: a CONCURRENCY rule holds leases; it has no local level",
                param="global_",
            )
        from .grants import check_options  # grants.py builds on this module

        check_options(
            self.name,
            self.spec,
            self.global_,
            self.batched,
            self.hold_ms,
            self.max_share_pct,
            self.striped,
        )

    @property
    def granted(self) -> bool:
        """Whether the rule is batched or striped: decided by grants, apart
        from the other rules' call."""
        return self.batched or self.striped > 1

    def key_for(self, identity: str) -> str:
        if self.fixed_key is not None:
            return self.fixed_key
        prefix = self.key_prefix if self.key_prefix is not None else f"rl:{self.name}:"
        return prefix + identity
