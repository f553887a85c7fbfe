"""Scenarios: the system under test and its baseline, measured the same way, in one run."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pyarrow as pa
import redis.asyncio as aioredis

from benchmarks.loadgen import (
    BatchFactory,
    Result,
    Workload,
    closed_loop,
    drive,
    follow_e2e,
    record_schema,
)
from gateway.client._reading import read_response_batches
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]


def _sent_ns(ipc: bytes) -> list[int]:
    if not ipc:
        return []
    out: list[int] = []
    for b in pa.ipc.open_stream(pa.py_buffer(ipc)):
        out.extend(b.column("sent_ns").to_pylist())
    return out


async def append_via_gateway(w: Workload, grpc_target: str, metadata: Any = None) -> Result:
    """Appends through the gateway's gRPC API; following readers measure end to end.

    ``metadata`` is one tenant's call metadata, or a list of them (``w.tenants`` tenants):
    each tenant then has its own table and producer ``p`` writes as tenant
    ``p % tenants`` to partition ``(p // tenants) % partitions`` of its table.
    """
    result = Result(w.name, f"tidegate ({w.hot} hot tier)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    tenants = metadata if isinstance(metadata, list) else [metadata]
    async with grpc.aio.insecure_channel(grpc_target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        refs = [await create_table(stub, w.name, w.partitions, md) for md in tenants]

        async def send(p: int, sent_ns: int) -> None:
            t = p % len(tenants)
            await stub.Append(
                pb.AppendRequest(
                    table=refs[t],
                    arrow_ipc=factory.ipc(sent_ns),
                    partition=(p // len(tenants)) % w.partitions,
                ),
                metadata=tenants[t],
            )

        stop = asyncio.Event()
        measure_from_wall = time.time_ns() + int(w.warmup_s * 1e9)

        def reader(t: int, p: int) -> Any:
            async def stream() -> AsyncIterator[list[int]]:
                call = stub.Read(
                    pb.ReadRequest(table=refs[t], partition=p, offset=0, follow=True),
                    metadata=tenants[t],
                )
                async for msg in call:
                    yield _sent_ns(msg.arrow_ipc)

            return stream

        followers = (
            [
                asyncio.create_task(follow_e2e(result, measure_from_wall, reader(t, p), stop))
                for t in range(len(tenants))
                for p in range(w.partitions)
            ]
            if w.consumers
            else []
        )
        await drive(w, result, send, w.batch_records, w.batch_bytes)
        await asyncio.sleep(0.5)  # let followers drain the tail
        stop.set()
        for f in followers:
            f.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        for ref, md in zip(refs, tenants, strict=True):
            await drop_table(stub, ref, md)
    if len(tenants) > 1:
        result.system += f", {len(tenants)} tenants"
    return result


async def append_via_redis(w: Workload, redis_url: str) -> Result:
    """Baseline: redis-py XADD of the same Arrow IPC blobs, one stream per partition, with
    the same producers, schedule and in-flight bound; XREAD followers for end to end."""
    result = Result(w.name, "redis-py XADD (baseline)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    client = aioredis.from_url(
        redis_url, max_connections=w.producers * w.inflight + w.partitions * w.tenants + 4
    )
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    # One stream per (tenant, partition), written by the same producers as with Tidegate.
    keys = [f"{prefix}:{p}" for p in range(w.partitions * w.tenants)]
    try:

        async def send(p: int, sent_ns: int) -> None:
            t, part = p % w.tenants, (p // w.tenants) % w.partitions
            await client.xadd(keys[t * w.partitions + part], {"d": factory.ipc(sent_ns)})

        stop = asyncio.Event()
        measure_from_wall = time.time_ns() + int(w.warmup_s * 1e9)

        def reader(p: int) -> Any:
            async def stream() -> AsyncIterator[list[int]]:
                last = "0-0"
                while not stop.is_set():  # ends by itself: never cancelled inside XREAD
                    got = await client.xread({keys[p]: last}, block=200, count=100)
                    for _, entries in got or []:
                        for entry_id, fields in entries:
                            last = entry_id
                            yield _sent_ns(fields[b"d"])

            return stream

        followers = (
            [
                asyncio.create_task(follow_e2e(result, measure_from_wall, reader(k), stop))
                for k in range(len(keys))
            ]
            if w.consumers
            else []
        )
        await drive(w, result, send, w.batch_records, w.batch_bytes)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*followers, return_exceptions=True)
    finally:
        await client.delete(*keys)
        await client.aclose()
    return result


def fields_of(schema: pa.Schema) -> list[Any]:
    return [pb.Field(name=f.name, type=str(f.type), nullable=f.nullable) for f in schema]


async def create_table(
    stub: Any, name: str, partitions: int, metadata: Any, schema: pa.Schema | None = None
) -> Any:
    """A table of the benchmark schema in a namespace of its own; returns its TableRef.
    Its Iceberg table is made too (a gateway makes it at the table's first use, here a
    describe), so that baselines reading the catalog directly find it."""
    ref = pb.TableRef(namespace=f"bench{uuid.uuid4().hex[:8]}", name=name.replace("-", "_"))
    await stub.CreateTable(
        pb.CreateTableRequest(
            table=ref, fields=fields_of(schema or record_schema()), partitions=partitions
        ),
        metadata=metadata,
    )
    await stub.DescribeTable(pb.DescribeTableRequest(table=ref), metadata=metadata)
    return ref


async def drop_table(stub: Any, ref: Any, metadata: Any) -> None:
    """Drop a benchmark table (its hot and cold data go with it), so that later scenarios
    (a tiering job tiers every table) find only their own."""
    await stub.DropTable(pb.DropTableRequest(table=ref), metadata=metadata)


async def fill(
    stub: Any,
    ref: Any,
    metadata: Any,
    *,
    records: int,
    batch_records: int,
    record_bytes: int,
    partitions: int = 1,
    concurrency: int = 4,
) -> int:
    """Append ``records`` records (rounded down to whole batches) spread round-robin over
    ``partitions``, with ``concurrency`` appends in flight; returns the records stored.
    Every batch of a partition lands in order, so each partition's offsets are dense."""
    factory = BatchFactory(batch_records, record_bytes)
    batches = max(1, records // batch_records)
    lanes = max(1, min(concurrency, partitions))

    async def lane(k: int) -> None:
        for i in range(k, batches, lanes):
            await stub.Append(
                pb.AppendRequest(
                    table=ref, arrow_ipc=factory.ipc(time.time_ns()), partition=i % partitions
                ),
                metadata=metadata,
            )

    if partitions % lanes:
        lanes = 1  # each partition must be written by one lane to keep its order
    await asyncio.gather(*(lane(k) for k in range(lanes)))
    return batches * batch_records


async def fill_workload(
    stub: Any, ref: Any, metadata: Any, w: Workload, partitions: int = 1
) -> int:
    """:func:`fill` with the workload's ``read_records`` records of its batch shape."""
    return await fill(
        stub,
        ref,
        metadata,
        records=w.read_records,
        batch_records=w.batch_records,
        record_bytes=w.record_bytes,
        partitions=partitions,
    )


def gateway_reader(stub: Any, ref: Any, metadata: Any) -> Any:
    """``read(partition, offset, max_records) -> (records, bytes)`` through the Read RPC,
    as the SDK reads: hot records as stored, which it decodes and gives their system
    columns (``read_response_batches``)."""

    async def read(partition: int, offset: int, max_records: int) -> tuple[int, int]:
        n = nbytes = 0
        request = pb.ReadRequest(
            table=ref, partition=partition, offset=offset, max_records=max_records, raw_hot=True
        )
        async for msg in stub.Read(request, metadata=metadata):
            for b in read_response_batches(msg, partition):
                n += b.num_rows
                nbytes += b.nbytes
        return n, nbytes

    return read


class FlightReader:
    """Stream reads and scans of one table over the gateway's Arrow Flight edge, with
    pyarrow's Flight client (blocking calls, run on worker threads)."""

    def __init__(self, flight_port: int, ref: Any, metadata: Any) -> None:
        import pyarrow.flight as fl

        self._fl = fl
        self.client = fl.connect(f"grpc+tcp://127.0.0.1:{flight_port}")
        self.options = fl.FlightCallOptions(headers=[(k.encode(), v.encode()) for k, v in metadata])
        self.where = {"namespace": ref.namespace, "name": ref.name}

    def _get(self, command: dict[str, Any]) -> pa.Table:
        ticket = self._fl.Ticket(json.dumps(command).encode())
        return self.client.do_get(ticket, self.options).read_all()

    async def read(self, partition: int, offset: int, max_records: int) -> tuple[int, int]:
        command = {
            "read": {
                **self.where,
                "partition": partition,
                "offset": offset,
                "max_records": max_records,
            }
        }
        table = await asyncio.to_thread(self._get, command)
        return table.num_rows, table.nbytes

    async def scan(self, r: int, call: int) -> tuple[int, int]:
        table = await asyncio.to_thread(self._get, {"scan": dict(self.where)})
        return table.num_rows, table.nbytes

    def close(self) -> None:
        self.client.close()


async def read_via_gateway(w: Workload, grpc_target: str, metadata: Any = None) -> Result:
    """Stream reads of one hot partition from offset 0 to its end, by ``w.producers``
    concurrent readers in a closed loop; latency is per Read call of ``read_chunk`` records."""
    result = Result(w.name, f"tidegate ({w.hot} hot tier)")
    async with grpc.aio.insecure_channel(grpc_target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        ref = await create_table(stub, "reads", 1, metadata)
        total = await fill_workload(stub, ref, metadata, w)
        read = gateway_reader(stub, ref, metadata)

        async def read_chunk(offset: int) -> tuple[int, int]:
            return await read(0, offset, w.read_chunk)  # type: ignore[no-any-return]

        await _closed_reads(w, result, total, read_chunk)
        # The disk gateway runs its embedded tiering schedule: records it tiered during
        # the run were read from Iceberg, not from the hot tier. Say how many.
        info = await stub.DescribeTable(pb.DescribeTableRequest(table=ref), metadata=metadata)
        tiered = min(p.tiered_watermark for p in info.partition_info)
        if tiered:
            result.extra["tiered_share"] = min(1.0, tiered / max(1, total))
        await drop_table(stub, ref, metadata)
    return result


async def read_via_flight(
    w: Workload, grpc_target: str, flight_port: int, metadata: Any = None
) -> Result:
    """:func:`read_via_gateway`'s reads over the gateway's Flight edge (``DoGet`` of a
    stream read, as the SDK reads ranges): Arrow's C++ client receives the batches with
    their system columns."""
    result = Result(w.name, f"tidegate Flight ({w.hot} hot tier)")
    async with grpc.aio.insecure_channel(grpc_target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        ref = await create_table(stub, "freads", 1, metadata)
        total = await fill_workload(stub, ref, metadata, w)
        flight = FlightReader(flight_port, ref, metadata or [])

        async def read_chunk(offset: int) -> tuple[int, int]:
            return await flight.read(0, offset, w.read_chunk)

        try:
            await _closed_reads(w, result, total, read_chunk)
        finally:
            flight.close()
        await drop_table(stub, ref, metadata)
    return result


async def read_via_redis(w: Workload, redis_url: str) -> Result:
    """Baseline: XRANGE of the same Arrow blobs from a Redis stream, decoded with pyarrow."""
    result = Result(w.name, "redis-py XRANGE (baseline)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    client = aioredis.from_url(redis_url)
    key = f"bench:{uuid.uuid4().hex[:8]}:reads"
    batches = max(1, w.read_records // w.batch_records)
    per_entry = w.batch_records
    try:
        for i in range(batches):
            await client.xadd(key, {"d": factory.ipc(i)}, id=f"{i * per_entry}-1")
        total = batches * per_entry

        async def read_chunk(offset: int) -> tuple[int, int]:
            first = (offset // per_entry) * per_entry
            count = -(-w.read_chunk // per_entry)
            entries = await client.xrange(key, min=f"{first}-1", count=count)
            n = nbytes = 0
            for _, fields in entries:
                for b in pa.ipc.open_stream(pa.py_buffer(fields[b"d"])):
                    n += b.num_rows
                    nbytes += b.nbytes
            return n, nbytes

        await _closed_reads(w, result, total, read_chunk)
    finally:
        await client.delete(key)
        await client.aclose()
    return result


async def _closed_reads(w: Workload, result: Result, total: int, read_chunk: Any) -> None:
    """``w.producers`` readers each scan [0, total) repeatedly in ``read_chunk`` calls,
    each starting at its own share of the range."""

    async def op(r: int, call: int) -> tuple[int, int]:
        first = (r * total // max(1, w.producers)) // w.read_chunk * w.read_chunk
        return await read_chunk((first + call * w.read_chunk) % total)  # type: ignore[no-any-return]

    await closed_loop(w, result, op)
