"""Schema evolution: the changes a table's schema admits, checked and applied to its JSON
fields, and how rows stored under an older schema read under a newer one.

A change is an object ``{"op": ..., "column": ..., ...}``:

======================  ==========================================  ===================
op                      what it does                                keys
======================  ==========================================  ===================
``add_column``          add a nullable column at the end            ``type``, ``doc``?
``update_type``         widen ``int32`` to ``int64`` or             ``type``
                        ``float32`` to ``float64``
``make_optional``       let a required column hold nulls            --
``update_doc``          set (or clear, with ``null``) the doc       ``doc``
======================  ==========================================  ===================

Every one of them keeps every stored row readable as it is (Iceberg's rule for schema
evolution without rewriting data files): older rows read the added column as null and
widened values as the wider type. Anything else (dropping, renaming, narrowing or
retyping a column, making a column required, adding a required one) is refused with
:class:`~gateway.wire.errors.SchemaChangeRefused` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.wire.errors import InvalidSchema, SchemaChangeRefused
from gateway.wire.schema import (
    MAX_COLUMNS,
    check_column_name,
    check_doc,
    check_unambiguous,
    format_type,
    parse_fields,
    parse_type,
)

__all__ = ["ACCEPTED", "MAX_CHANGES", "OPS", "StaleSchema", "apply_changes", "read_as"]

#: The ops, with the aliases a user may reach for first.
OPS = {
    "add_column": "add_column",
    "update_type": "update_type",
    "widen": "update_type",
    "make_optional": "make_optional",
    "update_doc": "update_doc",
    "set_doc": "update_doc",
}
#: Changes per request.
MAX_CHANGES = 100
#: What every refusal tells the caller would be accepted.
ACCEPTED = (
    "accepted changes are add_column (nullable), update_type (int32 to int64, float32 to "
    "float64), make_optional and update_doc"
)
_WIDENINGS = {pa.int32(): pa.int64(), pa.float32(): pa.float64()}
_REFUSED_OPS = {
    "drop_column": "dropping a column is not supported: readers of older snapshots and "
    "consumers of the stream still expect it",
    "delete_column": "dropping a column is not supported: readers of older snapshots and "
    "consumers of the stream still expect it",
    "rename_column": "renaming a column is not supported: clients, filters and engines "
    "reading the Iceberg table name it",
    "make_required": "making a column required is not supported: rows already stored may "
    "hold nulls",
}
_KEYS = {
    "add_column": {"op", "column", "type", "doc", "nullable"},
    "update_type": {"op", "column", "type"},
    "make_optional": {"op", "column"},
    "update_doc": {"op", "column", "doc"},
}


def _refuse(what: str, column: Any, why: str) -> SchemaChangeRefused:
    return SchemaChangeRefused(
        f"cannot {what} column {column!r:.80}: {why}; {ACCEPTED}",
        column=str(column)[:128],
    )


def apply_changes(
    fields: Sequence[Mapping[str, Any]],
    changes: Any,
    key_columns: Sequence[str] = (),
    not_null: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The stored JSON fields after ``changes``, in order (a later change sees the
    earlier ones). ``fields`` is the metadata store's form (with ``doc`` and ``added``);
    ``key_columns`` route rows to partitions; ``not_null``'s columns (name -> why) stay
    non-null.

    Raises:
        SchemaChangeRefused: a malformed change or one that is not admitted, naming the
            column, the change asked and what would be accepted. Nothing is applied.
    """
    if not isinstance(changes, Sequence) or isinstance(changes, str | bytes) or not changes:
        raise SchemaChangeRefused(f"'changes' must be a non-empty list of changes; {ACCEPTED}")
    if len(changes) > MAX_CHANGES:
        raise SchemaChangeRefused(
            f"{len(changes)} changes in one request; at most {MAX_CHANGES} are accepted"
        )
    out = [dict(f) for f in fields]
    for i, change in enumerate(changes):
        if not isinstance(change, Mapping):
            raise SchemaChangeRefused(f"change {i} must be an object with 'op' and 'column'")
        raw_op, column = change.get("op"), change.get("column")
        if not isinstance(raw_op, str) or not isinstance(column, str) or not column:
            raise SchemaChangeRefused(
                f"change {i} must name an 'op' and a 'column' (strings); {ACCEPTED}"
            )
        if raw_op in _REFUSED_OPS:
            raise _refuse(
                raw_op.replace("_column", "").replace("_", " "), column, _REFUSED_OPS[raw_op]
            )
        op = OPS.get(raw_op)
        if op is None:
            raise SchemaChangeRefused(
                f"unknown schema change {raw_op!r:.40} for column {column!r:.80}; {ACCEPTED}",
                column=column[:128],
            )
        unknown = set(change) - _KEYS[op]
        if unknown:
            raise SchemaChangeRefused(
                f"change {i} ({op} of column {column!r:.80}) has unknown keys {sorted(unknown)}"
            )
        if op == "add_column":
            _add(out, column, change)
            continue
        current = next((f for f in out if f["name"] == column), None)
        if current is None:
            raise _refuse(
                op.replace("_", " "),
                column,
                f"the table has no such column (its columns are {[f['name'] for f in out]})",
            )
        if op == "update_type":
            if column in key_columns and current["type"] in ("float", "float32"):
                raise _refuse(
                    "change the type of",
                    column,
                    "it is a key column, and a float32 key hashes differently as float64, "
                    "so its rows would go to other partitions",
                )
            _update_type(current, change)
        elif op == "make_optional":
            if not_null and column in not_null:
                raise _refuse("make optional", column, not_null[column])
            # Already optional: nothing to do, as pyiceberg's make_column_optional.
            current["nullable"] = True
        else:
            if "doc" not in change:
                raise _refuse("update the doc of", column, "the change gives no 'doc'")
            _set_doc(current, change["doc"], "update the doc of")
    # The whole result must still be a valid stored schema.
    try:
        parse_fields(out, stored=True)
    except InvalidSchema as exc:
        raise SchemaChangeRefused(f"{exc.message}; {ACCEPTED}") from None
    return out


