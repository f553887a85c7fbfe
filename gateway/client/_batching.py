"""The producer's batching, free of I/O: route sent rows to partitions as the gateway
would, buffer them per partition, and cut one request's worth at a time."""

from __future__ import annotations

import random
import time
from asyncio import InvalidStateError as _AsyncInvalidState
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import InvalidStateError as _InvalidState
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, TypeAlias, cast

import pyarrow as pa

from gateway.client._futures import publish, resolve_watched
from gateway.client._rows import RowPlan, columns_to_batch
from gateway.client._types import RecordMetadata, TableInfo, TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import Compression, encode_stream
from gateway.wire.errors import InvalidPartition
from gateway.wire.jsonrows import python_rows_to_batch
from gateway.wire.retry import Retry
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import conform_batch

__all__ = ["Accumulator", "Delivery", "Finished", "Piece", "ProducerBatch", "ProducerConfig"]


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

#: A batch's data in row order: Arrow batches, and runs of checked dict rows kept as one
#: list of values per column (schema order, see :class:`gateway.client._rows.RowPlan`).
Chunk: TypeAlias = pa.RecordBatch | list[list[Any]]

_new_tuple = tuple.__new__
#: A future already resolved (a cancelled one, say): nothing to tell it.
_ALREADY_DONE = (_InvalidState, _AsyncInvalidState)


@dataclass(slots=True)
class Piece:
    """Rows of one multi-row send in a batch; ``rows`` are their indices in the send,
    ``start`` the first one's row in the batch."""

    delivery: Delivery
    rows: Sequence[int] | range
    start: int = 0


@dataclass(slots=True)
class ProducerBatch:
    """One request's worth of rows for one partition.

    ``owners`` says whose rows the batch holds, in row order: a :class:`Piece` for rows of
    a multi-row send, or the future of a one-dict send itself (one row; no object of ours
    per record). Once answered, :meth:`settle` resolves those futures from the batch's
    ``base_offset`` or ``error``. In a ``bound`` batch (the sync producer's) the futures
    of one-dict sends are not in ``owners`` but bound to the batch
    (:meth:`SendFuture.bind`): they read the answer from it once published (:func:`publish`).
    """

    partition: int
    owners: list[Any] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    #: The last chunk when it is a run of column lists (dict rows go there), else None.
    columns: list[list[Any]] | None = None
    records: int = 0
    nbytes: int = 0
    created: float = field(default_factory=time.monotonic)
    sequence: int | None = None
    payload: bytes = b""
    #: The request's rows as one Arrow batch, for a transport that sends batches (Flight's
    #: DoPut) instead of ``payload``.
    arrow: pa.RecordBatch | None = None
    attempts: int = 0
    first_attempt: float = 0.0
    #: Futures among ``owners`` (one-dict sends).
    singles: int = 0
    base_offset: int = 0
    error: BaseException | None = None
    bound: bool = False
    published: bool = False
    watchers: list[Any] = field(default_factory=list)  # see gateway.client._futures

    @property
    def pieces(self) -> list[Piece]:
        return [o for o in self.owners if type(o) is Piece]

    def open_columns(self, width: int) -> list[list[Any]]:
        """The run of column lists dict rows are appended to (started if need be)."""
        cols = self.columns
        if cols is None:
            cols = self.columns = [[] for _ in range(width)]
            self.chunks.append(cols)
        return cols

    def add(
        self,
        chunk: pa.RecordBatch | Sequence[tuple[Any, ...]],
        delivery: Delivery,
        rows: Sequence[int] | range,
        nbytes: int,
    ) -> None:
        """Rows of a multi-row send: an Arrow batch, or checked dict rows (value tuples)."""
        if isinstance(chunk, pa.RecordBatch):
            self.chunks.append(chunk)
            self.columns = None
        else:
            cols = self.open_columns(len(chunk[0]))
            for col, values in zip(cols, zip(*chunk, strict=True), strict=True):
                col.extend(values)
        self.owners.append(Piece(delivery, rows, self.records))
        self.records += len(rows)
        self.nbytes += nbytes

    def add_values(self, values: tuple[Any, ...], owner: Any, nbytes: int) -> None:
        """One checked dict row (values in schema order) of a one-row send; ``owner`` is
        its future, or a :class:`Piece` of its delivery."""
        for col, v in zip(self.open_columns(len(values)), values, strict=True):
            col.append(v)
        if type(owner) is Piece:
            owner.start = self.records
            self.owners.append(owner)
        else:
            self.singles += 1
            if self.bound:
                owner.bind(self, self.records)
            else:
                self.owners.append(owner)
        self.records += 1
        self.nbytes += nbytes

    def seal(self, schema: pa.Schema, compression: Compression, encode: bool = True) -> None:
        """Make the request: one Arrow record batch with exactly the table's schema
        (column order and types), however many sends it holds, encoded as an Arrow IPC
        stream (``payload``) or, without ``encode``, kept as the batch (``arrow``).

        Raises:
            SchemaMismatch: dict rows that passed the check at ``send`` still failed to
                convert (the caller fails this batch's sends).
        """
        parts = [
            c if isinstance(c, pa.RecordBatch) else columns_to_batch(c, schema)
            for c in self.chunks
            if isinstance(c, pa.RecordBatch) or (c and c[0])  # no empty run
        ]
        if len(parts) > 1:
            parts = pa.Table.from_batches(parts, schema).combine_chunks().to_batches()
        if encode:
            self.payload = encode_stream(parts, schema, compression)
        else:
            self.arrow = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        self.chunks = []
        self.columns = None

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
        """Hand out offsets to multi-row sends; the deliveries that became complete (the
        one-row sends are resolved by :meth:`settle`)."""
        self.base_offset = base_offset
        self._answered()
        return [
            o.delivery
            for o in self.owners
            if type(o) is Piece and o.delivery.ack(o.rows, self.partition, base_offset + o.start)
        ]

    def fail(self, err: BaseException) -> list[Delivery]:
        self.error = err
        self._answered()
        return [o.delivery for o in self.owners if type(o) is Piece and o.delivery.fail(err)]

    def _answered(self) -> None:
        """The answer is final: drop the data (a future may keep the batch), publish."""
        self.payload, self.arrow = b"", None
        if self.bound:
            publish(self)

    def settle(self) -> None:
        """Resolve the futures of the one-dict sends after :meth:`complete` or :meth:`fail`
        (outside any lock: a sync future runs its callbacks at once)."""
        if self.bound:
            resolve_watched(self)
            return
        err = self.error
        partition = self.partition
        offset = self.base_offset
        owners = self.owners
        if err is None and owners and self.singles == len(owners):
            # The common case, in C loops: one RecordMetadata per future, no bytecode per
            # record. The futures of a producer are all of one type (its driver's).
            results = map(
                _new_tuple,
                repeat(RecordMetadata),
                zip(repeat(partition), range(offset, offset + len(owners))),
            )
            try:
                deque(map(type(owners[0]).set_result, owners, results), maxlen=0)
                return
            except _ALREADY_DONE:
                pass  # a future its caller cancelled: resolve the others one by one
        for o in self.owners:
            if type(o) is Piece:
                offset += len(o.rows)
                continue
            try:
                if err is None:
                    o.set_result(_new_tuple(RecordMetadata, (partition, offset)))
                else:
                    o.set_exception(err)
            except _ALREADY_DONE:
                pass
            offset += 1


