"""The Redis hot tier's key index over the virtual log: a hash per segment in the
segment's slot, an empty one after a move (nothing copied), lookups newest segment first,
a sealed segment's entries answering until tiering drops it (with its hash), a forced
drain copying it, replicas with stale chains. Real redis-servers and a real metadata store
(the fixtures of tests/hot/test_shards.py)."""

from __future__ import annotations

import pytest
import redis

from gateway.hot import PartitionId
from gateway.hot.redis import RedisHotLog
from gateway.hot.redis.scripts import segment_keys
from gateway.meta import MetadataStore
from tests.hot.test_shards import cluster, hot, meta, new_part, other, servers
from tests.services import RedisClusterServer, RedisServer

__all__ = ["cluster", "hot", "meta", "other", "servers"]  # fixtures used from test_shards

pytestmark = pytest.mark.integration


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def put(log: RedisHotLog, part: PartitionId, *names: str) -> int:
    keys = [n.encode() for n in names]
    return log.append(part, b"|".join(keys), len(keys), 0, keys=keys).base_offset


def look(log: RedisHotLog, part: PartitionId, *names: str) -> list[int | None]:
    return log.latest_offsets(part, [n.encode() for n in names])


def test_index_hash_sits_with_its_segment(
    hot: RedisHotLog, meta: MetadataStore, servers: dict[str, RedisServer]
) -> None:
    part = new_part(meta, shards=("default",))
    put(hot, part, "a", "b")
    log_key, meta_key, index = segment_keys(part, 0)
    tag = log_key[log_key.index("{") : log_key.index("}") + 1]
    assert index == f"tg:{tag}:keys" and tag in meta_key
    assert raw(servers["default"]).hgetall(index) == {b"a": b"0", b"b": b"1"}


def test_move_starts_an_empty_index_and_newest_segment_wins(
    hot: RedisHotLog, other: RedisHotLog, meta: MetadataStore, servers: dict[str, RedisServer]
) -> None:
    part = new_part(meta, shards=("default",))
    put(hot, part, "a", "b", "c")  # 0, 1, 2 on default
    assert look(other, part, "a") == [0]  # the other replica caches the one-segment chain
    hot.move(part, "b")
    _, _, index1 = segment_keys(part, 1)
    assert raw(servers["b"]).exists(index1) == 0  # nothing copied
    assert put(hot, part, "a") == 3  # on shard b
    assert look(hot, part, "a", "b", "c", "d") == [3, 1, 2, None]
    assert raw(servers["b"]).hgetall(index1) == {b"a": b"3"}
    # A replica whose chain is from before the move finds the sealed segment and reloads.
    assert look(other, part, "a", "b", "c", "d") == [3, 1, 2, None]
    assert hot.key_count(part) == 4  # a once per segment that holds it

    # Tiering moved offsets below 3 and trimmed: the sealed segment and its hash go.
    hot.trim(part, 3)
    assert raw(servers["default"]).exists(segment_keys(part, 0)[2]) == 0
    assert look(hot, part, "a", "b", "c") == [3, None, None]
    assert look(other, part, "a", "b", "c") == [3, None, None]
    assert hot.key_count(part) == 1


def test_a_key_trimmed_in_the_newer_segment_is_not_looked_for_in_older_ones(
    hot: RedisHotLog, meta: MetadataStore
) -> None:
    part = new_part(meta, shards=("default",))
    put(hot, part, "a")  # 0
    hot.move(part, "c")
    put(hot, part, "a")  # 1
    put(hot, part, "b")  # 2
    hot.trim(part, 2)  # drops segment 0, trims batch 1 of segment 1
    assert look(hot, part, "a", "b") == [None, 2]


def test_forced_drain_copies_the_index(
    hot: RedisHotLog, meta: MetadataStore, servers: dict[str, RedisServer]
) -> None:
    part = new_part(meta, shards=("default",))
    put(hot, part, *(f"k{i}" for i in range(3000)))  # several HSCAN pages
    hot.move(part, "b")
    put(hot, part, "k7")
    assert hot.copy_segment(part, 0, "c")
    assert raw(servers["default"]).exists(segment_keys(part, 0)[2]) == 0  # a tombstone now
    assert raw(servers["c"]).hlen(segment_keys(part, 0)[2]) == 3000
    assert look(hot, part, "k0", "k7", "k2999") == [0, 3000, 2999]


def test_trim_prunes_the_index(
    hot: RedisHotLog, meta: MetadataStore, servers: dict[str, RedisServer]
) -> None:
    part = new_part(meta, shards=("default",))
    for i in range(50):
        put(hot, part, f"k{i}", f"k{i % 5}")
    index = segment_keys(part, 0)[2]
    assert raw(servers["default"]).hlen(index) == 50
    hot.trim(part, 60)  # batches at 0, 2, ..., 58 go
    kept = {k: int(v) for k, v in raw(servers["default"]).hgetall(index).items()}
    assert all(v >= 60 for v in kept.values())
    assert set(kept) == {f"k{i}".encode() for i in range(30, 50)} | {b"k0", b"k1", b"k2"} | {
        b"k3",
        b"k4",
    }


def test_on_a_redis_cluster(
    meta: MetadataStore, servers: dict[str, RedisServer], cluster: RedisClusterServer
) -> None:
    """The append and lookup scripts name the index with the stream: one slot."""
    from gateway.config import RedisShardConfig
    from tests.hot.test_shards import gateway

    log = gateway(servers, meta, rc=RedisShardConfig(name="rc", url=cluster.url, cluster=True))
    try:
        part = new_part(meta, shards=("rc",))
        put(log, part, "a", "b", "a")
        log.move(part, "default")
        put(log, part, "b")
        assert look(log, part, "a", "b", "c") == [2, 3, None]
        assert log.trim(part, 3) == 3
        assert look(log, part, "a", "b") == [None, 3]
    finally:
        log.close()
