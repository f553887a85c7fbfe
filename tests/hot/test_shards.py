"""Hot-tier shards: placement, and the virtual log's moves without copying (issue 13).

Against real redis-server processes (three of this module's own, plus a Redis Cluster of
three masters) and a real metadata store on SQLite. Several ``RedisHotLog`` objects on the
same store and shards stand for several gateway replicas, each with its own cached chains.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from gateway.config import RedisShardConfig
from gateway.hot import PartitionId, ProducerSequence, StoredBatch
from gateway.hot.placement import Segment
from gateway.hot.redis import RedisHotLog, partition_keys
from gateway.meta import MetadataStore
from gateway.meta.placement import choose_shards
from gateway.wire.errors import InvalidRequest, OffsetOutOfRange
from tests.services import RedisClusterServer, RedisServer

pytestmark = pytest.mark.integration

BIG = 1 << 40
FIELDS = [{"name": "v", "type": "int64"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RedisServer]]:
    started = {
        name: RedisServer(tmp_path_factory.mktemp(f"shard-{name}")).start()
        for name in ("default", "b", "c")
    }
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    server = RedisClusterServer(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetadataStore]:
    store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        yield store
    finally:
        store.close()


def shard_configs(servers: dict[str, RedisServer]) -> list[RedisShardConfig]:
    return [RedisShardConfig(name=n, url=s.url) for n, s in servers.items()]


def gateway(
    servers: dict[str, RedisServer], meta: MetadataStore, **extra: RedisShardConfig
) -> RedisHotLog:
    """One gateway replica's hot log over the shards, bound to the metadata store."""
    log = RedisHotLog(shards=[*shard_configs(servers), *extra.values()])
    log.bind_placements(meta)
    return log


def _replica(servers: dict[str, RedisServer], meta: MetadataStore) -> Iterator[RedisHotLog]:
    log = gateway(servers, meta)
    try:
        yield log
    finally:
        log.close()


@pytest.fixture
def hot(servers: dict[str, RedisServer], meta: MetadataStore) -> Iterator[RedisHotLog]:
    yield from _replica(servers, meta)


@pytest.fixture
def other(servers: dict[str, RedisServer], meta: MetadataStore) -> Iterator[RedisHotLog]:
    """A second gateway replica with chains of its own."""
    yield from _replica(servers, meta)


def new_part(
    meta: MetadataStore,
    partitions: int = 1,
    *,
    tenant: str | None = None,
    shards: tuple[str, ...] = ("default", "b", "c"),
) -> PartitionId:
    """A new table's partition 0 (the table's other partitions are placed too)."""
    tenant = tenant or f"t{uuid.uuid4().hex[:10]}"
    meta.ensure_tenant(tenant)
    d = meta.create_table(tenant, "ns", f"x{uuid.uuid4().hex[:8]}", FIELDS, partitions, (), shards)
    return PartitionId(tenant, d.table_id, 0)


def append(log: RedisHotLog, part: PartitionId, n: int, start: int = 0) -> list[StoredBatch]:
    out = []
    for i in range(start, start + n):
        payload = f"batch-{i}".encode()
        r = log.append(part, payload, 2, 1_000 + i, ProducerSequence("prod", i))
        assert not r.duplicate
        out.append(StoredBatch(r.base_offset, 2, 1_000 + i, payload))
    return out


def read_all(log: RedisHotLog, part: PartitionId, offset: int = 0) -> list[StoredBatch]:
    high = log.offsets(part).high
    out: list[StoredBatch] = []
    while offset < high:
        batches = log.read(part, offset, 3, BIG)  # small reads: they cross segment bounds
        assert batches, f"nothing read at {offset} < {high}"
        out.extend(batches)
        offset = batches[-1].next_offset
    return out


def shard_metrics(source: str, target: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [
        ("tidegate_hot_moves_total", (("source", source), ("target", target))),
        ("tidegate_hot_shard_sealed_retries_total", (("shard", source),)),
        ("tidegate_hot_shard_append_records_total", (("shard", target),)),
    ]


def sample(name: str, labels: tuple[tuple[str, str], ...]) -> float:
    return REGISTRY.get_sample_value(name, dict(labels)) or 0.0


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port)


def chain_shards(log: RedisHotLog, part: PartitionId) -> list[tuple[str, int, int | None]]:
    return [(s.shard, s.start, s.end) for s in log.chain(part, refresh=True).segments]


