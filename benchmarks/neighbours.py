"""Noisy neighbour: does tenant A, sending at several times its quota, slow tenant B down?

Both tenants get the same append quota on the Redis-backed gateway (shared buckets in
Redis, as in a multi-replica deployment). B sends open loop at a fraction of its quota,
first alone, then while A sends open loop at a multiple of its own quota and ignores every
throttle (the worst client: the SDK would back off). B's acknowledgement latency beside A
is compared with B alone; A's accepted rate shows the quota holding.

Each multiple in ``noisy_factors`` is measured ``repeats`` times (B alone, then B beside
A, in each run): the rows are those of the median run by B's p99 ratio, with the ratio's
spread over the runs. A runs in a process of its own, so that its client's work (building
and sending hundreds of appends a second) does not delay B's client; the gateway's CPU in
each phase is read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
from dataclasses import asdict, replace
from typing import Any

import grpc

from benchmarks.harness import Bench
from benchmarks.loadgen import BatchFactory, Result, Workload, drive
from benchmarks.scenarios import CHANNEL_OPTIONS, create_table, drop_table
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc


async def _producer(
    target: str, w: Workload, result: Result, api_key: str, ready: Any = None
) -> None:
    md = (("authorization", f"Bearer {api_key}"),)
    factory = BatchFactory(w.batch_records, w.record_bytes)
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.TidegateStub(channel)
        ref = await create_table(stub, w.name, w.partitions, md)
        if ready is not None:
            ready.put("ready")

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


def _noisy(target: str, fields: dict[str, Any], api_key: str, system: str, out: Any) -> None:
    """Tenant A's producer, in a process of its own: says "ready" on ``out`` once its
    table exists, then sends, then puts its summary."""
    w = Workload(**fields)
    result = Result(w.name, system)
    asyncio.run(_producer(target, w, result, api_key, out))
    out.put(result.summary())


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cpu:
    """The gateway's CPU use over a block, as a share of one core."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.share = 0.0

    def __enter__(self) -> _Cpu:
        self._cpu, self._wall = _cpu_s(self.pid), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._wall
        self.share = (_cpu_s(self.pid) - self._cpu) / wall if wall > 0 else 0.0


def _p99(row: dict[str, Any]) -> float | None:
    return (row.get("ack_latency") or {}).get("p99_ms")


async def _one_run(
    b: Bench, w: Workload, factor: float, key_a: str, key_b: str
) -> tuple[dict[str, Any], ...]:
    gw = b.tiered
    pid = gw.proc.pid  # type: ignore[union-attr]
    quota = w.quota_bytes_per_s
    quiet = replace(w, target_batches_per_s=w.quiet_fraction * quota / w.batch_bytes)
    # A sends from before B starts until after B ends (its process starts slowly).
    noisy = replace(
        w,
        target_batches_per_s=factor * quota / w.batch_bytes,
        duration_s=w.warmup_s + w.duration_s + 2,
    )
    alone = Result(w.name, "tenant B alone (baseline)")
    with _Cpu(pid) as cpu_alone:
        await _producer(gw.grpc_target, quiet, alone, key_b)
    beside = Result(w.name, f"tenant B beside A at {factor:g}x its quota")
    system_a = f"tenant A at {factor:g}x its quota (throttled)"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(
        target=_noisy, args=(gw.grpc_target, asdict(noisy), key_a, system_a, out), daemon=True
    )
    proc.start()
    ready = await asyncio.to_thread(out.get, True, 300)
    assert ready == "ready", ready
    await asyncio.sleep(w.warmup_s)  # A at full rate before B starts
    with _Cpu(pid) as cpu_beside:
        await _producer(gw.grpc_target, quiet, beside, key_b)
        loud = await asyncio.to_thread(out.get, True, 600)
        await asyncio.to_thread(proc.join, 60)
    base, row = alone.summary(), beside.summary()
    base["gateway_cpu"] = cpu_alone.share
    row["gateway_cpu"] = cpu_beside.share
    p99_alone, p99_beside = _p99(base), _p99(row)
    row["p99_vs_alone"] = p99_beside / p99_alone if p99_alone and p99_beside else None
    loud["offered_mb_per_s"] = noisy.target_batches_per_s * w.batch_bytes / 1e6
    loud["quota_mb_per_s"] = quota / 1e6
    return base, row, loud


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    with b.tenants(b.tiered, 2, append_bytes_per_s=w.quota_bytes_per_s) as (key_a, key_b):
        for factor in w.noisy_factors or (w.noisy_factor,):
            runs = [await _one_run(b, w, factor, key_a, key_b) for _ in range(max(1, w.repeats))]
            measured = [r for r in runs if r[1]["p99_vs_alone"] is not None] or runs
            measured.sort(key=lambda r: r[1]["p99_vs_alone"] or 0.0)
            median = measured[len(measured) // 2]
            ratios = [r[1]["p99_vs_alone"] for r in measured if r[1]["p99_vs_alone"]]
            spread = {
                "runs": len(runs),
                "p99_ratio_median": statistics.median(ratios) if ratios else None,
                "p99_ratio_min": min(ratios) if ratios else None,
                "p99_ratio_max": max(ratios) if ratios else None,
                "p99_alone_ms": [_p99(r[0]) for r in runs],
                "p99_beside_ms": [_p99(r[1]) for r in runs],
                "load_avg_1m": load,
            }
            base, row, loud = (dict(x) for x in median)
            base["name"] = row["name"] = loud["name"] = f"{w.name}-{factor:g}x"
            row.update(spread)
            row["p99_vs_alone"] = spread["p99_ratio_median"]
            rows += [base, row, loud]
    return rows
