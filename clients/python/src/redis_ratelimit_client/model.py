"""The names this module held before the split, kept importable.

Errors are in `errors.py`, the algorithms, policies and rules in `spec.py`,
the decision in `decision.py`, the commands' arguments and the replies'
meaning in `protocol.py`; every name `redis_ratelimit_client.model` exported
is still importable from here.
"""

from __future__ import annotations

from .decision import Decision as Decision
from .errors import BadArgument as BadArgument
from .errors import Denied as Denied
from .errors import InvalidArgument as InvalidArgument
from .errors import ModuleMissing as ModuleMissing
from .errors import ModuleNotLoaded as ModuleNotLoaded
from .errors import ProtocolError as ProtocolError
from .errors import RateLimitError as RateLimitError
from .errors import ServerError as ServerError
from .errors import WrongType as WrongType
from .errors import answer_lost as answer_lost
from .errors import not_sent as not_sent
from .protocol import MODULE_NAME as MODULE_NAME
from .protocol import LogEntry as LogEntry
from .protocol import acquire_deadline as acquire_deadline
from .protocol import all_args as all_args
from .protocol import block_args as block_args
from .protocol import check_key as check_key
from .protocol import check_lease as check_lease
from .protocol import check_lease_ms as check_lease_ms
from .protocol import decode as decode
from .protocol import module_loaded as module_loaded
from .protocol import module_version as module_version
from .protocol import parse_log as parse_log
from .protocol import parse_policy as parse_policy
from .protocol import policy_set_args as policy_set_args
from .protocol import request_args as request_args
from .protocol import spec_args as spec_args
from .protocol import utc_only as utc_only
from .spec import _OFFSET as _OFFSET
from .spec import _ZONE_NAME as _ZONE_NAME
from .spec import ALGORITHMS as ALGORITHMS
from .spec import MAX_BUCKETS as MAX_BUCKETS
from .spec import MAX_CONCURRENCY as MAX_CONCURRENCY
from .spec import MAX_LEASE as MAX_LEASE
from .spec import MAX_PARAM as MAX_PARAM
from .spec import MAX_SLIDING as MAX_SLIDING
from .spec import MAX_SPAN_MS as MAX_SPAN_MS
from .spec import PERIOD_NOMINAL_S as PERIOD_NOMINAL_S
from .spec import Algorithm as Algorithm
from .spec import Concurrency as Concurrency
from .spec import FixedWindow as FixedWindow
from .spec import HashWindow as HashWindow
from .spec import LeakyBucket as LeakyBucket
from .spec import Period as Period
from .spec import PeriodLike as PeriodLike
from .spec import Policy as Policy
from .spec import PolicyMode as PolicyMode
from .spec import Quota as Quota
from .spec import Sliding as Sliding
from .spec import Spec as Spec
from .spec import TokenBucket as TokenBucket
from .spec import _check_int as _check_int
from .spec import _check_span as _check_span
from .spec import _tzinfo as _tzinfo
from .spec import check_period as check_period
from .spec import check_policy_name as check_policy_name
from .spec import check_zone as check_zone
