"""Redis-specific behaviour of the hot tier, against real redis-server processes.

The session Redis is shared by every test: tests touch only their own partitions' keys
(unique tenants), never FLUSHALL / FLUSHDB. Tests that kill, stop or pause Redis start a
``RedisServer`` of their own.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from gateway.hot import HotLog, PartitionId, ProducerSequence, StoredBatch, load_hot_log
from gateway.hot.redis import RedisHotLog, partition_key_pattern, partition_keys
from gateway.wire.errors import (
    HotStateLost,
    InvalidIdempotentAppend,
    OffsetOutOfRange,
    OutOfOrderSequence,
    Unavailable,
    UnknownProducer,
)
from tests.conftest import hot_settings
from tests.services import RedisServer

pytestmark = pytest.mark.integration


# Fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def log(redis_server: RedisServer, tmp_path: Path) -> Iterator[RedisHotLog]:
    hot = load_hot_log(hot_settings("redis", tmp_path, redis_server))
    assert isinstance(hot, RedisHotLog)
    try:
        yield hot
    finally:
        hot.close()


@pytest.fixture
def second_log(redis_server: RedisServer) -> Iterator[RedisHotLog]:
    """Another gateway: its own connection pool on the same Redis."""
    hot = RedisHotLog(redis_server.url)
    try:
        yield hot
    finally:
        hot.close()


@pytest.fixture
def part(unique_tenant: str) -> PartitionId:
    return PartitionId(unique_tenant, uuid.uuid4().hex, 0)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server this test may kill, stop or pause (appendfsync always)."""
    server = RedisServer(tmp_path / "own-redis").start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()


# Helpers ----------------------------------------------------------------------------------
def read_all(log: HotLog, part: PartitionId, from_offset: int = 0) -> list[StoredBatch]:
    out: list[StoredBatch] = []
    offset = from_offset
    while True:
        batches = log.read(part, offset, max_records=1000, max_bytes=1 << 20)
        if not batches:
            return out
        assert batches[0].base_offset <= offset < batches[0].next_offset
        out.extend(batches)
        offset = batches[-1].next_offset


def partition_keys_in_redis(client: redis.Redis, part: PartitionId) -> set[bytes]:
    return set(client.scan_iter(match=partition_key_pattern(part), count=1000))


def assert_dense(batches: list[StoredBatch], start: int = 0) -> None:
    expected = start
    for b in batches:
        assert b.base_offset == expected
        expected = b.next_offset


# Key layout -------------------------------------------------------------------------------
def test_backend_is_chosen_by_name(log: RedisHotLog) -> None:
    assert log.name == "redis"


def test_all_keys_of_a_partition_hash_to_one_cluster_slot(
    log: RedisHotLog, raw: redis.Redis, part: PartitionId
) -> None:
    log.append(part, b"a", 1, 1, ProducerSequence("p", 0))
    log.append(part, b"b", 2, 2)
    log.trim(part, 1)

    keys = partition_keys_in_redis(raw, part)
    assert keys == {k.encode() for k in partition_keys(part)}
    assert len({key_slot(k) for k in keys}) == 1
    assert key_slot(next(iter(keys))) == key_slot(part.path.encode())


def test_braces_in_names_cannot_break_the_hash_tag(log: RedisHotLog, raw: redis.Redis) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    odd = PartitionId(tenant + "}{x", "tab}le%7D", 1)
    lookalike = PartitionId(tenant + "%7D%7Bx", "tab%7Dle%7D", 1)
    assert set(partition_keys(odd)).isdisjoint(partition_keys(lookalike))

    log.append(odd, b"odd", 1, 1)
    log.append(lookalike, b"look", 2, 1)
    for p in (odd, lookalike):
        keys = partition_keys_in_redis(raw, p)
        assert len(keys) == 2
        assert len({key_slot(k) for k in keys}) == 1
    assert [b.payload for b in read_all(log, odd)] == [b"odd"]
    assert [b.payload for b in read_all(log, lookalike)] == [b"look"]
    log.drop(odd)
    log.drop(lookalike)


