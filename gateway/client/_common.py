"""Pure helpers shared by the sync (:mod:`gateway.client._sync`) and asyncio
(:mod:`gateway.client.aio`) clients: no I/O here, so both flavours behave the same.

Imports only grpc, pyarrow, protobuf and the gateway's own pure modules (errors, routing,
schema): never the server, Spark, fastapi, sqlalchemy or redis.
"""

from __future__ import annotations

import datetime as dt
import random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias, cast

import grpc
import pyarrow as pa
from google.rpc import error_details_pb2, status_pb2

from gateway._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.client._rows import RowPlan, values_to_batch
from gateway.errors import (
    InvalidPartition,
    OffsetOutOfRange,
    RetryableError,
    SchemaMismatch,
    Throttled,
    TidegateError,
    Unavailable,
    error_for_reason,
)
from gateway.routing import partition_for_key, route_by_key
from gateway.schema import conform_batch, parse_fields

__all__ = [
    "AppendRange",
    "Backoff",
    "ConstantBackoff",
    "ExponentialBackoff",
    "RecordMetadata",
    "Retry",
    "TableInfo",
    "TableRef",
    "error_from_rpc",
]

MAX_MESSAGE = 128 * 1024 * 1024
Compression = Literal["zstd", "lz4", "none"]
#: Where a consumer starts in a partition without a committed offset.
StartAt = Literal["earliest", "latest"] | int | dt.datetime


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AppendRange:
    """Offsets assigned to one appended batch in one partition."""

    partition: int
    base_offset: int
    count: int
    duplicate: bool = False


class RecordMetadata(NamedTuple):
    """Where one produced record landed."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class TableRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, table: str | TableRef) -> TableRef:
        if isinstance(table, TableRef):
            return table
        namespace, sep, name = table.partition(".")
        if not sep:
            raise ValueError(f"name a table as 'namespace.name', got {table!r}")
        return cls(namespace, name)

    def pb(self) -> pb.TableRef:
        return pb.TableRef(namespace=self.namespace, name=self.name)

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What the producer and consumer need of a table (from ``DescribeTable``)."""

    ref: TableRef
    schema: pa.Schema
    partitions: int
    key_columns: tuple[str, ...]
    high_watermarks: tuple[int, ...] = ()
    earliest_offsets: tuple[int, ...] = ()

    @classmethod
    def from_pb(cls, info: pb.TableInfo) -> TableInfo:
        fields = [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields]
        parts = sorted(info.partition_info, key=lambda p: p.partition)
        return cls(
            ref=TableRef(info.table.namespace, info.table.name),
            schema=parse_fields(fields),
            partitions=info.partitions,
            key_columns=tuple(info.key_columns),
            high_watermarks=tuple(p.high_watermark for p in parts),
            earliest_offsets=tuple(p.earliest_offset for p in parts),
        )


def table_fields(schema: Mapping[str, str] | Sequence[Mapping[str, Any]]) -> list[pb.Field]:
    if isinstance(schema, Mapping):
        return [pb.Field(name=k, type=v, nullable=True) for k, v in schema.items()]
    return [
        pb.Field(name=f["name"], type=f["type"], nullable=f.get("nullable", True)) for f in schema
    ]


def ranges_from_pb(response: pb.AppendResponse) -> list[AppendRange]:
    return [AppendRange(r.partition, r.base_offset, r.count, r.duplicate) for r in response.ranges]


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
def build_error(
    reason: str, message: str, metadata: Mapping[str, str], retry_ms: int | None
) -> TidegateError:
    """The typed error for a server ``reason`` (see :func:`gateway.errors.error_for_reason`)."""
    cls = error_for_reason(reason)
    if cls is OffsetOutOfRange:
        return OffsetOutOfRange(
            message,
            offset=int(metadata.get("offset", -1)),
            earliest=int(metadata.get("earliest", -1)),
            latest=int(metadata.get("latest", -1)),
        )
    details: dict[str, Any] = dict(metadata)
    details.pop("retry_after_ms", None)
    if issubclass(cls, RetryableError):
        return cls(message, retry_after_ms=retry_ms, **details)
    return cls(message, **details)


