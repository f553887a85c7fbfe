"""The workload of a fault run: operations that record every request and its outcome.

Each operation kind is a class registered in :data:`OPERATIONS`; the runner starts the
mix it is given, one thread each. Records carry a unique id (``rid``) so the checker can
follow every one of them. New subsystems add kinds here (a compaction job, a shard move,
the Spark writer as a producer): one class each, recording into the same history.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from gateway.client import Client, ExponentialBackoff, Retry
from gateway.wire.errors import (
    InvalidIdempotentAppend,
    InvalidRequest,
    OutOfOrderSequence,
    SchemaMismatch,
    Throttled,
    TidegateError,
)
from tests.faults.cluster import Cluster
from tests.faults.history import History
from tests.services import connect, connect_async

SCHEMA = {"rid": "string", "n": "int64"}
#: Per tenant of the cluster: (table, partitions).
TABLES = [("fa.events", 3), ("fb.events", 2)]


class Refused(Exception):
    """An HTTP answer that says for sure that nothing was stored (400, 409, 422, 429)."""


#: Errors that say for sure that nothing was stored.
DEFINITE = (SchemaMismatch, InvalidRequest, OutOfOrderSequence, Throttled, Refused)


@dataclass
class Context:
    cluster: Cluster
    history: History
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    errors: list[str] = field(default_factory=list)
    #: Extra seconds each producer waits between sends (the soak's bounded rate).
    pace: float = 0.0
    #: Seconds between scans, and whether a scan's records go into the history (the
    #: soak keeps only their count).
    scan_every: tuple[float, float] = (0.3, 1.2)
    record_scans: bool = True

    def rid(self, who: str) -> str:
        return f"{who}-{next(self.ids)}"


class Backlog:
    """A producer's sends not yet answered, bounded as an application bounds its buffer:
    on a loaded machine the gateways acknowledge slower than the workload sends, and an
    unbounded backlog would take minutes to drain at the end."""

    LIMIT = 200

    def __init__(self) -> None:
        self._pending = 0
        self._lock = threading.Lock()

    def add(self, fut: Any) -> None:
        with self._lock:
            self._pending += 1
        fut.add_done_callback(self._done)

    def _done(self, _: Any) -> None:
        with self._lock:
            self._pending -= 1

    def full(self) -> bool:
        return self._pending >= self.LIMIT


class Operation:
    """One client of the workload, run on its own thread until the context stops."""

    kind: ClassVar[str]

    def __init__(self, ctx: Context, index: int) -> None:
        self.ctx = ctx
        self.index = index
        self.name = f"{self.kind}{index}"
        self.rng = random.Random(f"{ctx.seed}-{self.name}")
        self.tenant_index = index % len(TABLES)
        self.table, self.partitions = TABLES[self.tenant_index]
        self.api_key = ctx.cluster.tenants[self.tenant_index][1]
        self.front = ctx.cluster.fronts[index % len(ctx.cluster.fronts)]
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.backlog = Backlog()

    def client(self, timeout: float = 5) -> Client:
        """A gRPC client through this operation's proxies. Every other operation scans and
        reads over the gateway's Flight edge (through its proxy), the rest over gRPC."""
        return connect(self.front.grpc_target, **self.client_options(timeout))

    def client_options(self, timeout: float = 5) -> dict[str, Any]:
        flight = self.front.flight_location if self.index % 2 == 0 else False
        return {
            "api_key": self.api_key,
            "timeout": timeout,
            "connect_timeout": 30,
            "flight": flight,
        }

    def record(self, type: str, **fields: Any) -> None:
        self.ctx.history.record(type, self.name, table=self.table, **fields)

    def _main(self) -> None:
        while not self.ctx.stop.is_set():
            try:
                self.run()
                return
            except TidegateError as err:
                # The gateway was out of reach where the client does not retry (opening a
                # producer, a first connection): start over, as a restarted client would.
                self.ctx.history.record("restart", self.name, error=repr(err)[:200])
                time.sleep(0.5)
            except Exception as exc:  # an operation's own bug: the run fails on it
                self.ctx.errors.append(f"{self.name}: {exc!r}")
                return

    def run(self) -> None:
        raise NotImplementedError

    def finish(self, timeout: float) -> None:
        self.thread.join(timeout)


OPERATIONS: dict[str, type[Operation]] = {}


def operation(cls: type[Operation]) -> type[Operation]:
    OPERATIONS[cls.kind] = cls
    return cls


