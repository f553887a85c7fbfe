"""Pure client logic: routing parity with the gateway, batching, sequencing, retry policy."""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

import pyarrow as pa
import pytest

from gateway.client import (
    ConstantBackoff,
    ExponentialBackoff,
    InvalidPartition,
    OutOfOrderSequence,
    Retry,
    SchemaMismatch,
    TableInfo,
    TableNotFound,
    TableRef,
    Throttled,
    TidegateError,
    Unavailable,
    UnknownProducer,
)
from gateway.client._batching import Accumulator, ProducerBatch, ProducerConfig
from gateway.client._producer import PartitionQueue, ProducerCore
from gateway.client._reading import start_positions
from gateway.client._types import PartitionInfo, timestamp_us
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.routing import route_by_key
from gateway.wire.status import error_to_pb

SCHEMA = pa.schema([("user", pa.string()), ("region", pa.int64()), ("n", pa.int64())])


def table(partitions: int = 4, keys: tuple[str, ...] = ()) -> TableInfo:
    return TableInfo(
        TableRef("ns", "t"),
        SCHEMA,
        partitions,
        keys,
        partition_info=tuple(
            PartitionInfo(p, 0, 10 + p, 0, 0, 10 + p, 0) for p in range(partitions)
        ),
    )


def rows(n: int, seed: int = 1) -> list[dict[str, object]]:
    rnd = random.Random(seed)
    names = ["ada", "alan", "grace", "Zoë", "李", "", None, "o'brien", 'q"uote']
    return [
        {"user": rnd.choice(names), "region": rnd.choice([None, -1, 0, 7, 2**40]), "n": i}
        for i in range(n)
    ]


@pytest.mark.parametrize("keys", [("user",), ("user", "region"), ("region",)])
def test_client_routing_matches_the_gateway(keys: tuple[str, ...]) -> None:
    data = rows(500)
    acc = Accumulator(table(7, keys), ProducerConfig(batch_records=100_000, linger=60))
    delivery = acc.add(data, None)
    batches = acc.drain(time.monotonic(), force=True)
    expected = route_by_key(pa.RecordBatch.from_pylist(data, schema=SCHEMA), keys, 7)
    got = {b.partition: [i for piece in b.pieces for i in piece.rows] for b in batches}
    assert got == {p: idx.to_pylist() for p, idx in expected.items()}
    for b in batches:
        for base in [100]:
            b.complete(base)
    assert delivery.done and len(delivery.result()) == 500  # type: ignore[arg-type]


def test_batches_are_cut_by_records_and_bytes() -> None:
    acc = Accumulator(table(1), ProducerConfig(batch_records=100, linger=60))
    acc.add(rows(250), None)
    assert [b.records for b in acc.drain(time.monotonic(), force=False)] == [100, 100]
    assert [b.records for b in acc.drain(time.monotonic(), force=True)] == [50]

    small = Accumulator(table(1), ProducerConfig(batch_records=10**6, batch_bytes=2_000))
    small.add(rows(1000), None)
    cut = small.drain(time.monotonic(), force=True)
    assert len(cut) > 1
    assert all(b.nbytes <= 2_000 or b.records == 1 for b in cut)
    assert sum(b.records for b in cut) == 1000


def test_linger_holds_a_partial_batch() -> None:
    acc = Accumulator(table(1), ProducerConfig(batch_records=100, linger=0.05))
    acc.add(rows(3), None)
    now = time.monotonic()
    assert acc.drain(now, force=False) == []
    deadline = acc.next_deadline()
    assert deadline is not None and deadline <= now + 0.05
    assert [b.records for b in acc.drain(now + 0.06, force=False)] == [3]


def test_unkeyed_rows_stick_to_a_partition_until_its_batch_is_full() -> None:
    acc = Accumulator(table(3), ProducerConfig(batch_records=10, linger=60))
    for r in rows(30):
        acc.add(r, None)
    batches = acc.drain(time.monotonic(), force=True)
    assert sorted(b.partition for b in batches) == [0, 1, 2]
    assert all(b.records == 10 for b in batches)


