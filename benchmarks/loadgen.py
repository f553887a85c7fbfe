"""Asyncio load generator in the manner of the OpenMessaging Benchmark.

Producers send on an *open-loop* schedule: request ``i`` of a producer is due at
``start + i / rate``. Latency is measured from that intended time, not from when the request
actually left, so a stall in the system under test shows up in the percentiles instead of
silently slowing the generator down (no coordinated omission). A target rate of 0 means
closed loop: every producer keeps ``inflight`` requests outstanding, which measures capacity.

End-to-end latency: every batch carries its intended send time (``sent_ns``); following
readers record ``receive time - sent_ns`` per record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from hdrh.histogram import HdrHistogram

#: Latencies are recorded in microseconds, up to 60 s, 3 significant digits.
_LOWEST_US, _HIGHEST_US, _DIGITS = 1, 60_000_000, 3


def histogram() -> HdrHistogram:
    return HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)


@dataclass(frozen=True)
class Workload:
    """One scenario's load, read from a YAML file (see benchmarks/workloads/)."""

    name: str
    description: str = ""
    hot: str = "disk"
    tenants: int = 1
    partitions: int = 4
    record_bytes: int = 100
    batch_records: int = 100
    producers: int = 4
    #: Batches per second over all producers; 0 = closed loop (capacity).
    target_batches_per_s: float = 0
    #: Outstanding requests per producer (closed loop), or at most (open loop).
    inflight: int = 4
    consumers: bool = True
    #: Which scenario runs the load: a key of ``benchmarks.__main__.SCENARIOS``.
    kind: str = "append"
    #: Records pre-filled for read workloads (the tiering backlog for ``tiering``), and
    #: records per Read call.
    read_records: int = 200_000
    read_chunk: int = 10_000
    #: Table sizes (records) of the spark-read scenario, each a table of its own in one
    #: run; empty: ``read_records`` alone.
    read_sizes: tuple[int, ...] = ()
    #: Records appended after tiering, so that reads cross the cold/hot boundary.
    hot_records: int = 50_000
    #: Table sizes, in data files, of the read-cost scenario, and records per data file.
    files: tuple[int, ...] = (10, 100, 1000)
    records_per_file: int = 1000
    #: Period of the tiering job of the freshness scenario.
    tier_every_s: float = 1.0
    #: Noisy neighbour: each tenant's append quota, and the noisy tenant's offered load
    #: as a multiple of it (the quiet tenant sends ``quiet_fraction`` of its quota).
    quota_bytes_per_s: int = 4_000_000
    noisy_factor: float = 5.0
    quiet_fraction: float = 0.5
    #: Several multiples measured in one run (``noisy_factor`` alone when empty), each
    #: ``repeats`` times (the rows give the median run and the spread).
    noisy_factors: tuple[float, ...] = ()
    repeats: int = 1
    #: Shards: un-tiered backlogs (MB) of the moved partitions, and the period of moves
    #: during the append-latency run.
    backlog_mb: tuple[int, ...] = (10, 500)
    move_every_s: float = 0.25
    #: Primary-key tables: distinct keys, and versions written of each (one pass each).
    keys: int = 10_000
    versions: int = 10
    #: Point lookups of one key measured (and a sixth as many of 100 keys).
    lookups: int = 300
    #: Consumer groups: the members' session timeout (what notices a dead member).
    session_timeout_s: float = 3.0
    duration_s: float = 10.0
    warmup_s: float = 2.0
    #: Longest the scenario may take (0: three times warm-up and duration, plus 240 s).
    timeout_s: float = 0.0
    quick: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, mode: str = "full") -> Workload:
        doc = yaml.safe_load(path.read_text())
        overrides = doc.pop(mode, {}) if mode in ("quick", "smoke") else {}
        doc.pop("quick", None)
        doc.pop("smoke", None)
        doc.update(overrides)
        for key in ("files", "backlog_mb", "read_sizes", "noisy_factors"):
            if key in doc:
                doc[key] = tuple(doc[key])
        return cls(**doc)

    @property
    def batch_bytes(self) -> int:
        return self.record_bytes * self.batch_records


def record_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("sent_ns", pa.int64(), nullable=False),
            pa.field("payload", pa.binary(), nullable=False),
        ]
    )


class BatchFactory:
    """Arrow batches of ``n`` records of ~``record_bytes`` each; only the id and send-time
    columns change between batches, so building one costs almost nothing."""

    def __init__(self, records: int, record_bytes: int) -> None:
        self.records = records
        body = max(1, record_bytes - 16)
        self._payload = pa.array([b"x" * body] * records, pa.binary())
        self._ids = itertools.count()
        self.schema = record_schema()

    def batch(self, sent_ns: int) -> pa.RecordBatch:
        start = next(self._ids) * self.records
        return pa.RecordBatch.from_arrays(
            [
                pa.array(range(start, start + self.records), pa.int64()),
                pa.array([sent_ns] * self.records, pa.int64()),
                self._payload,
            ],
            schema=self.schema,
        )

    def ipc(self, sent_ns: int) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema) as w:
            w.write_batch(self.batch(sent_ns))
        return bytes(sink.getvalue().to_pybytes())