def rows_of(t: Any, *names: str) -> list[list[Any]]:
    """``t``'s ``names`` columns as one list per row (what the history stores)."""
    return [list(r) for r in zip(*(t.column(n).to_pylist() for n in names), strict=True)]


#: What the gateway answers a sequence older than its de-duplication window with: not a
#: refusal that says nothing was stored (docs/durability.md lists those); an earlier
#: attempt of the batch may have been stored, e.g. after Redis lost the producer's state
#: and a later sequence of the producer arrived first.
#: The same for a producer the gateway no longer knows (``UNKNOWN_PRODUCER_ID``: Redis lost
#: its state): this attempt stored nothing, an earlier one may have.
MAYBE_STORED = ("INVALID_IDEMPOTENT_APPEND", "UNKNOWN_PRODUCER_ID")


def maybe_stored(error: str) -> bool:
    """Whether a recorded error (its text or repr) is one of :data:`MAYBE_STORED`."""
    names = ("InvalidIdempotentAppend", "UnknownProducer", *MAYBE_STORED)
    return any(n in error for n in names)


def outcome_of(err: BaseException) -> str:
    if isinstance(err, InvalidIdempotentAppend) or maybe_stored(str(err)):
        return "unknown"
    return "refused" if isinstance(err, DEFINITE) else "unknown"


class _KeyedAppender(Operation):
    """Batches of 1-5 records with an explicit idempotence key ``(producer, partition,
    sequence)``: a failed request is retried with the same key a few times, then the
    producer starts afresh under a new id (as a restarted client would)."""

    def send(
        self, rows: list[dict[str, Any]], partition: int, pid: str, seq: int
    ) -> list[list[int]]:
        raise NotImplementedError

    def run(self) -> None:
        pid, seqs = f"{self.name}-{uuid.uuid4().hex[:6]}", [0] * self.partitions
        while not self.ctx.stop.is_set():
            p = self.rng.randrange(self.partitions)
            if self.rng.random() < 0.03:  # a bad batch: must be refused, never stored
                bad = [{"rid": self.ctx.rid(self.name), "n": "not a number"}]
                self._attempt(bad, p, None, None)
                continue
            rows = [
                {"rid": self.ctx.rid(self.name), "n": self.rng.randrange(10**6)}
                for _ in range(self.rng.randint(1, 5))
            ]
            for attempt in range(4):
                outcome = self._attempt(rows, p, pid, seqs[p])
                if outcome == "ok":
                    seqs[p] += 1
                    break
                if outcome == "refused" or self.ctx.stop.is_set():
                    attempt = 3
                if attempt == 3:
                    pid, seqs = f"{self.name}-{uuid.uuid4().hex[:6]}", [0] * self.partitions
                    break
                time.sleep(0.2 * (attempt + 1))
            time.sleep(self.rng.uniform(0, 0.02) + self.ctx.pace)

    def _attempt(self, rows: list[dict[str, Any]], p: int, pid: str | None, seq: int | None) -> str:
        key = f"{pid}/{p}/{seq}" if pid else None
        rids = [r["rid"] for r in rows]
        started = time.monotonic()
        try:
            at = self.send(rows, p, pid or "", -1 if seq is None else seq)
        except Exception as err:
            outcome = outcome_of(err)
            self.record(
                "append", key=key, rids=rids, outcome=outcome, error=repr(err)[:200], atomic=True
            )
            return outcome
        took = round(time.monotonic() - started, 4)
        self.record("append", key=key, rids=rids, outcome="ok", at=at, took=took, atomic=True)
        return "ok"


@operation
class GrpcAppender(_KeyedAppender):
    """Unary gRPC appends through the SDK's client (no SDK retry: the operation retries)."""

    kind = "grpc"

    def run(self) -> None:
        with self.client() as self.grpc:
            super().run()

    def send(
        self, rows: list[dict[str, Any]], partition: int, pid: str, seq: int
    ) -> list[list[int]]:
        ranges = self.grpc.append(
            self.table,
            rows,
            partition=partition,
            producer_id=pid or None,
            sequence=None if seq < 0 else seq,
        )
        return [[r.partition, r.base_offset + i] for r in ranges for i in range(r.count)]


