"""The kit's own ASGI middleware on a FastAPI app: a per-user policy (5/s,
adapting to the backend's errors, staged by its deny ratio) and a global
15,000/s in one RL.ALL, with 429 + Retry-After + RateLimit fields + a
problem body, and the protection loop around them.

    make run
    pip install fastapi uvicorn './clients/python[metrics]'  # from the repo root
    uvicorn asgi_middleware:app   # then: curl -i -H 'x-user: alice' localhost:8000/

The routes:
- `/` (core) calls the backend through the `backend` circuit breaker, which
  the loop opens while the policy is at stage 2 (break); a backend failure
  answers 503, which the middleware counts as an error for the policy;
- `/recommendations` (non-core) answers its degrade handler (an empty,
  default list) while the policy is at stage 1 or 2, without a call to
  Redis, and in place of the 429 when it is denied;
- `/protection` (not limited): this instance's stage, scale and breaker;
- `POST /backend?fail_every=N` (not limited): the backend fails every Nth
  call from now on (0: never; `FAIL_EVERY` at start-up);
- `/metrics` (not limited): the instance's Prometheus metrics (every
  decision by rule, level and outcome, Redis round trips, the policy's
  scale and stage, the breakers, the deny events' counts).

Deny events: every denial, with the client's IP and User-Agent, shipped in
batches to Elasticsearch's `_bulk` at `RL_DENY_BULK` (say
`http://127.0.0.1:9200`), or appended to the file `RL_DENY_FILE` as JSON
lines; neither set: none.

The policy is created when the server has none (`RL_POLICY_SPEC`); change it
at any time with `RL.POLICY SET`, every instance follows.
"""

from __future__ import annotations

import os
import shlex

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from redis_ratelimit_client import (
    AsyncProtection,
    BreakerOpen,
    BulkSink,
    CircuitBreaker,
    DenyEvents,
    FileSink,
    Policy,
    TokenBucket,
)
from redis_ratelimit_client.asgi import (
    FallbackMode,
    RateLimitMiddleware,
    RouteOptions,
    Rule,
    header,
)

POLICY = "api"
#: The policy created when the server has none: 5/s per user, a scale that
#: drops to 80% (then 64%, down to 50%) while more than 5% of the requests
#: fail, stage 1 above 30% denied, stage 2 above 50%.
POLICY_SPEC = "SLIDING 5 1000 ADAPT ERRORS 5 STAGES 30 50"


class Backend:
    """The downstream the service calls: fails every `fail_every`th call
    (0: never), deterministically."""

    def __init__(self, fail_every: int = 0) -> None:
        self.fail_every = fail_every
        self.calls = 0

    async def fetch(self) -> dict[str, str]:
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise ConnectionError("the backend failed")
        return {"hello": "world"}


def ensure_policy(host: str, port: int) -> None:
    """Creates the policy when the server has none (never overwrites it)."""
    with redis.Redis(host=host, port=port, socket_timeout=2) as r:
        if r.execute_command("RL.POLICY", "GET", POLICY) is None:
            spec = os.environ.get("RL_POLICY_SPEC", POLICY_SPEC)
            r.execute_command("RL.POLICY", "SET", POLICY, *shlex.split(spec))


def seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, str(default)))


def deny_events() -> DenyEvents | None:
    """The deny events' shipper the environment asks for, if any (the
    contract's defaults: 10,000 buffered, a flush every 5 s or 1,000 events,
    2 s per flush; the tests shorten the interval)."""
    interval = seconds("RL_DENY_FLUSH_INTERVAL", 5.0)
    if os.environ.get("RL_DENY_BULK"):
        return DenyEvents(BulkSink(os.environ["RL_DENY_BULK"]), flush_interval=interval)
    if os.environ.get("RL_DENY_FILE"):
        return DenyEvents(FileSink(os.environ["RL_DENY_FILE"]), flush_interval=interval)
    return None


def create_app() -> FastAPI:
    """One instance of the service: its own client, limiter, protection
    loop, breaker and backend."""
    host, port = os.environ.get("RL_REDIS", "127.0.0.1:6379").rsplit(":", 1)
    ensure_policy(host, int(port))
    backend = Backend(int(os.environ.get("FAIL_EVERY", "0")))
    breaker = CircuitBreaker("backend")
    client = aioredis.Redis(host=host, port=int(port), socket_timeout=1, socket_connect_timeout=1)
    # The instance's own registry (prometheus_client's REGISTRY would do too).
    registry = CollectorRegistry()
    events = deny_events()
    protection = AsyncProtection(
        client,
        [POLICY],
        breakers={POLICY: breaker},
        # The contract's defaults (1 s, 1 s, 5 s); the tests shorten them.
        report_interval=seconds("RL_REPORT_INTERVAL", 1.0),
        stage_poll=seconds("RL_STAGE_POLL", 1.0),
        stage_hold=seconds("RL_STAGE_HOLD", 5.0),
        metrics=registry,  # its scale, stage and breaker
    )
    app = FastAPI()
    app.state.backend = backend
    app.state.breaker = breaker
    app.state.protection = protection
    app.state.registry = registry
    app.state.deny_events = events

    @app.get("/")
    async def index() -> JSONResponse:
        try:
            data = await breaker.call_async(backend.fetch)
        except BreakerOpen:
            # The policy is at stage 2: the backend is spared, a default answer.
            return JSONResponse({"hello": "world", "served": "default"})
        except ConnectionError as e:
            return JSONResponse({"error": str(e)}, status_code=503)
        return JSONResponse(data)

    @app.get("/recommendations")
    async def recommendations() -> dict[str, object]:
        return {"recommendations": ["a", "b", "c"], "degraded": False}

    @app.get("/protection")
    async def state() -> dict[str, object]:
        return {**protection.state()[POLICY], "breaker_name": breaker.name}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/backend")
    async def set_backend(fail_every: int) -> dict[str, int]:
        backend.fail_every = fail_every
        return {"fail_every": fail_every}

    app.add_middleware(
        RateLimitMiddleware,
        client=client,
        key=header("x-user"),  # or redis_ratelimit_client.asgi.client_ip
        rules=[
            Rule(Policy(POLICY), "per-user", key_prefix="{api}:user:"),
            Rule(TokenBucket(15_000, 15_000, 1000), "global", fixed_key="{api}:global"),
        ],
        fallback=FallbackMode.LOCAL_ONLY,  # or FAIL_OPEN / FAIL_CLOSED
        instances=int(os.environ.get("INSTANCES", "1")),
        deadline=seconds("RL_DEADLINE", 0.1),  # seconds per Redis call
        # A denial from the deny cache is reported to the server (DENIED n):
        # the stages see a flood the deny cache answers.
        deny_cache_max=seconds("RL_DENY_CACHE_MAX", 1.0),
        protection=protection,
        metrics=registry,  # every decision, by rule, level and outcome
        deny_events=events,  # every denial, with client_ip and user_agent
        routes=[
            RouteOptions(
                "/recommendations",
                core=False,
                degrade=JSONResponse({"recommendations": [], "degraded": True}),
            ),
            RouteOptions("/protection", limited=False),
            RouteOptions("/backend", limited=False),
            RouteOptions("/metrics", limited=False),
        ],
    )
    return app


app = create_app()