def _add(out: list[dict[str, Any]], column: str, change: Mapping[str, Any]) -> None:
    try:
        check_column_name(column)
    except InvalidSchema as exc:
        raise _refuse("add", column, exc.message) from None
    if any(f["name"] == column for f in out):
        raise _refuse("add", column, "the table already has a column of that name")
    clash = next((f["name"] for f in out if f["name"].casefold() == column.casefold()), None)
    if clash is not None:
        raise _refuse(
            "add",
            column,
            f"the table has column {clash!r}, which differs from it only in case: engines "
            "that match names without case (Spark, DuckDB, Trino) could not tell them apart",
        )
    if change.get("nullable", True) is not True:
        raise _refuse(
            "add",
            column,
            "a new column must be nullable: the rows already stored have no value for it",
        )
    if len(out) >= MAX_COLUMNS:
        raise _refuse("add", column, f"the table already has {MAX_COLUMNS} columns")
    try:
        given: Any = change.get("type")
        t = parse_type(given)
        check_unambiguous([pa.field(column, t)])
    except InvalidSchema as exc:
        raise _refuse("add", column, exc.message) from None
    item: dict[str, Any] = {"name": column, "type": format_type(t), "nullable": True}
    out.append(item)
    _set_doc(item, change.get("doc"), "add")
    item["added"] = True


def _update_type(current: dict[str, Any], change: Mapping[str, Any]) -> None:
    column = current["name"]
    try:
        given: Any = change.get("type")
        want = parse_type(given)
    except InvalidSchema as exc:
        raise _refuse("change the type of", column, exc.message) from None
    have = parse_type(current["type"])
    if want.equals(have):
        return  # already that type: nothing to do, as pyiceberg's update_column
    if _WIDENINGS.get(have) != want:
        narrowing = any(want == k and have == v for k, v in _WIDENINGS.items())
        kind = "narrowing" if narrowing else "a type change"
        raise _refuse(
            "change the type of",
            column,
            f"{format_type(have)} to {format_type(want)} is {kind}, not a widening that "
            "keeps every stored value",
        )
    current["type"] = format_type(want)


def _set_doc(item: dict[str, Any], doc: Any, what: str) -> None:
    try:
        check_doc(item["name"], doc)
    except InvalidSchema as exc:
        raise _refuse(what, item["name"], exc.message) from None
    if doc:
        item["doc"] = doc
    else:
        item.pop("doc", None)


class StaleSchema(Exception):
    """A stored batch was written under a newer schema than the reader's view of the
    table (a change committed through another gateway since it cached the table): the
    reader looks at the table again."""


def read_as(batch: pa.RecordBatch, schema: pa.Schema, *, strict: bool = True) -> pa.RecordBatch:
    """A stored batch (a hot payload, written under this schema or an older one) in
    ``schema``: a column added since reads as nulls, a widened one is cast.

    Raises:
        StaleSchema: with ``strict``, the batch holds a column ``schema`` lacks or a type
            wider than ``schema``'s (written under a newer schema than the reader's
            view). Without ``strict`` such a column is left out or cast back.
    """
    if batch.schema.equals(schema):
        return batch
    if strict:
        names = set(schema.names)
        newer = [n for n in batch.schema.names if n not in names] or [
            f.name
            for f in schema
            if f.name in batch.schema.names
            and _WIDENINGS.get(f.type) == batch.schema.field(f.name).type
        ]
        if newer:
            raise StaleSchema(f"columns {newer} are newer than the reader's schema")
    n = batch.num_rows
    arrays = []
    for f in schema:
        at = batch.schema.get_field_index(f.name)
        if at < 0:
            arrays.append(pa.nulls(n, f.type))
            continue
        col = batch.column(at)
        arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
