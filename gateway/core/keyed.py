"""Primary-key tables in the core: a write's rows checked, and resolved against the hot
tier into the changes they make (docs/decisions/primary-keys.md).

An append to a key table goes through :func:`check_writes` once (before any partition is
written), then, per partition, :func:`resolve`: the hot key index gives the offset of each
written key's last change, those records are read back from the hot tier (a ``-D`` there
means the key is not live), and :func:`~gateway.wire.changes.changelog` turns the writes
into ``+I``, ``-U``/``+U`` and ``-D`` under the table's merge engine. The caller appends
the changes with the keys and ``expect_high`` set to the high watermark the resolution
saw, and resolves again when another append landed meanwhile.

A key the hot index does not answer changed last below the partition's hot low mark, or
never: once the hot tier has been trimmed (below the state table's ``A(p)`` only), such
keys are looked up in the state table (``state``, :meth:`CoreBase._state_lookup`), so an
update of a key whose last row is only in Iceberg carries that row in its ``-U``.

Nothing here knows a backend: it talks to :class:`~gateway.hot.HotLog`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.core.base import CoreBase
from gateway.core.recent import RecentBatches
from gateway.hot import HotLog, PartitionId
from gateway.hot.base import high_moved
from gateway.wire.changes import (
    CHANGE_COLUMN,
    Change,
    PrimaryKey,
    Versioned,
    changelog,
)
from gateway.wire.codec import decode_batch
from gateway.wire.errors import HighWatermarkMoved, OffsetOutOfRange, SchemaMismatch, Unavailable
from gateway.wire.evolution import read_as
from gateway.wire.routing import key_bytes, route_by_key
from gateway.wire.schema import conform_batch, system_schema, with_system_columns

__all__ = ["LookupOps", "Resolved", "StateRows", "check_writes", "lookup", "resolve", "row_keys"]

_WRITE_CODES = "0 or 2 (upsert) and 3 (delete)"
#: The live rows the state table holds for keys the hot tier does not: ``(partition,
#: keys (a table of the key's columns), the hot low mark read after asking the index)``
#: -> rows with the user and system columns.
StateRows = Callable[[PartitionId, pa.Table, int], pa.Table]
#: A lookup whose hot records were trimmed under it asks again this many times.
_LOOKUP_TRIES = 8


@dataclass(frozen=True, slots=True)
class Resolved:
    """The changes a partition's writes make, the key of each change (its routing bytes,
    for the hot key index) and the high watermark the resolution saw."""

    changes: pa.Table
    keys: list[bytes]
    high: int
    #: The incarnation of the partition's hot state the resolution read
    #: (:meth:`~gateway.hot.HotLog.key_offsets`).
    incarnation: str | None = None


def row_keys(rows: pa.Table | pa.RecordBatch, key: PrimaryKey) -> list[bytes]:
    """Each row's key as the hot key index holds it."""
    return key_bytes([rows.column(c) for c in key.columns])


def check_writes(rows: pa.Table, schema: pa.Schema, key: PrimaryKey) -> None:
    """Refuse, before anything is written, a write a key table cannot take: a ``_change``
    that is not 0, 2 or 3, a null in an upsert's non-nullable column (``schema``, the
    table's user schema; a delete needs its key only) or in its version column.

    Raises:
        SchemaMismatch: one sentence naming the column, the row and what is accepted.
    """
    kinds = write_kinds(rows)
    upsert = kinds != Change.DELETE
    must = [f.name for f in schema if not f.nullable and f.name not in key.columns]
    if isinstance(key.engine, Versioned):
        must.append(key.engine.column)
    for name in must:
        column = rows.column(name)
        if not column.null_count:
            continue
        nulls = np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), bool) & upsert
        if nulls.any():
            row = int(np.flatnonzero(nulls)[0])
            why = (
                "every upsert of a versioned table carries its version"
                if isinstance(key.engine, Versioned) and name == key.engine.column
                else "the column is not nullable (only a delete, _change 3, may leave it null)"
            )
            raise SchemaMismatch(f"row {row}.{name} is null in an upsert; {why}", column=name)


def write_kinds(rows: pa.Table) -> np.ndarray:
    """The change code of each write: 0 (an upsert) where ``_change`` is absent or null.

    Raises:
        SchemaMismatch: a code other than 0, 2 or 3 (1, update-before, is what the
            gateway writes, never a writer).
    """
    if CHANGE_COLUMN not in rows.column_names:
        return np.zeros(rows.num_rows, np.int8)
    column = rows.column(CHANGE_COLUMN)
    codes = np.asarray(pc.fill_null(column, 0).to_numpy(zero_copy_only=False), np.int64)
    bad = (codes != Change.INSERT) & (codes != Change.UPDATE_AFTER) & (codes != Change.DELETE)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise SchemaMismatch(
            f"row {row}.{CHANGE_COLUMN} is {int(codes[row])}; a write's {CHANGE_COLUMN} is "
            f"{_WRITE_CODES}, since update-before rows (1) are made by the gateway",
            column=CHANGE_COLUMN,
        )
    return codes.astype(np.int8)


