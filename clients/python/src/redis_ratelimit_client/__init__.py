"""redis-ratelimit-client: typed calls on redis-py, a `Limiter`, a `limits` storage, ASGI middleware

Importing this package registers the `redis+rl://` and `async+redis+rl://`
storage schemes with `limits` when `limits` is installed.
"""

from .aio import AsyncClient
from .breaker import BreakerOpen, BreakerState, CircuitBreaker
from .client import Client
from .decision import Decision
from .errors import (
    BadArgument,
    Denied,
    InvalidArgument,
    ModuleMissing,
    ModuleNotLoaded,
    ProtocolError,
    RateLimitError,
    ServerError,
    WrongType,
)
from .events import BulkSink, DenyEvent, DenyEvents, FileSink, SinkError
from .lease import AsyncLease, Lease
from .limiter import Admission, AsyncLimiter, FallbackMode, Limiter
from .metrics import Metrics, MetricsMissing
from .protection import AsyncProtection, PolicyStats, Protection
from .protocol import LogEntry
from .request import Request, RequestKind
from .spec import (
    MAX_PARAM,
    Adapt,
    Concurrency,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    Period,
    Policy,
    PolicyMode,
    Quota,
    Rule,
    Sliding,
    Spec,
    Stages,
    TokenBucket,
)

try:  # the storage needs `limits` 5.x (pip install ./clients/python[limits]; Python 3.10+)
    from .limits_storage import AsyncRLStorage as AsyncRLStorage
    from .limits_storage import RLStorage as RLStorage

    _STORAGE = ["AsyncRLStorage", "RLStorage"]
except ImportError:  # pragma: no cover - limits absent
    _STORAGE = []

__version__ = "0.2.0"

__all__ = [
    "MAX_PARAM",
    "Admission",
    "AsyncLimiter",
    "FallbackMode",
    "Limiter",
    "Rule",
    "Adapt",
    "AsyncClient",
    "AsyncProtection",
    "BreakerOpen",
    "BreakerState",
    "CircuitBreaker",
    "PolicyStats",
    "Protection",
    "AsyncLease",
    "BadArgument",
    "BulkSink",
    "DenyEvent",
    "DenyEvents",
    "FileSink",
    "Metrics",
    "MetricsMissing",
    "SinkError",
    "Client",
    "Concurrency",
    "Decision",
    "Denied",
    "FixedWindow",
    "HashWindow",
    "InvalidArgument",
    "LeakyBucket",
    "Lease",
    "LogEntry",
    "ModuleMissing",
    "ModuleNotLoaded",
    "Period",
    "Policy",
    "PolicyMode",
    "ProtocolError",
    "Quota",
    "RateLimitError",
    "Request",
    "RequestKind",
    "ServerError",
    "Sliding",
    "Stages",
    "Spec",
    "TokenBucket",
    "WrongType",
    *_STORAGE,
]
