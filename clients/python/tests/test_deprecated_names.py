"""The former error names stay importable for one release, as the same classes."""

from __future__ import annotations

import pytest

import redis_ratelimit_client as rl
from redis_ratelimit_client import (
    BadArgument,
    InvalidArgument,
    ModuleMissing,
    ModuleNotLoaded,
    TokenBucket,
    errors,
    model,
)
from redis_ratelimit_client import client as client_mod


def test_old_names_are_the_new_classes() -> None:
    assert BadArgument is InvalidArgument
    assert ModuleNotLoaded is ModuleMissing
    for mod in (rl, errors, model):
        assert mod.BadArgument is mod.InvalidArgument
        assert mod.ModuleNotLoaded is mod.ModuleMissing
    assert client_mod.BadArgument is InvalidArgument
    assert client_mod.ModuleNotLoaded is ModuleMissing
    assert {"BadArgument", "InvalidArgument", "ModuleNotLoaded", "ModuleMissing"} <= set(rl.__all__)


def test_except_old_name_catches_what_is_raised() -> None:
    with pytest.raises(BadArgument) as info:
        TokenBucket(capacity=0, refill_count=1, refill_ms=1000)
    assert type(info.value) is InvalidArgument
    assert info.value.param == "capacity"
    try:
        raise ModuleMissing("localhost:6379")
    except ModuleNotLoaded as e:
        assert e.server == "localhost:6379"
