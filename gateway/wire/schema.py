"""Table schemas: Arrow type names on the wire, validation of appended rows, system columns.

A table schema is a list of fields ``{"name", "type", "nullable"}`` whose ``type`` is an
Arrow type name as ``str(pyarrow type)`` prints it (``int64``, ``string``,
``timestamp[us, tz=UTC]``, ``decimal128(10, 2)``, ``list<item: int32>`` or ``list<int32>``,
``struct<a: int32, b: string>``). Only types that round-trip losslessly through Iceberg are
admitted; the gateway adds the system columns ``_partition``, ``_offset``, ``_timestamp``.
The type names are parsed in :mod:`gateway.wire.type_names` (re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.errors import InvalidSchema, SchemaMismatch
from gateway.wire.type_names import (
    MAX_FIELDS,
    MAX_TYPE_CHARS,
    MAX_TYPE_DEPTH,
    FieldBudget,
    format_type,
    parse_type,
)

__all__ = [
    "MAX_DOCS_CHARS",
    "MAX_DOC_CHARS",
    "MAX_FIELDS",
    "MAX_SCHEMA_CHARS",
    "MAX_TYPE_CHARS",
    "MAX_TYPE_DEPTH",
    "OFFSET_COLUMN",
    "PARTITION_COLUMN",
    "SYSTEM_COLUMNS",
    "TIMESTAMP_COLUMN",
    "TIMESTAMP_TYPE",
    "added_columns",
    "check_column_name",
    "check_doc",
    "check_schema_size",
    "check_unambiguous",
    "check_values",
    "columns_mismatch",
    "conform_batch",
    "fields_to_json",
    "format_type",
    "parse_fields",
    "parse_fields_text",
    "parse_type",
    "with_system_columns",
]

PARTITION_COLUMN = "_partition"
OFFSET_COLUMN = "_offset"
TIMESTAMP_COLUMN = "_timestamp"
SYSTEM_COLUMNS = (PARTITION_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
#: Bounds of a table schema: its columns (a type name's are in gateway.wire.type_names).
MAX_COLUMNS = 1000
#: Length of a column's doc.
MAX_DOC_CHARS = 1024
#: Bounds of a whole schema (each schema version is kept in every Iceberg metadata file,
#: and every listing, describe and lake pass reads it): fields at every depth
#: (``MAX_FIELDS``, with the type names), characters of the type names, names and docs
#: together, and of the docs alone.
MAX_SCHEMA_CHARS = 256 * 1024
MAX_DOCS_CHARS = 64 * 1024
_FIELD_KEYS = frozenset({"name", "type", "nullable", "doc"})


def parse_fields(spec: Any, *, stored: bool = False, bounded: bool | None = None) -> pa.Schema:
    """The user schema from its JSON form.

    Accepts ``[{"name": ..., "type": ..., "nullable": true, "doc": ...}, ...]`` or the
    shorthand ``{"name": "type", ...}``. ``stored``: the form the metadata store keeps,
    which may also mark columns ``"added": true`` (added by a schema change).
    ``bounded`` (default: not ``stored``, so that tables created before a bound keep
    reading): refuse a schema over the whole-schema bounds (:func:`check_schema_size`).

    Raises:
        InvalidSchema: a malformed spec, a bad or duplicate name, a reserved system column,
            an unsupported type, a doc that is not a short string, a schema too large.
    """
    bounded = not stored if bounded is None else bounded
    if bounded:
        check_schema_size(spec)
    budget = FieldBudget() if bounded else None
    allowed = _FIELD_KEYS | {"added"} if stored else _FIELD_KEYS
    items: list[tuple[str, Any, bool]] = []
    if isinstance(spec, Mapping):
        items = [(str(k), v, True) for k, v in spec.items()]
    elif isinstance(spec, Sequence) and not isinstance(spec, str | bytes):
        for i, f in enumerate(spec):
            if not isinstance(f, Mapping) or "name" not in f or "type" not in f:
                raise InvalidSchema(f"field {i} must be an object with 'name' and 'type'")
            unknown = set(f) - allowed
            if unknown:
                raise InvalidSchema(f"field {f['name']!r} has unknown keys {sorted(unknown)}")
            nullable = f.get("nullable", True)
            if not isinstance(nullable, bool):
                raise InvalidSchema(f"field {f['name']!r}: 'nullable' must be true or false")
            check_doc(f["name"], f.get("doc"))
            items.append((f["name"], f["type"], nullable))
    else:
        raise InvalidSchema("schema must be a list of fields or an object of name: type")
    if not items:
        raise InvalidSchema("schema must have at least one column")
    if len(items) > MAX_COLUMNS:
        raise InvalidSchema(f"schema has {len(items)} columns; at most {MAX_COLUMNS} are accepted")
    seen: set[str] = set()
    fields = []
    for name, type_name, nullable in items:
        check_column_name(name)
        if name in seen:
            raise InvalidSchema(f"column {name!r} appears twice")
        seen.add(name)
        if budget is not None:
            budget.column = name
        fields.append(pa.field(name, parse_type(type_name, budget), nullable=nullable))
    if not stored:  # tables created before the rule keep reading
        check_unambiguous(fields)
    return pa.schema(fields)


def check_schema_size(spec: Any) -> None:
    """Refuse a schema (JSON form, as :func:`parse_fields` takes it) whose names, type
    names and docs together hold more than ``MAX_SCHEMA_CHARS`` characters, or whose docs
    more than ``MAX_DOCS_CHARS``: counted before any type is parsed, so an oversized body
    costs one pass over its strings. (Fields at every depth are counted while parsing.)

    Raises:
        InvalidSchema: naming the bound and the schema's figure.
    """
    if isinstance(spec, Mapping):
        items: list[Any] = [{"name": k, "type": v} for k, v in spec.items()]
    elif isinstance(spec, Sequence) and not isinstance(spec, str | bytes):
        items = [f for f in spec if isinstance(f, Mapping)]
    else:
        return
    total = docs = 0
    for f in items:
        for key in ("name", "type", "doc"):
            value = f.get(key)
            if isinstance(value, str):
                total += len(value)
                if key == "doc":
                    docs += len(value)
    if docs > MAX_DOCS_CHARS:
        raise InvalidSchema(
            f"the schema's docs hold {docs} characters in total; at most {MAX_DOCS_CHARS} "
            "are accepted"
        )
    if total > MAX_SCHEMA_CHARS:
        raise InvalidSchema(
            f"the schema's names, types and docs hold {total} characters in total; at "
            f"most {MAX_SCHEMA_CHARS} are accepted"
        )


def check_unambiguous(fields: Sequence[pa.Field], within: str = "") -> None:
    """Refuse two names that differ only in case among columns, or among the fields of
    one struct (at any depth, in lists too): Spark, DuckDB and Trino match names without
    case, so they could not tell ``a`` from ``A``. Also refuses a struct field named twice.

    Raises:
        InvalidSchema: naming both names and where they are.
    """
    folded: dict[str, str] = {}
    for f in fields:
        key = f.name.casefold()
        other = folded.get(key)
        if other is not None:
            if other == f.name:
                raise InvalidSchema(f"field {f.name!r} of struct column {within!r} appears twice")
            where = f"fields of struct column {within!r}" if within else "columns"
            raise InvalidSchema(
                f"{where} {other!r} and {f.name!r} differ only in case, which engines that "
                "match names without case (Spark, DuckDB, Trino) cannot tell apart; rename "
                "one of them"
            )
        folded[key] = f.name
        t = f.type
        while pa.types.is_list(t) or pa.types.is_large_list(t):
            t = t.value_type
        if pa.types.is_struct(t):
            path = f"{within}.{f.name}" if within else f.name
            check_unambiguous(list(t), path)


def parse_fields_text(text: str) -> list[dict[str, Any]]:
    """Fields written ``name:type,name:type`` (the CLI's ``--schema``, the console's form);
    commas inside a type (``decimal128(10, 2)``, ``struct<a: int32, b: string>``) stay
    in it.

    Raises:
        InvalidSchema: a part is not ``name:type``.
    """
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    fields = []
    for part in parts:
        name, sep, type_name = part.strip().partition(":")
        if not sep:
            raise InvalidSchema(
                f"expected name:type, got {part.strip()!r} (e.g. 'id:int64,name:string')"
            )
        fields.append({"name": name.strip(), "type": type_name.strip()})
    return fields


def check_column_name(name: Any) -> None:
    """Refuse a name that is reserved or not an identifier.

    Raises:
        InvalidSchema: naming the column.
    """
    if not isinstance(name, str) or name in SYSTEM_COLUMNS:
        raise InvalidSchema(f"column name {name!r:.80} is reserved for system columns")
    if not _NAME_RE.fullmatch(name):
        raise InvalidSchema(
            f"column name {name!r:.80} must start with a letter and hold only letters, "
            "digits and '_' (at most 128)"
        )


def check_doc(column: Any, doc: Any) -> None:
    """Refuse a column doc that is not valid text (a lone surrogate from JSON's
    ``\\ud800``) of at most ``MAX_DOC_CHARS`` characters.

    Raises:
        InvalidSchema: naming the column.
    """
    if doc is None:
        return
    valid = isinstance(doc, str) and len(doc) <= MAX_DOC_CHARS
    if valid:
        try:
            doc.encode("utf-8")
        except UnicodeEncodeError:
            valid = False
    if not valid:
        raise InvalidSchema(
            f"field {column!r:.80}: 'doc' must be valid text of at most {MAX_DOC_CHARS} characters"
        )


def fields_to_json(
    schema: pa.Schema, stored: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The JSON form of ``schema``; the ``doc`` and ``added`` marks of its columns come
    from ``stored`` (the metadata store's fields), when given."""
    extra = {f["name"]: f for f in stored}
    out = []
    for f in schema:
        item: dict[str, Any] = {"name": f.name, "type": format_type(f.type), "nullable": f.nullable}
        kept = extra.get(f.name, {})
        if kept.get("doc"):
            item["doc"] = kept["doc"]
        if kept.get("added"):
            item["added"] = True
        out.append(item)
    return out


