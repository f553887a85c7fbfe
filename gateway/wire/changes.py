"""Primary-key tables, pure: change kinds, merge engines and the current state changes make.

A primary-key table's log is its changelog: every record is one change of one key, with
its kind in the system column ``_change`` (int8, the codes of Flink's ``RowKind``):

    code  kind            short  what the row holds
    0     insert          +I     the key's first live row
    1     update_before   -U     the row an update replaced (its full old values)
    2     update_after    +U     the row that replaced it
    3     delete          -D     the row a delete removed (its full old values)

A write names only what it wants: an upsert (``+I`` or ``+U``, the gateway decides which)
or a delete (``-D``, of which only the key counts); :func:`changelog` turns a batch of writes
into the changes they make against the rows the keys held before, under the table's
**merge engine** (:class:`LastRow`, the default, :class:`FirstRow`, :class:`Versioned`,
:class:`PartialUpdate`). A delete removes its key under every engine.

:func:`current_rows` folds changes (writes or a changelog) into the latest live row per key,
and :func:`merge_snapshot` does so on top of a pinned snapshot's current-state rows: the
scan of a primary-key table. All three are vectorised with Arrow and numpy over the whole
batch; the order of rows stands for the order of offsets.

Nothing here does I/O (docs/decisions/primary-keys.md says where each piece runs).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.errors import InvalidSchema, SchemaMismatch

__all__ = [
    "CHANGE_COLUMN",
    "CHANGE_TYPE",
    "MAX_KEY_COLUMNS",
    "Change",
    "FirstRow",
    "LastRow",
    "MergeEngine",
    "PartialUpdate",
    "PrimaryKey",
    "Versioned",
    "changelog",
    "check_primary_key",
    "current_rows",
    "delete_rows",
    "engine_from_json",
    "engine_to_json",
    "merge_snapshot",
]

CHANGE_COLUMN = "_change"
CHANGE_TYPE = pa.int8()
#: Columns a primary key may have (Iceberg's identifier fields; routing hashes them all).
MAX_KEY_COLUMNS = 16


class Change(enum.IntEnum):
    """The kind of a change, by its code in ``_change``."""

    INSERT = 0
    UPDATE_BEFORE = 1
    UPDATE_AFTER = 2
    DELETE = 3

    @property
    def short(self) -> str:
        """``+I``, ``-U``, ``+U`` or ``-D``, as Flink and Fluss print a change."""
        return ("+I", "-U", "+U", "-D")[self.value]


# --------------------------------------------------------------------------------------
# Merge engines
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LastRow:
    """The latest write of a key wins (by offset): the default."""

    name: ClassVar[str] = "last_row"


@dataclass(frozen=True)
class FirstRow:
    """The first write of a key wins; later upserts of a live key change nothing."""

    name: ClassVar[str] = "first_row"


@dataclass(frozen=True)
class Versioned:
    """The write with the highest ``column`` wins; of equal versions the later offset."""

    column: str
    name: ClassVar[str] = "versioned"


@dataclass(frozen=True)
class PartialUpdate:
    """An upsert sets the columns it holds a value for; a null keeps the current value."""

    name: ClassVar[str] = "partial_update"


MergeEngine: TypeAlias = LastRow | FirstRow | Versioned | PartialUpdate
_ENGINES: dict[str, MergeEngine] = {e.name: e for e in (LastRow(), FirstRow(), PartialUpdate())}
_ENGINE_NAMES = "last_row, first_row, versioned (with a column) or partial_update"


def engine_to_json(engine: MergeEngine) -> dict[str, str]:
    """``{"type": name}``, and ``"column"`` for :class:`Versioned`."""
    if isinstance(engine, Versioned):
        return {"type": engine.name, "column": engine.column}
    return {"type": engine.name}


def engine_from_json(value: object) -> MergeEngine:
    """A merge engine from its name or its JSON form (:func:`engine_to_json`).

    Raises:
        InvalidSchema: not a merge engine.
    """
    if isinstance(value, str):
        value = {"type": value}
    if isinstance(value, Mapping) and value.get("column") == "":
        value = {k: v for k, v in value.items() if k != "column"}  # protobuf's unset
    if not isinstance(value, Mapping):
        raise InvalidSchema(f"a merge engine is a name or an object; {_ENGINE_NAMES} is accepted")
    name = value.get("type")
    extra = set(value) - {"type", "column"}
    if extra:
        raise InvalidSchema(
            f"a merge engine takes 'type' and, for versioned, 'column'; "
            f"{sorted(map(str, extra))[0]!r:.80} is not one"
        )
    if name == Versioned.name:
        column = value.get("column")
        if not isinstance(column, str) or not column:
            raise InvalidSchema("the versioned merge engine needs 'column', the version column")
        return Versioned(column)
    engine = _ENGINES.get(name) if isinstance(name, str) else None
    if engine is None:
        raise InvalidSchema(f"merge engine {name!r:.80} is unknown; {_ENGINE_NAMES} is accepted")
    if "column" in value:
        raise InvalidSchema(f"merge engine {name!r} takes no column; only versioned does")
    return engine


# --------------------------------------------------------------------------------------
# The declaration
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrimaryKey:
    """A table's primary key (its columns, in order) and its merge engine."""

    columns: tuple[str, ...]
    engine: MergeEngine = LastRow()


