"""The kit's own ASGI middleware on a FastAPI app: per-user 5/s and a global
15,000/s in one RL.ALL, with 429 + Retry-After + RateLimit fields + a problem body.

    make run
    pip install fastapi uvicorn ./clients/python  # redis-ratelimit-client, from the repo root
    uvicorn asgi_middleware:app   # then: curl -i -H 'x-user: alice' localhost:8000/
"""

import os

import redis.asyncio as aioredis
from fastapi import FastAPI

from redis_ratelimit_client import Sliding, TokenBucket
from redis_ratelimit_client.asgi import FallbackMode, RateLimitMiddleware, Rule, header

REDIS = os.environ.get("RL_REDIS", "127.0.0.1:6379")
host, port = REDIS.rsplit(":", 1)

app = FastAPI()


@app.get("/")
async def index() -> dict[str, str]:
    return {"hello": "world"}


app.add_middleware(
    RateLimitMiddleware,
    client=aioredis.Redis(host=host, port=int(port)),
    key=header("x-user"),  # or redis_ratelimit_client.asgi.client_ip
    rules=[
        Rule(Sliding(5, 1000), "per-user", key_prefix="{api}:user:"),
        Rule(TokenBucket(15_000, 15_000, 1000), "global", fixed_key="{api}:global"),
    ],
    fallback=FallbackMode.LOCAL_ONLY,  # or FAIL_OPEN / FAIL_CLOSED
    instances=int(os.environ.get("INSTANCES", "1")),
    deadline=float(os.environ.get("RL_DEADLINE", "0.1")),  # seconds per Redis call
)