def error_from_rpc(exc: grpc.RpcError) -> TidegateError:
    """The typed error behind a failed call, from its rich status details.

    A status without ``ErrorInfo`` (a proxy, or the transport itself) maps by code:
    UNAVAILABLE is :class:`Unavailable`, RESOURCE_EXHAUSTED with a ``RetryInfo`` is
    :class:`Throttled`; anything else is a plain :class:`TidegateError` whose
    ``details["grpc_code"]`` names the code.
    """
    call = cast(grpc.Call, exc)
    code = call.code()
    message = call.details() or (code.name if code is not None else "UNKNOWN")
    reason = ""
    metadata: dict[str, str] = {}
    retry_ms: int | None = None
    for key, value in call.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_ms = retry.retry_delay.seconds * 1000 + retry.retry_delay.nanos // 1_000_000
    if not reason:
        if code is grpc.StatusCode.UNAVAILABLE:
            return Unavailable(message, retry_after_ms=retry_ms)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and retry_ms is not None:
            return Throttled(message, retry_after_ms=retry_ms)
        reason = code.name if code is not None else "UNKNOWN"
    err = build_error(reason, message, metadata, retry_ms)
    if type(err) is TidegateError:
        err.details.setdefault("grpc_code", code.name if code is not None else "UNKNOWN")
    return err


def error_from_pb(e: pb.Error) -> TidegateError:
    """The typed error of one failed ``AppendStream`` request."""
    return build_error(e.reason, e.message, dict(e.metadata), e.retry_after_ms or None)


# --------------------------------------------------------------------------------------
# Retries as data
# --------------------------------------------------------------------------------------
class Backoff(ABC):
    """How long to wait before retry number ``failures`` (1 for the first retry)."""

    @abstractmethod
    def compute(self, failures: int) -> float:
        """Seconds to wait."""


@dataclass(frozen=True)
class ConstantBackoff(Backoff):
    delay: float = 0.1

    def compute(self, failures: int) -> float:
        return self.delay


@dataclass(frozen=True)
class ExponentialBackoff(Backoff):
    """``base * 2**(failures-1)`` capped at ``cap``; with ``jitter``, a uniform draw from
    the upper half of that ("equal jitter"), so retrying clients spread out."""

    base: float = 0.05
    cap: float = 2.0
    jitter: bool = True

    def compute(self, failures: int) -> float:
        delay = min(self.cap, self.base * (2 ** max(0, failures - 1)))
        return random.uniform(delay / 2, delay) if self.jitter else delay


def _default_retry_on() -> tuple[type[TidegateError], ...]:
    return (RetryableError,)


@dataclass(frozen=True)
class Retry:
    """A retry policy: which errors, how often, how long, and the wait between attempts.

    The wait is the larger of the backoff and the server's retry-after hint
    (``RetryInfo`` / ``Retry-After``), so a throttled client never comes back early.

    Args:
        backoff: wait between attempts.
        attempts: most retries after the first attempt; None for no limit (``timeout``
            still applies).
        timeout: give up once this many seconds passed since the first attempt; None for
            no limit.
        retry_on: error classes worth retrying; by default every
            :class:`~gateway.errors.RetryableError` (UNAVAILABLE, RESOURCE_EXHAUSTED,
            OUT_OF_ORDER_SEQUENCE).
    """

    backoff: Backoff = field(default_factory=ExponentialBackoff)
    attempts: int | None = None
    timeout: float | None = 120.0
    retry_on: tuple[type[TidegateError], ...] = field(default_factory=_default_retry_on)

    @classmethod
    def none(cls) -> Retry:
        """Never retry."""
        return cls(ConstantBackoff(0.0), attempts=0, timeout=0.0)

    def retryable(self, err: BaseException) -> bool:
        if isinstance(err, TidegateError) and err.details.get("grpc_code") == "DEADLINE_EXCEEDED":
            return True
        return isinstance(err, self.retry_on)

    def delay(self, err: BaseException, failures: int) -> float:
        """Seconds to wait before retry number ``failures``."""
        wait = self.backoff.compute(failures)
        hint = getattr(err, "retry_after_ms", None)
        if hint:
            wait = max(wait, hint / 1000)
        return wait

    def next_delay(self, err: BaseException, failures: int, started: float) -> float | None:
        """The wait before retry number ``failures``, or None to give up.

        ``started`` is the ``time.monotonic()`` of the first attempt.
        """
        if not self.retryable(err):
            return None
        if self.attempts is not None and failures > self.attempts:
            return None
        wait = self.delay(err, failures)
        if self.timeout is not None and time.monotonic() + wait - started > self.timeout:
            return None
        return wait


# --------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------
def channel_options(extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        # Come back quickly after a gateway restart (grpc's default waits up to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        *extra,
    ]


def channel_credentials(
    tls: bool | None, root_certificates: bytes | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for a plaintext channel."""
    if tls is None:
        tls = root_certificates is not None
    if not tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def normalise_target(endpoint: str) -> tuple[str, bool | None]:
    """Strip a scheme: ``grpcs://`` / ``https://`` imply TLS, ``grpc://`` / ``http://`` not."""
    for scheme, tls in (("grpcs://", True), ("https://", True), ("grpc://", False)):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :], tls
    if endpoint.startswith("http://"):
        return endpoint[len("http://") :], False
    return endpoint, None


