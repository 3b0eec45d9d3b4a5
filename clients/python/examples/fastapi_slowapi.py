"""slowapi (FastAPI) on the module: one import, one URI.

make run
pip install fastapi uvicorn slowapi ./clients/python  # redis-ratelimit-client, from the repo root
uvicorn fastapi_slowapi:app   # then: curl -i localhost:8000/
"""

import os

from fastapi import FastAPI, Request, Response
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address

import redis_ratelimit_client  # noqa: F401  registers redis+rl:// with limits

REDIS = os.environ.get("RL_REDIS", "127.0.0.1:6379")

limiter = Limiter(
    key_func=get_remote_address,
    storage_uri=f"redis+rl://{REDIS}",  # was: redis://...
    strategy="moving-window",
    headers_enabled=True,
)
app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)


@app.get("/")
@limiter.limit("5/second")
async def index(request: Request, response: Response) -> dict[str, str]:
    return {"hello": "world"}