def test_offsets_stay_exact_beyond_lua_number_formatting(
    log: RedisHotLog, raw: redis.Redis, part: PartitionId
) -> None:
    """Lua prints numbers above 1e14 in exponent notation: offsets never go through it."""
    start = 10**15 + 7
    _, meta = partition_keys(part)
    # A producer already at sequence 2**52 - 1 (its first batch must be sequence 0).
    raw.hset(meta, mapping={"hw": start, "low": start, "p:big": f"{2**52 - 1},{start - 1},1"})

    first = log.append(part, b"x", 3, 10, ProducerSequence("big", 2**52))
    second = log.append(part, b"y", 4, 11, ProducerSequence("big", 2**52 + 1))
    assert (first.base_offset, second.base_offset) == (start, start + 3)
    assert log.append(part, b"x", 3, 10, ProducerSequence("big", 2**52)).duplicate

    batches = log.read(part, start + 4, 100, 1 << 20)
    assert [(b.base_offset, b.count, b.payload) for b in batches] == [(start + 3, 4, b"y")]
    assert log.offsets(part).high == start + 7
    assert log.trim(part, start + 3) == start + 3
    log.drop(part)


# Several gateways on one Redis ------------------------------------------------------------
def test_two_gateways_appending_concurrently_get_dense_disjoint_offsets(
    log: RedisHotLog, second_log: RedisHotLog, part: PartitionId
) -> None:
    per_thread = 60
    results: list[tuple[int, int, bytes]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(hot: RedisHotLog, name: str) -> None:
        try:
            for i in range(per_thread):
                payload = f"{name}:{i}".encode()
                count = 1 + (i % 5)
                r = hot.append(part, payload, count, i)
                with lock:
                    results.append((r.base_offset, r.count, payload))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(hot, f"{tag}{n}"))
        for hot, tag in ((log, "a"), (second_log, "b"))
        for n in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    results.sort()
    expected = 0
    for base, count, _ in results:
        assert base == expected
        expected += count
    assert log.offsets(part).high == expected == second_log.offsets(part).high

    stored = read_all(second_log, part)
    assert [(b.base_offset, b.count, b.payload) for b in stored] == results


def test_idempotent_retry_through_another_gateway_is_deduplicated(
    log: RedisHotLog, second_log: RedisHotLog, part: PartitionId
) -> None:
    first = log.append(part, b"one", 2, 1, ProducerSequence("prod", 0))
    retried = second_log.append(part, b"one", 2, 1, ProducerSequence("prod", 0))
    assert retried == type(first)(first.base_offset, first.count, duplicate=True)
    assert log.offsets(part).high == 2

    nxt = second_log.append(part, b"two", 3, 2, ProducerSequence("prod", 1))
    assert (nxt.base_offset, nxt.duplicate) == (2, False)
    assert log.append(part, b"two", 3, 2, ProducerSequence("prod", 1)).duplicate
    with pytest.raises(OutOfOrderSequence):
        log.append(part, b"four", 1, 3, ProducerSequence("prod", 3))
    with pytest.raises(InvalidIdempotentAppend):
        second_log.append(part, b"one", 5, 1, ProducerSequence("prod", 0))
    assert [b.payload for b in read_all(log, part)] == [b"one", b"two"]