_KEY_TYPES = "an integer, string, binary, bool, date32, time64[us], timestamp or decimal128"
_VERSION_TYPES = "an integer, date32 or timestamp"


def _key_type(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date32(t)
        or pa.types.is_time64(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_decimal(t)
    )


def _version_type(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t))


def check_primary_key(schema: pa.Schema, key: PrimaryKey, routing: Sequence[str] = ()) -> pa.Schema:
    """``schema`` with ``key``'s columns made non-null (a primary key implies NOT NULL,
    as in SQL and Fluss), once the declaration is checked against it.

    Args:
        schema: the table's user schema.
        key: the declared primary key and merge engine.
        routing: the table's key columns for routing, if declared: a part of the primary
            key (all of it when empty), so every version of a key meets in one partition.

    Raises:
        InvalidSchema: one sentence naming the column and what is accepted.
    """
    names = set(schema.names)
    if not key.columns:
        raise InvalidSchema("a primary key names at least one column")
    if len(key.columns) > MAX_KEY_COLUMNS:
        raise InvalidSchema(
            f"the primary key names {len(key.columns)} columns; at most {MAX_KEY_COLUMNS} "
            "are accepted"
        )
    seen: set[str] = set()
    for c in key.columns:
        if c not in names:
            raise InvalidSchema(
                f"primary key column {c!r:.80} is not a column of the schema; "
                f"a key names columns of the table"
            )
        if c in seen:
            raise InvalidSchema(f"primary key column {c!r} is named twice")
        seen.add(c)
        t = schema.field(c).type
        if not _key_type(t):
            raise InvalidSchema(
                f"primary key column {c!r} is {t}; a key column is {_KEY_TYPES} "
                "(floats compare unreliably and nested values have no order)"
            )
    for c in routing:
        if c not in seen:
            raise InvalidSchema(
                f"key column {c!r:.80} is not in the primary key ({', '.join(key.columns)}); "
                "a primary-key table routes by its key or a part of it, so that every "
                "version of a key meets in one partition"
            )
    engine = key.engine
    if isinstance(engine, Versioned):
        c = engine.column
        if c not in names:
            raise InvalidSchema(f"version column {c!r:.80} is not a column of the schema")
        if c in seen:
            raise InvalidSchema(
                f"version column {c!r} is in the primary key; the version is a column "
                "that changes between writes of a key"
            )
        t = schema.field(c).type
        if not _version_type(t):
            raise InvalidSchema(f"version column {c!r} is {t}; a version is {_VERSION_TYPES}")
    if isinstance(engine, PartialUpdate):
        for f in schema:
            if f.name not in seen and not f.nullable:
                raise InvalidSchema(
                    f"column {f.name!r} is not nullable; the partial_update merge engine "
                    "needs every column outside the key nullable, since a null keeps the "
                    "current value"
                )
    return pa.schema(
        [f.with_nullable(False) if f.name in seen else f for f in schema], metadata=schema.metadata
    )


