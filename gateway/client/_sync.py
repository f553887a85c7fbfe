"""The synchronous client: :class:`Client`, :class:`Producer` and :class:`Consumer`.

Its twin :mod:`gateway.client.aio` has the same surface with ``async`` methods; both drive
the I/O-free modules of the package (``_batching``, ``_producer``, ``_reading``). Imports
neither the server nor Spark.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, cast

import grpc
import pyarrow as pa

from gateway.client._arrow import decode, ipc
from gateway.client._batching import Delivery, ProducerConfig
from gateway.client._channel import (
    call_metadata,
    channel_credentials,
    channel_options,
    normalise_target,
)
from gateway.client._producer import ProducerCore
from gateway.client._reading import mark_consumed, scan_request, scan_table, start_positions
from gateway.client._types import (
    AppendRange,
    RecordMetadata,
    StartAt,
    TableInfo,
    TableRef,
    ranges_from_pb,
    table_fields,
    timestamp_us,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import Compression
from gateway.wire.errors import Throttled, TidegateError, Unavailable
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["Client", "Consumer", "Producer"]

#: The first client's name for :func:`gateway.client._arrow.ipc` (tests use it).
_ipc = ipc

#: Retry policy of idempotent unary calls (describe, list, offsets).
DEFAULT_CALL_RETRY = Retry(timeout=30.0)


class Client:
    """A connection to one gateway over gRPC.

    Args:
        endpoint: ``host:port``; a ``grpcs://`` or ``https://`` prefix turns TLS on.
        api_key: sent as ``authorization: Bearer <api_key>`` on every call.
        tls: use TLS (default: when ``root_certificates`` is given or the scheme says so).
        root_certificates: PEM roots to verify the gateway with (default: system roots).
        timeout: seconds per unary call.
        retry: policy for idempotent calls (describe, list, read, offsets); appends are
            retried only by the :class:`Producer`, whose batches are idempotent.

    Example::

        with Client("127.0.0.1:50051") as c:
            c.create_table("shop.orders", {"id": "int64", "item": "string"}, partitions=4)
            c.append("shop.orders", [{"id": 1, "item": "kettle"}])
            print(c.read("shop.orders", partition=0, offset=0).to_pylist())
    """

    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
        timeout: float = 30.0,
        retry: Retry = DEFAULT_CALL_RETRY,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        target, scheme_tls = normalise_target(endpoint)
        self.timeout = timeout
        self.retry = retry
        self.metadata = call_metadata(api_key)
        creds = channel_credentials(tls if tls is not None else scheme_tls, root_certificates)
        opts = channel_options(options)
        self._channel = (
            grpc.insecure_channel(target, options=opts)
            if creds is None
            else grpc.secure_channel(target, creds, options=opts)
        )
        self._stub = pb_grpc.TidegateStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        """The raw gRPC stub (pass ``metadata=client.metadata`` with each call)."""
        return self._stub

    def _call(self, method: str, request: Any, *, idempotent: bool = False) -> Any:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                return getattr(self._stub, method)(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = self.retry.next_delay(err, failures, started) if idempotent else None
                if delay is None:
                    raise err from None
                time.sleep(delay)

    # Tables ----------------------------------------------------------------------------
    def create_table(
        self,
        table: str | TableRef,
        schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
        *,
        partitions: int = 1,
        key_columns: Sequence[str] = (),
    ) -> pb.TableInfo:
        """Create a table; ``schema`` is ``{column: arrow type name}`` or a list of fields."""
        request = pb.CreateTableRequest(
            table=TableRef.parse(table).pb(),
            fields=table_fields(schema),
            partitions=partitions,
            key_columns=list(key_columns),
        )
        return cast(pb.TableInfo, self._call("CreateTable", request))

    def describe_table(self, table: str | TableRef) -> pb.TableInfo:
        """The table with live per-partition offsets."""
        request = pb.DescribeTableRequest(table=TableRef.parse(table).pb())
        return cast(pb.TableInfo, self._call("DescribeTable", request, idempotent=True))

    def table_info(self, table: str | TableRef) -> TableInfo:
        """:meth:`describe_table` with the schema parsed into Arrow."""
        return TableInfo.from_pb(self.describe_table(table))

    def list_tables(self, namespace: str = "") -> list[pb.TableInfo]:
        response = self._call(
            "ListTables", pb.ListTablesRequest(namespace=namespace), idempotent=True
        )
        return list(response.tables)

    def drop_table(self, table: str | TableRef) -> None:
        self._call("DropTable", pb.DropTableRequest(table=TableRef.parse(table).pb()))

    # Tenants, keys and quotas arrive with the tenancy API: add their calls here, next to
    # the table admin calls, once the gateway serves them.

    # Writes ----------------------------------------------------------------------------
    def append_ipc(
        self,
        table: str | TableRef,
        arrow_ipc: bytes,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Append an already encoded Arrow IPC stream (one unary call, no retry)."""
        request = pb.AppendRequest(
            table=TableRef.parse(table).pb(),
            arrow_ipc=arrow_ipc,
            partition=partition,
            producer_id=producer_id or "",
            sequence=sequence,
        )
        return ranges_from_pb(self._call("Append", request))

    def append(
        self,
        table: str | TableRef,
        rows: Any,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
        compression: Compression = "none",
    ) -> list[AppendRange]:
        """Append rows (an Arrow table or batch, a pandas frame, or a list of dicts) in one
        request; the gateway routes them. For batching and retries use :meth:`producer`."""
        return self.append_ipc(
            table,
            ipc(rows, compression),
            partition=partition,
            producer_id=producer_id,
            sequence=sequence,
        )

    def producer(self, table: str | TableRef, **config: Any) -> Producer:
        """A :class:`Producer` for ``table``; keyword arguments as for :class:`Producer`."""
        return Producer(self, table, **config)

    # Reads -----------------------------------------------------------------------------
    def read_batches(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        follow: bool = False,
        timeout: float | None = None,
    ) -> Iterator[tuple[list[pa.RecordBatch], int, int]]:
        """``(batches, next_offset, high_watermark)`` per response message.

        With ``follow`` the iterator waits for new records until ``max_records`` have
        arrived or ``timeout`` seconds pass (then it ends quietly).
        """
        request = pb.ReadRequest(
            table=TableRef.parse(table).pb(),
            partition=partition,
            offset=offset,
            max_records=max_records,
            max_bytes=max_bytes,
            follow=follow,
        )
        call = self._stub.Read(
            request,
            timeout=timeout if follow else (timeout or self.timeout),
            metadata=self.metadata,
        )
        try:
            for msg in call:
                yield decode(msg.arrow_ipc), msg.next_offset, msg.high_watermark
        except grpc.RpcError as exc:
            if follow and cast(grpc.Call, exc).code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
    ) -> pa.Table:
        """Records of one partition from ``offset`` (user columns plus system columns)."""
        batches: list[pa.RecordBatch] = []
        for chunk, _, _ in self.read_batches(
            table, partition=partition, offset=offset, max_records=max_records, max_bytes=max_bytes
        ):
            batches.extend(chunk)
        if not batches:
            return pa.table({})
        return pa.Table.from_batches(batches)

    def _read_once(
        self, ref: TableRef, partition: int, offset: int, max_records: int
    ) -> tuple[list[pa.RecordBatch], int]:
        """One bounded read, retried on retryable errors; ``(batches, next_offset)``."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                out: list[pa.RecordBatch] = []
                nxt = offset
                for chunk, next_offset, _ in self.read_batches(
                    ref, partition=partition, offset=offset, max_records=max_records
                ):
                    out.extend(b for b in chunk if b.num_rows)
                    nxt = max(nxt, next_offset)
                return out, nxt
            except TidegateError as err:
                failures += 1
                delay = self.retry.next_delay(err, failures, started)
                if delay is None:
                    raise
                time.sleep(delay)

    def consumer(self, table: str | TableRef, **options: Any) -> Consumer:
        """A :class:`Consumer` of ``table``; keyword arguments as for :class:`Consumer`."""
        return Consumer(self, table, **options)

    # Scans -----------------------------------------------------------------------------
    def scan_batches(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Batches of the whole table (cold snapshot plus hot tail, one consistent view)
        with a projection, a filter (``"v > 5 and tag is not null"``, see
        :mod:`gateway.wire.filters`) and a limit. With ``as_of`` (a snapshot id or an
        ISO-8601 time) only that Iceberg snapshot is read."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            for msg in self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata):
                yield from pa.ipc.open_stream(msg.arrow_ipc)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def scan(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """:meth:`scan_batches` as one ``pyarrow.Table`` (``.to_pandas()`` for pandas)."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            messages = list(self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return scan_table(messages)

    def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan: the pinned snapshot's data files (URLs readable without warehouse
        credentials) and the hot ranges per partition."""
        request = pb.PlanReadRequest(
            table=TableRef.parse(table).pb(),
            filter=filter,
            as_of="" if as_of is None else str(as_of),
        )
        return cast(pb.PlanReadResponse, self._call("PlanRead", request, idempotent=True))

    # Offsets ---------------------------------------------------------------------------
    def offsets_for_times(
        self,
        table: str | TableRef,
        when: dt.datetime | float,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """Per partition, the first offset appended at or after ``when`` (a datetime, or
        epoch seconds); the high watermark where nothing is that recent."""
        request = pb.OffsetsForTimesRequest(
            table=TableRef.parse(table).pb(),
            timestamp_us=timestamp_us(when),
            partitions=list(partitions or ()),
        )
        response = self._call("OffsetsForTimes", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}

    def commit_offsets(self, group: str, table: str | TableRef, offsets: Mapping[int, int]) -> None:
        """Store ``group``'s committed offsets: partition -> next offset to consume."""
        request = pb.CommitOffsetsRequest(
            group=group,
            table=TableRef.parse(table).pb(),
            offsets=[pb.PartitionOffset(partition=p, offset=o) for p, o in offsets.items()],
        )
        self._call("CommitOffsets", request, idempotent=True)

    def fetch_offsets(
        self, group: str, table: str | TableRef, partitions: Sequence[int] | None = None
    ) -> dict[int, int]:
        """``group``'s committed offsets; partitions never committed are absent."""
        request = pb.FetchOffsetsRequest(
            group=group, table=TableRef.parse(table).pb(), partitions=list(partitions or ())
        )
        response = self._call("FetchOffsets", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}


