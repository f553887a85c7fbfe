"""Small records (100 bytes) sent one at a time, through the SDK producer and through the
same loop written directly against Redis streams."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa
import redis.asyncio as aioredis

from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload, record_schema
from gateway.client import AsyncClient, Client

#: One record in ``SAMPLE`` has its acknowledgement latency recorded (a callback per
#: record would cost the producer more than the benchmark wants to measure).
SAMPLE = 16


def _records(w: Workload) -> Callable[[int], dict[str, Any]]:
    payload = b"x" * max(1, w.record_bytes - 16)

    def record(i: int) -> dict[str, Any]:
        return {"id": i, "sent_ns": time.time_ns(), "payload": payload}

    return record


def _tracker(result: Result) -> Callable[[float], Callable[[Any], None]]:
    """A done-callback factory recording a sampled send's acknowledgement latency (or an
    error) into ``result``."""

    def track(t0: float) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            if fut.cancelled() or fut.exception() is not None:
                result.errors += 1
            else:
                result.ack.record_value(max(1, int((time.monotonic() - t0) * 1e6)))

        return done

    return track


async def _send_loop(
    w: Workload, result: Result, send: Callable[[dict[str, Any]], Awaitable[Any]]
) -> None:
    """Send records one by one, as fast as ``send`` accepts them, for warm-up + duration.
    ``send`` returns an awaitable that resolves when the record is acknowledged."""
    make = _records(w)
    start = time.monotonic()
    measure_from = start + w.warmup_s
    stop_at = measure_from + w.duration_s
    pending: list[Awaitable[Any]] = []

    track = _tracker(result)

    i = 0
    while True:
        now = time.monotonic()
        if now >= stop_at:
            break
        fut = await send(make(i))
        if i % 100 == 0:
            await asyncio.sleep(0)  # an application loop yields now and then
        if now >= measure_from:
            result.records += 1
            result.bytes += w.record_bytes
            if i % SAMPLE == 0:
                fut.add_done_callback(track(now))
                pending.append(fut)
        i += 1
    await asyncio.gather(*pending, return_exceptions=True)
    # Throughput counts records accepted in the window that were then acknowledged.
    result.seconds = w.duration_s
    result.batches = result.records // w.batch_records


async def via_sdk(b: Bench, w: Workload, hot: str) -> Result:
    gw = b.gateways[hot]
    result = Result(w.name, f"tidegate SDK producer ({hot} hot tier)")
    async with AsyncClient(gw.grpc_target, api_key=gw.api_key) as client:
        table = f"bench{uuid.uuid4().hex[:8]}.small"
        schema = {f.name: str(f.type) for f in record_schema()}
        await client.create_table(table, schema, partitions=w.partitions)
        async with client.producer(
            table,
            batch_records=w.batch_records,
            max_in_flight=w.inflight,
            buffer_records=w.batch_records * w.inflight * w.partitions,
        ) as producer:
            await _send_loop(w, result, producer.send)
            result.extra["retries"] = producer.retries
        await client.drop_table(table)
    return result


def sync_send_loop(
    w: Workload,
    result: Result,
    send: Callable[[dict[str, Any]], Any],
    make: Callable[[int], dict[str, Any]] | None = None,
) -> None:
    """:func:`_send_loop` for a producer whose futures are concurrent ones (the sync
    SDK's, the Kafka benchmark's), sending ``make(i)`` (default: ids, send times and
    bytes)."""
    make = make or _records(w)
    start = time.monotonic()
    measure_from = start + w.warmup_s
    stop_at = measure_from + w.duration_s
    pending: list[Any] = []

    track = _tracker(result)

    i = 0
    while True:
        now = time.monotonic()
        if now >= stop_at:
            break
        fut = send(make(i))
        if now >= measure_from:
            result.records += 1
            result.bytes += w.record_bytes
            if i % SAMPLE == 0:
                fut.add_done_callback(track(now))
                pending.append(fut)
        i += 1
    for fut in pending:
        with contextlib.suppress(Exception):
            fut.result(60)
    result.seconds = w.duration_s
    result.batches = result.records // w.batch_records


async def via_sync_sdk(b: Bench, w: Workload, hot: str, transport: str) -> Result:
    """The sync SDK producer over ``transport`` (``grpc``: AppendStream; ``flight``:
    DoPut), the same one-record-at-a-time loop in a thread."""
    gw = b.gateways[hot]
    result = Result(w.name, f"tidegate sync SDK producer over {transport} ({hot} hot tier)")

    def produce() -> None:
        with Client(gw.grpc_target, api_key=gw.api_key) as client:
            table = f"bench{uuid.uuid4().hex[:8]}.small"
            schema = {f.name: str(f.type) for f in record_schema()}
            client.create_table(table, schema, partitions=w.partitions)
            with client.producer(
                table,
                batch_records=w.batch_records,
                max_in_flight=w.inflight,
                buffer_records=w.batch_records * w.inflight * w.partitions,
                transport=transport,
            ) as producer:
                sync_send_loop(w, result, producer.send)
                result.extra["retries"] = producer.retries
            client.drop_table(table)

    await asyncio.to_thread(produce)
    return result


async def via_redis(b: Bench, w: Workload) -> Result:
    """Baseline: the same one-record-at-a-time loop, batching ``batch_records`` rows into
    an Arrow IPC blob per XADD (round-robin over one stream per partition), with the same
    bound on unacknowledged records; each record's future resolves with its batch."""
    result = Result(w.name, "redis-py XADD of Arrow batches (baseline)")
    client = aioredis.from_url(b.redis.url, max_connections=w.inflight * w.partitions + 4)
    schema = record_schema()
    keys = [f"bench:{uuid.uuid4().hex[:8]}:{p}" for p in range(w.partitions)]
    room = asyncio.Semaphore(w.inflight * w.partitions)
    rows: list[dict[str, Any]] = []
    futures: list[asyncio.Future[None]] = []
    tasks: set[asyncio.Task[None]] = set()
    batches = 0

    async def xadd(key: str, data: list[dict[str, Any]], futs: list[asyncio.Future[None]]) -> None:
        try:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema) as writer:
                writer.write_batch(pa.RecordBatch.from_pylist(data, schema=schema))
            await client.xadd(key, {"d": sink.getvalue().to_pybytes()})
            for f in futs:
                f.set_result(None)
        except Exception as exc:
            for f in futs:
                f.set_exception(exc)
        finally:
            room.release()

    async def cut() -> None:
        nonlocal rows, futures, batches
        await room.acquire()
        task = asyncio.create_task(xadd(keys[batches % w.partitions], rows, futures))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        rows, futures = [], []
        batches += 1

    async def send(record: dict[str, Any]) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rows.append(record)
        futures.append(fut)
        if len(rows) >= w.batch_records:
            await cut()
        return fut

    try:
        sender = asyncio.create_task(_send_loop(w, result, send))
        while not sender.done():  # the linger: a partial batch waits at most 5 ms
            await asyncio.sleep(0.005)
            if rows:
                await cut()
        await sender
        await asyncio.gather(*tasks)
    finally:
        await client.delete(*keys)
        await client.aclose()
    return result


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    base = (await via_redis(b, w)).summary()
    rows = [base]
    for hot in b.gateways:
        aio = compare((await via_sdk(b, w, hot)).summary(), [base])
        rows.append(aio)
        # The sync producer's rows say how near the asyncio one's they come (goal: 0.8x).
        for transport in ("grpc", "flight"):
            result = await via_sync_sdk(b, w, hot, transport)
            rows.append(compare(result.summary(), [base, aio]))
    return rows