class Finished:
    """Sends that answers (or failures) finished, for the driver to resolve outside its
    lock: whole multi-row deliveries, and the batches whose one-dict sends to settle."""

    __slots__ = ("batches", "deliveries")

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.batches: list[ProducerBatch] = []

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.batches)

    def acked(self, batch: ProducerBatch, base_offset: int) -> None:
        self.deliveries.extend(batch.complete(base_offset))
        if batch.singles:
            self.batches.append(batch)

    def failed(self, batch: ProducerBatch, err: BaseException) -> None:
        self.deliveries.extend(batch.fail(err))
        if batch.singles:
            self.batches.append(batch)

    def extend(self, other: Finished) -> None:
        self.deliveries.extend(other.deliveries)
        self.batches.extend(other.batches)

    def resolve(self) -> None:
        """Resolve every future (concurrent.futures or asyncio) with its outcome."""
        for b in self.batches:
            b.settle()
        for d in self.deliveries:
            fut = d.future
            if fut is None or fut.done():
                continue
            if d.error is not None:
                fut.set_exception(d.error)
            else:
                fut.set_result(d.result())


class Accumulator:
    """Routes sent rows to partitions (as the gateway would) and cuts per-partition batches.

    Rows with key columns go where :func:`gateway.wire.routing.route_by_key` sends them; rows
    without keys stick to one partition until its batch is full, then move to the next
    (Kafka's sticky partitioner), so every batch targets one partition, as idempotent
    appends must.

    Dict rows that pass :class:`~gateway.client._rows.RowPlan`'s check are kept as Python
    values, one list per column, and become Arrow once per batch, a column at a time, at
    :meth:`ProducerBatch.seal`; other data is converted (and conformed) to Arrow at once.
    """

    def __init__(self, table: TableInfo, config: ProducerConfig, *, bound: bool = False) -> None:
        """``bound``: one-dict sends' futures are bound to their batch (ProducerBatch)."""
        self.table = table
        self.config = config
        self.bound = bound
        self.plan = RowPlan(table.schema, table.key_columns, table.added_columns)
        self.width = len(table.schema)
        self.open: dict[int, ProducerBatch] = {}
        self.ready: list[ProducerBatch] = []
        self.buffered = 0
        #: Set when a batch was opened or closed: the sender has a new deadline or work.
        self.kick = False
        # Looked up once per one-dict send (add_dict).
        self._fill_row = self.plan.fill
        self._keyed = bool(self.plan.key_index)
        self._batch_records = config.batch_records
        self._batch_bytes = config.batch_bytes
        self._sticky = random.randrange(table.partitions)

    def add(self, data: Any, partition: int | None, future: Any = None) -> Delivery | None:
        """Route and buffer ``data``; returns its delivery. Validates before buffering.

        With a ``future`` for a one-dict send, the future itself stands for the send in
        its batch (:meth:`ProducerBatch.settle` resolves it) and None is returned (the
        fast path, :meth:`add_dict`, is for the caller to try first).

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
                delivery = None if future is not None else Delivery(1, True)
                owner = future if delivery is None else Piece(delivery, _ONE)
                self._append_row(partition, values, nbytes, owner)
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
                batch = self._arrow_rows(rows, check=False)
        return self._add_batch(batch, partition, single=False)

    def add_dict(self, row: dict[str, Any], partition: int | None, future: Any) -> bool:
        """The fast path of a one-dict send (see :attr:`RowPlan.fill`): True when the row
        is buffered, its ``future`` standing for it; False when the send must take the
        careful path (keys to route, a value the fill does not vouch for, a partition
        that does not exist), with nothing buffered."""
        if partition is None:
            if self._keyed:
                return False
            p = self._sticky
        elif 0 <= partition < self.table.partitions:
            p = partition
        else:
            return False
        batch = self.open.get(p)
        if batch is None:
            batch = self.open[p] = ProducerBatch(p, bound=self.bound)
        cols = batch.columns
        if cols is None:
            cols = batch.open_columns(self.width)
        size = self._fill_row(row, cols)
        if size < 0:
            if not batch.records:
                del self.open[p]
            return False
        records = batch.records
        if records and batch.nbytes + size > self._batch_bytes:
            # Over the byte limit: the row goes to the next batch (its partition's, or the
            # next sticky partition's), after this one is cut.
            for col in cols:
                col.pop()
            self._close(p)
            return self.add_dict(row, partition, future)
        if not records:
            self.kick = True
        if self.bound:  # SendFuture.bind, inlined
            future._batch, future._index = batch, records
        else:
            batch.owners.append(future)
        batch.singles += 1
        batch.records = records = records + 1
        batch.nbytes += size
        self.buffered += 1
        if records >= self._batch_records or batch.nbytes >= self._batch_bytes:
            self._close(p)
        return True

    def _arrow_rows(self, rows: Sequence[Any], *, check: bool = True) -> pa.RecordBatch:
        """Dict rows the Python check could not vouch for, converted as every interface
        converts them (:func:`~gateway.wire.jsonrows.python_rows_to_batch`: the JSON forms
        of values too, decimals made exact before Arrow sees them)."""
        if check:
            for row in rows:
                self.plan.check_columns(row)
        return python_rows_to_batch(rows, self.table.schema, omittable=self.table.added_columns)

    def _check_partition(self, partition: int | None) -> None:
        if partition is not None and not 0 <= partition < self.table.partitions:
            raise InvalidPartition(
                f"partition {partition} does not exist in {self.table.ref}, which has "
                f"partitions 0..{self.table.partitions - 1}",
                partitions=self.table.partitions,
            )

    def _add_batch(self, batch: pa.RecordBatch, partition: int | None, single: bool) -> Delivery:
        batch = conform_batch(batch, self.table.schema, self.table.added_columns)
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
        self, partition: int | None, values: tuple[Any, ...], nbytes: int, owner: Any
    ) -> None:
        """:meth:`_append` of a single checked dict row (``owner``: its future or piece)."""
        config = self.config
        while True:
            p = self._sticky if partition is None else partition
            current = self.open.get(p)
            if current is None:
                current = self.open[p] = ProducerBatch(p, bound=self.bound)
                self.kick = True
            elif current.records and current.nbytes + nbytes > config.batch_bytes:
                self._close(p)
                continue
            break
        current.add_values(values, owner, nbytes)
        if current.records >= config.batch_records or current.nbytes >= config.batch_bytes:
            self._close(p)

    def _append(
        self,
        partition: int | None,
        data: pa.RecordBatch | list[tuple[Any, ...]],
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
                current = self.open[p] = ProducerBatch(p, bound=self.bound)
                self.kick = True
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
            self.kick = True
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