def test_rows_are_validated_before_buffering() -> None:
    acc = Accumulator(table(2), ProducerConfig())
    with pytest.raises(SchemaMismatch):
        acc.add(pa.table({"user": ["a"], "n": [1]}), None)
    with pytest.raises(InvalidPartition):
        acc.add({"user": "a", "region": 1, "n": 1}, 5)
    assert acc.buffered == 0 and acc.drain(time.monotonic(), force=True) == []
    # Lossless widening, as the gateway does: int32 into int64.
    widened = pa.table(
        {
            "user": ["a"],
            "region": pa.array([1], pa.int32()),
            "n": pa.array([1], pa.int32()),
        }
    )
    acc.add(widened, 1)
    (batch,) = acc.drain(time.monotonic(), force=True)
    chunk = batch.chunks[0]
    assert isinstance(chunk, pa.RecordBatch) and chunk.schema == SCHEMA


def test_partition_queue_sequences_in_flight_and_rewind() -> None:
    q = PartitionQueue(0, max_in_flight=3)
    q.waiting = [ProducerBatch(0) for _ in range(5)]
    now = time.monotonic()
    first = q.take(idempotent=True)
    assert first.sequence == 0
    assert not q.can_send(now), "only one batch in flight before the first acknowledgement"
    q.in_flight.remove(first)
    q.acked_once = True
    sent = [q.take(True) for _ in range(3)]
    assert [b.sequence for b in sent] == [1, 2, 3]
    assert not q.can_send(now)
    q.rewind()  # a retryable failure: resend in order with the same sequences
    assert [b.sequence for b in q.waiting[:3]] == [1, 2, 3]
    again = [q.take(True) for _ in range(3)]
    assert again == sent
    q.in_flight.remove(sent[0])  # seq 1 failed for good: 2 and 3 were never stored
    q.renumber(1)
    assert [q.take(True).sequence for _ in range(3)] == [1, 2, 3]