@dataclass
class Result:
    """What one run measured (during the measurement window only)."""

    name: str
    system: str
    batches: int = 0
    records: int = 0
    bytes: int = 0
    errors: int = 0
    seconds: float = 0.0
    ack: HdrHistogram = field(default_factory=histogram)
    e2e: HdrHistogram = field(default_factory=histogram)
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def _pcts(h: HdrHistogram) -> dict[str, float] | None:
        if h.get_total_count() == 0:
            return None
        return {
            "p50_ms": h.get_value_at_percentile(50) / 1000,
            "p99_ms": h.get_value_at_percentile(99) / 1000,
            "p999_ms": h.get_value_at_percentile(99.9) / 1000,
            "max_ms": h.get_max_value() / 1000,
            "count": h.get_total_count(),
        }

    def summary(self) -> dict[str, Any]:
        secs = self.seconds or 1.0
        return {
            "name": self.name,
            "system": self.system,
            "records_per_s": self.records / secs,
            "mb_per_s": self.bytes / secs / 1e6,
            "batches_per_s": self.batches / secs,
            "errors": self.errors,
            "seconds": self.seconds,
            "ack_latency": self._pcts(self.ack),
            "e2e_latency": self._pcts(self.e2e),
            **self.extra,
        }


SendFn = Callable[[int, int], Awaitable[None]]
"""``send(producer_index, sent_ns)``: one append, returns when acknowledged."""


async def drive(
    workload: Workload, result: Result, send: SendFn, batch_records: int, batch_bytes: int
) -> None:
    """Run the producers of ``workload`` against ``send`` and record into ``result``."""
    loop_start = time.monotonic_ns()
    measure_from = loop_start + int(workload.warmup_s * 1e9)
    stop_at = measure_from + int(workload.duration_s * 1e9)
    closed = workload.target_batches_per_s <= 0
    interval_ns = 0 if closed else int(1e9 * workload.producers / workload.target_batches_per_s)

    async def one(p: int, intended_ns: int) -> None:
        try:
            await send(p, time.time_ns() - (time.monotonic_ns() - intended_ns))
        except Exception:
            if intended_ns >= measure_from:
                result.errors += 1
            return
        done = time.monotonic_ns()
        if measure_from <= intended_ns < stop_at:
            result.batches += 1
            result.records += batch_records
            result.bytes += batch_bytes
            result.ack.record_value(max(1, (done - intended_ns) // 1000))

    async def producer(p: int) -> None:
        slots = asyncio.Semaphore(workload.inflight)
        tasks: set[asyncio.Task[None]] = set()
        i = 0
        while True:
            if closed:
                await slots.acquire()
                intended = time.monotonic_ns()
            else:
                intended = loop_start + (p * interval_ns) // workload.producers + i * interval_ns
                delay = (intended - time.monotonic_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                # Over the in-flight bound we wait here; the wait counts in the latency.
                await slots.acquire()
            if intended >= stop_at:
                slots.release()
                break
            task = asyncio.create_task(one(p, intended))
            tasks.add(task)
            task.add_done_callback(lambda t: (tasks.discard(t), slots.release()))
            i += 1
        if tasks:
            await asyncio.gather(*tasks)

    await asyncio.gather(*(producer(p) for p in range(workload.producers)))
    result.seconds = workload.duration_s


async def follow_e2e(
    result: Result, measure_from_wall_ns: int, stream: Callable[[], Any], stop: asyncio.Event
) -> None:
    """Record end-to-end latency of every record a following reader receives."""
    with contextlib.suppress(asyncio.CancelledError):
        async for sent_ns_list in stream():
            if stop.is_set():
                return
            now = time.time_ns()
            for sent in sent_ns_list:
                if sent >= measure_from_wall_ns:
                    result.e2e.record_value(max(1, (now - sent) // 1000))
            if stop.is_set():
                return


Op = Callable[[int, int], Awaitable[tuple[int, int]]]
"""``op(worker, call)``: one operation of a closed loop; returns (records, bytes) done."""


async def closed_loop(w: Workload, result: Result, op: Op, workers: int | None = None) -> None:
    """``workers`` (default ``w.producers``) callers repeat ``op`` back to back until the
    window ends; each call's latency and size is recorded once the warm-up is over. This
    measures capacity (and the latency at capacity), which is what read and scan
    workloads compare with their baselines."""
    start = time.monotonic()
    measure_from = start + w.warmup_s
    stop_at = measure_from + w.duration_s

    last_end = stop_at

    async def worker(r: int) -> None:
        nonlocal last_end
        call = 0
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                n, nbytes = await op(r, call)
            except Exception:
                if t0 >= measure_from:
                    result.errors += 1
                call += 1
                continue
            call += 1
            if t0 >= measure_from:
                result.batches += 1
                result.records += n
                result.bytes += nbytes
                end = time.monotonic()
                result.ack.record_value(max(1, int((end - t0) * 1e6)))
                last_end = max(last_end, end)

    await asyncio.gather(*(worker(r) for r in range(workers or w.producers)))
    # Calls that started inside the window and ended after it are counted whole: so is
    # the time they took (this matters for slow calls such as whole-table scans).
    result.seconds = last_end - measure_from
