"""The commands' arguments and the replies' meaning, shared by the sync
(`client.py`) and asyncio (`aio.py`) clients: each builds its arguments here,
checked before anything is sent, sends them its own way, and reads the
reply here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Sequence
from typing import Any, Callable, Literal, Union

from redis.exceptions import ResponseError

from .decision import Decision
from .errors import Denied, InvalidArgument, ModuleMissing, ProtocolError, ServerError, WrongType
from .request import Request, RequestKind
from .spec import (
    ALGORITHMS,
    MAX_LEASE,
    Adapt,
    Algorithm,
    Concurrency,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    Policy,
    PolicyMode,
    Quota,
    Sliding,
    Spec,
    Stages,
    TokenBucket,
    _check_int,
    check_policy_name,
    loop_args,
)

Key = Union[str, bytes]
Arg = Union[str, bytes, int]

#: The module's name in `MODULE LIST`.
MODULE_NAME = "ratelimit"


def check_key(key: object, what: str = "key") -> str | bytes:
    if not isinstance(key, (str, bytes)) or len(key) == 0:
        raise InvalidArgument(f"{what} must be a non-empty str or bytes, not {key!r}")
    return key


def check_lease(lease: object) -> int:
    """A lease id as `RL.RELEASE`/`RL.RENEW` take it (0 to 2^63 - 1)."""
    return _check_int("lease", lease, 0, MAX_LEASE)


def check_lease_ms(lease_ms: object) -> int:
    return _check_int("lease_ms", lease_ms, 1)


def block_args(timeout_ms: object) -> list[str | int]:
    """`BLOCK timeout_ms` (0: wait without a limit); checked before sending."""
    return ["BLOCK", _check_int("timeout_ms", timeout_ms, 0)]


def waiting(request: Request) -> Request:
    """A blocking call's request: a cost (it waits until the units are
    taken), or an upto (it waits for the first unit)."""
    if request.kind not in (RequestKind.COST, RequestKind.UPTO):
        raise InvalidArgument(
            "a blocking call waits for Request.cost(n), not a forced cost or a refund",
            param=request.option if request.kind is RequestKind.REFUND else "FORCE",
        )
    return request


def acquire_deadline(timeout_ms: int) -> float | None:
    """The socket timeout of a blocking acquire, in seconds: the BLOCK timeout
    plus a margin of max(1 s, 10 %); None (no limit) for BLOCK 0."""
    if timeout_ms == 0:
        return None
    return timeout_ms / 1000.0 + max(1.0, timeout_ms / 10_000.0)


def utc_only(spec: object, where: str) -> None:
    """`RL.ALL`'s inline specs count quotas in UTC only (a policy's quota
    counts in the policy's zone)."""
    if isinstance(spec, Quota) and spec.zone is not None:
        raise InvalidArgument(
            f"zone: {where} counts a quota in UTC only, not in {spec.zone!r}: apply a zoned "
            "quota with its own RL.QUOTA call"
        )


def spec_args(spec: Spec) -> list[str | int]:
    if isinstance(spec, Policy):
        return ["POLICY", spec.name]
    if isinstance(spec, ALGORITHMS):
        return [spec.ALGORITHM, *spec.params()]
    raise InvalidArgument(f"a spec must be an algorithm or a Policy, not {type(spec).__name__}")


def request_args(
    cost: int = 1, *, force: bool = False, refund: int | None = None
) -> list[str | int]:
    """`COST n [FORCE]` or `REFUND n`; checked before sending. Deprecated
    form of `Request.args()`, kept for one release."""
    if refund is not None:
        if force:
            raise InvalidArgument("REFUND cannot be given with FORCE", param="REFUND")
        if cost != 1:
            raise InvalidArgument("REFUND cannot be given with COST", param="REFUND")
        return Request.refund(refund).args()
    return (Request.force(cost) if force else Request.cost(cost)).args()


def is_upto(request: Request) -> bool:
    """Whether the reply to `request` carries `granted`."""
    return request.kind is RequestKind.UPTO