def resolve(
    hot: HotLog,
    part: PartitionId,
    writes: pa.Table,
    key: PrimaryKey,
    log_schema: pa.Schema,
    recent: RecentBatches | None = None,
    state: StateRows | None = None,
) -> Resolved:
    """The changes ``writes`` (checked by :func:`check_writes`, in the table's write
    schema) make to the partition as its hot tier holds it now, and its state table for
    the keys the hot tier no longer holds.

    Raises:
        HighWatermarkMoved: an append landed while the previous rows were looked up
            (resolve again).
        Unavailable: the hot tier cannot be reached.
    """
    if CHANGE_COLUMN in writes.column_names and writes.column(CHANGE_COLUMN).null_count:
        at = writes.column_names.index(CHANGE_COLUMN)
        kinds = pc.fill_null(writes.column(CHANGE_COLUMN), pa.scalar(0, pa.int8()))
        writes = writes.set_column(at, CHANGE_COLUMN, kinds)  # null: an upsert
    keys = row_keys(writes, key)
    asked = list(dict.fromkeys(keys))
    high = hot.offsets(part).high
    found, incarnation = _key_offsets(hot, part, asked, recent)
    offsets = sorted({o for o in found if o is not None})
    if offsets and offsets[-1] >= high:
        raise high_moved(part, high, offsets[-1] + 1)
    user = [n for n in writes.column_names if n != CHANGE_COLUMN]
    try:
        previous = _rows_at(hot, part, offsets, log_schema, user, recent, incarnation)
    except OffsetOutOfRange:
        # Trimmed meanwhile: the index answers afresh (the key then falls through).
        raise high_moved(part, high, -1) from None
    cold = _not_hot(hot, part, writes, keys, found_by(asked, found), key, state)
    if cold is not None and cold.num_rows:
        previous = pa.concat_tables([previous, cold.select(user).cast(previous.schema)])
    changes = changelog(writes, previous, key)
    return Resolved(changes, row_keys(changes, key) if changes.num_rows else [], high, incarnation)


def _key_offsets(
    hot: HotLog, part: PartitionId, asked: Sequence[bytes], recent: RecentBatches | None
) -> tuple[list[int | None], str | None]:
    """The hot index's answer for ``asked``, with the incarnation it was read in, which
    ``recent`` is told of (it drops what it kept of another)."""
    found, incarnation = hot.key_offsets(part, asked)
    if recent is not None:
        recent.observe(part, incarnation)
    return found, incarnation


def found_by(asked: Sequence[bytes], found: Sequence[int | None]) -> dict[bytes, int | None]:
    return dict(zip(asked, found, strict=True))


def _not_hot(
    hot: HotLog,
    part: PartitionId,
    rows: pa.Table,
    keys: Sequence[bytes],
    found: dict[bytes, int | None],
    key: PrimaryKey,
    state: StateRows | None,
) -> pa.Table | None:
    """The state table's rows of the keys of ``rows`` (``keys``: each row's key bytes)
    that the hot index did not answer (``found``), when the partition's hot tier was ever
    trimmed, or holds nothing; None when none is to be asked (a partition never trimmed
    holds every key's last change hot). A hot tier that holds nothing may have lost its
    state (a Redis emptied, a disk partition removed) and not been re-seeded yet (that
    happens at the next append): its keys may be in the state table."""
    if state is None or all(o is not None for o in found.values()):
        return None
    marks = hot.offsets(part)
    low = marks.low
    if low <= 0 and marks.high > 0:
        return None
    first: dict[bytes, int] = {}
    for i, k in enumerate(keys):
        if found.get(k, 0) is None and k not in first:
            first[k] = i
    picked = rows.select(list(key.columns)).take(pa.array(list(first.values()), pa.int64()))
    return state(part, picked, low)


