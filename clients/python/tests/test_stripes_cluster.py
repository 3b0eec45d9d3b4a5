"""Striped rules on a real 3-master cluster (issue 27): the tags from the
slot map, each stripe on its own master, CRC16 as the server hashes, the
sum of admissions never above the limit, batched and striped together."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from conftest import FIXED_MS, Cluster
from redis.cluster import RedisCluster

from redis_ratelimit_client import FixedWindow, Rule, TokenBucket
from redis_ratelimit_client.grants import slot_of, stripe_key, stripe_tags
from redis_ratelimit_client.limiter import FallbackMode, Limiter


@pytest.fixture
def rc(cluster: Cluster) -> Iterator[RedisCluster]:
    c = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=5)
    for n in cluster.nodes:
        n.client().flushall()
    yield c
    c.close()


def masters(cluster: Cluster) -> list[tuple[list[tuple[int, int]], int]]:
    """Each master's slot ranges and its port, from CLUSTER SLOTS."""
    by_port: dict[int, list[tuple[int, int]]] = {}
    for lo, hi, primary, *_ in cluster.nodes[0].client().execute_command("CLUSTER", "SLOTS"):
        by_port.setdefault(int(primary[1]), []).append((int(lo), int(hi)))
    return [(ranges, port) for port, ranges in by_port.items()]


