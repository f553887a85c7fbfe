"""Scenarios: the system under test and its baseline, measured the same way, in one run."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pyarrow as pa
import redis.asyncio as aioredis

from benchmarks.loadgen import BatchFactory, Result, Workload, drive, follow_e2e
from gateway._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

_CHANNEL_OPTIONS = [
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
    """Appends through the gateway's gRPC API; following readers measure end to end."""
    result = Result(w.name, f"tidegate ({w.hot} hot tier)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    async with grpc.aio.insecure_channel(grpc_target, options=_CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        ns = f"bench{uuid.uuid4().hex[:8]}"
        ref = pb.TableRef(namespace=ns, name=w.name.replace("-", "_"))
        fields = [
            pb.Field(name=f.name, type=str(f.type), nullable=f.nullable) for f in factory.schema
        ]
        await stub.CreateTable(
            pb.CreateTableRequest(table=ref, fields=fields, partitions=w.partitions),
            metadata=metadata,
        )

        async def send(p: int, sent_ns: int) -> None:
            await stub.Append(
                pb.AppendRequest(
                    table=ref, arrow_ipc=factory.ipc(sent_ns), partition=p % w.partitions
                ),
                metadata=metadata,
            )

        stop = asyncio.Event()
        measure_from_wall = time.time_ns() + int(w.warmup_s * 1e9)

        def reader(p: int) -> Any:
            async def stream() -> AsyncIterator[list[int]]:
                call = stub.Read(
                    pb.ReadRequest(table=ref, partition=p, offset=0, follow=True), metadata=metadata
                )
                async for msg in call:
                    yield _sent_ns(msg.arrow_ipc)

            return stream

        followers = (
            [
                asyncio.create_task(follow_e2e(result, measure_from_wall, reader(p), stop))
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
    return result


async def append_via_redis(w: Workload, redis_url: str) -> Result:
    """Baseline: redis-py XADD of the same Arrow IPC blobs, one stream per partition, with
    the same producers, schedule and in-flight bound; XREAD followers for end to end."""
    result = Result(w.name, "redis-py XADD (baseline)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    client = aioredis.from_url(
        redis_url, max_connections=w.producers * w.inflight + w.partitions + 4
    )
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}:{p}" for p in range(w.partitions)]
    try:

        async def send(p: int, sent_ns: int) -> None:
            await client.xadd(keys[p % w.partitions], {"d": factory.ipc(sent_ns)})

        stop = asyncio.Event()
        measure_from_wall = time.time_ns() + int(w.warmup_s * 1e9)

        def reader(p: int) -> Any:
            async def stream() -> AsyncIterator[list[int]]:
                last = "0-0"
                while True:
                    got = await client.xread({keys[p]: last}, block=200, count=100)
                    for _, entries in got or []:
                        for entry_id, fields in entries:
                            last = entry_id
                            yield _sent_ns(fields[b"d"])

            return stream

        followers = (
            [
                asyncio.create_task(follow_e2e(result, measure_from_wall, reader(p), stop))
                for p in range(w.partitions)
            ]
            if w.consumers
            else []
        )
        await drive(w, result, send, w.batch_records, w.batch_bytes)
        await asyncio.sleep(0.5)
        stop.set()
        for f in followers:
            f.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
    finally:
        await client.delete(*keys)
        await client.aclose()
    return result