@operation
class HttpAppender(_KeyedAppender):
    """JSON appends over HTTP with ``producer_id`` and ``sequence``."""

    kind = "http"

    def run(self) -> None:
        headers = {"authorization": f"Bearer {self.api_key}"}
        with httpx.Client(base_url=self.front.http_url, headers=headers, timeout=5) as self.http:
            super().run()

    def send(
        self, rows: list[dict[str, Any]], partition: int, pid: str, seq: int
    ) -> list[list[int]]:
        ns, name = self.table.split(".")
        body: dict[str, Any] = {"rows": rows, "partition": partition}
        if pid:
            body.update(producer_id=pid, sequence=seq)
        resp = self.http.post(f"/v1/tables/{ns}/{name}/records", json=body)
        if resp.status_code in (400, 409, 422, 429):
            raise Refused(f"HTTP {resp.status_code}: {resp.text[:150]}")
        resp.raise_for_status()  # 5xx: unknown
        return [
            [r["partition"], r["base_offset"] + i]
            for r in resp.json()["ranges"]
            for i in range(r["count"])
        ]


def _producer_config() -> dict[str, Any]:
    return {
        "linger": 0.01,
        "batch_records": 20,
        "compression": "lz4",
        "max_in_flight": 3,
        "retry": Retry(ExponentialBackoff(base=0.05, cap=0.5), timeout=25),
    }


def _record_delivery(op: Operation, pid: str | None, rids: list[str], fut: Any) -> None:
    err = fut.exception()
    if err is not None:
        op.record("append", key=pid, rids=rids, outcome=outcome_of(err), error=repr(err)[:200])
        return
    mds = fut.result()
    mds = mds if isinstance(mds, list) else [mds]
    op.record("append", key=pid, rids=rids, outcome="ok", at=[[m.partition, m.offset] for m in mds])


@operation
class SdkProducer(Operation):
    """The SDK's sync idempotent producer (batching, in-flight pipelining, retries)."""

    kind = "producer"

    def run(self) -> None:
        with (
            self.client() as c,
            c.producer(self.table, **_producer_config()) as p,
        ):
            while not self.ctx.stop.is_set():
                if self.backlog.full():
                    time.sleep(0.02)
                    continue
                rows = [
                    {"rid": self.ctx.rid(self.name), "n": i} for i in range(self.rng.randint(1, 4))
                ]
                rids = [r["rid"] for r in rows]
                try:
                    fut = p.send(rows)
                except TidegateError as err:
                    self.record(
                        "append",
                        key=p.producer_id,
                        rids=rids,
                        outcome="refused",
                        error=repr(err)[:200],
                    )
                    continue
                self.backlog.add(fut)
                fut.add_done_callback(
                    lambda f, r=rids, pid=p.producer_id: _record_delivery(self, pid, r, f)
                )
                time.sleep(self.rng.uniform(0, 0.02) + self.ctx.pace)
            with contextlib.suppress(TidegateError):
                # A gateway down for a while (a power cut: its restart takes seconds on
                # a loaded machine) leaves a backlog to drain.
                p.flush(120)


@operation
class AsyncProducer(Operation):
    """The SDK's asyncio idempotent producer, on a loop of its own."""

    kind = "aioproducer"

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        async with connect_async(self.front.grpc_target, **self.client_options()) as c:
            p = c.producer(self.table, **_producer_config())
            async with p:
                while not self.ctx.stop.is_set():
                    if self.backlog.full():
                        await asyncio.sleep(0.02)
                        continue
                    rows = [
                        {"rid": self.ctx.rid(self.name), "n": i}
                        for i in range(self.rng.randint(1, 4))
                    ]
                    rids = [r["rid"] for r in rows]
                    fut = await p.send(rows)
                    self.backlog.add(fut)
                    fut.add_done_callback(
                        lambda f, r=rids, pid=p.producer_id: _record_delivery(self, pid, r, f)
                    )
                    await asyncio.sleep(self.rng.uniform(0, 0.02) + self.ctx.pace)


@operation
class Follower(Operation):
    """A follow stream per partition in turn, resumed from the next offset after errors."""

    kind = "follower"

    def run(self) -> None:
        nxt = [0] * self.partitions
        with self.client() as c:
            while not self.ctx.stop.is_set():
                p = self.rng.randrange(self.partitions)
                try:
                    for batches, next_offset, _ in c.read_batches(
                        self.table,
                        partition=p,
                        offset=nxt[p],
                        max_records=300,
                        follow=True,
                        timeout=1.5,
                    ):
                        recs = [r for b in batches for r in rows_of(b, "_offset", "rid")]
                        if recs:
                            self.record("read", partition=p, **{"from": nxt[p]}, records=recs)
                        nxt[p] = max(nxt[p], next_offset)
                        if self.ctx.stop.is_set():
                            break
                except TidegateError:
                    time.sleep(0.1)