def port_of(cluster: Cluster, key: str) -> int:
    slot = int(cluster.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", key))
    for ranges, port in masters(cluster):
        if any(lo <= slot <= hi for lo, hi in ranges):
            return port
    raise AssertionError(f"no master owns slot {slot}")


def fw_remaining(rc: RedisCluster, key: str, limit: int) -> int:
    return int(rc.execute_command("RL.FIXEDWINDOW", key, limit, FIXED_MS, "COST", 0)[2])


def test_crc16_matches_cluster_keyslot(cluster: Cluster) -> None:
    node = cluster.nodes[0].client()
    for c in range(300):
        tag = f"rl{c}"
        assert slot_of(tag) == int(node.execute_command("CLUSTER", "KEYSLOT", tag)), tag


def test_three_stripes_fall_on_three_masters(cluster: Cluster, rc: RedisCluster) -> None:
    rule = Rule(FixedWindow(30, FIXED_MS), "s", fixed_key="api", global_=True, striped=3)
    lim = Limiter(rc, [rule])
    assert lim.check("x").allowed
    tags = lim._grants[0].tags
    assert tags is not None
    # The reference: from CLUSTER SLOTS, as the contract picks them.
    assert tags == stripe_tags([ranges for ranges, _ in masters(cluster)], 3)
    keys = [stripe_key(t, "api") for t in tags]
    assert len({port_of(cluster, k) for k in keys}) == 3
    # The first master (lowest slot) holds stripe 0.
    first = min(masters(cluster), key=lambda m: m[0][0][0])[1]
    assert port_of(cluster, keys[0]) == first


def test_striped_sum_never_exceeds_the_limit(cluster: Cluster, rc: RedisCluster) -> None:
    limit = 30
    rule = Rule(FixedWindow(limit, FIXED_MS), "sum", fixed_key="sum", global_=True, striped=3)
    lims = [Limiter(rc, [rule], fallback=FallbackMode.FAIL_CLOSED) for _ in range(3)]
    for i, lim in enumerate(lims):
        lim._grants[0].own = i  # one instance per stripe: every master in use
    admitted = sum(lims[i % 3].check("x").allowed for i in range(2 * limit))
    assert admitted == limit
    tags = lims[0]._grants[0].tags
    assert tags is not None
    assert [fw_remaining(rc, stripe_key(t, "sum"), 10) for t in tags] == [0, 0, 0]
    assert [n.client().dbsize() for n in cluster.nodes] == [1, 1, 1]
    # Spill-over: an instance whose stripe is drained takes from the next one.
    fresh = Rule(FixedWindow(30, FIXED_MS), "spill", fixed_key="spill", global_=True, striped=3)
    one = Limiter(rc, [fresh])
    one._grants[0].own = 2
    assert sum(one.check("x").allowed for _ in range(25)) == 20
    assert fw_remaining(rc, stripe_key(tags[0], "spill"), 10) == 0
    assert fw_remaining(rc, stripe_key(tags[2], "spill"), 10) == 0
    assert fw_remaining(rc, stripe_key(tags[1], "spill"), 10) == 10


def test_batched_striped_on_the_cluster_stays_within_the_limit(
    cluster: Cluster, rc: RedisCluster
) -> None:
    capacity = 90
    rule = Rule(
        TokenBucket(capacity, 3, 3_600_000),
        "bs",
        fixed_key="bsc",
        global_=True,
        batched=True,
        striped=3,
        max_share_pct=50,
    )
    lims = [Limiter(rc, [rule], fallback=FallbackMode.FAIL_CLOSED) for _ in range(3)]
    for i, lim in enumerate(lims):
        lim._grants[0].own = i
    for n in cluster.nodes:
        n.client().config_resetstat()
    admitted = sum(lims[i % 3].check("x").allowed for i in range(2 * capacity))
    for lim in lims:
        lim.close()
    assert 0.9 * capacity <= admitted <= capacity
    per_master = [
        int(n.client().info("commandstats").get("cmdstat_RL.TOKENBUCKET", {}).get("calls", 0))
        for n in cluster.nodes
    ]
    assert all(c > 0 for c in per_master) and sum(per_master) < 2 * capacity


def test_a_slot_map_change_re_picks_only_the_stripe_that_collides() -> None:
    own = Cluster()  # its slots move: not the session's cluster
    try:
        rc = RedisCluster(host="127.0.0.1", port=own.nodes[0].port, socket_timeout=5)
        rule = Rule(FixedWindow(30, FIXED_MS), "mv", fixed_key="mv", global_=True, striped=3)
        lim = Limiter(rc, [rule])
        g = lim._grants[0]
        g.own = 1
        assert lim.check("x").allowed
        assert g.tags == ["rl0", "rl1", "rl2"]
        first = min(masters(own), key=lambda m: m[0][0][0])[1]
        second = port_of(own, stripe_key("rl1", "mv"))
        assert second != first
        # rl1's slot moves to the first master, which holds rl0 (its key
        # dropped first: a slot moves without keys here).
        rc.delete(stripe_key("rl1", "mv"))
        target = own.nodes[[n.port for n in own.nodes].index(first)].client()
        node_id = target.execute_command("CLUSTER", "MYID")
        for n in own.nodes:
            n.client().execute_command("CLUSTER", "SETSLOT", slot_of("rl1"), "NODE", node_id)
        moved = own.moved_errors()
        assert lim.check("x").allowed  # MOVED: the client refreshes its slot map
        assert own.moved_errors() > moved
        assert lim.check("x").allowed  # the next decision sees the new map
        assert g.tags is not None and g.tags[0] == "rl0" and g.tags[2] == "rl2"
        assert g.tags[1] != "rl1" and port_of(own, stripe_key(g.tags[1], "mv")) == second
        assert fw_remaining(rc, stripe_key(g.tags[1], "mv"), 10) == 9
        rc.close()
    finally:
        own.stop()


def test_async_striped_on_the_cluster(cluster: Cluster, rc: RedisCluster) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from redis_ratelimit_client.limiter import AsyncLimiter

    rule = Rule(FixedWindow(30, FIXED_MS), "as", fixed_key="as", global_=True, striped=3)

    async def main() -> tuple[int, list[str] | None, int]:
        arc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            async with AsyncLimiter(arc, [rule], deadline=1.0) as lim:
                g = lim._grants[0]
                out = [await lim.check("x") for _ in range(25)]
                return sum(a.allowed for a in out), g.tags, g.own
        finally:
            await arc.aclose()

    admitted, tags, own = asyncio.run(main())
    assert admitted == 20
    assert tags == stripe_tags([ranges for ranges, _ in masters(cluster)], 3)
    assert fw_remaining(rc, stripe_key(tags[own], "as"), 10) == 0
    assert fw_remaining(rc, stripe_key(tags[(own + 1) % 3], "as"), 10) == 0
    assert sum(n.client().dbsize() for n in cluster.nodes) == 2