def delete_rows(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """Writes that delete ``keys`` (a table of the key's columns) from a table of
    ``schema``: the key's values, nulls elsewhere and ``_change`` = ``-D``.

    Raises:
        SchemaMismatch: a key column is missing from ``keys``.
    """
    n = keys.num_rows
    columns: list[pa.Array | pa.ChunkedArray] = []
    for f in schema:
        if f.name in keys.column_names:
            columns.append(keys.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    columns.append(pa.array(np.full(n, Change.DELETE, np.int8), CHANGE_TYPE))
    fields = [f.with_nullable(True) for f in schema]
    return pa.table(columns, schema=pa.schema([*fields, pa.field(CHANGE_COLUMN, CHANGE_TYPE)]))


# --------------------------------------------------------------------------------------
# Current state
# --------------------------------------------------------------------------------------
def current_rows(changes: pa.Table, key: PrimaryKey) -> pa.Table:
    """The latest live row per key after ``changes`` (in offset order), under ``key``'s
    engine: writes or a changelog alike (``-U`` rows are before-images and count for
    nothing; without ``_change`` every row is an upsert). Rows come in the order of each
    key's last change, with ``changes``' columns less ``_change``.

    Raises:
        SchemaMismatch: a key column is missing or null, a version is null, or
            ``_change`` holds a code that is not a change.
    """
    kinds = _kinds(changes, writes=False)
    pool = _without_change(changes)
    keep = kinds != Change.UPDATE_BEFORE
    if not keep.all():
        pool = pool.filter(pa.array(keep))
        kinds = kinds[keep]
    return _Resolution(pool, kinds, key).latest()


def merge_snapshot(snapshot: pa.Table, changes: pa.Table, key: PrimaryKey) -> pa.Table:
    """``snapshot``'s current-state rows (one live row per key) with ``changes`` above it
    applied, under ``key``'s engine: the current state a scan returns. Rows of keys no
    change touched come first in the snapshot's order, then the changed keys' rows in the
    order of their last change, in ``snapshot``'s schema.

    Raises:
        SchemaMismatch: as :func:`current_rows`, or ``changes`` lacks a column of
            ``snapshot``.
    """
    if changes.num_rows == 0:
        return snapshot
    relaxed = _relaxed(snapshot.schema)
    missing = [c for c in snapshot.column_names if c not in changes.column_names]
    if missing:
        raise SchemaMismatch(f"the changes have no column {missing[0]!r} of the snapshot")
    kinds = np.concatenate(
        [np.full(snapshot.num_rows, Change.INSERT, np.int8), _kinds(changes, writes=False)]
    )
    pool = pa.concat_tables(
        [snapshot.cast(relaxed), changes.select(snapshot.column_names).cast(relaxed)]
    )
    keep = kinds != Change.UPDATE_BEFORE
    if not keep.all():
        pool = pool.filter(pa.array(keep))
        kinds = kinds[keep]
    return _Resolution(pool, kinds, key).latest().cast(snapshot.schema)


def changelog(writes: pa.Table, previous: pa.Table, key: PrimaryKey) -> pa.Table:
    """The changes ``writes`` (upserts and deletes, in order) make to a table whose keys
    held ``previous`` (their live rows, at most one per key; keys absent from it are not
    live), under ``key``'s engine, in the order of the writes that made them (``-U``
    before its ``+U``): ``writes``' columns less ``_change``, then ``_change``.

    An upsert of a key that is not live makes ``+I``; of a live key ``-U`` (the old row)
    and ``+U`` (the new one, merged under partial update), or nothing where the engine
    keeps the old row (first_row; versioned with a lower version). A delete of a live key
    makes ``-D`` with the old row; of a key that is not live, nothing.

    Raises:
        SchemaMismatch: as :func:`current_rows`, a write of ``-U``, or ``previous`` lacks
            a column of ``writes``.
    """
    kinds = _kinds(writes, writes=True)
    rows = _without_change(writes)
    missing = [c for c in rows.column_names if c not in previous.column_names]
    if missing:
        raise SchemaMismatch(f"the previous rows have no column {missing[0]!r} of the writes")
    relaxed = _relaxed(rows.schema)
    n_prev = previous.num_rows
    pool = pa.concat_tables([previous.select(rows.column_names).cast(relaxed), rows.cast(relaxed)])
    kinds = np.concatenate([np.full(n_prev, Change.INSERT, np.int8), kinds])
    r = _Resolution(pool, kinds, key)
    j = np.arange(r.n)
    is_write = r.order >= n_prev
    live_before = ~r.seg_start
    deleted = is_write & ~r.upsert & live_before
    inserted = is_write & r.upsert & ~live_before
    updated = is_write & r.upsert & live_before
    engine = key.engine
    if isinstance(engine, FirstRow):
        updated &= False
    elif isinstance(engine, Versioned):
        prior = np.maximum(j - 1, 0)
        updated &= r.after[j] != r.after[prior]
    parts = [  # (sorted positions whose write made the change, state at, kind, sub-order)
        (j[deleted], j[deleted] - 1, Change.DELETE, 0),
        (j[inserted], j[inserted], Change.INSERT, 0),
        (j[updated], j[updated] - 1, Change.UPDATE_BEFORE, 0),
        (j[updated], j[updated], Change.UPDATE_AFTER, 1),
    ]
    made_by = np.concatenate([r.order[p[0]] for p in parts])
    state_at = np.concatenate([p[1] for p in parts])
    kind = np.concatenate([np.full(len(p[0]), p[2], np.int8) for p in parts])
    sub = np.concatenate([np.full(len(p[0]), p[3], np.int8) for p in parts])
    out = np.lexsort((sub, made_by))
    changed = r.rows_at(state_at[out])
    changed = changed.append_column(
        pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False), pa.array(kind[out], CHANGE_TYPE)
    )
    return changed


# --------------------------------------------------------------------------------------
# The fold, vectorised
# --------------------------------------------------------------------------------------
class _Resolution:
    """Each change of ``pool`` (rows in offset order, ``kinds`` their codes: upserts and
    deletes only) with the state of its key after it, under an engine.

    Rows are sorted by key, then offset (``order``: sorted position -> pool row). A key's
    changes split into *segments*, each ending at a delete: a segment's first change finds
    its key not live, every later one finds it live. ``after[j]`` is the pool row the key's
    state is after the change at sorted position ``j`` (-1 after a delete); under partial
    update ``column_after[c][j]`` is the pool row column ``c``'s value comes from (-1: null).
    """

    def __init__(self, pool: pa.Table, kinds: np.ndarray, key: PrimaryKey) -> None:
        self.pool = pool
        self.key = key
        n = self.n = pool.num_rows
        ids = _key_ids(pool, key.columns)
        self.order = np.lexsort((np.arange(n), ids))
        sorted_ids = ids[self.order]
        is_delete = kinds[self.order] == Change.DELETE
        self.upsert = ~is_delete
        self.group_start = np.ones(n, bool)
        self.group_start[1:] = sorted_ids[1:] != sorted_ids[:-1]
        self.seg_start = self.group_start.copy()
        self.seg_start[1:] |= is_delete[:-1]
        self.seg = np.cumsum(self.seg_start) - 1
        j = np.arange(n)
        engine = key.engine
        if isinstance(engine, FirstRow):
            after = np.flatnonzero(self.seg_start)[self.seg]
        elif isinstance(engine, Versioned):
            version = _versions(pool, engine.column, kinds)[self.order]
            by_version = np.lexsort((self.order, version))  # rank -> sorted position
            rank = np.empty(n, np.int64)
            rank[by_version] = j
            best = self._running_max(np.where(self.upsert, rank, -1))
            after = by_version[np.maximum(best, 0)]
        else:
            after = j
        self.after = np.where(self.upsert, after, -1)
        self.column_after: dict[str, np.ndarray] = {}
        if isinstance(engine, PartialUpdate):
            for name in pool.column_names:
                if name in key.columns:
                    continue
                valid = _validity(pool.column(name))[self.order] & self.upsert
                self.column_after[name] = self._running_max(np.where(valid, j, -1))

    def _running_max(self, values: np.ndarray) -> np.ndarray:
        """Per segment, the running maximum of ``values`` (each in ``[-1, n)``)."""
        base = self.seg * (self.n + 1)
        found: np.ndarray = np.maximum.accumulate(base + values + 1) - base - 1
        return found

    def latest(self) -> pa.Table:
        """The live state of each key after its last change, by that change's offset."""
        last = np.flatnonzero(np.append(self.group_start[1:], self.n > 0))
        live = last[self.upsert[last]]
        return self.rows_at(live[np.argsort(self.order[live], kind="stable")])

    def rows_at(self, positions: np.ndarray) -> pa.Table:
        """The state after the changes at sorted ``positions``, one row each."""
        rows = self._pool_rows(self.after[positions])
        indices = pa.array(rows, pa.int64(), mask=rows < 0)
        if not self.column_after:
            return self.pool.take(indices)
        columns = []
        for name in self.pool.column_names:
            found = self.column_after.get(name)
            if found is None:
                columns.append(self.pool.column(name).take(indices))
            else:
                at = self._pool_rows(found[positions])
                columns.append(self.pool.column(name).take(pa.array(at, pa.int64(), mask=at < 0)))
        return pa.table(columns, schema=self.pool.schema)

    def _pool_rows(self, sorted_positions: np.ndarray) -> np.ndarray:
        return np.where(sorted_positions >= 0, self.order[np.maximum(sorted_positions, 0)], -1)


def _key_ids(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """A dense id per row, equal for rows with equal key values.

    Raises:
        SchemaMismatch: a key column is missing or holds a null.
    """
    ids = np.zeros(table.num_rows, np.int64)
    for name in columns:
        if name not in table.column_names:
            raise SchemaMismatch(f"the rows have no primary key column {name!r}")
        column = table.column(name).combine_chunks()
        if column.null_count:
            row = int(np.flatnonzero(~_validity(column))[0])
            raise SchemaMismatch(
                f"primary key column {name!r} is null in row {row}; every row of a "
                "primary-key table names its key"
            )
        if pa.types.is_boolean(column.type):
            column = pc.cast(column, pa.int8())
        encoded = pc.dictionary_encode(column)
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64)
        ids = ids * len(encoded.dictionary) + codes
        ids = np.unique(ids, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return ids


def _versions(pool: pa.Table, name: str, kinds: np.ndarray) -> np.ndarray:
    """The version of each row as int64 (deletes' versions do not count).

    Raises:
        SchemaMismatch: the column is missing, or an upsert's version is null.
    """
    if name not in pool.column_names:
        raise SchemaMismatch(f"the rows have no version column {name!r}")
    column = pool.column(name).combine_chunks()
    valid = _validity(column)
    bad = ~valid & (kinds != Change.DELETE)
    if bad.any():
        raise SchemaMismatch(
            f"version column {name!r} is null in row {int(np.flatnonzero(bad)[0])}; "
            "every upsert of a versioned table carries its version"
        )
    if pa.types.is_date32(column.type):
        column = pc.cast(column, pa.int32())
    values = pc.fill_null(pc.cast(column, pa.int64()), 0)
    return np.asarray(values.to_numpy(zero_copy_only=False), np.int64)


def _kinds(rows: pa.Table, *, writes: bool) -> np.ndarray:
    """The change code of each row (an upsert where ``_change`` is absent).

    Raises:
        SchemaMismatch: a code that is not a change, or ``-U`` in writes.
    """
    if CHANGE_COLUMN not in rows.column_names:
        return np.full(rows.num_rows, Change.INSERT, np.int8)
    column = rows.column(CHANGE_COLUMN).combine_chunks()
    if not pa.types.is_integer(column.type):
        raise SchemaMismatch(
            f"column {CHANGE_COLUMN!r} is {column.type}; it holds a change's code as int8 "
            "(0 insert, 1 update-before, 2 update-after, 3 delete)"
        )
    codes = np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), np.int64)
    allowed = (
        (codes == Change.INSERT) | (codes == Change.UPDATE_AFTER) | (codes == Change.DELETE)
        if writes
        else (codes >= 0) & (codes <= Change.DELETE)
    )
    if not allowed.all():
        row = int(np.flatnonzero(~allowed)[0])
        accepted = (
            "0 or 2 (upsert) and 3 (delete) in a write"
            if writes
            else "0 to 3 (insert, update-before, update-after, delete)"
        )
        raise SchemaMismatch(
            f"column {CHANGE_COLUMN!r} holds {column[row].as_py()!r} in row {row}; "
            f"{accepted} is accepted"
        )
    return codes.astype(np.int8)


def _without_change(rows: pa.Table) -> pa.Table:
    if CHANGE_COLUMN in rows.column_names:
        return rows.drop_columns([CHANGE_COLUMN])
    return rows


def _relaxed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable (a delete's row holds its key only)."""
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


def _validity(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count == 0:
        return np.ones(len(column), bool)
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