@operation
class Scanner(Operation):
    """Table scans (cold snapshot plus hot tail) now and then."""

    kind = "scanner"

    def run(self) -> None:
        with self.client(timeout=10) as c:
            while not self.ctx.stop.wait(self.rng.uniform(*self.ctx.scan_every)):
                try:
                    t = c.scan(self.table, columns=["rid", "_partition", "_offset"])
                except TidegateError:
                    continue
                recs = rows_of(t, "_partition", "_offset", "rid")
                if self.ctx.record_scans:
                    self.record("scan", records=recs)
                else:
                    self.record("scan", records=[], count=len(recs))


@operation
class GroupConsumer(Operation):
    """A consumer group member: read from the committed offset, commit, fetch the offsets
    back (they must never go backwards)."""

    kind = "group"

    def run(self) -> None:
        group = f"g-{self.name}"
        with self.client() as c:
            while not self.ctx.stop.wait(self.rng.uniform(0.05, 0.3)):
                p = self.rng.randrange(self.partitions)
                try:
                    committed = c.fetch_offsets(group, self.table)
                    self.record(
                        "fetch_offsets",
                        group=group,
                        offsets={str(k): v for k, v in committed.items()},
                    )
                    start = committed.get(p, 0)
                    t = c.read(self.table, partition=p, offset=start, max_records=200)
                    if t.num_rows == 0:
                        continue
                    recs = rows_of(t, "_offset", "rid")
                    self.record("read", partition=p, **{"from": start}, records=recs)
                    c.commit_offsets(group, self.table, {p: recs[-1][0] + 1})
                    self.record("commit", group=group, offsets={str(p): recs[-1][0] + 1})
                except TidegateError:
                    time.sleep(0.1)


@operation
class SparkWriter(Operation):
    """``df.write.format("tidegate")`` of small DataFrames (the Python Data Source, through
    a gRPC proxy) while the nemesis works: a write that fails is run again under the same
    ``write_id`` (its tasks' idempotent producers then re-send the same sequences), up to
    four times; a write that returns acknowledges every row of it. Needs the run's
    SparkSession (``--spark``)."""

    kind = "spark"

    def run(self) -> None:
        import gateway.spark

        spark = self.ctx.cluster.spark
        assert spark is not None, "the spark writer needs the run's SparkSession"
        gateway.spark.register(spark)
        while not self.ctx.stop.is_set():
            rows = [
                (self.ctx.rid(self.name), self.rng.randrange(10**6))
                for _ in range(self.rng.randint(10, 200))
            ]
            rids = [r[0] for r in rows]
            frame = spark.createDataFrame(rows, "rid string, n long").repartition(2)
            write_id = f"{self.name}-{uuid.uuid4().hex[:8]}"
            for attempt in range(4):
                try:
                    (
                        frame.write.format("tidegate")
                        .option("endpoint", self.front.http_url)
                        .option("api_key", self.api_key)
                        .option("write_id", write_id)
                        .option("batch_rows", 25)
                        .mode("append")
                        .save(self.table)
                    )
                except Exception as err:  # Spark wraps the task's error: the outcome is unknown
                    if attempt < 3 and not self.ctx.stop.is_set():
                        time.sleep(0.5 * (attempt + 1))
                        continue
                    self.record(
                        "append", key=write_id, rids=rids, outcome="unknown", error=repr(err)[:200]
                    )
                    break
                self.record("append", key=write_id, rids=rids, outcome="ok", at=None)
                break
            time.sleep(self.rng.uniform(0.2, 1.0))


#: The default mix: every kind, two producers of each flavour across both tenants.
DEFAULT_MIX: list[tuple[str, int]] = [
    ("grpc", 2),
    ("http", 2),
    ("producer", 2),
    ("aioproducer", 2),
    ("follower", 2),
    ("scanner", 2),
    ("group", 2),
]


#: What a run with a SparkSession adds to its mix: one Spark writer per tenant.
SPARK_MIX: list[tuple[str, int]] = [("spark", 2)]


def start_operations(ctx: Context, mix: list[tuple[str, int]]) -> list[Operation]:
    ops = [OPERATIONS[kind](ctx, i) for kind, n in mix for i in range(n)]
    for op in ops:
        op.thread.start()
    return ops
