"""flask-limiter on the module: one import, one URI; and the kit's own
`Limiter` on one route, with Prometheus metrics on `/metrics` and deny
events.

make run                      # a server with the module on 6379
pip install flask flask-limiter './clients/python[metrics]'  # from the repo root
flask --app flask_app run     # then: curl -i localhost:5000/ ; curl localhost:5000/metrics

Deny events of `/checkout`: appended to the file `RL_DENY_FILE` as JSON
lines, or shipped to Elasticsearch's `_bulk` at `RL_DENY_BULK`; neither set:
none.
"""

from __future__ import annotations

import os

import redis
from flask import Flask, Response, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

import redis_ratelimit_client  # registers redis+rl:// with limits
from redis_ratelimit_client import BulkSink, DenyEvents, FileSink, Rule, Sliding

REDIS = os.environ.get("RL_REDIS", "127.0.0.1:6379")

app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    storage_uri=f"redis+rl://{REDIS}",  # was: redis://...
    strategy="moving-window",  # exact, on RL.SLIDING
    headers_enabled=True,
    default_limits=["100/minute"],
)
orders = limiter.shared_limit("20/minute", scope="orders")


@app.route("/")
@limiter.limit("5/second")
def index() -> str:
    return "hello\n"


@app.route("/orders/create")
@orders
def create() -> str:
    return "created\n"


@app.route("/orders/list")
@orders
def listing() -> str:
    return "listed\n"


# The kit's own Limiter (deny cache, fallback, breaker), with metrics and
# deny events: 3 checkouts a minute per client address.
registry = CollectorRegistry()  # or prometheus_client.REGISTRY
interval = float(os.environ.get("RL_DENY_FLUSH_INTERVAL", "5"))
events = None
if os.environ.get("RL_DENY_BULK"):
    events = DenyEvents(BulkSink(os.environ["RL_DENY_BULK"]), flush_interval=interval)
elif os.environ.get("RL_DENY_FILE"):
    events = DenyEvents(FileSink(os.environ["RL_DENY_FILE"]), flush_interval=interval)
host, port = REDIS.rsplit(":", 1)
checkout_limiter = redis_ratelimit_client.Limiter(
    redis.Redis(host=host, port=int(port), socket_timeout=0.1),  # the deadline
    [Rule(Sliding(3, 60_000), "checkout", key_prefix="rl:checkout:")],
    metrics=registry,
    deny_events=events,
)


@app.route("/checkout")
@limiter.exempt
def checkout() -> Response:
    ip = request.remote_addr or "unknown"
    a = checkout_limiter.check(ip, client_ip=ip, user_agent=request.user_agent.string or None)
    if not a.allowed:
        wait = a.decision.retry_after_s
        headers = {} if wait is None else {"Retry-After": str(wait)}
        return Response("too many checkouts\n", 429, headers=headers)
    return Response("checked out\n")


@app.route("/metrics")
@limiter.exempt
def metrics() -> Response:
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
