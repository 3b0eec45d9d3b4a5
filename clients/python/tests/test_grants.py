"""Batched and striped global rules (issue 27): the pure logic of grants.py,
then `Limiter` and `AsyncLimiter` against a real server (the bound read
from the server's clock, the calls from INFO commandstats, the units held
given back at close and after hold_ms, the fallback while Redis is away)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio as aioredis
from conftest import FIXED_MS, Server, wait_until
from observability import decisions, scrape
from prometheus_client import CollectorRegistry

from redis_ratelimit_client import (
    Concurrency,
    FixedWindow,
    HashWindow,
    InvalidArgument,
    LeakyBucket,
    Policy,
    Quota,
    Request,
    Rule,
    Sliding,
    TokenBucket,
)
from redis_ratelimit_client.decision import Decision
from redis_ratelimit_client.grants import (
    ONE_MASTER,
    Batch,
    RateCounter,
    batch_size,
    repick_tags,
    slot_of,
    stripe_denial,
    stripe_key,
    stripe_specs,
    stripe_tags,
)
from redis_ratelimit_client.limiter import AsyncLimiter, FallbackMode, Limiter

# -- pure: batch size, rate, shares, tags ------------------------------------------


def test_batch_size_is_hold_ms_of_the_rate_clamped() -> None:
    assert batch_size(0, 50, 1000, 10) == 1
    assert batch_size(1, 50, 1000, 10) == 1  # ceil(0.05)
    assert batch_size(1000, 50, 1000, 10) == 50
    assert batch_size(1001, 50, 1000, 10) == 51  # rounded up
    assert batch_size(100_000, 50, 1000, 10) == 100  # 10 % of the limit
    assert batch_size(100_000, 50, 5, 10) == 1  # max(1, 0)
    assert batch_size(100_000, 60_000, 7, 100) == 7


def test_the_rate_is_the_larger_of_the_last_whole_second_and_this_one() -> None:
    rc = RateCounter()
    for t in range(5):
        rc.note(10_000 + t)
    assert rc.rate(10_500) == 5
    rc.note(11_000)
    assert rc.rate(11_000) == 5  # previous second's 5, current 1
    for _ in range(7):
        rc.note(11_100)
    assert rc.rate(11_100) == 8
    assert rc.rate(12_000) == 8  # the second after: the last whole one
    assert rc.rate(13_000) == 0  # a second with nothing between
    rc.note(20_000)
    assert rc.rate(20_000) == 1


def test_stripe_shares_split_every_size_and_rate_the_remainder_first() -> None:
    tb = stripe_specs(TokenBucket(11, 5, 1000), 3)
    assert [(s.capacity, s.refill_count, s.refill_ms) for s in tb] == [  # type: ignore[union-attr]
        (4, 2, 1000),
        (4, 2, 1000),
        (3, 1, 1000),
    ]
    assert [s.limit for s in stripe_specs(FixedWindow(10, 60_000), 4)] == [3, 3, 2, 2]  # type: ignore[union-attr]
    hw = stripe_specs(HashWindow(7, 60_000, 1000), 2)
    assert hw == [HashWindow(4, 60_000, 1000), HashWindow(3, 60_000, 1000)]
    q = stripe_specs(Quota(5, "DAY", "+05:30"), 5)
    assert q == [Quota(1, "DAY", "+05:30")] * 5
    assert sum(s.limit for s in stripe_specs(Sliding(100, 1000), 64)) == 100  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "spec, n",
    [(TokenBucket(10, 2, 1000), 3), (FixedWindow(2, 1000), 3), (Quota(63, "DAY"), 64)],
)
def test_more_stripes_than_units_is_refused_naming_striped(spec: object, n: int) -> None:
    with pytest.raises(InvalidArgument) as e:
        stripe_specs(spec, n)  # type: ignore[arg-type]
    assert e.value.param == "striped"
    with pytest.raises(InvalidArgument) as e:
        Rule(spec, "r", fixed_key="k", global_=True, striped=n)  # type: ignore[arg-type]
    assert e.value.param == "striped"


def test_standalone_tags_are_rl0_rl1_rl2() -> None:
    assert stripe_tags(ONE_MASTER, 3) == ["rl0", "rl1", "rl2"]
    assert stripe_key("rl1", "api:global") == "{rl1}api:global"


THREE = [[(0, 5460)], [(5461, 10922)], [(10923, 16383)]]


def first_tag_owned(ranges: list[tuple[int, int]], used: set[str]) -> str:
    """The reference: the first "rlC" whose slot the master owns, not used."""
    c = 0
    while True:
        t = f"rl{c}"
        if t not in used and any(lo <= slot_of(t) <= hi for lo, hi in ranges):
            return t
        c += 1


def test_three_master_tags_are_the_first_owned_by_each_master() -> None:
    tags = stripe_tags(THREE, 3)
    used: set[str] = set()
    for i, t in enumerate(tags):
        assert t == first_tag_owned(THREE[i % 3], used)
        used.add(t)
    # The masters' order is their lowest slot's, not the order given.
    assert stripe_tags(list(reversed(THREE)), 3) == tags
    six = stripe_tags(THREE, 6)
    assert six[:3] == tags and len(set(six)) == 6
    assert [
        next(m for m, r in enumerate(THREE) if r[0][0] <= slot_of(t) <= r[0][1]) for t in six
    ] == [
        0,
        1,
        2,
        0,
        1,
        2,
    ]


def test_repick_keeps_tags_whose_master_still_holds_them() -> None:
    tags = stripe_tags(THREE, 3)
    assert repick_tags(THREE, tags) == tags
    # Slots 10923-12000 (rl2's 11838 among them) move to master 0, which
    # holds rl0: rl2 moves to the first free tag of the master left without
    # a stripe (12001-16383); the others stay.
    moved = [[(0, 5460), (10923, 12000)], [(5461, 10922)], [(12001, 16383)]]
    after = repick_tags(moved, tags)
    assert after[:2] == tags[:2] and after[2] == first_tag_owned([(12001, 16383)], set(tags))
    # Two masters for three stripes: the first gets two, so nothing moves.
    assert repick_tags([[(0, 10922)], [(10923, 16383)]], tags) == tags


def test_crc16_is_the_cluster_hash_slot() -> None:
    # The cluster specification's own example: CRC16-XMODEM of "123456789" is 0x31C3.
    assert slot_of("123456789") == 0x31C3 % 16384
    assert slot_of("rl0") == 3708


def test_a_batch_follows_the_contract_rules() -> None:
    b = Batch(FixedWindow(100, 60_000), hold_ms=50, max_share_pct=10)
    assert b.from_held(1) is None and b.denied_here(0.0) is None
    # A grant of 5 when 5 were asked: 1 taken, 4 held, no wait to ask again.
    d = b.granted(Decision(True, 100, 95, 0, 900, granted=5), 1000.0, 5, 1)
    assert d.allowed and b.held == 4 and b.next_ask_at == 0.0 and d.remaining == 95
    held = b.from_held(1)
    assert held == Decision(True, 100, 3, 0, 900)
    # Fewer than asked: the limiter is drained, ask again after hold_ms.
    b.granted(Decision(True, 100, 0, 0, 900, granted=2), 2000.0, 5, 1)
    assert b.next_ask_at == 2050.0 and b.held == 4
    # A denial: wait max(wait_ms, hold_ms) for b > 1, wait_ms for b = 1.
    b.granted(Decision(False, 100, 0, 20, 900, granted=0), 3000.0, 5, 1)
    assert b.next_ask_at == 3050.0
    assert b.denied_here(3010.0) == Decision(False, 100, 0, 40, 900)
    b.granted(Decision(False, 100, 0, 20, 900, granted=0), 3000.0, 1, 1)
    assert b.next_ask_at == 3020.0
    b.granted(Decision(False, 100, 0, -1, 900, granted=0), 3000.0, 1, 1)
    assert b.denied_here(1e12) == Decision(False, 100, 0, -1, 900)
    # Held longer than hold_ms: taken out to refund.
    b.held, b.granted_at = 3, 5000.0
    assert b.stale(5049.0) == 0 and b.stale(5050.0) == 3 and b.held == 0


def test_waiters_take_in_order_and_the_rest_are_denied_with_the_reply() -> None:
    b = Batch(TokenBucket(10, 1, 1000), hold_ms=50, max_share_pct=100)
    # 3 granted of 5 asked: the limiter is drained, the next ask after hold_ms.
    b.granted(Decision(True, 10, 0, 0, 300, granted=3), 0.0, 5, 1)
    assert b.held == 2
    firsts = [b.after_wait(1.0, 1), b.after_wait(1.0, 1)]
    assert all(d is not None and d.allowed for d in firsts)
    late = b.after_wait(10.0, 1)
    assert late is not None and not late.allowed and late.limit == 10 and late.wait_ms == 40
    # A denial reached the waiters: theirs is that denial.
    b.granted(Decision(False, 10, 0, 70, 300, granted=0), 20.0, 5, 1)
    assert b.after_wait(21.0, 1) == Decision(False, 10, 0, 70, 300, granted=0)


def test_both_stripes_denied_give_the_own_fields_with_the_shorter_wait() -> None:
    own = Decision(False, 10, 0, 500, 700)
    assert stripe_denial(own, Decision(False, 10, 0, 200, 100)) == Decision(False, 10, 0, 200, 700)
    assert stripe_denial(own, Decision(False, 10, 0, -1, 100)).wait_ms == 500
    never = Decision(False, 10, 0, -1, 0)
    assert stripe_denial(never, Decision(False, 10, 0, 300, 0)).wait_ms == 300


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"batched": True, "global_": False}, "batched"),
        ({"striped": 2, "global_": False}, "striped"),
        ({"batched": 1}, "batched"),
        ({"hold_ms": 0}, "hold_ms"),
        ({"hold_ms": 60_001}, "hold_ms"),
        ({"max_share_pct": 0}, "max_share_pct"),
        ({"max_share_pct": 101}, "max_share_pct"),
        ({"striped": 0}, "striped"),
        ({"striped": 65}, "striped"),
        ({"striped": True}, "striped"),
    ],
)
def test_rule_options_are_checked_naming_them(kw: dict[str, object], param: str) -> None:
    args: dict[str, object] = {"global_": True, **kw}
    with pytest.raises(InvalidArgument) as e:
        Rule(FixedWindow(100, 1000), "r", fixed_key="k", **args)  # type: ignore[arg-type]
    assert e.value.param == param


@pytest.mark.parametrize("spec", [LeakyBucket(10, 1, 100), Policy("p")])
@pytest.mark.parametrize("option", [{"batched": True}, {"striped": 2}])
def test_only_the_five_inline_algorithms_batch_or_stripe(
    spec: object, option: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgument) as e:
        Rule(spec, "r", fixed_key="k", global_=True, **option)  # type: ignore[arg-type]
    assert e.value.param == next(iter(option))
    with pytest.raises(InvalidArgument):
        Rule(Concurrency(5, 100), "c", global_=True, batched=True)


# -- batched, on a real server -------------------------------------------------------


def server_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def fw_remaining(r: redis.Redis, key: str, limit: int) -> int:
    return int(r.execute_command("RL.FIXEDWINDOW", key, limit, FIXED_MS, "COST", 0)[2])


def test_batched_threads_never_exceed_the_bound_with_few_calls(
    server: Server, r: redis.Redis
) -> None:
    capacity, refill_count, refill_ms = 50, 1, 100
    rule = Rule(
        TokenBucket(capacity, refill_count, refill_ms),
        "hot",
        fixed_key="hot",
        global_=True,
        batched=True,
        max_share_pct=20,
    )
    # Fail closed: a reply late on a loaded host is not a local-only admission.
    lim = Limiter(server.client(), [rule], fallback=FallbackMode.FAIL_CLOSED)
    lim.startup()
    r.config_resetstat()
    start = server_ms(r)
    admitted = 0
    count = threading.Lock()

    def work(_: int) -> None:
        nonlocal admitted
        for _ in range(300):
            if lim.check("anyone").allowed:
                with count:
                    admitted += 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    elapsed = server_ms(r) - start
    lim.close()
    bound = capacity + refill_count * (elapsed // refill_ms + 1)
    # Never above the bound; below it by at most what one instance holds (b <= 20 % of 50).
    assert capacity - capacity * 20 // 100 <= admitted <= bound
    sent = calls(r, "RL.TOKENBUCKET")
    assert 0 < sent * 10 < 8 * 300, (sent, lim.stats)
    assert lim.stats.grant_held > 0 and lim.stats.grant_denied > 0


def test_held_units_go_back_at_close(server: Server, r: redis.Redis) -> None:
    limit = 1000
    rule = Rule(
        FixedWindow(limit, FIXED_MS),
        "close",
        fixed_key="closing",
        global_=True,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )
    lim = Limiter(server.client(), [rule])
    admitted = sum(lim.check("x").allowed for _ in range(20))
    assert admitted == 20
    # A minute's worth of the rate is held: the server counts more than admitted.
    assert fw_remaining(r, "closing", limit) < limit - admitted
    lim.close()
    wait_until(lambda: fw_remaining(r, "closing", limit) == limit - admitted, what="refund")
    assert lim.stats.grant_refunds == 1


def test_an_idle_instance_holds_nothing_after_hold_ms(server: Server, r: redis.Redis) -> None:
    limit = 1000
    rule = Rule(
        FixedWindow(limit, FIXED_MS),
        "idle",
        fixed_key="idling",
        global_=True,
        batched=True,
        hold_ms=200,
        max_share_pct=100,
    )
    lim = Limiter(server.client(), [rule])
    admitted = sum(lim.check("x").allowed for _ in range(300))
    assert admitted == 300
    wait_until(lambda: fw_remaining(r, "idling", limit) == limit - admitted, what="timer refund")
    assert lim.stats.grant_refunds >= 1 and lim.stats.grant_held > 0
    wait_until(lambda: lim._timer is None, what="the timer ends once nothing is held")
    lim.close()
    assert fw_remaining(r, "idling", limit) == limit - admitted


def test_grant_decisions_count_at_the_grant_level(server: Server, r: redis.Redis) -> None:
    reg = CollectorRegistry()
    rule = Rule(
        FixedWindow(10, FIXED_MS),
        "metered",
        fixed_key="metered",
        global_=True,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )
    with Limiter(server.client(), [rule], metrics=reg) as lim:
        paths = [lim.check("x").path for _ in range(15)]
    # The first asks for all 10 (a minute of its rate, up to the limit) and
    # holds 9; the 11th is denied by Redis, and the next 4 without a call.
    assert paths == ["redis"] + ["grant"] * 9 + ["redis"] + ["grant"] * 4
    counted = decisions(scrape(reg))
    assert counted[("metered", "grant", "admitted")] == 9
    assert counted[("metered", "grant", "denied")] == 4
    assert counted[("metered", "redis", "admitted")] == 1
    assert counted[("metered", "redis", "denied")] == 1


def test_a_batched_rule_beside_a_plain_one_gives_back_on_its_denial(
    server: Server, r: redis.Redis
) -> None:
    batched = Rule(
        FixedWindow(100, FIXED_MS),
        "b",
        fixed_key="beside",
        global_=True,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )
    plain = Rule(FixedWindow(3, FIXED_MS), "p")
    with Limiter(server.client(), [batched, plain]) as lim:
        out = [lim.check("u") for _ in range(6)]
        assert [a.allowed for a in out] == [True] * 3 + [False] * 3
        assert out[3].index == 1 and out[3].path in ("redis", "deny_cache")
        held = sum(b.held for b in lim._grants[0].batches.values())
    # At close, 3 units are counted for the batched rule: the denied ones went back.
    assert fw_remaining(r, "beside", 100) == 97 and held > 0


def test_batched_rule_falls_back_when_redis_is_away(own_server: Server) -> None:
    rule = Rule(
        FixedWindow(100, FIXED_MS),
        "fb",
        fixed_key="fb",
        global_=True,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )
    client = redis.Redis(host="127.0.0.1", port=own_server.port, socket_timeout=0.3)
    lim = Limiter(client, [rule], fallback=FallbackMode.LOCAL_ONLY, breaker_failures=1)
    first = [lim.check("x") for _ in range(3)]
    assert all(a.allowed for a in first)
    held = sum(b.held for b in lim._grants[0].batches.values())
    assert held > 0
    own_server.kill()
    # Held units are spent first, then the fallback decides.
    spent = [lim.check("x") for _ in range(held)]
    assert {a.path for a in spent} == {"grant"}
    after = lim.check("x")
    assert after.allowed and after.path == "fallback"
    closed = Limiter(client, [rule], fallback=FallbackMode.FAIL_CLOSED, breaker_failures=1)
    assert closed.check("y").path == "fallback" and not closed.check("y").allowed
    lim.close()  # the refund fails quietly: Redis is away


def test_async_batched_bound_calls_and_aclose(server: Server, r: redis.Redis) -> None:
    limit = 200

    async def main() -> tuple[int, int, int]:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        rule = Rule(
            FixedWindow(limit, FIXED_MS),
            "ab",
            fixed_key="abatch",
            global_=True,
            batched=True,
            hold_ms=60_000,
            max_share_pct=25,
        )
        try:
            lim = AsyncLimiter(ar, [rule], deadline=5.0, fallback=FallbackMode.FAIL_CLOSED)
            await lim.startup()
            r.config_resetstat()
            results = await asyncio.gather(*(lim.check("x") for _ in range(2 * limit)))
            admitted = sum(a.allowed for a in results)
            before = fw_remaining(r, "abatch", limit)
            await lim.aclose()
            return admitted, before, calls(r, "RL.FIXEDWINDOW")
        finally:
            await ar.aclose()

    admitted, before, sent = asyncio.run(main())
    assert 0 < admitted <= limit and before <= limit - admitted
    assert sent * 4 < 2 * limit
    wait_until(lambda: fw_remaining(r, "abatch", limit) == limit - admitted, what="aclose refund")


# -- striped, standalone ------------------------------------------------------------------


def test_striped_standalone_spills_over_to_the_next_stripe_only(
    server: Server, r: redis.Redis
) -> None:
    rule = Rule(FixedWindow(30, FIXED_MS), "s", fixed_key="str", global_=True, striped=3)
    lim = Limiter(server.client(), [rule])
    out = [lim.check("x") for _ in range(25)]
    assert [a.allowed for a in out] == [True] * 20 + [False] * 5
    own = lim._grants[0].own
    keys = [stripe_key(f"rl{i}", "str") for i in range(3)]
    assert fw_remaining(r, keys[own], 10) == 0
    assert fw_remaining(r, keys[(own + 1) % 3], 10) == 0
    assert not r.exists(keys[(own + 2) % 3])
    denied = out[-1].decision
    assert denied.limit == 10 and denied.wait_ms > 0


def test_striped_instances_never_exceed_the_limit_together(server: Server, r: redis.Redis) -> None:
    limit = 30
    rule = Rule(FixedWindow(limit, FIXED_MS), "t", fixed_key="together", global_=True, striped=3)
    closed = FallbackMode.FAIL_CLOSED
    lims = [Limiter(server.client(), [rule], fallback=closed) for _ in range(4)]
    admitted = sum(lims[i % 4].check("x").allowed for i in range(2 * limit))
    assert 20 <= admitted <= limit
    used = sum(10 - fw_remaining(r, stripe_key(f"rl{i}", "together"), 10) for i in range(3))
    assert used == admitted


def test_batched_and_striped_batch_per_stripe_key(server: Server, r: redis.Redis) -> None:
    rule = Rule(
        FixedWindow(60, FIXED_MS),
        "bs",
        fixed_key="bs",
        global_=True,
        striped=3,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )
    with Limiter(server.client(), [rule]) as lim:
        out = [lim.check("x") for _ in range(50)]
        g = lim._grants[0]
        assert set(g.batches) == {stripe_key(f"rl{i}", "bs") for i in (g.own, (g.own + 1) % 3)}
    assert sum(a.allowed for a in out) == 40


def one_call_rule(key: str) -> Rule:
    """A batch of 60 at the first decision: a minute (hold_ms) of a rate of 1/s."""
    return Rule(
        FixedWindow(1000, FIXED_MS),
        "flight",
        fixed_key=key,
        global_=True,
        batched=True,
        hold_ms=60_000,
        max_share_pct=100,
    )


def test_concurrent_threads_share_one_call_in_flight(server: Server, r: redis.Redis) -> None:
    with Limiter(server.client(), [one_call_rule("flight-t")]) as lim:
        lim.startup()
        r.config_resetstat()
        start = threading.Barrier(20)

        def one(_: int) -> bool:
            start.wait()
            return lim.check("x").allowed

        with ThreadPoolExecutor(20) as pool:
            assert all(pool.map(one, range(20)))
        assert calls(r, "RL.FIXEDWINDOW") == 1 and lim.stats.grant_calls == 1
        assert fw_remaining(r, "flight-t", 1000) == 1000 - 60


def test_concurrent_tasks_share_one_call_in_flight(server: Server, r: redis.Redis) -> None:
    async def main() -> list[str]:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        try:
            async with AsyncLimiter(ar, [one_call_rule("flight-a")], deadline=1.0) as lim:
                await lim.startup()
                r.config_resetstat()
                out = await asyncio.gather(*(lim.check("x") for _ in range(50)))
                assert all(a.allowed for a in out)
                return [a.path for a in out]
        finally:
            await ar.aclose()

    paths = asyncio.run(main())
    assert paths.count("redis") == 1 and paths.count("grant") == 49
    # One UPTO, then the REFUND of the 10 left at aclose.
    assert calls(r, "RL.FIXEDWINDOW") == 2
    assert fw_remaining(r, "flight-a", 1000) == 1000 - 50


def test_a_grant_too_small_for_the_cost_goes_back_at_once(server: Server, r: redis.Redis) -> None:
    r.execute_command("RL.FIXEDWINDOW", "small", 10, FIXED_MS, "COST", 8)
    rule = Rule(FixedWindow(10, FIXED_MS), "small", fixed_key="small", global_=True, batched=True)
    with Limiter(server.client(), [rule]) as lim:
        a = lim.check("x", Request.cost(5))
        assert not a.allowed and a.path == "redis"
        # The 2 units UPTO 5 took came back with the denial, not after hold_ms.
        assert fw_remaining(r, "small", 10) == 2 and lim.stats.grant_refunds == 1
        # Drained: the next ask waits hold_ms (denied here meanwhile), then takes both.
        wait_until(lambda: lim.check("x", Request.cost(2)).allowed, what="the next ask")
        assert fw_remaining(r, "small", 10) == 0


def test_units_given_back_by_a_plain_denial_still_go_back_after_hold_ms(
    server: Server, r: redis.Redis
) -> None:
    # A batch of 1 (hold_ms of a rate of 1 or 2 a second): nothing is held
    # after each ask, so no refund timer runs; the plain rule's denial then
    # puts the unit back in what is held, and it must still go back.
    batched = Rule(
        FixedWindow(1000, FIXED_MS),
        "b",
        fixed_key="given-back",
        global_=True,
        batched=True,
        hold_ms=100,
        max_share_pct=100,
    )
    plain = Rule(FixedWindow(1, FIXED_MS), "p")
    lim = Limiter(server.client(), [batched, plain])
    try:
        assert lim.check("u").allowed
        second = lim.check("u")
        assert not second.allowed and second.index == 1
        assert fw_remaining(r, "given-back", 1000) == 998
        wait_until(
            lambda: fw_remaining(r, "given-back", 1000) == 999,
            timeout=5,
            what="the given-back unit refunded after hold_ms",
        )
    finally:
        lim.close()


def test_async_units_given_back_by_a_plain_denial_still_go_back_after_hold_ms(
    server: Server, r: redis.Redis
) -> None:
    batched = Rule(
        FixedWindow(1000, FIXED_MS),
        "b",
        fixed_key="given-back-a",
        global_=True,
        batched=True,
        hold_ms=100,
        max_share_pct=100,
    )
    plain = Rule(FixedWindow(1, FIXED_MS), "p")

    async def main() -> None:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        lim = AsyncLimiter(ar, [batched, plain], deadline=2.0)
        try:
            assert (await lim.check("u")).allowed
            second = await lim.check("u")
            assert not second.allowed and second.index == 1
            for _ in range(500):
                if fw_remaining(r, "given-back-a", 1000) == 999:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the given-back unit was not refunded after hold_ms")
        finally:
            await lim.aclose()
            await ar.aclose()

    asyncio.run(main())


def test_close_while_a_grant_is_in_flight_gives_its_units_back(
    server: Server, r: redis.Redis
) -> None:
    lim = Limiter(server.client(), [one_call_rule("flight-close")])
    lim.startup()
    # The server holds writes for a while: the ask (UPTO 60) is in flight when close() comes.
    r.execute_command("CLIENT", "PAUSE", 500, "WRITE")
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(lim.check, "x")
        batches = lim._grants[0].batches
        wait_until(
            lambda: any(b.flight is not None for b in list(batches.values())), what="ask in flight"
        )
        lim.close()
        assert fut.result().allowed
    # The 59 units that ask brought go back at close, not a minute (hold_ms) later.
    wait_until(
        lambda: fw_remaining(r, "flight-close", 1000) == 999, timeout=5, what="refund at close"
    )


def test_aclose_while_a_grant_is_in_flight_gives_its_units_back(
    server: Server, r: redis.Redis
) -> None:
    async def main() -> None:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        lim = AsyncLimiter(ar, [one_call_rule("flight-aclose")], deadline=2.0)
        try:
            await lim.startup()
            r.execute_command("CLIENT", "PAUSE", 500, "WRITE")
            task = asyncio.ensure_future(lim.check("x"))
            batches = lim._grants[0].batches
            while not any(b.flight is not None for b in batches.values()):
                await asyncio.sleep(0.005)
            await lim.aclose()
            assert (await task).allowed
            for _ in range(500):
                if fw_remaining(r, "flight-aclose", 1000) == 999:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the units of the ask in flight were not refunded at aclose")
        finally:
            await lim.aclose()
            await ar.aclose()

    asyncio.run(main())


def test_a_cancelled_ask_sends_its_waiters_to_the_fallback(server: Server, r: redis.Redis) -> None:
    # The ask's caller is cancelled (a client gone) while its UPTO is in
    # flight: the deciders waiting for it get no grant, and go to the
    # fallback as after a failed call, not a denial from an older reply.
    rule = Rule(
        FixedWindow(1000, FIXED_MS),
        "cancel",
        fixed_key="cancelled",
        global_=True,
        batched=True,
        hold_ms=100,
        max_share_pct=100,
    )

    async def main() -> None:
        ar = aioredis.Redis(host="127.0.0.1", port=server.port)
        lim = AsyncLimiter(ar, [rule], deadline=2.0)
        try:
            # A batch of 1, all spent: the last reply admitted, nothing held.
            assert (await lim.check("x")).allowed
            r.execute_command("CLIENT", "PAUSE", 500, "WRITE")
            owner = asyncio.ensure_future(lim.check("x"))
            batches = lim._grants[0].batches
            while not any(b.flight is not None for b in batches.values()):
                await asyncio.sleep(0.005)
            waiter = asyncio.ensure_future(lim.check("x"))
            for _ in range(20):
                await asyncio.sleep(0)
            owner.cancel()
            out = await waiter
            assert (out.allowed, out.path) == (True, "fallback"), out
        finally:
            await lim.aclose()
            await ar.aclose()

    asyncio.run(main())


def test_both_stripes_denied_is_a_redis_decision_when_either_asked(
    server: Server, r: redis.Redis
) -> None:
    # Two stripes of one unit each, batched. Level `grant` is for answers
    # without a round trip: a denial where the other stripe asked Redis is
    # at level redis, whichever stripe asked.
    rule = Rule(
        FixedWindow(2, FIXED_MS),
        "both",
        fixed_key="both",
        global_=True,
        striped=2,
        batched=True,
    )
    with Limiter(server.client(), [rule]) as lim:
        lim._grants[0].own = 0
        out = [lim.check("x") for _ in range(4)]
    assert [(a.allowed, a.path) for a in out] == [
        (True, "redis"),  # the own stripe's unit
        (True, "redis"),  # the own stripe denies (Redis), the other's unit
        (False, "redis"),  # the own stripe denies here, the other asks Redis: denied
        (False, "grant"),  # both deny here
    ]