def check_upto(spec: Spec, request: Request) -> None:
    """`UPTO` is refused on the leaky bucket and concurrency, in the server's words."""
    if request.kind is RequestKind.UPTO and isinstance(spec, (LeakyBucket, Concurrency)):
        raise InvalidArgument(f"UPTO is not an option of RL.{spec.ALGORITHM}", param="UPTO")


def limit_args(key: Key, spec: Spec, request: Request) -> list[Arg]:
    check_key(key)
    check_upto(spec, request)
    req = request.args()
    if isinstance(spec, Policy):
        return ["RL.HIT", spec.name, key, *req]
    if not isinstance(spec, ALGORITHMS):
        raise InvalidArgument(f"a spec must be an algorithm or a Policy, not {type(spec).__name__}")
    if isinstance(spec, Quota):
        return ["RL.QUOTA", key, *spec.command_args(), *req]
    return [f"RL.{spec.ALGORITHM}", key, *spec_args(spec)[1:], *req]


def lease_ms_of(spec: object, request: Request, renew_ms: int | None) -> int | None:
    """Checks a lease's spec and request (a cost of at least one unit); the
    `lease_ms` it is renewed with."""
    if not isinstance(spec, (Concurrency, Policy)):
        raise InvalidArgument(f"a lease needs a Concurrency or a Policy, not {type(spec).__name__}")
    if request.kind is not RequestKind.COST:
        raise InvalidArgument("a lease is taken with Request.cost(n)", param=request.option)
    _check_int("COST", request.units, 1)
    if renew_ms is not None:
        return check_lease_ms(renew_ms)
    return spec.lease_ms if isinstance(spec, Concurrency) else None


def lease_of(client: Any, key: Key, d: Decision, lease_ms: int | None, spec: Spec, cls: Any) -> Any:
    """The lease of an admission, or `Denied`."""
    if not d.allowed:
        raise Denied(key, d)
    if d.lease is None:
        name = spec.name if isinstance(spec, Policy) else spec
        raise InvalidArgument(f"policy {name!r} is not a CONCURRENCY policy: it grants no lease")
    return cls(client, key, d, lease_ms)


def policy_set_args(
    name: str,
    spec: Algorithm,
    mode: PolicyMode,
    rollout: int,
    adapt: Adapt | Literal["OFF"] | None = None,
    stages: Stages | None = None,
    window_ms: int | None = None,
) -> list[str | int]:
    check_policy_name(name)
    if isinstance(spec, Policy):
        raise InvalidArgument("a policy is an algorithm, not another Policy")
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
        *loop_args(adapt, stages, window_ms),
    ]


def policy_scale_args(name: str, pct: int) -> list[Arg]:
    return ["RL.POLICY", "SCALE", check_policy_name(name), _check_int("pct", pct, 1, 100)]


def all_args(
    limits: Sequence[tuple[str | bytes, Spec]], request: Request
) -> list[str | bytes | int]:
    if not 1 <= len(limits) <= 16:
        raise InvalidArgument("RL.ALL takes 1 to 16 limiters")
    keys = [check_key(k) for k, _ in limits]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("RL.ALL: a key is given twice")
    args: list[str | bytes | int] = ["RL.ALL", len(keys), *keys]
    for i, (_, spec) in enumerate(limits):
        if isinstance(spec, Concurrency):
            raise InvalidArgument(
                f"RL.ALL spec {i + 1}: CONCURRENCY cannot be used here "
                "(a lease must be released on its own key)"
            )
        utc_only(spec, f"RL.ALL (spec {i + 1})")
        if request.kind is RequestKind.UPTO and isinstance(spec, LeakyBucket):
            raise InvalidArgument(
                f"UPTO is not an option of RL.ALL with a LEAKYBUCKET limiter (spec {i + 1})",
                param="UPTO",
            )
        args += spec_args(spec)
    if request.kind is RequestKind.REFUND:
        raise InvalidArgument(
            "REFUND is not an option of RL.ALL: refund each limiter with its own command",
            param="REFUND",
        )
    args += request.args()
    return args


def release_args(key: Key, lease: int) -> list[Arg]:
    """`RL.RELEASE key lease`."""
    check_key(key)
    return ["RL.RELEASE", key, check_lease(lease)]