# --------------------------------------------------------------------------------------
# Arrow
# --------------------------------------------------------------------------------------
def ipc_options(compression: Compression) -> pa.ipc.IpcWriteOptions:
    codec = None if compression == "none" else ("lz4_frame" if compression == "lz4" else "zstd")
    return pa.ipc.IpcWriteOptions(compression=codec)


def encode(batches: Sequence[pa.RecordBatch], schema: pa.Schema, compression: Compression) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=ipc_options(compression)) as writer:
        for b in batches:
            writer.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


def to_table(data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """An Arrow table from a table, batch, list of batches, pandas frame or list of dicts."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__module__.partition(".")[0] == "pandas":
        return pa.Table.from_pandas(data, schema=schema, preserve_index=False)
    if isinstance(data, Mapping):
        data = [data]
    rows = list(data)
    if rows and isinstance(rows[0], pa.RecordBatch):
        return pa.Table.from_batches(rows)
    return pa.Table.from_pylist(rows, schema=schema)


def ipc(data: Any, compression: Compression = "none") -> bytes:
    table = to_table(data)
    return encode(table.to_batches(), table.schema, compression)


def decode(data: bytes) -> list[pa.RecordBatch]:
    if not data:
        return []
    return list(pa.ipc.open_stream(pa.py_buffer(data)))


def timestamp_us(when: dt.datetime | float | int) -> int:
    """Microseconds since the epoch of an aware datetime (naive means UTC) or epoch seconds."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(when * 1_000_000)


# --------------------------------------------------------------------------------------
# Producer internals: routing, batching, sequencing (no I/O)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings; see :class:`gateway.client.Producer` for their meaning."""

    batch_records: int = 10_000
    batch_bytes: int = 1024 * 1024
    linger: float = 0.005
    compression: Compression = "zstd"
    idempotent: bool = True
    max_in_flight: int = 5
    buffer_records: int = 1_000_000
    retry: Retry = field(default_factory=Retry)
    producer_id: str | None = None

    def __post_init__(self) -> None:
        if self.batch_records < 1 or self.batch_bytes < 1:
            raise ValueError("batch_records and batch_bytes must be at least 1")
        if not 1 <= self.max_in_flight <= 15:
            # The gateway remembers 16 batches per producer and partition: a retried batch
            # must still be inside that window.
            raise ValueError("max_in_flight must be from 1 to 15")
        if self.compression not in ("zstd", "lz4", "none"):
            raise ValueError("compression must be 'zstd', 'lz4' or 'none'")


class Delivery:
    """Collects the offsets of one ``send`` call's rows; ``single`` for one record."""

    __slots__ = ("done", "error", "future", "offsets", "partitions", "pending", "single")

    def __init__(self, rows: int, single: bool) -> None:
        #: The driver's future (concurrent.futures or asyncio) resolved from this delivery.
        self.future: Any = None
        self.single = single
        self.pending = rows
        self.partitions = [0] * rows
        self.offsets = [0] * rows
        self.error: BaseException | None = None
        self.done = rows == 0

    def ack(self, rows: Sequence[int] | range, partition: int, base_offset: int) -> bool:
        """Record offsets for ``rows`` (indices of the send); True once every row is in."""
        for k, i in enumerate(rows):
            self.partitions[i] = partition
            self.offsets[i] = base_offset + k
        self.pending -= len(rows)
        if self.pending <= 0 and not self.done:
            self.done = True
            return True
        return False

    def fail(self, err: BaseException) -> bool:
        if self.done:
            return False
        self.done = True
        self.error = err
        return True

    def result(self) -> RecordMetadata | list[RecordMetadata]:
        out = [RecordMetadata(p, o) for p, o in zip(self.partitions, self.offsets, strict=True)]
        return out[0] if self.single else out


#: The rows of a one-record send.
_ONE = range(1)

#: A batch's data in row order: Arrow batches, and runs of checked dict rows (their values
#: in schema order, see :class:`gateway.client._rows.RowPlan`).
Chunk: TypeAlias = pa.RecordBatch | list[tuple[Any, ...]]


@dataclass(slots=True)
class Piece:
    """Rows of one send in a batch; ``rows`` are their indices in the send."""

    delivery: Delivery
    rows: Sequence[int] | range


@dataclass(slots=True)
class ProducerBatch:
    """One request's worth of rows for one partition."""

    partition: int
    pieces: list[Piece] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    records: int = 0
    nbytes: int = 0
    created: float = field(default_factory=time.monotonic)
    sequence: int | None = None
    payload: bytes = b""
    attempts: int = 0
    first_attempt: float = 0.0

    def add(
        self, chunk: Chunk, delivery: Delivery, rows: Sequence[int] | range, nbytes: int
    ) -> None:
        if isinstance(chunk, pa.RecordBatch):
            self.chunks.append(chunk)
        elif self.chunks and isinstance(self.chunks[-1], list):
            self.chunks[-1].extend(chunk)
        else:
            self.chunks.append(list(chunk))
        self.pieces.append(Piece(delivery, rows))
        self.records += len(rows)
        self.nbytes += nbytes

    def add_row(self, values: tuple[Any, ...], delivery: Delivery, nbytes: int) -> None:
        """One checked dict row, a send of its own (the common case, kept short)."""
        chunks = self.chunks
        if chunks and isinstance(chunks[-1], list):
            chunks[-1].append(values)
        else:
            chunks.append([values])
        self.pieces.append(Piece(delivery, _ONE))
        self.records += 1
        self.nbytes += nbytes

    def seal(self, schema: pa.Schema, compression: Compression) -> None:
        """Encode the request: one Arrow record batch, however many sends it holds.

        Raises:
            SchemaMismatch: dict rows that passed the check at ``send`` still failed to
                convert (the caller fails this batch's deliveries).
        """
        parts = [
            c if isinstance(c, pa.RecordBatch) else values_to_batch(c, schema) for c in self.chunks
        ]
        if len(parts) > 1:
            parts = pa.Table.from_batches(parts, schema).combine_chunks().to_batches()
        self.payload = encode(parts, schema, compression)
        self.chunks = []

    def request(self, ref: TableRef, producer_id: str | None, epoch: int) -> pb.AppendRequest:
        if producer_id and epoch:
            producer_id = f"{producer_id}.{epoch}"
        return pb.AppendRequest(
            table=ref.pb(),
            arrow_ipc=self.payload,
            partition=self.partition,
            producer_id=producer_id or "",
            sequence=self.sequence,
        )

    def complete(self, base_offset: int) -> list[Delivery]:
        """Hand out offsets; the deliveries that became complete."""
        done = []
        offset = base_offset
        for piece in self.pieces:
            if piece.delivery.ack(piece.rows, self.partition, offset):
                done.append(piece.delivery)
            offset += len(piece.rows)
        return done

    def fail(self, err: BaseException) -> list[Delivery]:
        return [p.delivery for p in self.pieces if p.delivery.fail(err)]


class Accumulator:
    """Routes sent rows to partitions (as the gateway would) and cuts per-partition batches.

    Rows with key columns go where :func:`gateway.routing.route_by_key` sends them; rows
    without keys stick to one partition until its batch is full, then move to the next
    (Kafka's sticky partitioner), so every batch targets one partition, as idempotent
    appends must.

    Dict rows that pass :class:`~gateway.client._rows.RowPlan`'s check are kept as Python
    values and become Arrow once per batch, at :meth:`ProducerBatch.seal`; other data is
    converted (and conformed) to Arrow at once.
    """

    def __init__(self, table: TableInfo, config: ProducerConfig) -> None:
        self.table = table
        self.config = config
        self.plan = RowPlan(table.schema, table.key_columns)
        self.open: dict[int, ProducerBatch] = {}
        self.ready: list[ProducerBatch] = []
        self.buffered = 0
        self._sticky = random.randrange(table.partitions)

    def add(self, data: Any, partition: int | None) -> Delivery:
        """Route and buffer ``data``; returns its delivery. Validates before buffering.

        Raises:
            SchemaMismatch: the rows do not fit the table schema.
            InvalidPartition: ``partition`` is not one of the table's.
        """
        plan = self.plan
        python_routes = partition is not None or plan.keys_in_python
        if isinstance(data, Mapping):
            checked = plan.check(data)
            if checked is not None and python_routes:
                self._check_partition(partition)
                values, nbytes = checked
                if partition is None and plan.key_index:
                    partition = partition_for_key(plan.key(values), self.table.partitions)
                delivery = Delivery(1, True)
                self._append_row(partition, values, nbytes, delivery)
                self.buffered += 1
                return delivery
            return self._add_batch(self._arrow_rows([data]), partition, single=True)
        if isinstance(data, pa.RecordBatch):
            batch = data
        elif isinstance(data, pa.Table):
            combined = data.combine_chunks().to_batches()
            batch = (
                combined[0]
                if combined
                else pa.RecordBatch.from_pylist([], schema=self.table.schema)
            )
        elif type(data).__module__.partition(".")[0] == "pandas":
            batch = pa.RecordBatch.from_pandas(data, schema=self.table.schema, preserve_index=False)
        else:
            rows = list(data)
            if rows and all(isinstance(r, Mapping) for r in rows):
                all_checked = [plan.check(r) for r in rows]
                if python_routes and all(c is not None for c in all_checked):
                    return self._add_rows(
                        cast(list[tuple[tuple[Any, ...], int]], all_checked), partition
                    )
                batch = self._arrow_rows(rows)
            else:
                batch = pa.RecordBatch.from_pylist(rows, schema=self.table.schema)
        return self._add_batch(batch, partition, single=False)

    def _arrow_rows(self, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        """Dict rows the Python check could not vouch for, converted by Arrow."""
        for row in rows:
            self.plan.check_columns(row)
        try:
            return pa.RecordBatch.from_pylist(list(rows), schema=self.table.schema)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            raise SchemaMismatch(f"rows do not match the table schema: {exc}") from exc

    def _check_partition(self, partition: int | None) -> None:
        if partition is not None and not 0 <= partition < self.table.partitions:
            raise InvalidPartition(
                f"partition {partition} does not exist in {self.table.ref}, which has "
                f"partitions 0..{self.table.partitions - 1}",
                partitions=self.table.partitions,
            )

    def _add_batch(self, batch: pa.RecordBatch, partition: int | None, single: bool) -> Delivery:
        batch = conform_batch(batch, self.table.schema)
        delivery = Delivery(batch.num_rows, single)
        n = batch.num_rows
        if n == 0:
            return delivery
        self._check_partition(partition)
        if partition is not None:
            self._append(partition, batch, n, batch.nbytes, delivery, range(n))
        elif self.table.key_columns:
            routes = route_by_key(batch, self.table.key_columns, self.table.partitions)
            if len(routes) == 1:
                self._append(next(iter(routes)), batch, n, batch.nbytes, delivery, range(n))
            else:
                for p, idx in routes.items():
                    part = batch.take(idx)
                    self._append(p, part, part.num_rows, part.nbytes, delivery, idx.to_pylist())
        else:
            self._append(None, batch, n, batch.nbytes, delivery, range(n))
        self.buffered += n
        return delivery

    def _add_rows(
        self, checked: list[tuple[tuple[Any, ...], int]], partition: int | None
    ) -> Delivery:
        """Checked dict rows of one send (values in schema order, estimated bytes)."""
        n = len(checked)
        delivery = Delivery(n, False)
        self._check_partition(partition)
        if partition is None and self.plan.key_index:
            groups: dict[int, list[int]] = {}
            for i, (values, _) in enumerate(checked):
                p = partition_for_key(self.plan.key(values), self.table.partitions)
                groups.setdefault(p, []).append(i)
            for p, idx in sorted(groups.items()):
                rows = [checked[i][0] for i in idx]
                self._append(p, rows, len(idx), sum(checked[i][1] for i in idx), delivery, idx)
        else:
            rows = [values for values, _ in checked]
            self._append(partition, rows, n, sum(b for _, b in checked), delivery, range(n))
        self.buffered += n
        return delivery

    def _append_row(
        self, partition: int | None, values: tuple[Any, ...], nbytes: int, delivery: Delivery
    ) -> None:
        """:meth:`_append` of a single checked dict row."""
        config = self.config
        while True:
            p = self._sticky if partition is None else partition
            current = self.open.get(p)
            if current is None:
                current = self.open[p] = ProducerBatch(p)
            elif current.records and current.nbytes + nbytes > config.batch_bytes:
                self._close(p)
                continue
            break
        current.add_row(values, delivery, nbytes)
        if current.records >= config.batch_records or current.nbytes >= config.batch_bytes:
            self._close(p)

    def _append(
        self,
        partition: int | None,
        data: Chunk,
        n: int,
        nbytes: int,
        delivery: Delivery,
        rows: Sequence[int] | range,
    ) -> None:
        start = 0
        row_bytes = max(1, nbytes // max(1, n))
        while start < n:
            p = self._sticky if partition is None else partition
            current = self.open.get(p)
            if current is None:
                current = self.open[p] = ProducerBatch(p)
            room = min(
                self.config.batch_records - current.records,
                max(1, (self.config.batch_bytes - current.nbytes) // row_bytes),
            )
            take = min(n - start, max(1, room))
            if current.records and current.nbytes + take * row_bytes > self.config.batch_bytes:
                self._close(p)
                continue
            chunk = (
                data.slice(start, take)
                if isinstance(data, pa.RecordBatch)
                else data[start : start + take]
            )
            current.add(chunk, delivery, rows[start : start + take], take * row_bytes)
            start += take
            if current.records >= self.config.batch_records or (
                current.nbytes >= self.config.batch_bytes
            ):
                self._close(p)

    def _close(self, partition: int) -> None:
        batch = self.open.pop(partition, None)
        if batch is not None:
            self.ready.append(batch)
        if partition == self._sticky and self.table.partitions > 1:
            self._sticky = (self._sticky + 1) % self.table.partitions

    def drain(self, now: float, force: bool) -> list[ProducerBatch]:
        """Batches to send: the full ones, plus those older than ``linger`` (or all)."""
        for p, b in list(self.open.items()):
            if force or now - b.created >= self.config.linger:
                self._close(p)
        out, self.ready = self.ready, []
        return out

    def next_deadline(self) -> float | None:
        if self.ready:
            return time.monotonic()
        if not self.open:
            return None
        return min(b.created for b in self.open.values()) + self.config.linger


class PartitionQueue:
    """Sequencing and in-flight bookkeeping of one partition (Kafka's rules).

    Batches get consecutive sequences when first sent. At most ``max_in_flight`` are
    unanswered at once, and only one until the partition's first acknowledgement (the
    gateway accepts any sequence as a producer's first one, so a second in-flight batch
    must never overtake a refused first). After a retryable failure every unanswered batch
    is resent in order, keeping its sequence: the gateway answers those it already stored
    with their original offsets. After a final failure the batches behind it are
    renumbered, as none of them can have been stored.
    """

    def __init__(self, partition: int, max_in_flight: int) -> None:
        self.partition = partition
        self.max_in_flight = max_in_flight
        self.waiting: list[ProducerBatch] = []
        self.in_flight: list[ProducerBatch] = []
        self.next_sequence = 0
        self.acked_once = False
        #: Bumped when batches of unknown fate are given up; part of the producer identity.
        self.epoch = 0
        #: Set after a retryable failure: time before which nothing is (re)sent.
        self.paused_until = 0.0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.in_flight)

    def can_send(self, now: float, probing: bool = False) -> bool:
        """Whether another batch may go now; ``probing``: the stream has not answered yet."""
        limit = self.max_in_flight if self.acked_once and not probing else 1
        return bool(self.waiting) and len(self.in_flight) < limit and now >= self.paused_until

    def take(self, idempotent: bool) -> ProducerBatch:
        batch = self.waiting.pop(0)
        if idempotent and batch.sequence is None:
            batch.sequence = self.next_sequence
            self.next_sequence += 1
        if not batch.attempts:
            batch.first_attempt = time.monotonic()
        batch.attempts += 1
        self.in_flight.append(batch)
        return batch

    def rewind(self) -> None:
        """Put every unanswered batch back in front, in order, to be resent."""
        self.waiting[:0] = self.in_flight
        self.in_flight = []

    def renumber(self, freed: int) -> None:
        """After a final failure of the batch with sequence ``freed``: none of the batches
        behind it can have been stored (each would have been a gap), so they are resent
        with new sequences from ``freed`` on."""
        self.rewind()
        for b in self.waiting:
            b.sequence = None
        self.next_sequence = freed


#: gRPC codes of a stream broken by the transport rather than refused by the gateway.
_TRANSPORT_CODES = frozenset({"INTERNAL", "UNKNOWN", "CANCELLED", "DEADLINE_EXCEEDED"})


class ProducerCore:
    """The producer's state machine, free of I/O: the sync and asyncio producers drive it.

    All requests go over one ``AppendStream`` (the gateway answers its requests in order);
    per partition :class:`PartitionQueue` keeps sequences and in-flight limits. A driver
    calls :meth:`add` for sends, :meth:`outgoing` to get requests to write,
    :meth:`on_response` / :meth:`on_stream_error` with what the stream said, and resolves
    the deliveries those return.
    """

    def __init__(self, table: TableInfo, config: ProducerConfig) -> None:
        self.table = table
        self.config = config
        self.producer_id = (config.producer_id or new_producer_id()) if config.idempotent else None
        self.acc = Accumulator(table, config)
        self.queues = [PartitionQueue(p, config.max_in_flight) for p in range(table.partitions)]
        self.pending: dict[int, tuple[PartitionQueue, ProducerBatch]] = {}
        #: Requests of the open stream rewound for resending before their answer came:
        #: a retry-after hint in that late answer must still hold their partition back.
        self.rewound: dict[int, PartitionQueue] = {}
        self.failures = [0] * table.partitions
        self._ids = 0
        self.stream_gen = 0
        self.stream_open = False
        self.stream_paused_until = 0.0
        self.stream_failures = 0
        #: Whether the current stream answered once. Until it has, one batch per partition
        #: goes: after an outage or a refusal the stream is probed before the window opens
        #: (and a refusal never races a burst of requests, which can cost its status).
        self.stream_answered = False
        #: Records sent but not yet acknowledged or failed (buffered, queued, in flight).
        self.unfinished = 0
        #: Batches put back to be resent after a retryable failure (a statistic).
        self.retries = 0
        #: Deliveries whose batch failed to seal, for :meth:`take_rejected`.
        self.rejected: list[Delivery] = []

    # Sends ------------------------------------------------------------------------------
    def add(self, data: Any, partition: int | None) -> Delivery:
        delivery = self.acc.add(data, partition)
        self.unfinished += delivery.pending
        return delivery

    def idle(self) -> bool:
        return self.unfinished == 0

    def _stage(self, now: float, force: bool) -> None:
        for b in self.acc.drain(now, force):
            try:
                b.seal(self.table.schema, self.config.compression)
            except SchemaMismatch as err:
                # Dict rows the check at send let through, refused by Arrow: fail this
                # batch alone (it never got a sequence, so nothing behind it is affected).
                self.unfinished -= b.records
                self.rejected.extend(b.fail(err))
                continue
            self.queues[b.partition].waiting.append(b)

    def take_rejected(self) -> list[Delivery]:
        """Deliveries failed while sealing their batch; the driver resolves them."""
        out, self.rejected = self.rejected, []
        return out

    def needs_stream(self, now: float, force: bool = False) -> bool:
        self._stage(now, force)
        return (
            not self.stream_open
            and now >= self.stream_paused_until
            and any(q.waiting for q in self.queues)
        )

    def stream_opened(self) -> int:
        """Call when a new stream is open; returns its generation."""
        self.stream_gen += 1
        self.stream_open = True
        self.stream_answered = False
        self.rewound.clear()
        return self.stream_gen

    def outgoing(self, now: float, force: bool = False) -> list[pb.AppendStreamRequest]:
        """Requests to write now (batches whose linger passed, or all with ``force``)."""
        self._stage(now, force)
        if not self.stream_open:
            return []
        out = []
        for q in self.queues:
            while q.can_send(now, probing=not self.stream_answered):
                batch = q.take(self.config.idempotent)
                self._ids += 1
                self.pending[self._ids] = (q, batch)
                out.append(
                    pb.AppendStreamRequest(
                        request_id=self._ids,
                        append=batch.request(self.table.ref, self.producer_id, q.epoch),
                    )
                )
        return out

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`outgoing` may next have something (None: only after an event)."""
        times = []
        deadline = self.acc.next_deadline()
        if deadline is not None:
            times.append(deadline)
        for q in self.queues:
            if q.waiting and q.paused_until > now:
                times.append(q.paused_until)
        if not self.stream_open and any(q.waiting for q in self.queues):
            times.append(self.stream_paused_until)
        return min(times) if times else None

    # Answers ----------------------------------------------------------------------------
    def on_response(self, gen: int, resp: pb.AppendStreamResponse) -> list[Delivery]:
        """A response of stream ``gen``; returns the deliveries it finished."""
        entry = self.pending.pop(resp.request_id, None)
        if entry is None or gen != self.stream_gen:
            # An answer to a batch already rewound for resending. If it was refused with a
            # retry-after (a pipelined batch throttled just after the one that paused the
            # partition), its resend must wait for that hint too.
            q = self.rewound.pop(resp.request_id, None) if gen == self.stream_gen else None
            if q is not None and resp.WhichOneof("result") == "error":
                hint = resp.error.retry_after_ms
                if hint > 0:
                    q.paused_until = max(q.paused_until, time.monotonic() + hint / 1000)
            return []
        q, batch = entry
        self.stream_failures = 0
        self.stream_answered = True
        if resp.WhichOneof("result") == "ok":
            q.in_flight.remove(batch)
            q.acked_once = True
            self.failures[q.partition] = 0
            self.unfinished -= batch.records
            ranges = resp.ok.ranges
            return batch.complete(ranges[0].base_offset if ranges else 0)
        return self._failed(q, batch, error_from_pb(resp.error))

    def _forget(self, q: PartitionQueue) -> None:
        for b in q.in_flight:
            for rid, (_, other) in list(self.pending.items()):
                if other is b:
                    del self.pending[rid]
                    self.rewound[rid] = q

    def _failed(
        self, q: PartitionQueue, batch: ProducerBatch, err: BaseException
    ) -> list[Delivery]:
        self.failures[q.partition] += 1
        delay = self.config.retry.next_delay(err, self.failures[q.partition], batch.first_attempt)
        self._forget(q)
        if delay is not None:
            self.retries += len(q.in_flight)
            q.rewind()
            q.paused_until = time.monotonic() + delay
            return []
        q.in_flight.remove(batch)
        self.unfinished -= batch.records
        self.failures[q.partition] = 0
        if batch.sequence is not None:
            q.renumber(batch.sequence)
        else:
            q.rewind()
        return batch.fail(err)

    def on_stream_error(self, gen: int, err: BaseException) -> list[Delivery]:
        """Stream ``gen`` broke: resend what it carried, or fail it when not retryable."""
        if gen != self.stream_gen or not self.stream_open:
            return []
        if (
            isinstance(err, TidegateError)
            and not isinstance(err, RetryableError)
            and err.details.get("grpc_code") in _TRANSPORT_CODES
        ):
            # The stream broke below the API (a reset, a lost connection): resending is
            # safe, the batches being idempotent.
            err = Unavailable(f"the append stream broke: {err.message}")
        self.stream_open = False
        self.pending.clear()
        self.stream_failures += 1
        retry = self.config.retry
        done: list[Delivery] = []
        now = time.monotonic()
        if retry.retryable(err):
            self.stream_paused_until = now + retry.delay(err, self.stream_failures)
        for q in self.queues:
            self.retries += len(q.in_flight)
            q.rewind()
            if not q.waiting:
                continue
            head = q.waiting[0]
            if retry.next_delay(err, self.stream_failures, head.first_attempt or now) is None:
                # Give up on everything queued for the partition.
                for b in q.waiting:
                    self.unfinished -= b.records
                    done.extend(b.fail(err))
                q.waiting = []
                # Whether the gateway stored the batches we gave up on is unknown: continue
                # under a new producer identity for this partition, so no later batch can be
                # mistaken for one of them.
                q.epoch += 1
                q.next_sequence = 0
                q.acked_once = False
        return done

    def fail_all(self, err: BaseException) -> list[Delivery]:
        """Fail everything not yet acknowledged (the producer is closing without flushing)."""
        self._stage(time.monotonic(), True)
        done = self.take_rejected()
        for q in self.queues:
            q.rewind()
            for b in q.waiting:
                done.extend(b.fail(err))
            q.waiting = []
        self.pending.clear()
        self.unfinished = 0
        return done


def new_producer_id() -> str:
    return f"p-{uuid.uuid4().hex}"


def key_partition(values: Iterable[Any], partitions: int) -> int:
    """The partition the gateway routes a key to (same hash as :mod:`gateway.routing`)."""
    return partition_for_key(list(values), partitions)


# --------------------------------------------------------------------------------------
# Consumer internals
# --------------------------------------------------------------------------------------
def mark_consumed(consumed: dict[int, int], batch: pa.RecordBatch) -> None:
    """Move ``consumed`` past ``batch`` (a batch of one partition, with system columns)."""
    p = batch.column("_partition")[0].as_py()
    consumed[p] = batch.column("_offset")[-1].as_py() + 1


def start_positions(
    table: TableInfo,
    partitions: Sequence[int],
    committed: Mapping[int, int],
    start: StartAt,
    by_time: Mapping[int, int] | None,
) -> dict[int, int]:
    """Where each partition starts: its committed offset, else ``start``."""
    from gateway.errors import InvalidPartition

    out: dict[int, int] = {}
    for p in partitions:
        if not 0 <= p < table.partitions:
            raise InvalidPartition(f"partition {p} does not exist in {table.ref}")
        if p in committed:
            out[p] = committed[p]
        elif start == "earliest":
            out[p] = table.earliest_offsets[p]
        elif start == "latest":
            out[p] = table.high_watermarks[p]
        elif isinstance(start, dt.datetime):
            assert by_time is not None
            out[p] = by_time[p]
        elif isinstance(start, int) and not isinstance(start, bool):
            out[p] = start
        else:
            raise ValueError(
                f"start must be 'earliest', 'latest', an offset or a datetime, not {start!r}"
            )
    return out


def scan_request(
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
) -> pb.ScanRequest:
    return pb.ScanRequest(
        table=TableRef.parse(table).pb(),
        columns=list(columns),
        filter=filter,
        as_of="" if as_of is None else str(as_of),
        limit=limit,
    )


def scan_table(messages: Sequence[pb.ScanResponse]) -> pa.Table:
    """The rows of a Scan call's messages; the first message always carries the schema."""
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    for msg in messages:
        reader = pa.ipc.open_stream(msg.arrow_ipc)
        schema = reader.schema
        batches.extend(reader)
    return pa.Table.from_batches(batches, schema)
