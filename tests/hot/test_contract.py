"""The behaviour every hot log backend shares, run against each through ``hot_log``.

Every test uses partitions of its own (random tenant and table ids): the Redis server is
shared by the whole session.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.hot import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)
from gateway.wire.errors import (
    HotStateLost,
    InvalidIdempotentAppend,
    OffsetOutOfRange,
    OutOfOrderSequence,
    UnknownProducer,
)
from tests.hot.conftest import provision, reopen

BIG = 1 << 40


def new_partition(
    partition: int = 0, *, tenant: str | None = None, moved: bool = True
) -> PartitionId:
    """A new partition on the running test's backend (placed on shards, and moved once
    unless not ``moved``, where the backend is the Redis tier's virtual log: see
    conftest)."""
    tenant = tenant or f"t{uuid.uuid4().hex[:12]}"
    made = provision(partition, tenant, moved)
    if made is not None:
        return made
    return PartitionId(tenant=tenant, table_id=uuid.uuid4().hex, partition=partition)


@pytest.fixture
def part(hot_log: HotLog) -> PartitionId:
    return new_partition()


def read_all(log: HotLog, part: PartitionId, from_offset: int | None = None) -> list[StoredBatch]:
    """Every batch from ``from_offset`` (default: the low mark) to the high watermark."""
    offsets = log.offsets(part)
    offset = offsets.low if from_offset is None else from_offset
    out: list[StoredBatch] = []
    while offset < offsets.high:
        batches = log.read(part, offset, 1000, BIG)
        assert batches, f"no batch returned at {offset} below the high watermark"
        out.extend(batches)
        offset = batches[-1].next_offset
    return out


def append_batches(
    log: HotLog, part: PartitionId, counts: list[int], size: int = 10
) -> list[StoredBatch]:
    """Append one batch per count; returns what the log should now hold."""
    stored = []
    for i, count in enumerate(counts):
        payload = f"{part.table_id}:{i}:".encode().ljust(size, b"#")[:size]
        result = log.append(part, payload, count, 1_700_000_000_000_000 + i)
        stored.append(StoredBatch(result.base_offset, count, 1_700_000_000_000_000 + i, payload))
    return stored


def seq(producer: str, sequence: int) -> ProducerSequence:
    return ProducerSequence(producer_id=producer, sequence=sequence)


def out_of_range_details(exc: pytest.ExceptionInfo[OffsetOutOfRange]) -> dict[str, int]:
    return {k: exc.value.details[k] for k in ("offset", "earliest", "latest")}


# Appends and reads ------------------------------------------------------------------------
def test_empty_partition(hot_log: HotLog, part: PartitionId) -> None:
    assert hot_log.offsets(part) == LogOffsets(low=0, high=0, size_bytes=0)
    assert hot_log.read(part, 0, 10, BIG) == []
    with pytest.raises(OffsetOutOfRange) as exc:
        hot_log.read(part, 1, 10, BIG)
    assert out_of_range_details(exc) == {"offset": 1, "earliest": 0, "latest": 0}
    assert hot_log.trim(part, 10) == 0
    assert hot_log.offsets(part) == LogOffsets(low=0, high=0, size_bytes=0)


def test_append_read_round_trip(hot_log: HotLog, part: PartitionId) -> None:
    payloads = [
        bytes(range(256)),
        b"\x00" * 7,
        b"a",
        os.urandom(300_000),
        b"\xff\xfe\r\n\x00tail",
    ]
    counts = [1, 5, 2, 1000, 3]
    results = [
        hot_log.append(part, payload, count, 1_000 + i)
        for i, (payload, count) in enumerate(zip(payloads, counts, strict=True))
    ]
    bases = [0, 1, 6, 8, 1008]
    assert results == [AppendResult(b, c) for b, c in zip(bases, counts, strict=True)]
    offsets = hot_log.offsets(part)
    assert (offsets.low, offsets.high) == (0, 1011)
    assert offsets.size_bytes == sum(len(p) for p in payloads)
    expected = [
        StoredBatch(b, c, 1_000 + i, p)
        for i, (b, c, p) in enumerate(zip(bases, counts, payloads, strict=True))
    ]
    assert hot_log.read(part, 0, BIG, BIG) == expected
    assert read_all(hot_log, part) == expected


def test_count_must_be_positive(hot_log: HotLog, part: PartitionId) -> None:
    with pytest.raises(ValueError):
        hot_log.append(part, b"x", 0, 1)
    assert hot_log.offsets(part).high == 0


def test_concurrent_writers_get_disjoint_dense_ranges(hot_log: HotLog, part: PartitionId) -> None:
    writers, per_writer = 8, 40
    barrier = threading.Barrier(writers)
    results: dict[int, list[tuple[AppendResult, bytes]]] = {}
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        mine: list[tuple[AppendResult, bytes]] = []
        try:
            barrier.wait()
            for i in range(per_writer):
                payload = f"w{w}-b{i}-".encode() + bytes([w]) * (i * 37 % 200)
                count = (w * 7 + i * 3) % 9 + 1
                mine.append((hot_log.append(part, payload, count, i), payload))
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)
        results[w] = mine

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    acked = sorted((r for mine in results.values() for r in mine), key=lambda r: r[0].base_offset)
    assert len(acked) == writers * per_writer
    next_offset = 0
    for result, _ in acked:
        assert result.base_offset == next_offset, "ranges overlap or leave a gap"
        assert not result.duplicate
        next_offset = result.base_offset + result.count
    assert hot_log.offsets(part).high == next_offset

    # Each writer's own batches got increasing offsets, in the order it appended them.
    for mine in results.values():
        bases = [r.base_offset for r, _ in mine]
        assert bases == sorted(bases)

    stored = read_all(hot_log, part)
    assert [(b.base_offset, b.count, b.payload) for b in stored] == [
        (r.base_offset, r.count, p) for r, p in acked
    ]


def test_read_from_the_middle_of_a_batch(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [5, 5, 1, 4])  # [0,5) [5,10) [10,11) [11,15)
    expected_first = {0: 0, 1: 0, 4: 0, 5: 5, 7: 5, 9: 5, 10: 10, 11: 11, 14: 11}
    for offset, base in expected_first.items():
        batches = hot_log.read(part, offset, BIG, BIG)
        assert batches[0].base_offset == base
        assert batches[0].base_offset <= offset < batches[0].next_offset
        assert batches[-1].next_offset == 15


def test_read_record_and_byte_limits(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [3, 3, 3, 3, 3], size=10)  # bases 0 3 6 9 12

    def bases(from_offset: int, max_records: int, max_bytes: int) -> list[int]:
        return [b.base_offset for b in hot_log.read(part, from_offset, max_records, max_bytes)]

    # Records count from from_offset; adding stops once the limit is reached.
    assert bases(0, 1, BIG) == [0]
    assert bases(0, 3, BIG) == [0]
    assert bases(0, 4, BIG) == [0, 3]
    assert bases(0, 6, BIG) == [0, 3]
    assert bases(0, 7, BIG) == [0, 3, 6]
    assert bases(2, 1, BIG) == [0]
    assert bases(2, 2, BIG) == [0, 3]
    assert bases(2, 4, BIG) == [0, 3]
    assert bases(2, 5, BIG) == [0, 3, 6]
    # Payload bytes likewise (every payload is 10 bytes).
    assert bases(0, BIG, 1) == [0]
    assert bases(0, BIG, 10) == [0]
    assert bases(0, BIG, 11) == [0, 3]
    assert bases(0, BIG, 25) == [0, 3, 6]
    assert bases(4, BIG, 20) == [3, 6]
    # Whichever limit comes first.
    assert bases(0, 4, 100) == [0, 3]
    assert bases(0, 100, 20) == [0, 3]
    # At least one batch, however small the limits.
    assert bases(7, 0, 0) == [6]
    assert bases(14, 1, 1) == [12]
    # Never past the high watermark.
    assert bases(0, BIG, BIG) == [0, 3, 6, 9, 12]
    assert bases(13, BIG, BIG) == [12]


def test_read_at_the_high_watermark_is_empty(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [2, 3])
    assert hot_log.read(part, 5, 10, BIG) == []
    assert hot_log.read(part, 5, 0, 0) == []
    hot_log.append(part, b"next", 1, 0)
    assert [b.payload for b in hot_log.read(part, 5, 10, BIG)] == [b"next"]


def test_reads_outside_the_log_raise(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [3, 4, 3])  # [0,3) [3,7) [7,10)
    for offset in (11, 1000):
        with pytest.raises(OffsetOutOfRange) as exc:
            hot_log.read(part, offset, 10, BIG)
        assert out_of_range_details(exc) == {"offset": offset, "earliest": 0, "latest": 10}
    with pytest.raises(OffsetOutOfRange) as exc:
        hot_log.read(part, -1, 10, BIG)
    assert out_of_range_details(exc) == {"offset": -1, "earliest": 0, "latest": 10}

    assert hot_log.trim(part, 7) == 7
    for offset in (0, 3, 6):
        with pytest.raises(OffsetOutOfRange) as exc:
            hot_log.read(part, offset, 10, BIG)
        assert out_of_range_details(exc) == {"offset": offset, "earliest": 7, "latest": 10}
    assert exc.value.reason == "OFFSET_OUT_OF_RANGE"


def test_read_at_answers_the_marks_and_what_read_answers(
    hot_log: HotLog, part: PartitionId
) -> None:
    append_batches(hot_log, part, [3, 4, 3])  # [0,3) [3,7) [7,10)
    hot_log.trim(part, 3)
    for offset in (3, 4, 7, 9):
        for records, nbytes in ((BIG, BIG), (1, BIG), (4, 15), (0, 0)):
            o, batches = hot_log.read_at(part, offset, records, nbytes)
            assert (o.low, o.high) == (3, 10)
            assert batches == hot_log.read(part, offset, records, nbytes)
    # Where read raises or answers nothing: the marks, no batches.
    for offset in (0, 2, 10, 11):
        o, batches = hot_log.read_at(part, offset, BIG, BIG)
        assert (o.low, o.high, batches) == (3, 10, [])


def test_offsets_of_many_partitions_at_once(hot_log: HotLog) -> None:
    parts = [new_partition(p) for p in range(4)]
    for i, p in enumerate(parts[:3]):
        append_batches(hot_log, p, [2] * (i + 1))
    hot_log.trim(parts[2], 2)
    many = hot_log.offsets_many(parts)
    assert [(o.low, o.high) for o in many] == [(0, 2), (0, 4), (2, 6), (0, 0)]
    assert many == [hot_log.offsets(p) for p in parts]


def test_timestamps_are_kept(hot_log: HotLog, part: PartitionId) -> None:
    stamps = [0, 1, 1_700_000_000_123_456, 2**62]
    for ts in stamps:
        hot_log.append(part, b"p", 1, ts)
    assert [b.timestamp_us for b in read_all(hot_log, part)] == stamps


# Trim -------------------------------------------------------------------------------------
def test_trim_deletes_whole_batches_only(hot_log: HotLog, part: PartitionId) -> None:
    stored = append_batches(hot_log, part, [3, 4, 3], size=10)  # [0,3) [3,7) [7,10)
    # Offset 5 lies inside [3,7): that batch straddles and stays.
    assert hot_log.trim(part, 5) == 3
    assert hot_log.offsets(part) == LogOffsets(low=3, high=10, size_bytes=20)
    assert hot_log.read(part, 3, BIG, BIG) == stored[1:]
    assert hot_log.read(part, 5, 1, BIG) == stored[1:2]
    with pytest.raises(OffsetOutOfRange):
        hot_log.read(part, 2, 10, BIG)

    # Trimming below the low mark changes nothing; a batch ending exactly at the offset goes.
    assert hot_log.trim(part, 1) == 3
    assert hot_log.trim(part, 3) == 3
    assert hot_log.trim(part, 7) == 7
    assert hot_log.read(part, 7, BIG, BIG) == stored[2:]
    assert hot_log.offsets(part) == LogOffsets(low=7, high=10, size_bytes=10)


def test_trim_everything_keeps_the_high_watermark(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [3, 4, 3])
    assert hot_log.trim(part, 1_000) == 10
    assert hot_log.offsets(part) == LogOffsets(low=10, high=10, size_bytes=0)
    assert hot_log.read(part, 10, 10, BIG) == []
    with pytest.raises(OffsetOutOfRange) as exc:
        hot_log.read(part, 9, 10, BIG)
    assert out_of_range_details(exc) == {"offset": 9, "earliest": 10, "latest": 10}

    assert hot_log.append(part, b"after", 2, 5) == AppendResult(10, 2)
    assert hot_log.read(part, 10, 10, BIG) == [StoredBatch(10, 2, 5, b"after")]
    assert hot_log.offsets(part) == LogOffsets(low=10, high=12, size_bytes=5)


# Idempotent producers ---------------------------------------------------------------------
def test_a_producer_starts_at_sequence_zero(hot_log: HotLog, part: PartitionId) -> None:
    """A producer the partition holds no state of may only start at 0: above it, its
    earlier batches were never seen here (or their state was lost), so a retry of one
    could not be recognised (Kafka's UNKNOWN_PRODUCER_ID)."""
    with pytest.raises(UnknownProducer) as exc:
        hot_log.append(part, b"a", 2, 0, seq("p", 41))
    assert exc.value.reason == "UNKNOWN_PRODUCER_ID" and not exc.value.retryable
    assert "holds no state of this producer" in exc.value.message
    assert hot_log.offsets(part).high == 0  # nothing stored
    assert hot_log.append(part, b"a", 2, 0, seq("p", 0)) == AppendResult(0, 2)
    assert hot_log.append(part, b"b", 1, 0, seq("p", 1)) == AppendResult(2, 1)
    assert hot_log.append(part, b"c", 1, 0, seq("q", 0)) == AppendResult(3, 1)
    with pytest.raises(InvalidIdempotentAppend):
        hot_log.append(part, b"d", 1, 0, seq("r", -1))
    assert hot_log.offsets(part).high == 4


def test_retry_returns_the_original_offsets(hot_log: HotLog, part: PartitionId) -> None:
    first = [hot_log.append(part, f"b{i}".encode(), i + 1, i, seq("p", i)) for i in range(3)]
    assert first == [AppendResult(0, 1), AppendResult(1, 2), AppendResult(3, 3)]
    # A retry with the same count is acknowledged with the original range, not stored again.
    for i in (2, 0, 1, 2):
        again = hot_log.append(part, b"retried payload", i + 1, 99, seq("p", i))
        assert again == AppendResult(first[i].base_offset, first[i].count, duplicate=True)
    assert hot_log.offsets(part).high == 6
    assert [b.payload for b in read_all(hot_log, part)] == [b"b0", b"b1", b"b2"]
    # The sequence goes on where it was.
    assert hot_log.append(part, b"b3", 1, 0, seq("p", 3)) == AppendResult(6, 1)


def test_retry_with_another_count_is_rejected(hot_log: HotLog, part: PartitionId) -> None:
    hot_log.append(part, b"x", 3, 0, seq("p", 0))
    hot_log.append(part, b"y", 3, 0, seq("p", 1))
    with pytest.raises(InvalidIdempotentAppend) as exc:
        hot_log.append(part, b"x", 4, 0, seq("p", 0))
    assert exc.value.reason == "INVALID_IDEMPOTENT_APPEND"
    assert hot_log.offsets(part).high == 6


def test_sequence_gap_raises_out_of_order(hot_log: HotLog, part: PartitionId) -> None:
    hot_log.append(part, b"x", 1, 0, seq("p", 0))
    hot_log.append(part, b"x", 1, 0, seq("p", 1))
    for bad in (3, 100):
        with pytest.raises(OutOfOrderSequence) as exc:
            hot_log.append(part, b"y", 1, 0, seq("p", bad))
        assert exc.value.retryable
    assert hot_log.offsets(part).high == 2
    # Nothing was remembered for the rejected sequences.
    assert hot_log.append(part, b"y", 1, 0, seq("p", 2)) == AppendResult(2, 1)


def test_sequences_older_than_the_window_are_rejected(hot_log: HotLog, part: PartitionId) -> None:
    results = [hot_log.append(part, b"x", 1, 0, seq("p", i)) for i in range(21)]
    # The last 16 batches (sequences 5..20) are remembered.
    assert hot_log.append(part, b"x", 1, 0, seq("p", 5)) == AppendResult(
        results[5].base_offset, 1, duplicate=True
    )
    assert hot_log.append(part, b"x", 1, 0, seq("p", 20)).duplicate
    for old in (0, 4):
        with pytest.raises(InvalidIdempotentAppend) as exc:
            hot_log.append(part, b"x", 1, 0, seq("p", old))
        # The producer's last sequence tells a retrying writer that ``old`` was stored.
        assert exc.value.details["last_sequence"] == 20
    assert hot_log.offsets(part).high == 21


def kafka_seq(producer: str, sequence: int) -> ProducerSequence:
    return ProducerSequence(producer_id=producer, sequence=sequence, counts_records=True)


def test_sequences_that_count_records(hot_log: HotLog, part: PartitionId) -> None:
    """Kafka's idempotent producer: a batch's sequence is its first record's, so the next
    batch's is this one's plus its record count; a retry is found by its first."""
    assert hot_log.append(part, b"a", 3, 0, kafka_seq("k", 0)) == AppendResult(0, 3)
    assert hot_log.append(part, b"b", 2, 0, kafka_seq("k", 3)) == AppendResult(3, 2)
    for first, stored in ((0, AppendResult(0, 3, True)), (3, AppendResult(3, 2, True))):
        assert hot_log.append(part, b"again", stored.count, 0, kafka_seq("k", first)) == stored
    # Past the last batch's records is a gap.
    with pytest.raises(OutOfOrderSequence) as gap:
        hot_log.append(part, b"c", 1, 0, kafka_seq("k", 6))
    assert gap.value.details["expected_sequence"] == 5
    # A sequence inside a stored batch starts no batch: not a retry the tier knows.
    for inside in (1, 4):
        with pytest.raises(InvalidIdempotentAppend):
            hot_log.append(part, b"c", 1, 0, kafka_seq("k", inside))
    assert hot_log.append(part, b"c", 1, 0, kafka_seq("k", 5)) == AppendResult(5, 1)
    assert hot_log.offsets(part).high == 6
    assert [b.payload for b in read_all(hot_log, part)] == [b"a", b"b", b"c"]


def test_record_sequences_wrap_to_zero(hot_log: HotLog, part: PartitionId) -> None:
    """Kafka's sequences are 32-bit: after 2**31 - 1 comes 0, which is then no retry of
    the producer's first batch but the next one."""
    big = (1 << 31) - 2
    assert hot_log.append(part, b"a", big, 0, kafka_seq("k", 0)) == AppendResult(0, big)
    assert hot_log.append(part, b"b", 2, 0, kafka_seq("k", big)) == AppendResult(big, 2)
    assert hot_log.append(part, b"c", 1, 0, kafka_seq("k", 0)) == AppendResult(big + 2, 1)
    assert hot_log.append(part, b"c", 1, 0, kafka_seq("k", 0)).duplicate
    assert hot_log.append(part, b"d", 1, 0, kafka_seq("k", 1)) == AppendResult(big + 3, 1)


def test_producers_are_independent(hot_log: HotLog) -> None:
    a, b = new_partition(0), new_partition(1)
    assert hot_log.append(a, b"1", 1, 0, seq("p", 0)) == AppendResult(0, 1)
    # Same producer, other partition: its own sequence space.
    assert hot_log.append(b, b"1", 1, 0, seq("p", 0)) == AppendResult(0, 1)
    assert hot_log.append(b, b"2", 1, 0, seq("p", 1)) == AppendResult(1, 1)
    # Other producer, same partition, same sequence: not a duplicate.
    assert hot_log.append(a, b"2", 1, 0, seq("q", 0)) == AppendResult(1, 1)
    # Appends without a producer do not disturb either.
    assert hot_log.append(a, b"3", 1, 0) == AppendResult(2, 1)
    assert hot_log.append(a, b"4", 1, 0, seq("p", 1)) == AppendResult(3, 1)
    assert hot_log.append(a, b"1", 1, 0, seq("p", 0)) == AppendResult(0, 1, duplicate=True)


def test_concurrent_retries_store_once(hot_log: HotLog, part: PartitionId) -> None:
    threads, rounds = 8, 5
    barrier = threading.Barrier(threads)
    results: list[tuple[int, AppendResult]] = []
    lock = threading.Lock()

    def producer_retrying() -> None:
        for r in range(rounds):
            barrier.wait()
            result = hot_log.append(part, f"r{r}".encode(), 2, 0, seq("p", r))
            with lock:
                results.append((r, result))

    workers = [threading.Thread(target=producer_retrying) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(results) == threads * rounds
    for r in range(rounds):
        mine = [res for rr, res in results if rr == r]
        assert sum(not res.duplicate for res in mine) == 1
        assert {(res.base_offset, res.count) for res in mine} == {(2 * r, 2)}
    assert [b.payload for b in read_all(hot_log, part)] == [f"r{r}".encode() for r in range(rounds)]


def test_idempotence_survives_trim(hot_log: HotLog, part: PartitionId) -> None:
    first = [hot_log.append(part, b"x" * 100, 2, 0, seq("p", i)) for i in range(4)]
    assert hot_log.trim(part, 1_000) == 8
    for i in (3, 0):
        assert hot_log.append(part, b"x", 2, 0, seq("p", i)) == AppendResult(
            first[i].base_offset, 2, duplicate=True
        )
    with pytest.raises(OutOfOrderSequence):
        hot_log.append(part, b"x", 2, 0, seq("p", 5))
    assert hot_log.append(part, b"y", 2, 0, seq("p", 4)) == AppendResult(8, 2)
    assert hot_log.offsets(part) == LogOffsets(low=8, high=10, size_bytes=1)


# Isolation and drop -----------------------------------------------------------------------
def test_partitions_tables_and_tenants_are_isolated(hot_log: HotLog) -> None:
    base = new_partition(0)
    parts = [
        base,
        PartitionId(base.tenant, base.table_id, 1),  # other partition
        PartitionId(base.tenant, uuid.uuid4().hex, 0),  # other table, same tenant
        PartitionId(f"t{uuid.uuid4().hex[:12]}", base.table_id, 0),  # same table id, other tenant
    ]
    for n, p in enumerate(parts):
        for i in range(n + 2):
            assert hot_log.append(p, f"{n}:{i}".encode(), 1, 0, seq("p", i)).base_offset == i
    for n, p in enumerate(parts):
        assert hot_log.offsets(p).high == n + 2
        assert [b.payload for b in read_all(hot_log, p)] == [
            f"{n}:{i}".encode() for i in range(n + 2)
        ]
    assert hot_log.trim(parts[0], 100) == 2
    assert [hot_log.offsets(p).low for p in parts] == [2, 0, 0, 0]
    hot_log.drop(parts[1])
    assert hot_log.offsets(parts[1]) == LogOffsets(0, 0, 0)
    assert [hot_log.offsets(p).high for p in parts] == [2, 0, 4, 5]
    assert [b.payload for b in read_all(hot_log, parts[3])][-1] == b"3:4"


def test_drop_deletes_data_and_producer_state(hot_log: HotLog, part: PartitionId) -> None:
    append_batches(hot_log, part, [3, 2])
    hot_log.append(part, b"z", 1, 0, seq("p", 0))
    hot_log.trim(part, 3)
    hot_log.drop(part)
    assert hot_log.offsets(part) == LogOffsets(0, 0, 0)
    assert hot_log.read(part, 0, 10, BIG) == []
    with pytest.raises(OffsetOutOfRange):
        hot_log.read(part, 3, 10, BIG)
    # A new log from offset 0, and the producer is unknown again.
    assert hot_log.append(part, b"z", 1, 0, seq("p", 0)) == AppendResult(0, 1)
    with pytest.raises(UnknownProducer):
        hot_log.append(part, b"w", 1, 0, seq("q", 9))
    assert hot_log.append(part, b"w", 1, 0, seq("q", 0)) == AppendResult(1, 1)
    hot_log.drop(part)
    hot_log.drop(part)  # dropping twice is harmless
    assert hot_log.offsets(part) == LogOffsets(0, 0, 0)


# Lost state (issue 33, item 3) ---------------------------------------------------------------
def test_an_append_that_knows_the_partition_never_starts_it_over(hot_log: HotLog) -> None:
    """A caller that knows the partition (``floor``) is refused, with nothing stored, by a
    partition without state: it is never silently created again at offset 0. (A moved
    partition has state: its move opened the next segment.)"""
    part = new_partition(moved=False)
    with pytest.raises(HotStateLost):
        hot_log.append(part, b"x", 1, 0, floor=0)
    assert hot_log.offsets(part) == LogOffsets(0, 0, 0)
    assert hot_log.open_partition(part, 7) == 7
    assert hot_log.offsets(part) == LogOffsets(7, 7, 0)
    assert hot_log.append(part, b"ab", 2, 1, floor=0) == AppendResult(7, 2)
    assert hot_log.open_partition(part, 3) == 9  # at or above the floor: left alone
    assert hot_log.open_partition(part, 9) == 9
    assert read_all(hot_log, part) == [StoredBatch(7, 2, 1, b"ab")]
    with pytest.raises(OffsetOutOfRange):
        hot_log.read(part, 6, 10, BIG)  # below the re-seeded start


def test_a_partition_behind_a_known_floor_is_refused_then_started_over(
    hot_log: HotLog, part: PartitionId
) -> None:
    """A high watermark below what the caller knows was reached (a rolled-back state) is
    refused; opening it at that floor starts it over, empty, there."""
    hot_log.open_partition(part, 0)
    append_batches(hot_log, part, [3, 2])
    hot_log.append(part, b"p", 1, 0, seq("p", 0), floor=0)
    with pytest.raises(HotStateLost):
        hot_log.append(part, b"x", 1, 0, floor=20)
    assert hot_log.offsets(part).high == 6
    assert hot_log.open_partition(part, 20) == 20
    assert hot_log.offsets(part) == LogOffsets(20, 20, 0)
    assert hot_log.append(part, b"y", 1, 5, floor=20) == AppendResult(20, 1)
    # The producer state from before is gone with the rest: its next sequence is refused
    # (a retry of its last batch could not be told from a new one), a restart from 0 taken.
    with pytest.raises(UnknownProducer):
        hot_log.append(part, b"p", 1, 0, seq("p", 1), floor=0)
    assert hot_log.append(part, b"p", 1, 0, seq("p", 0), floor=0) == AppendResult(21, 1)
    assert [b.base_offset for b in read_all(hot_log, part)] == [20, 21]


def test_new_partitions_open_at_zero(hot_log: HotLog) -> None:
    parts = [new_partition(p) for p in range(3)]
    hot_log.open_partitions(parts)
    hot_log.open_partitions(parts)  # again: nothing changes
    for p in parts:
        assert hot_log.append(p, b"x", 2, 0, floor=0) == AppendResult(0, 2)
    hot_log.open_partitions(parts)
    assert [hot_log.offsets(p).high for p in parts] == [2, 2, 2]


def test_everything_survives_a_new_instance(hot_log: HotLog) -> None:
    part = new_partition()
    results = [hot_log.append(part, f"b{i}".encode(), 2, i, seq("p", i)) for i in range(6)]
    hot_log.trim(part, 5)  # [0,2) [2,4) go; [4,6) straddles
    emptied = new_partition()
    hot_log.append(emptied, b"gone", 3, 0)
    hot_log.trim(emptied, 3)
    before = read_all(hot_log, part)
    hot_log.close()

    reopened = reopen()
    try:
        assert reopened.offsets(part) == LogOffsets(low=4, high=12, size_bytes=8)
        assert read_all(reopened, part) == before
        assert reopened.append(part, b"", 2, 0, seq("p", 1)) == AppendResult(
            results[1].base_offset, 2, duplicate=True
        )
        assert reopened.append(part, b"b6", 2, 0, seq("p", 6)) == AppendResult(12, 2)
        assert reopened.offsets(emptied) == LogOffsets(low=3, high=3, size_bytes=0)
        assert reopened.append(emptied, b"again", 1, 0) == AppendResult(3, 1)
    finally:
        reopened.close()


# Property: random operations against a model ---------------------------------------------
@dataclass
class Model:
    """The hot log contract in a few lines of Python."""

    batches: list[StoredBatch] = field(default_factory=list)
    low: int = 0
    windows: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    @property
    def high(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.low

    def live(self) -> list[StoredBatch]:
        return [b for b in self.batches if b.base_offset >= self.low]

    def append(
        self, payload: bytes, count: int, ts: int, producer: ProducerSequence | None
    ) -> AppendResult | type[Exception]:
        if producer is not None:
            window = self.windows.get(producer.producer_id, [])
            if not window and producer.sequence > 0:
                return UnknownProducer
            if window:
                last = window[-1][0]
                if producer.sequence > last + 1:
                    return OutOfOrderSequence
                if producer.sequence <= last:
                    for s, base, stored_count in window:
                        if s == producer.sequence:
                            if stored_count != count:
                                return InvalidIdempotentAppend
                            return AppendResult(base, stored_count, duplicate=True)
                    return InvalidIdempotentAppend
        result = AppendResult(self.high, count)
        self.batches.append(StoredBatch(self.high, count, ts, payload))
        if producer is not None:
            window = self.windows.setdefault(producer.producer_id, [])
            window.append((producer.sequence, result.base_offset, count))
            del window[:-16]
        return result

    def trim(self, below: int) -> int:
        for b in self.live():
            if b.next_offset > below:
                self.low = max(self.low, b.base_offset)
                return self.low
        self.low = self.high
        return self.low

    def read(
        self, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch] | type[Exception]:
        if from_offset < self.low or from_offset > self.high:
            return OffsetOutOfRange
        out: list[StoredBatch] = []
        records = size = 0
        for b in self.live():
            if b.next_offset <= from_offset:
                continue
            out.append(b)
            records += b.next_offset - max(from_offset, b.base_offset)
            size += len(b.payload)
            if records >= max_records or size >= max_bytes:
                break
        return out


def _run(call: Callable[[], object]) -> object:
    try:
        return call()
    except (OffsetOutOfRange, OutOfOrderSequence, InvalidIdempotentAppend) as exc:
        return type(exc)


_append_op = st.tuples(
    st.just("append"),
    st.integers(1, 4),  # count
    st.binary(min_size=1, max_size=30),
    st.one_of(st.none(), st.tuples(st.sampled_from(["a", "b"]), st.integers(-18, 2))),
)
_trim_op = st.tuples(st.just("trim"), st.integers(0, 100))
_read_op = st.tuples(st.just("read"), st.integers(0, 100), st.integers(0, 8), st.integers(0, 60))
_ops = st.lists(st.one_of(_append_op, _append_op, _trim_op, _read_op), max_size=30)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=_ops)
def test_random_operations_match_the_model(hot_log: HotLog, ops: list[tuple[object, ...]]) -> None:
    part = new_partition()
    model = Model()
    for step, op in enumerate(ops):
        if op[0] == "append":
            _, count, payload, prod = op
            assert isinstance(count, int) and isinstance(payload, bytes)
            producer = None
            if isinstance(prod, tuple):
                pid, delta = prod
                window = model.windows.get(pid)
                sequence = window[-1][0] + 1 + delta if window else abs(delta)
                producer = seq(pid, max(sequence, 0))
            got = _run(partial(hot_log.append, part, payload, count, step, producer))
            assert got == model.append(payload, count, step, producer), op
        elif op[0] == "trim":
            below = int(op[1]) * (model.high + 2) // 100
            assert hot_log.trim(part, below) == model.trim(below), op
        else:
            _, where, max_records, max_bytes = op
            assert isinstance(where, int) and isinstance(max_records, int)
            assert isinstance(max_bytes, int)
            from_offset = model.low - 2 + where * (model.high - model.low + 4) // 100
            got = _run(partial(hot_log.read, part, from_offset, max_records, max_bytes))
            assert got == model.read(from_offset, max_records, max_bytes), (op, from_offset)
        live = model.live()
        size = sum(len(b.payload) for b in live)
        assert hot_log.offsets(part) == LogOffsets(model.low, model.high, size)
    assert read_all(hot_log, part) == model.live()