def _rows_at(
    hot: HotLog,
    part: PartitionId,
    offsets: Sequence[int],
    log_schema: pa.Schema,
    columns: Sequence[str],
    recent: RecentBatches | None = None,
    incarnation: str | None = None,
) -> pa.Table:
    """The live rows the changes at ``offsets`` (each a key's last change) left: the
    record at each offset unless it is a delete, in ``columns`` (user or system columns).
    One read per stored batch that holds an offset and ``recent`` does not (a batch read
    is kept there as one of the hot state's ``incarnation``)."""
    pieces: list[pa.RecordBatch] = []
    batch: pa.RecordBatch | None = None
    base = end = 0
    wanted: list[int] = []

    def flush() -> None:
        if batch is not None and wanted:
            pieces.append(batch.take(pa.array(np.asarray(wanted, np.int64) - base)))

    for off in offsets:
        if batch is None or not base <= off < end:
            flush()
            wanted = []
            held = recent.find(part, off) if recent is not None else None
            if held is None:
                stored = hot.read(part, off, 1, 1)
                if not stored or not stored[0].base_offset <= off < stored[0].next_offset:
                    raise high_moved(part, off, -1)
                sb = stored[0]
                held = sb.base_offset, decode_batch(sb.payload), sb.timestamp_us
                if recent is not None:
                    recent.add(part, *held, incarnation)
            base, raw, ts = held
            rows = read_as(raw, log_schema, strict=False)
            batch = with_system_columns(rows, part.partition, base, ts)
            end = base + batch.num_rows
        wanted.append(off)
    flush()
    full = system_schema(log_schema)
    schema = pa.schema([full.field(c).with_nullable(True) for c in columns])
    if not pieces:
        return schema.empty_table()
    rows = pa.Table.from_batches(pieces)
    live = pc.not_equal(rows.column(CHANGE_COLUMN), pa.scalar(int(Change.DELETE), pa.int8()))
    return rows.filter(live).select(list(columns)).cast(schema)


def lookup(
    hot: HotLog,
    part: PartitionId,
    keys: pa.Table,
    key: PrimaryKey,
    log_schema: pa.Schema,
    recent: RecentBatches | None = None,
    state: StateRows | None = None,
) -> pa.Table:
    """The live rows of ``keys`` (a table of the key's columns, all routed to ``part``),
    with the system columns of the change that made each: those the hot index answers
    from the hot tier, in offset order, then those it does not from the state table
    (``state``); keys not live are left out.

    Raises:
        Unavailable: the hot tier kept trimming the records asked for.
    """
    names = [n for n in system_schema(log_schema).names if n != CHANGE_COLUMN]
    each = row_keys(keys, key)
    asked = list(dict.fromkeys(each))
    for _ in range(_LOOKUP_TRIES):
        found, incarnation = _key_offsets(hot, part, asked, recent)
        offsets = sorted({o for o in found if o is not None})
        try:
            rows = _rows_at(hot, part, offsets, log_schema, names, recent, incarnation)
        except (OffsetOutOfRange, HighWatermarkMoved):
            continue  # trimmed under the lookup: the index answers afresh
        cold = _not_hot(hot, part, keys, each, found_by(asked, found), key, state)
        if cold is not None and cold.num_rows:
            rows = pa.concat_tables([rows, cold.select(names).cast(rows.schema)])
        return rows
    raise Unavailable(
        f"partition {part.partition}'s hot tier kept trimming the keys looked up; try again",
        retry_after_ms=50,
    )


class LookupOps(CoreBase):
    async def get(self, tenant: str, namespace: str, name: str, keys: pa.Table) -> pa.Table:
        """Point lookups of a primary-key table: the live row of each of ``keys`` (a
        table of the key's columns, in the key's types or ones that widen to them), with
        the system columns of the change that made it; keys not live are left out. From
        the hot tier's key index, one lookup per partition the keys route to, and the
        state table for keys no longer hot (the rows come partition by partition).

        Raises:
            TableNotFound, SchemaMismatch: the table has no primary key, or ``keys``
                does not hold exactly the key's columns.
        """
        table = await self.table(tenant, namespace, name)
        d = table.definition
        pk = d.primary_key
        if pk is None:
            raise SchemaMismatch(
                f"table {namespace}.{name} has no primary key; only a key table answers get"
            )
        if sorted(keys.column_names) != sorted(pk.columns):
            raise SchemaMismatch(
                f"the keys name {sorted(keys.column_names)}; a key of {namespace}.{name} "
                f"names exactly its primary key columns {list(pk.columns)}"
            )
        key_schema = pa.schema([table.schema.field(c) for c in pk.columns])
        typed = pa.Table.from_batches(
            [conform_batch(b, key_schema) for b in keys.to_batches() if b.num_rows], key_schema
        )
        out_schema = pa.schema(
            [f for f in table.stored_schema if f.name != CHANGE_COLUMN],
        )

        state = self._state_lookup(table)

        def run() -> pa.Table:
            found: list[pa.Table] = []
            if typed.num_rows:
                batch = typed.combine_chunks().to_batches()[0]
                routes = route_by_key(batch, d.key_columns, d.partitions)
                for p, idx in sorted(routes.items()):
                    part = PartitionId(d.tenant, d.table_id, p)
                    rows = lookup(
                        self.hot,
                        part,
                        typed.take(idx),
                        pk,
                        table.log_schema,
                        self._recent,
                        state,
                    )
                    found.append(rows.cast(out_schema))
            return pa.concat_tables(found) if found else out_schema.empty_table()

        return await self._run(run)