# --------------------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------------------
class Producer:
    """Batches, routes, compresses and sends rows; retries without duplicates.

    ``send`` routes rows to partitions exactly as the gateway would (key hash, or sticky
    round-robin without keys), buffers them per partition and returns a future resolving to
    :class:`RecordMetadata` ``(partition, offset)`` for a dict, or a list of them (one per
    row, in row order) for a table, batch, frame or list. A background thread sends a
    partition's batch once it holds ``batch_records`` rows or ``batch_bytes`` bytes, or
    after ``linger`` seconds, over one pipelined ``AppendStream``.

    Args:
        batch_records / batch_bytes: cut a batch at this many rows / bytes (uncompressed).
        linger: seconds a non-full batch waits for more rows.
        compression: Arrow IPC compression on the wire: ``zstd``, ``lz4`` or ``none``.
        idempotent: give each batch ``(producer_id, sequence)`` per partition so retries are
            stored once (default on). Without it a retry may store a batch twice.
        max_in_flight: unanswered batches per partition (1 to 15); order is kept anyway.
        buffer_records: ``send`` blocks while this many rows are unacknowledged...
        max_block: ...for at most this many seconds, then raises :class:`Throttled`.
        retry: a :class:`Retry`; waits at least the gateway's retry-after hint.
        producer_id: a stable id (default: a random one per producer).
    """

    def __init__(
        self, client: Client, table: str | TableRef, *, max_block: float = 60.0, **config: Any
    ) -> None:
        self.client = client
        self.config = ProducerConfig(**config)
        self.table = client.table_info(table)
        self.max_block = max_block
        self._core = ProducerCore(self.table, self.config)
        self._cond = threading.Condition()
        self._closed = False
        self._stop = False
        self._flushing = 0
        self._requests: queue.SimpleQueue[pb.AppendStreamRequest | None] | None = None
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name="tidegate-producer", daemon=True)
        self._thread.start()

    @property
    def retries(self) -> int:
        """Batches resent so far after retryable failures."""
        return self._core.retries

    @property
    def producer_id(self) -> str | None:
        return self._core.producer_id

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Public ----------------------------------------------------------------------------
    def send(
        self, data: Any, *, partition: int | None = None
    ) -> Future[RecordMetadata | list[RecordMetadata]]:
        """Buffer rows for sending; the future resolves once the gateway stored them.

        Raises (at once, nothing buffered):
            SchemaMismatch: the rows do not fit the table. InvalidPartition.
            Throttled: the buffer stayed full for ``max_block`` seconds.
        """
        future: Future[RecordMetadata | list[RecordMetadata]] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the producer is closed")
            deadline = time.monotonic() + self.max_block
            while self._core.unfinished >= self.config.buffer_records:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Throttled(
                        f"the producer buffer stayed full ({self.config.buffer_records} "
                        f"records) for {self.max_block}s",
                        retry_after_ms=100,
                    )
                self._cond.wait(left)
            delivery = self._core.add(data, partition)
            delivery.future = future
            if delivery.done:
                future.set_result(delivery.result())
            self._cond.notify_all()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait until it is acknowledged (or failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while not self._core.idle():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("flush timed out")
                    self._cond.wait(min(left, 0.5) if left is not None else 0.5)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender. Sends after close raise."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._stop = True
                finished = self._core.fail_all(RuntimeError("the producer was closed"))
                self._cond.notify_all()
            _resolve(finished)
            self._thread.join(10)
            self._close_stream()

    # Sender ----------------------------------------------------------------------------
    def _close_stream(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
            self._requests = None
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _open_stream(self) -> None:
        self._close_stream()
        requests: queue.SimpleQueue[pb.AppendStreamRequest | None] = queue.SimpleQueue()
        gen = self._core.stream_opened()
        call = self.client.stub.AppendStream(
            iter(requests.get, None), metadata=self.client.metadata
        )
        self._requests, self._call = requests, call
        threading.Thread(
            target=self._read_responses, args=(call, gen), name="tidegate-producer-rx", daemon=True
        ).start()

    def _read_responses(self, call: Any, gen: int) -> None:
        err: BaseException
        try:
            for resp in call:
                with self._cond:
                    done = self._core.on_response(gen, resp)
                    self._cond.notify_all()
                _resolve(done)
            # The stream ended without an error status: the gateway went away cleanly.
            err = Unavailable("the append stream ended")
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
        with self._cond:
            done = self._core.on_stream_error(gen, err)
            self._cond.notify_all()
        _resolve(done)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                now = time.monotonic()
                force = self._flushing > 0 or self._closed
                if self._core.needs_stream(now, force):
                    try:
                        self._open_stream()
                    except Exception as exc:  # pragma: no cover - channel closed under us
                        _resolve(self._core.fail_all(exc))
                        continue
                requests = self._core.outgoing(now, force)
                rejected = self._core.take_rejected()
                if rejected:
                    _resolve(rejected)
                    self._cond.notify_all()
                if requests and self._requests is not None:
                    for r in requests:
                        self._requests.put(r)
                    continue
                wake = self._core.next_wakeup(now)
                self._cond.wait(None if wake is None else max(0.0, wake - now) + 0.0005)


def _resolve(deliveries: list[Delivery]) -> None:
    for d in deliveries:
        fut = d.future
        if fut is None or fut.done():
            continue
        if d.error is not None:
            fut.set_exception(d.error)
        else:
            fut.set_result(d.result())


# --------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------
class Consumer:
    """Reads a table's partitions in offset order; optionally as a consumer group.

    Iterate records (dicts with the system columns) or :meth:`batches` (Arrow record
    batches). Each partition starts at the group's committed offset when there is one,
    else at ``start``: ``"earliest"``, ``"latest"``, an offset, or a datetime (the first
    record appended at or after it, via ``OffsetsForTimes``).

    Group membership is static: the caller chooses ``partitions`` (all by default), and
    several consumers of one group must be given disjoint partitions (no rebalancing).

    Args:
        group: consumer group whose committed offsets the gateway stores.
        partitions: the partitions to read (default all).
        start: where partitions without a committed offset begin.
        follow: keep waiting for new records (default); without it iteration ends at the
            high watermark seen.
        auto_commit_interval: with a group, commit the offsets of records already handed
            out every this many seconds (at the next fetch, so at-least-once); None to
            commit only by :meth:`commit`.
        max_records: records per fetch and partition.
        poll_interval: wait between polls while every partition is caught up.
    """

    def __init__(
        self,
        client: Client,
        table: str | TableRef,
        *,
        group: str | None = None,
        partitions: Sequence[int] | None = None,
        start: StartAt = "earliest",
        follow: bool = True,
        auto_commit_interval: float | None = 5.0,
        max_records: int = 10_000,
        poll_interval: float = 0.1,
    ) -> None:
        self.client = client
        self.table = client.table_info(table)
        self.ref = self.table.ref
        self.group = group
        self.partitions = (
            list(range(self.table.partitions)) if partitions is None else list(partitions)
        )
        self.follow = follow
        self.auto_commit_interval = auto_commit_interval
        self.max_records = max_records
        self.poll_interval = poll_interval
        committed = client.fetch_offsets(group, self.ref, self.partitions) if group else {}
        by_time = (
            client.offsets_for_times(self.ref, start, self.partitions)
            if isinstance(start, dt.datetime)
            else None
        )
        self.positions = start_positions(self.table, self.partitions, committed, start, by_time)
        #: Next offset after the records handed out, per partition (what commit stores).
        self.consumed = dict(self.positions)
        self._committed = dict(committed)
        self._last_commit = time.monotonic()
        self._next = 0

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Commit what was handed out (with a group and auto-commit)."""
        if self.group and self.auto_commit_interval is not None:
            self.commit()

    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Commit ``offsets`` (default: past every record handed out) for the group."""
        if not self.group:
            raise ValueError("commit needs a consumer group")
        wanted = dict(self.consumed if offsets is None else offsets)
        changed = {p: o for p, o in wanted.items() if self._committed.get(p) != o}
        if changed:
            self.client.commit_offsets(self.group, self.ref, changed)
            self._committed.update(changed)
        self._last_commit = time.monotonic()

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset
        self.consumed[partition] = offset

    def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        """Batches from the partitions that have records (empty after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._maybe_auto_commit()
            out = self._fetch_round()
            if out or (deadline is not None and time.monotonic() >= deadline):
                return out
            time.sleep(self.poll_interval)

    def _fetch_round(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        n = len(self.partitions)
        for k in range(n):
            p = self.partitions[(self._next + k) % n]
            batches, nxt = self.client._read_once(self.ref, p, self.positions[p], self.max_records)
            out.extend(batches)
            self.positions[p] = nxt
        self._next = (self._next + 1) % max(1, n)
        return out

    def _maybe_auto_commit(self) -> None:
        if (
            self.group
            and self.auto_commit_interval is not None
            and time.monotonic() - self._last_commit >= self.auto_commit_interval
        ):
            self.commit()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Arrow record batches in offset order per partition."""
        while True:
            self._maybe_auto_commit()
            got = self._fetch_round()
            if not got:
                if not self.follow:
                    return
                time.sleep(self.poll_interval)
                continue
            for batch in got:
                mark_consumed(self.consumed, batch)
                yield batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                self.consumed[p] = row["_offset"] + 1
                yield row