# Placement ------------------------------------------------------------------------------
def test_policy_spreads_a_tenant_and_respects_reserved_shards() -> None:
    shards = ["a", "b", "c"]
    assert choose_shards(3, "t1", shards, {}, {}, {}) == ["a", "b", "c"]
    # the tenant's own spread first, then the total load
    assert choose_shards(2, "t1", shards, {}, {"a": 9}, {"b": 1}) == ["c", "a"]
    # a tenant with reserved shards goes only there; nobody else does
    assert choose_shards(3, "t1", shards, {"c": "t1"}, {}, {}) == ["c", "c", "c"]
    assert choose_shards(4, "t2", shards, {"c": "t1"}, {}, {}) == ["a", "b", "a", "b"]
    with pytest.raises(InvalidRequest):
        choose_shards(1, "t3", ["c"], {"c": "t1"}, {}, {})


def test_new_partitions_are_placed_and_pins_are_kept(meta: MetadataStore) -> None:
    pinned = f"t{uuid.uuid4().hex[:10]}"
    meta.ensure_tenant(pinned)
    meta.pin_shards(pinned, ["c"])
    assert meta.shard_pins() == {"c": pinned}
    with pytest.raises(InvalidRequest):
        meta.ensure_tenant("intruder")
        meta.pin_shards("intruder", ["c"])
    busy = new_part(meta, 6).table_id
    mine = new_part(meta, 2, tenant=pinned).table_id
    by_table: dict[str, list[str]] = {}
    for p in meta.placements():
        by_table.setdefault(p.table_id, []).append(p.shard)
    assert sorted(by_table[busy]) == ["b", "b", "b", "default", "default", "default"]
    assert by_table[mine] == ["c", "c"]


def test_single_url_keeps_the_layout_from_before_sharding(
    servers: dict[str, RedisServer], meta: MetadataStore, hot: RedisHotLog
) -> None:
    """Data written by a one-URL gateway (no placements) is read, appended to and moved by
    a sharded one whose shard ``default`` is that Redis."""
    part = new_part(meta, shards=("default",))
    old = RedisHotLog(servers["default"].url)
    try:
        written = append(old, part, 3)
        assert raw(servers["default"]).exists(partition_keys(part)[0])
    finally:
        old.close()
    assert read_all(hot, part) == written
    hot.move(part, "b")
    written += append(hot, part, 2, start=3)
    assert read_all(hot, part) == written
    assert chain_shards(hot, part) == [("default", 0, 6), ("b", 6, None)]


# Moves ----------------------------------------------------------------------------------
def test_moves_back_and_forth_keep_one_dense_log_without_copying(
    servers: dict[str, RedisServer], meta: MetadataStore, hot: RedisHotLog
) -> None:
    part = new_part(meta)
    start = hot.chain(part).active.shard
    others = [s for s in ("default", "b", "c") if s != start]
    written = append(hot, part, 4)
    route = [others[0], start, others[1], others[0]]
    for n, target in enumerate(route):
        hot.move(part, target)
        written += append(hot, part, 3, start=4 + 3 * n)
    assert [b.base_offset for b in written] == list(range(0, 2 * len(written), 2))
    assert read_all(hot, part) == written
    for offset in range(2 * len(written)):  # every offset, from any segment
        assert hot.read(part, offset, 1, BIG)[0].base_offset == offset - offset % 2
    segments = chain_shards(hot, part)
    assert [s[0] for s in segments] == [start, *route]
    assert [s[1] for s in segments] == [0, 8, 14, 20, 26]
    # nothing was copied: each shard holds only the batches appended while it was active
    for seq, (shard, lo, hi) in enumerate(segments):
        entries = raw(servers[shard]).xlen(partition_keys(part, seq)[0])
        assert entries == ((hi or 2 * len(written)) - lo) // 2
    o = hot.offsets(part)
    assert (o.low, o.high) == (0, 2 * len(written))
    assert o.size_bytes == sum(len(b.payload) for b in written)
    # moving to where it already is does nothing
    epoch = hot.chain(part, refresh=True).epoch
    hot.move(part, route[-1])
    assert hot.chain(part, refresh=True).epoch == epoch


def test_a_tables_chains_read_at_once_are_each_partitions_chain(
    meta: MetadataStore, hot: RedisHotLog
) -> None:
    """What a new table's partitions are opened with (one read for the table) is what
    reading each partition's chain gives, moved partitions and sealed segments included."""
    part = new_part(meta, partitions=3)
    parts = [PartitionId(part.tenant, part.table_id, p) for p in range(3)]
    for p in parts[:2]:
        append(hot, p, 2)
        first = hot.chain(p).active.shard
        hot.move(p, next(s for s in ("default", "b", "c") if s != first))
        append(hot, p, 1, start=2)
    meta.begin_move(part.table_id, 1, "c" if hot.chain(parts[1]).active.shard != "c" else "b")
    each = {p.partition: meta.chain(p.table_id, p.partition) for p in parts}
    assert meta.chains(part.table_id) == each
    assert [len(each[p][1]) for p in range(3)] == [2, 2, 1]
    assert each[1][2] is not None and each[0][2] is None
    hot.bind_placements(meta)  # forgets the cached chains
    assert hot.chains(parts) == [hot.chain(p, refresh=True) for p in parts]


