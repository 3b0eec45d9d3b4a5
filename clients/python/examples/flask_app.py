"""flask-limiter on the module: one import, one URI.

make run                      # a server with the module on 6379
pip install flask flask-limiter ./clients/python  # redis-ratelimit-client, from the repo root
flask --app flask_app run     # then: curl -i localhost:5000/
"""

import os

from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

import redis_ratelimit_client  # noqa: F401  registers redis+rl:// with limits

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