def test_retry_policy_is_data() -> None:
    policy = Retry(ConstantBackoff(0.01), attempts=2, timeout=None)
    started = time.monotonic()
    assert policy.next_delay(Unavailable("down"), 1, started) == 0.01
    assert policy.next_delay(OutOfOrderSequence("gap"), 2, started) == 0.01
    assert policy.next_delay(Unavailable("down"), 3, started) is None
    assert policy.next_delay(TableNotFound("no"), 1, started) is None
    # The server's hint wins over a shorter backoff.
    assert policy.next_delay(Throttled("slow", retry_after_ms=750), 1, started) == 0.75
    # A wait that would end past the timeout gives up.
    short = Retry(ConstantBackoff(0.5), timeout=0.1)
    assert short.next_delay(Unavailable("down"), 1, time.monotonic()) is None
    assert Retry.none().next_delay(Unavailable("down"), 1, time.monotonic()) is None
    exp = ExponentialBackoff(base=0.1, cap=1.0, jitter=False)
    assert [exp.compute(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    jittered = ExponentialBackoff(base=0.1, cap=1.0)
    assert all(0.2 <= jittered.compute(3) <= 0.4 for _ in range(100))


def test_producer_config_guards_the_dedup_window() -> None:
    with pytest.raises(ValueError):
        ProducerConfig(max_in_flight=16)
    with pytest.raises(ValueError):
        ProducerConfig(compression="gzip")  # type: ignore[arg-type]


def test_start_positions() -> None:
    info = table(3)
    assert start_positions(info, [0, 1, 2], {1: 4}, "earliest", None) == {0: 0, 1: 4, 2: 0}
    assert start_positions(info, [0, 2], {}, "latest", None) == {0: 10, 2: 12}
    assert start_positions(info, [1], {}, 3, None) == {1: 3}
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert start_positions(info, [0], {}, when, {0: 7}) == {0: 7}
    with pytest.raises(InvalidPartition):
        start_positions(info, [3], {}, "earliest", None)
    assert timestamp_us(dt.datetime(1970, 1, 1, 0, 0, 1)) == 1_000_000
    assert timestamp_us(1.5) == 1_500_000


def test_every_reason_maps_to_its_own_class() -> None:
    from gateway.wire.errors import RetryableError, TidegateError, error_for_reason

    assert error_for_reason("INTERNAL") is TidegateError
    assert not issubclass(error_for_reason("INTERNAL"), RetryableError)
    assert error_for_reason("THROTTLED") is Throttled
    assert error_for_reason("NO_SUCH_REASON") is TidegateError


def _answer(core: ProducerCore, request: pb.AppendStreamRequest, err: Exception | None) -> Any:
    response = pb.AppendStreamResponse(request_id=request.request_id)
    if err is None:
        response.ok.ranges.add(partition=request.append.partition, base_offset=0, count=1)
    else:
        assert isinstance(err, TidegateError)
        response.error.CopyFrom(error_to_pb(err))
    return core.on_response(core.stream_gen, response)


def _reopen(core: ProducerCore, err: Exception) -> None:
    """The append stream breaks (the fate of what it carried is unknown) and a new one
    opens at once."""
    core.on_stream_error(core.stream_gen, err)
    core.stream_paused_until = 0
    for q in core.queues:
        q.paused_until = 0
    core.stream_opened()


def _sent(requests: list[pb.AppendStreamRequest]) -> list[tuple[str, int]]:
    return [(r.append.producer_id, r.append.sequence) for r in requests]


def test_a_producer_the_gateway_lost_goes_on_under_a_new_epoch() -> None:
    """UNKNOWN_PRODUCER_ID (the gateway's hot tier lost the producer's state): batches
    sent once go again under a new epoch from sequence 0; a batch sent before may have
    been stored by its earlier attempt, so it fails and is never sent under the new id."""
    config = ProducerConfig(linger=60, batch_records=1, producer_id="prod")
    core = ProducerCore(table(partitions=1), config)
    sends = [core.add([{"user": "u", "region": 0, "n": 0}], 0)]
    core.stream_opened()
    (first,) = core.outgoing(time.monotonic(), force=True)
    _answer(core, first, None)
    # Batch 1's stream breaks (its fate is unknown): it is sent again and stored.
    sends.append(core.add([{"user": "u", "region": 1, "n": 1}], 0))
    assert _sent(core.outgoing(time.monotonic(), force=True)) == [("prod", 1)]
    _reopen(core, Unavailable("the stream broke"))
    (resent,) = core.outgoing(time.monotonic(), force=True)
    assert _sent([resent]) == [("prod", 1)]
    _answer(core, resent, None)
    # Batches 2-4 go, sent once each; the hot tier has lost the producer's state.
    sends += [core.add([{"user": "u", "region": i, "n": i}], 0) for i in range(2, 5)]
    sent = core.outgoing(time.monotonic(), force=True)
    assert _sent(sent) == [("prod", 2), ("prod", 3), ("prod", 4)]
    lost = UnknownProducer("partition 0 holds no state of this producer", producer_id="prod")
    assert not _answer(core, sent[0], lost)  # each was refused by its only send: none fails
    for r in sent[1:]:
        assert not _answer(core, r, lost)  # the late refusals change nothing
    again = core.outgoing(time.monotonic(), force=True)
    assert _sent(again) == [("prod.1", 0)]  # one until the new identity is acknowledged
    _answer(core, again[0], None)
    rest = core.outgoing(time.monotonic(), force=True)
    assert _sent(rest) == [("prod.1", 1), ("prod.1", 2)]
    for r in rest:
        _answer(core, r, None).resolve()
    assert core.idle()
    assert all(d is not None and d.done and d.error is None for d in sends)

    # Batches 5 and 6 go; the stream breaks (either may have been stored), then the
    # gateway no longer knows the producer: neither is sent again, under any identity.
    more = [core.add([{"user": "u", "region": i, "n": i}], 0) for i in (5, 6)]
    assert _sent(core.outgoing(time.monotonic(), force=True)) == [("prod.1", 3), ("prod.1", 4)]
    _reopen(core, Unavailable("the stream broke"))
    (retry,) = core.outgoing(time.monotonic(), force=True)
    _answer(core, retry, lost).resolve()
    for d in more:
        assert d is not None and isinstance(d.error, UnknownProducer)
        assert "may have been stored" in d.error.message
    assert core.idle()
    # New sends go under the next identity.
    core.add([{"user": "u", "region": 7, "n": 7}], 0)
    assert _sent(core.outgoing(time.monotonic(), force=True)) == [("prod.2", 0)]