def test_producer_state_follows_the_partition(meta: MetadataStore, hot: RedisHotLog) -> None:
    part = new_part(meta)
    written = append(hot, part, 3)
    hot.move(part, "c" if hot.chain(part).active.shard != "c" else "b")
    # a retry of a batch stored before the move gets its original offsets
    again = hot.append(part, b"batch-2", 2, 1_002, ProducerSequence("prod", 2))
    assert (again.base_offset, again.duplicate) == (written[2].base_offset, True)
    nxt = hot.append(part, b"batch-3", 2, 1_003, ProducerSequence("prod", 3))
    assert (nxt.base_offset, nxt.duplicate) == (6, False)


def test_a_gateway_with_an_old_placement_is_fenced_and_follows(
    servers: dict[str, RedisServer], meta: MetadataStore, hot: RedisHotLog, other: RedisHotLog
) -> None:
    part = new_part(meta)
    written = append(hot, part, 2)
    assert read_all(other, part) == written  # `other` caches the chain now
    source = other.chain(part).active.shard
    target = "b" if source != "b" else "c"
    before = {k: sample(*k) for k in shard_metrics(source, target)}
    hot.move(part, target)
    # `other` still names the source segment: the shard refuses, it reloads and retries
    assert other.chain(part).active.shard == source
    written += append(other, part, 2, start=2)
    assert other.chain(part).active.shard == target
    grew = {k[0]: sample(*k) - before[k] for k in shard_metrics(source, target)}
    assert grew == {
        "tidegate_hot_moves_total": 1,
        "tidegate_hot_shard_sealed_retries_total": 1,
        "tidegate_hot_shard_append_records_total": 4,
    }
    assert raw(servers[target]).xlen(partition_keys(part, 1)[0]) == 2
    assert raw(servers[source]).xlen(partition_keys(part, 0)[0]) == 2
    assert read_all(hot, part) == written


def test_a_follower_at_the_seal_continues_on_the_new_segment(
    meta: MetadataStore, hot: RedisHotLog, other: RedisHotLog
) -> None:
    part = new_part(meta)
    append(hot, part, 2)
    assert other.read(part, 4, 10, BIG) == []  # caught up, chain cached
    hot.move(part, "b" if hot.chain(part).active.shard != "b" else "c")
    written = append(hot, part, 1, start=2)
    assert other.read(part, 4, 10, BIG) == written
    assert other.offsets(part).high == 6


def test_a_move_stopped_after_the_seal_is_finished_by_the_next_append(
    meta: MetadataStore, hot: RedisHotLog, other: RedisHotLog
) -> None:
    part = new_part(meta)
    written = append(hot, part, 2)
    source = hot.chain(part).active
    target = "b" if source.shard != "b" else "c"
    # the mover records its intent and seals, then dies
    assert hot.begin_move(part, target) == target
    assert hot.seal(part, source)[0] == 4
    # a gateway finds the seal, finishes the move itself, and its append lands after it
    written += append(other, part, 1, start=2)
    assert written[-1].base_offset == 4
    assert chain_shards(other, part) == [(source.shard, 0, 4), (target, 4, None)]
    assert meta.chain(part.table_id, 0)[2] is None
    # the mover's rerun finds nothing left to do
    hot.finish_move(part)
    assert read_all(hot, part) == written
    assert len(hot.chain(part, refresh=True).segments) == 2


def test_a_move_stopped_after_opening_the_target_is_finished_once(
    meta: MetadataStore, hot: RedisHotLog
) -> None:
    part = new_part(meta)
    written = append(hot, part, 2)
    source = hot.chain(part).active
    target = "b" if source.shard != "b" else "c"
    hot.begin_move(part, target)
    end, producers = hot.seal(part, source)
    hot.open_segment(part, 1, target, end, producers)
    hot.open_segment(part, 1, target, end, producers)  # idempotent
    hot.move(part, target)  # the rerun
    assert chain_shards(hot, part) == [(source.shard, 0, 4), (target, 4, None)]
    written += append(hot, part, 1, start=2)
    assert read_all(hot, part) == written