def test_concurrent_retries_of_one_batch_store_it_once(
    log: RedisHotLog, second_log: RedisHotLog, part: PartitionId
) -> None:
    outcomes: list[tuple[int, bool]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def send(hot: RedisHotLog) -> None:
        barrier.wait()
        r = hot.append(part, b"same", 4, 1, ProducerSequence("racer", 0))
        with lock:
            outcomes.append((r.base_offset, r.duplicate))

    threads = [threading.Thread(target=send, args=(h,)) for h in [log, second_log] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [(0, False)] + [(0, True)] * 7
    assert log.offsets(part).high == 4


def test_producer_window_comes_from_settings(
    redis_server: RedisServer, tmp_path: Path, part: PartitionId
) -> None:
    settings = hot_settings("redis", tmp_path, redis_server)
    settings.hot.producer_window = 2  # type: ignore[union-attr]
    hot = RedisHotLog.from_settings(settings)
    try:
        for seq in range(3):
            hot.append(part, b"p", 1, seq, ProducerSequence("w", seq))
        assert hot.append(part, b"p", 1, 1, ProducerSequence("w", 1)).duplicate
        with pytest.raises(InvalidIdempotentAppend):
            hot.append(part, b"p", 1, 0, ProducerSequence("w", 0))
    finally:
        hot.close()


# Trim and read consistency ----------------------------------------------------------------
def test_trim_in_several_script_calls_keeps_accounting(
    redis_server: RedisServer, part: PartitionId
) -> None:
    hot = RedisHotLog(redis_server.url, trim_chunk=3)
    try:
        for i in range(20):
            hot.append(part, bytes(10 + i), 2, i)
        total = sum(10 + i for i in range(20))
        assert hot.offsets(part).size_bytes == total

        assert hot.trim(part, 25) == 24
        offsets = hot.offsets(part)
        assert (offsets.low, offsets.high) == (24, 40)
        assert offsets.size_bytes == total - sum(10 + i for i in range(12))
        assert_dense(read_all(hot, part, 24), 24)

        assert hot.trim(part, 1000) == 40
        assert hot.offsets(part) == type(offsets)(40, 40, 0)
        assert hot.append(part, b"z", 1, 99).base_offset == 40
    finally:
        hot.drop(part)
        hot.close()


def test_reads_never_see_a_gap_while_another_gateway_trims(
    log: RedisHotLog, second_log: RedisHotLog, part: PartitionId
) -> None:
    for i in range(300):
        log.append(part, f"{i}".encode(), 1 + i % 3, i)
    high = log.offsets(part).high
    done = threading.Event()

    def trimmer() -> None:
        for below in range(0, high + 1, 7):
            second_log.trim(part, below)
        done.set()

    t = threading.Thread(target=trimmer)
    t.start()
    checks = 0
    while not done.is_set() or checks == 0:
        low = log.offsets(part).low
        for offset in (low, min(low + 5, high - 1)):
            try:
                batches = log.read(part, offset, 50, 1 << 20)
            except OffsetOutOfRange as exc:
                assert exc.details["earliest"] > offset
                assert exc.details["latest"] == high
                continue
            assert batches[0].base_offset <= offset < batches[0].next_offset
            assert_dense(batches, batches[0].base_offset)
            checks += 1
    t.join()
    assert checks > 0


# Drop -------------------------------------------------------------------------------------
def test_drop_removes_every_key_of_the_partition_and_only_those(
    log: RedisHotLog, raw: redis.Redis, unique_tenant: str
) -> None:
    table = uuid.uuid4().hex
    p0, p1, p10 = (PartitionId(unique_tenant, table, n) for n in (0, 1, 10))
    for p in (p0, p1, p10):
        for seq in range(3):
            log.append(p, b"x" * 10, 2, seq, ProducerSequence("prod", seq))
    log.trim(p0, 2)
    assert len(partition_keys_in_redis(raw, p0)) == 2

    log.drop(p0)

    assert partition_keys_in_redis(raw, p0) == set()
    assert len(partition_keys_in_redis(raw, p1)) == 2
    assert len(partition_keys_in_redis(raw, p10)) == 2
    assert log.offsets(p0) == type(log.offsets(p0))(0, 0, 0)
    assert log.read(p0, 0, 10, 100) == []
    # Producer state went with it: the producer is unknown there, and starts again at 0.
    with pytest.raises(UnknownProducer):
        log.append(p0, b"y", 1, 9, ProducerSequence("prod", 1))
    again = log.append(p0, b"y", 1, 9, ProducerSequence("prod", 0))
    assert (again.base_offset, again.duplicate) == (0, False)
    assert log.offsets(p1).high == 6
    for p in (p0, p1, p10):
        log.drop(p)
    log.drop(p0)  # dropping twice is fine


# Failures of Redis itself -----------------------------------------------------------------
def test_unavailable_while_redis_is_down_then_recovers(
    own_redis: RedisServer, part: PartitionId
) -> None:
    hot = RedisHotLog(own_redis.url, socket_timeout_s=2.0)
    try:
        hot.append(part, b"before", 1, 1)
        own_redis.stop()

        with pytest.raises(Unavailable) as info:
            hot.append(part, b"lost", 1, 2)
        assert f"127.0.0.1:{own_redis.port}" in str(info.value)
        assert info.value.retryable
        with pytest.raises(Unavailable):
            hot.read(part, 0, 10, 100)
        with pytest.raises(Unavailable):
            hot.offsets(part)
        with pytest.raises(Unavailable):
            hot.trim(part, 1)
        with pytest.raises(Unavailable):
            hot.drop(part)

        own_redis.start()
        assert [b.payload for b in read_all(hot, part)] == [b"before"]
        assert hot.append(part, b"after", 1, 3).base_offset == 1
    finally:
        hot.close()


def test_a_timeout_is_unavailable(own_redis: RedisServer, part: PartitionId) -> None:
    hot = RedisHotLog(own_redis.url, socket_timeout_s=0.3)
    assert own_redis.proc is not None
    try:
        hot.append(part, b"a", 1, 1)
        own_redis.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(Unavailable):
                hot.offsets(part)
            with pytest.raises(Unavailable):
                hot.append(part, b"b", 1, 2, ProducerSequence("slow", 0))
        finally:
            own_redis.proc.send_signal(signal.SIGCONT)
        # The paused append may have been applied after all: the producer resends it.
        r = hot.append(part, b"b", 1, 2, ProducerSequence("slow", 0))
        assert r.base_offset == 1
        assert [b.payload for b in read_all(hot, part)] == [b"a", b"b"]
    finally:
        hot.close()


def test_scripts_are_reloaded_after_the_script_cache_is_flushed(
    own_redis: RedisServer, part: PartitionId
) -> None:
    hot = RedisHotLog(own_redis.url)
    client = redis.Redis(port=own_redis.port)
    try:
        hot.append(part, b"a", 1, 1)
        client.script_flush()
        assert hot.append(part, b"b", 1, 2).base_offset == 1
        assert len(hot.read(part, 0, 10, 100)) == 2
    finally:
        client.close()
        hot.close()


def test_producer_state_survives_a_redis_restart(own_redis: RedisServer, part: PartitionId) -> None:
    hot = RedisHotLog(own_redis.url)
    try:
        for seq in range(3):
            hot.append(part, f"{seq}".encode(), 2, seq, ProducerSequence("durable", seq))
        own_redis.restart()  # kill -9, then start on the same folder and port
        retry = hot.append(part, b"2", 2, 2, ProducerSequence("durable", 2))
        assert (retry.base_offset, retry.duplicate) == (4, True)
        assert hot.append(part, b"3", 2, 3, ProducerSequence("durable", 3)).base_offset == 6
    finally:
        hot.close()


def test_kill_9_of_redis_during_appends_loses_and_duplicates_nothing(
    own_redis: RedisServer, part: PartitionId
) -> None:
    """A producer appends in a loop, resending on Unavailable, while Redis is killed.

    Every acknowledged batch must be there after the restart, exactly once, at the offsets
    that were acknowledged.
    """
    total, kill_after = 120, 40
    acked: list[tuple[int, int, bytes]] = []
    errors: list[BaseException] = []
    enough_acked = threading.Event()
    saw_unavailable = threading.Event()
    stop = threading.Event()
    hot = RedisHotLog(own_redis.url, socket_timeout_s=2.0)

    def producer() -> None:
        try:
            for seq in range(total):
                payload = f"batch-{seq}".encode()
                count = 1 + seq % 4
                while not stop.is_set():
                    try:
                        r = hot.append(part, payload, count, seq, ProducerSequence("k9", seq))
                    except Unavailable:
                        saw_unavailable.set()
                        stop.wait(0.01)
                        continue
                    acked.append((r.base_offset, r.count, payload))
                    break
                if len(acked) >= kill_after:
                    enough_acked.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            enough_acked.set()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert enough_acked.wait(120)
        own_redis.kill()
        assert saw_unavailable.wait(120), "the producer never noticed Redis was down"
        acked_before_restart = list(acked)
        own_redis.start()
        thread.join(150)
        assert not thread.is_alive()
    finally:
        stop.set()
        thread.join(10)
    assert errors == []
    assert len(acked) == total

    fresh = RedisHotLog(own_redis.url)
    try:
        stored = read_all(fresh, part)
        assert [(b.base_offset, b.count, b.payload) for b in stored] == acked
        assert set(acked_before_restart) <= set(acked)
        assert_dense(stored)
        assert fresh.offsets(part).high == sum(c for _, c, _ in acked)
    finally:
        fresh.close()
        hot.close()


def test_offset_out_of_range_carries_earliest_and_latest(
    log: RedisHotLog, part: PartitionId
) -> None:
    for i in range(4):
        log.append(part, b"r", 5, i)
    log.trim(part, 12)
    with pytest.raises(OffsetOutOfRange) as low:
        log.read(part, 9, 10, 100)
    assert low.value.details == {"offset": 9, "earliest": 10, "latest": 20}
    with pytest.raises(OffsetOutOfRange) as high:
        log.read(part, 21, 10, 100)
    assert high.value.details == {"offset": 21, "earliest": 10, "latest": 20}
    assert log.read(part, 20, 10, 100) == []


# Lost state (issue 33, item 3) ------------------------------------------------------------
def test_an_emptied_redis_is_refused_then_reopened_where_this_process_left_it(
    own_redis: RedisServer, part: PartitionId
) -> None:
    """Redis restarted without persistence (or FLUSHALL): a process that appended to the
    partition never appends at offsets it assigned before."""
    own_redis.extra_args = ["--appendonly", "no"]
    own_redis.restart()
    hot = RedisHotLog(own_redis.url)
    try:
        assert hot.append(part, b"a", 5, 0).base_offset == 0  # a caller that knows nothing
        assert hot.append(part, b"b", 3, 0).base_offset == 5
        own_redis.restart()  # nothing kept on disk: everything is gone
        with pytest.raises(HotStateLost, match="holds no state"):
            hot.append(part, b"c", 1, 0)  # even without a floor: this process saw it at 8
        assert hot.offsets(part).high == 0
        assert hot.open_partition(part, 0) == 8  # what it saw, over the floor given
        assert hot.append(part, b"c", 1, 0, floor=0).base_offset == 8
        assert [b.base_offset for b in read_all(hot, part, 8)] == [8]
    finally:
        hot.close()


def test_a_redis_restored_from_an_older_snapshot_is_refused(
    own_redis: RedisServer, part: PartitionId
) -> None:
    """``appendonly no`` with RDB snapshots: a restart loads the last dump, older than what
    was acknowledged since. The high watermark went back: refused, then started over at
    the highest offset this process saw."""
    own_redis.extra_args = ["--appendonly", "no"]
    own_redis.restart()
    hot = RedisHotLog(own_redis.url)
    client = redis.Redis(port=own_redis.port)
    try:
        hot.append(part, b"a", 4, 0)
        client.save()  # the dump holds offsets [0, 4)
        hot.append(part, b"b", 6, 0)
        own_redis.restart()
        assert hot.offsets(part).high == 4  # rolled back
        with pytest.raises(HotStateLost, match="older state"):
            hot.append(part, b"c", 1, 0, floor=0)
        assert hot.open_partition(part, 0) == 10
        assert hot.offsets(part).low == 10
        assert hot.append(part, b"c", 1, 0, floor=0).base_offset == 10
    finally:
        client.close()
        hot.close()


def test_reopening_a_sealed_segment_follows_the_move(own_redis: RedisServer) -> None:
    """A segment sealed by a move is never opened again: opening the partition goes to
    the chain's new active segment."""
    from gateway.hot.redis.scripts import REOPEN_LUA

    client = redis.Redis(port=own_redis.port)
    try:
        log_key, meta_key = "tg:{x}:log", "tg:{x}:meta"
        client.hset(meta_key, mapping={"hw": 3, "sealed": 1})
        reopen = client.register_script(REOPEN_LUA)
        assert reopen(keys=[log_key, meta_key], args=[10, "a1"]) == [0, b"3"]
        assert client.hget(meta_key, "hw") == b"3"
        client.delete(meta_key)
        assert reopen(keys=[log_key, meta_key], args=[10, "b2"]) == [1, b"10"]
        assert client.hmget(meta_key, "hw", "low", "start") == [b"10", b"10", b"10"]
        # A segment started over gets the incarnation it was given; one open keeps its own.
        assert client.hget(meta_key, "inc") == b"b2"
        assert reopen(keys=[log_key, meta_key], args=[4, "c3"]) == [1, b"10"]
        assert client.hget(meta_key, "inc") == b"b2"
    finally:
        client.close()