def added_columns(stored: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Columns added by a schema change (``"added": true``): an append may leave them
    out, and reads show them as null in rows written before."""
    return frozenset(f["name"] for f in stored if f.get("added"))


# --------------------------------------------------------------------------------------
# Validation of appended data
# --------------------------------------------------------------------------------------
_SAFE_WIDENING: dict[pa.DataType, tuple[pa.DataType, ...]] = {
    pa.int8(): (pa.int16(), pa.int32(), pa.int64()),
    pa.int16(): (pa.int32(), pa.int64()),
    pa.int32(): (pa.int64(),),
    pa.float32(): (pa.float64(),),
    pa.large_string(): (pa.string(),),
    pa.string_view(): (pa.string(),),
    pa.large_binary(): (pa.binary(),),
    pa.binary_view(): (pa.binary(),),
}


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    if got.equals(want):
        return True
    if want in _SAFE_WIDENING.get(got, ()):
        return True
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(want):
        # Same instant semantics required: naive vs zoned never mix.
        return got.unit in ("s", "ms", "us") and (got.tz is None) == (want.tz is None)
    if pa.types.is_large_list(got) and pa.types.is_list(want):
        return _compatible(got.value_type, want.value_type)
    if pa.types.is_list(got) and pa.types.is_list(want):
        return _compatible(got.value_type, want.value_type)
    if pa.types.is_struct(got) and pa.types.is_struct(want):
        if got.num_fields != want.num_fields:
            return False
        return all(
            got.field(i).name == want.field(i).name
            and _compatible(got.field(i).type, want.field(i).type)
            for i in range(want.num_fields)
        )
    return False


def conform_batch(
    batch: pa.RecordBatch, schema: pa.Schema, omittable: Collection[str] = ()
) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns, order and types.

    Columns may come in any order; lossless widenings (int32 into int64, float32 into
    float64, large_string into string, a coarser timestamp unit) are applied. Columns
    named in ``omittable`` (nullable columns added by a schema change) may be left out:
    they are filled with nulls.

    Raises:
        SchemaMismatch: an extra, missing or mistyped column, or a null in a non-nullable
            column. The message names every offending column.
    """
    got_names = batch.schema.names
    if len(set(got_names)) != len(got_names):
        raise SchemaMismatch("the rows name a column more than once")
    want_names = schema.names
    extra = [n for n in got_names if n not in want_names]
    missing = [n for n in want_names if n not in got_names and n not in omittable]
    problems = []
    if extra:
        problems.append(f"unexpected column(s) {extra}")
    if missing:
        problems.append(f"missing column(s) {missing}")
    mistyped = []
    for f in schema:
        if f.name in got_names:
            got = batch.schema.field(f.name).type
            if not _compatible(got, f.type):
                mistyped.append(f"{f.name!r} is {got}, expected {format_type(f.type)}")
    if mistyped:
        problems.append("mistyped column(s): " + "; ".join(mistyped))
    if problems:
        raise SchemaMismatch(
            "rows do not match the table schema: " + ", ".join(problems),
            unexpected=",".join(extra),
            missing=",".join(missing),
        )
    columns = []
    for f in schema:
        at = batch.schema.get_field_index(f.name)
        if at < 0:
            columns.append(pa.nulls(batch.num_rows, f.type))
            continue
        col = batch.column(at)
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatch(
                    f"column {f.name!r} cannot be stored as {f.type}: {exc}"
                ) from exc
        _check_values(col, f)
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def check_values(batch: pa.RecordBatch, schema: pa.Schema) -> None:
    """Refuse the values :func:`conform_batch` refuses, in a batch already in exactly
    ``schema`` (its columns, order and types): nulls in a non-nullable column, dates,
    times and timestamps outside years 1 to 9999. Nothing is copied.

    Raises:
        SchemaMismatch: naming the column (and the value).
    """
    for f, col in zip(schema, batch.columns, strict=True):
        _check_values(col, f)


def _check_values(col: pa.Array, f: pa.Field) -> None:
    if not f.nullable and col.null_count:
        raise SchemaMismatch(f"column {f.name!r} is not nullable but holds nulls")
    _check_temporal(col, f.name)


#: Arrow type -> (its integer storage, lowest, highest): what a reader can turn into a
#: date or time (years 1 to 9999), so no appended value breaks a later JSON read.
_TEMPORAL_RANGES: dict[pa.DataType, tuple[pa.DataType, int, int]] = {
    pa.timestamp("us"): (pa.int64(), -62_135_596_800_000_000, 253_402_300_799_999_999),
    pa.timestamp("us", tz="UTC"): (pa.int64(), -62_135_596_800_000_000, 253_402_300_799_999_999),
    pa.date32(): (pa.int32(), -719_162, 2_932_896),
    pa.time64("us"): (pa.int64(), 0, 86_399_999_999),
}


def _check_temporal(values: pa.Array, where: str) -> None:
    """Refuse dates, times and timestamps outside years 1 to 9999 (nested ones too).

    Raises:
        SchemaMismatch: naming the column and the value.
    """
    t = values.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        _check_temporal(values.flatten(), f"{where}[]")
        return
    if pa.types.is_struct(t):
        for i, child in enumerate(values.flatten()):
            _check_temporal(child, f"{where}.{t.field(i).name}")
        return
    bounds = _TEMPORAL_RANGES.get(t)
    if bounds is None or len(values) == values.null_count:
        return
    storage, lowest, highest = bounds
    low, high = pc.min_max(values.view(storage)).values()
    for value in (low.as_py(), high.as_py()):
        if not lowest <= value <= highest:
            raise SchemaMismatch(
                f"column {where!r} holds {t} value {value}, outside years 1 to 9999",
                column=where,
            )


def with_system_columns(
    batch: pa.RecordBatch, partition: int, base_offset: int, timestamp_us: int
) -> pa.RecordBatch:
    """``batch`` plus ``_partition``, ``_offset`` (base_offset...), ``_timestamp``."""
    n = batch.num_rows
    arrays = [
        *batch.columns,
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64)),
        pa.repeat(pa.scalar(timestamp_us, TIMESTAMP_TYPE), n),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=system_schema(batch.schema))


def system_schema(user: pa.Schema) -> pa.Schema:
    """The stored schema: user columns followed by the system columns."""
    return pa.schema(
        [
            *user,
            pa.field(PARTITION_COLUMN, pa.int32(), nullable=False),
            pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
            pa.field(TIMESTAMP_COLUMN, TIMESTAMP_TYPE, nullable=False),
        ]
    )


def columns_mismatch(where: str, extra: Sequence[str], missing: Sequence[str]) -> SchemaMismatch:
    """The error for a row (``where``: which) with unknown or missing columns."""
    parts = []
    if extra:
        parts.append(f"unexpected column(s) {list(extra)}")
    if missing:
        parts.append(
            f"missing column(s) {list(missing)} (every column needs a value: write null "
            "for a nullable one)"
        )
    return SchemaMismatch(
        f"{where} does not match the table schema: " + ", ".join(parts),
        unexpected=",".join(extra),
        missing=",".join(missing),
    )