def test_trim_drops_tiered_sealed_segments_and_leaves_a_fence(
    servers: dict[str, RedisServer], meta: MetadataStore, hot: RedisHotLog, other: RedisHotLog
) -> None:
    part = new_part(meta)
    first = hot.chain(part).active.shard
    second = "b" if first != "b" else "c"
    written = append(hot, part, 3)
    hot.move(part, second)
    written += append(hot, part, 3, start=3)
    hot.move(part, first)
    written += append(hot, part, 1, start=6)
    assert read_all(other, part) == written  # `other` caches the three segments
    # below the first seal: the first segment goes; within the second: a plain trim
    assert hot.trim(part, 8) == 8
    assert chain_shards(hot, part) == [(second, 6, 12), (first, 12, None)]
    log0, meta0 = partition_keys(part, 0)
    assert not raw(servers[first]).exists(log0)
    assert raw(servers[first]).hget(meta0, "dropped") == b"1"
    assert hot.offsets(part).low == 8
    # `other` still names the dropped segment: it reloads and answers right
    with pytest.raises(OffsetOutOfRange) as exc:
        other.read(part, 0, 10, BIG)
    assert (exc.value.details["earliest"], exc.value.details["latest"]) == (8, 14)
    assert read_all(other, part, 8) == written[4:]
    # everything tiered: only the active segment remains
    assert hot.trim(part, 14) == 14
    assert chain_shards(hot, part) == [(first, 12, None)]
    assert other.offsets(part).low == 14
    hot.drop(part)
    for server in servers.values():
        assert not list(raw(server).scan_iter(match=f"tg:{{{part.tenant}*"))


def test_moves_onto_and_off_a_redis_cluster_shard(
    servers: dict[str, RedisServer], cluster: RedisClusterServer, meta: MetadataStore
) -> None:
    log = gateway(servers, meta, rc=RedisShardConfig(name="rc", url=cluster.url, cluster=True))
    try:
        part = new_part(meta)
        written = append(log, part, 2)
        log.move(part, "rc")
        written += append(log, part, 3, start=2)
        source = log.chain(part).segments[0].shard
        log.move(part, source)
        written += append(log, part, 1, start=5)
        assert read_all(log, part) == written
        assert [s.shard for s in log.chain(part, refresh=True).segments] == [source, "rc", source]
        assert log.chain(part).segments[1] == Segment(1, "rc", 4, 10)
        assert log.trim(part, 10) == 10
        assert [s.shard for s in log.chain(part, refresh=True).segments] == [source]
    finally:
        log.close()


def test_copy_of_a_sealed_segment_replaces_it_and_keeps_offsets_and_times(
    servers: dict[str, RedisServer], meta: MetadataStore, hot: RedisHotLog, other: RedisHotLog
) -> None:
    part = new_part(meta)
    first = hot.chain(part).active.shard
    second, third = (s for s in ("default", "b", "c") if s != first)
    written = append(hot, part, 3)
    hot.move(part, second)
    written += append(hot, part, 2, start=3)
    assert hot.trim(part, 4) == 4  # the first segment keeps only its last batch
    assert read_all(other, part, 4) == written[2:]  # `other` caches the old chain
    with pytest.raises(InvalidRequest, match="is active: move the partition"):
        hot.copy_segment(part, 1, third)
    before = hot.held_bytes([(part, 0, first), (part, 1, second)])
    assert hot.copy_segment(part, 0, third)
    assert not hot.copy_segment(part, 0, third)  # idempotent: already there
    assert chain_shards(hot, part) == [(third, 0, 6), (second, 6, None)]
    assert hot.held_bytes([(part, 0, third), (part, 1, second)]) == before
    # same offsets, append times and payloads; the source is a tombstone that makes an
    # older chain reload, and the copy is trimmed and dropped like any sealed segment
    assert read_all(hot, part, 4) == written[2:]
    assert read_all(other, part, 4) == written[2:]
    assert raw(servers[first]).hget(partition_keys(part, 0)[1], "dropped") == b"1"
    assert hot.offsets(part).low == 4
    assert hot.trim(part, 6) == 6
    assert chain_shards(hot, part) == [(second, 6, None)]
    hot.drop(part)
    for server in servers.values():
        assert not list(raw(server).scan_iter(match=f"tg:{{{part.tenant}*"))


def test_copy_onto_and_off_a_redis_cluster_shard(
    servers: dict[str, RedisServer], cluster: RedisClusterServer, meta: MetadataStore
) -> None:
    log = gateway(servers, meta, rc=RedisShardConfig(name="rc", url=cluster.url, cluster=True))
    try:
        part = new_part(meta)
        source = log.chain(part).active.shard
        other = next(s for s in ("default", "b", "c") if s != source)
        written = append(log, part, 3)
        log.move(part, "rc")
        written += append(log, part, 2, start=3)
        assert log.copy_segment(part, 0, "rc")  # onto the cluster
        log.move(part, other)
        assert log.copy_segment(part, 1, other)  # off the cluster
        assert [s.shard for s in log.chain(part, refresh=True).segments] == ["rc", other, other]
        assert read_all(log, part) == written
        assert sum(log.held_bytes([(part, s.seq, s.shard) for s in log.chain(part).segments])) > 0
    finally:
        log.close()
