"""Noisy neighbour: does tenant A, sending at several times its quota, slow tenant B down?

Both tenants get the same append quota on the Redis-backed gateway (shared buckets in
Redis, as in a multi-replica deployment). B sends open loop at a fraction of its quota,
first alone, then while A sends open loop at ``noisy_factor`` times its own quota and
ignores every throttle (the worst client: the SDK would back off). B's acknowledgement
latency beside A is compared with B alone; A's accepted rate shows the quota holding.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from benchmarks.harness import Bench
from benchmarks.loadgen import BatchFactory, Result, Workload, drive
from benchmarks.scenarios import create_table, drop_table
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb


async def _producer(b: Bench, w: Workload, result: Result, api_key: str) -> None:
    gw = b.tiered
    md = b.auth(gw, api_key)
    factory = BatchFactory(w.batch_records, w.record_bytes)
    async with b.stub(gw) as stub:
        ref = await create_table(stub, w.name, w.partitions, md)

        async def send(p: int, sent_ns: int) -> None:
            await stub.Append(
                pb.AppendRequest(
                    table=ref, arrow_ipc=factory.ipc(sent_ns), partition=p % w.partitions
                ),
                metadata=md,
            )

        try:
            await drive(w, result, send, w.batch_records, w.batch_bytes)
        finally:
            await drop_table(stub, ref, md)


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    quota = w.quota_bytes_per_s
    quiet = replace(w, target_batches_per_s=w.quiet_fraction * quota / w.batch_bytes)
    noisy = replace(w, target_batches_per_s=w.noisy_factor * quota / w.batch_bytes)
    with b.tenants(b.tiered, 2, append_bytes_per_s=quota) as (key_a, key_b):
        alone = Result(w.name, "tenant B alone (baseline)")
        await _producer(b, quiet, alone, key_b)
        beside = Result(w.name, f"tenant B beside A at {w.noisy_factor:g}x its quota")
        loud = Result(w.name, f"tenant A at {w.noisy_factor:g}x its quota (throttled)")
        await asyncio.gather(_producer(b, quiet, beside, key_b), _producer(b, noisy, loud, key_a))
    base = alone.summary()
    row = beside.summary()
    p99_alone = (base["ack_latency"] or {}).get("p99_ms")
    p99_beside = (row["ack_latency"] or {}).get("p99_ms")
    row["p99_vs_alone"] = p99_beside / p99_alone if p99_alone and p99_beside else None
    a = loud.summary()
    a["offered_mb_per_s"] = noisy.target_batches_per_s * w.batch_bytes / 1e6
    a["quota_mb_per_s"] = quota / 1e6
    return [base, row, a]