def renew_args(key: Key, lease: int, lease_ms: int) -> list[Arg]:
    """`RL.RENEW key lease lease_ms`."""
    check_key(key)
    return ["RL.RENEW", key, check_lease(lease), check_lease_ms(lease_ms)]


def parse_live(reply: object) -> bool:
    """`RL.RELEASE`/`RL.RENEW`: whether the lease was live."""
    return bool(int(reply))  # type: ignore[call-overload]


def policy_get_args(name: str) -> list[Arg]:
    return ["RL.POLICY", "GET", check_policy_name(name)]


def policy_del_args(name: str) -> list[Arg]:
    return ["RL.POLICY", "DEL", check_policy_name(name)]


def parse_policy_del(replies: Sequence[object]) -> bool:
    """`RL.POLICY DEL` of every master: whether any had the policy."""
    return any(int(r) for r in replies)  # type: ignore[call-overload]


#: `RL.POLICY LIST`.
POLICY_LIST: tuple[Arg, ...] = ("RL.POLICY", "LIST")


def parse_policy_list(reply: object) -> list[str]:
    names = decode(reply)
    return [str(n) for n in names] if isinstance(names, list) else []


def log_get_args(count: int) -> list[Arg]:
    """`RL.LOG GET count`."""
    return ["RL.LOG", "GET", _check_int("count", count, 0)]


def parse_logs(replies: Sequence[object], count: int) -> list[LogEntry]:
    """`RL.LOG GET` of every master: the newest `count` denials, newest first."""
    entries = [e for r in replies for e in parse_log(r)]
    return sorted(entries, key=lambda e: e.unix_ms, reverse=True)[:count]


#: `RL.LOG LEN`.
LOG_LEN: tuple[Arg, ...] = ("RL.LOG", "LEN")


def parse_log_len(replies: Sequence[object]) -> int:
    """`RL.LOG LEN` of every master: their sum."""
    return sum(int(r) for r in replies)  # type: ignore[call-overload]


#: `RL.LOG RESET`.
LOG_RESET: tuple[Arg, ...] = ("RL.LOG", "RESET")
#: `MODULE LIST`.
MODULE_LIST: tuple[Arg, ...] = ("MODULE", "LIST")


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


def loaded_version(reply: object, server: str) -> int:
    """The module's version in `server`'s `MODULE LIST` reply, or
    `ModuleMissing` naming the server."""
    v = module_version(reply)
    if v is None:
        raise ModuleMissing(server)
    return v


def module_loaded(reply: object) -> bool:
    """Whether a `MODULE LIST` reply names the `ratelimit` module."""
    return module_version(reply) is not None


def spec_from_policy(policy: dict[str, object]) -> Algorithm:
    """The algorithm of an `RL.POLICY GET` reply."""
    algo = str(policy.get("algorithm", "")).upper()
    raw = list(policy.get("params", []))  # type: ignore[call-overload]
    if algo == "QUOTA" and len(raw) == 2:
        # `[limit, "DAY"]`: the period as its word; a `zone` field when not UTC.
        zone = policy.get("zone")
        return Quota(int(raw[0]), str(raw[1]), None if zone is None else str(zone))  # type: ignore[arg-type]
    params = [int(p) for p in raw]
    table: dict[str, Callable[..., Algorithm]] = {
        "TOKENBUCKET": TokenBucket,
        "LEAKYBUCKET": LeakyBucket,
        "SLIDING": Sliding,
        "HASHWINDOW": HashWindow,
        "FIXEDWINDOW": FixedWindow,
        "CONCURRENCY": Concurrency,
    }
    if algo not in table:
        raise InvalidArgument(f"policy {policy.get('name')!r} has algorithm {algo!r}, unknown here")
    return table[algo](*params)


# -- error replies and redis-py's connections, as both clients meet them --


def server_name(client: Any) -> str:
    """host:port (or the socket path) of a redis-py client, for messages."""
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kw:
        return f"unix:{kw['path']}"
    if "host" in kw:
        return f"{kw['host']}:{kw.get('port', 6379)}"
    name = getattr(client, "name", None)
    return str(name) if name else repr(client)


#: A server without the module: "unknown command 'RL.SLIDING', with args ..."
#: (Redis 6.2 quoted it with a backtick).
_UNKNOWN_RL = re.compile(r"unknown command [`']?(RL|CL)\.", re.IGNORECASE)


def map_error(exc: ResponseError, key: Key | None, server: str = "the server") -> Exception:
    """An error reply as the kit's error: `ModuleMissing` for an `RL.*`
    command the server does not know (it lost the module, say a restart
    without `--loadmodule`), `WrongType`, else `ServerError`."""
    text = str(exc)
    if _UNKNOWN_RL.search(text):
        return ModuleMissing(server)
    if text.startswith("WRONGTYPE"):
        shown = key.decode("utf-8", "replace") if isinstance(key, bytes) else (key or "")
        return WrongType(shown, text)
    return ServerError(text)


def is_moved(exc: ResponseError) -> bool:
    return type(exc).__name__ == "MovedError" or str(exc).startswith("MOVED")


_TAKES_COMMAND_NAME: dict[type, bool] = {}


def _takes_command_name(pool: Any) -> bool:
    """redis-py 5 requires `get_connection(command_name)`; 6+ deprecates it."""
    cls = type(pool)
    known = _TAKES_COMMAND_NAME.get(cls)
    if known is None:
        try:
            params = inspect.signature(cls.get_connection).parameters
            p = params.get("command_name")
            known = p is not None and p.default is inspect.Parameter.empty
        except (TypeError, ValueError):
            known = True
        _TAKES_COMMAND_NAME[cls] = known
    return known


# -- the protection loop: RL.OUTCOME and RL.POLICY STATS --

#: `RL.POLICY STATS` (and `RL.OUTCOME`): its names, in order.
STATS_FIELDS = ("scale", "stage", "window_ms", "window_end_ms", "current", "last", "adapting")
#: Each window's names, in order.
WINDOW_FIELDS = ("calls", "admitted", "denied", "ok", "errors", "deny_permille", "error_permille")


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of a policy's loop, as the master counted it."""

    calls: int
    admitted: int
    denied: int
    ok: int
    errors: int
    deny_permille: int
    error_permille: int


@dataclasses.dataclass(frozen=True)
class PolicyStats:
    """`RL.POLICY STATS name` (and `RL.OUTCOME`'s reply)."""

    scale: int
    stage: int
    window_ms: int
    window_end_ms: int
    current: Window
    last: Window
    adapting: bool

    @classmethod
    def from_reply(cls, reply: object) -> PolicyStats:
        """Parses the flat name/value list; exactly `STATS_FIELDS`, in order,
        each window exactly `WINDOW_FIELDS`."""
        values = _named(decode(reply), STATS_FIELDS, "RL.POLICY STATS")
        windows = [
            Window(*(int(v) for v in _named(values[k], WINDOW_FIELDS, f"RL.POLICY STATS {k}")))
            for k in (4, 5)
        ]
        return cls(
            int(values[0]),
            int(values[1]),
            int(values[2]),
            int(values[3]),
            windows[0],
            windows[1],
            int(values[6]) != 0,
        )


def _named(items: object, names: Sequence[str], what: str) -> list[Any]:
    if not isinstance(items, list) or len(items) != 2 * len(names):
        raise ProtocolError(f"{what} answered {items!r}")
    got = [str(n) for n in items[::2]]
    if got != list(names):
        raise ProtocolError(f"{what} answered the fields {got}, not {list(names)}")
    return list(items[1::2])


def outcome_args(policy: str, ok: int, errors: int, denied: int = 0) -> list[str | int]:
    """`RL.OUTCOME name ok errors [DENIED n]`: `denied`, the calls of the
    policy a kit denied without asking the server (its deny cache, the
    local level of a global rule), sent only when there are some."""
    args: list[str | int] = [
        "RL.OUTCOME",
        check_policy_name(policy),
        _check_int("ok", ok, 0),
        _check_int("errors", errors, 0),
    ]
    if _check_int("DENIED", denied, 0):
        args += ["DENIED", denied]
    return args


def stats_args(policy: str) -> list[str | int]:
    return ["RL.POLICY", "STATS", check_policy_name(policy)]
