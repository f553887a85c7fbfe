"""``tidegate table ...``: create, list, describe, snapshot and drop tables."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli._common import (
    ContainsOption,
    JsonFlag,
    PageSizeOption,
    PageTokenOption,
    TableArg,
    client_for,
    columns,
    duration,
    next_page,
    plural,
    size,
    table_app,
)
from gateway.wire.errors import InvalidSchema
from gateway.wire.schema import parse_fields_text


def _parse_schema(spec: str) -> list[dict[str, Any]]:
    """``name:type,name:type`` or a JSON document (inline or ``@file.json``)."""
    text = Path(spec[1:]).read_text() if spec.startswith("@") else spec
    if text.lstrip().startswith(("[", "{")):
        doc = json.loads(text)
        if isinstance(doc, dict):
            return [{"name": k, "type": v} for k, v in doc.items()]
        return list(doc)
    try:
        return parse_fields_text(text)
    except InvalidSchema as exc:
        raise typer.BadParameter(exc.message, param_hint="--schema") from None


def _describe(info: Any) -> dict[str, Any]:
    return {
        "table": str(info.table),
        "table_id": info.table_id,
        "schema": [
            {
                "name": f.name,
                "type": f.type,
                "nullable": f.nullable,
                **({"doc": f.doc} if f.doc else {}),
                **({"added": True} if f.added else {}),
            }
            for f in info.fields
        ],
        "schema_version": info.schema_version,
        "iceberg_schema_id": info.iceberg_schema_id,
        "partitions": info.partitions,
        "key_columns": list(info.key_columns),
        "primary_key": list(info.primary_key),
        "merge_engine": info.merge_engine,
        "iceberg_table": info.iceberg_table,
        "iceberg_metadata": info.iceberg_metadata,
        "retention_ms": info.retention_ms,
        "retention_records": info.retention_records,
        "partition_info": [
            {
                "partition": p.partition,
                "earliest_offset": p.earliest_offset,
                "high_watermark": p.high_watermark,
                "tiered_watermark": p.tiered_watermark,
                "hot_bytes": p.hot_bytes,
                "lag_records": p.lag_records,
                "lag_bytes": p.lag_bytes,
            }
            for p in info.partition_info
        ],
        "maintenance": _maintenance(info.maintenance),
    }


def _maintenance(m: Any) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "data_files": m.data_files,
        "small_files": m.small_files,
        "small_file_ratio": round(m.small_file_ratio, 4),
        "data_bytes": m.data_bytes,
        "snapshots": m.snapshots,
        "leases": [
            {"snapshot_id": x.snapshot_id, "kind": x.kind, "expires_at": x.expires_at.isoformat()}
            for x in m.leases
        ],
        "last_runs": {
            job: {
                "finished_at": r.finished_at.isoformat(),
                "outcome": r.outcome,
                "detail": r.detail,
            }
            for job, r in m.last_runs.items()
        },
    }


def _lake_text(m: Any) -> list[str]:
    """The table's lake health in two lines (none without a cold tier)."""
    if m is None:
        return []
    runs = ", ".join(
        f"{job} {r.outcome} at {r.finished_at:%Y-%m-%d %H:%M:%S}Z"
        + (f" ({r.detail})" if r.detail else "")
        for job, r in sorted(m.last_runs.items())
    )
    return [
        f"lake        {plural(m.data_files, 'data file')} ({m.small_files} small), "
        f"{size(m.data_bytes)}, {plural(m.snapshots, 'snapshot')}, "
        f"{plural(len(m.leases), 'lease')}",
        f"lake jobs   {runs or 'none run yet'}",
    ]


def _describe_text(info: Any) -> str:
    keys = ", ".join(info.key_columns) or "none (round robin)"
    lines = [
        f"table       {info.table}",
        f"table id    {info.table_id}",
        f"partitions  {info.partitions}, keyed by {keys}",
        *(
            [
                f"primary key {', '.join(info.primary_key)}, merge engine "
                + ":".join(v for v in (info.merge_engine or {}).values() if v)
            ]
            if info.primary_key
            else []
        ),
        f"iceberg     {info.iceberg_table or '-'}",
        f"metadata    {info.iceberg_metadata or '-'}",
        f"schema      version {info.schema_version}, Iceberg schema id "
        f"{'-' if info.iceberg_schema_id is None else info.iceberg_schema_id}",
        f"retention   {_retention_text(info)}",
        *_lake_text(info.maintenance),
        "",
        "columns",
    ]
    lines += [
        "  " + line.rstrip()
        for line in columns(
            [
                [
                    f.name,
                    f.type,
                    "nullable" if f.nullable else "not null",
                    ("added  " if f.added else "") + f.doc,
                ]
                for f in info.fields
            ]
        )
    ]
    lines += ["", "partitions (offsets below 'tiered' are in Iceberg, the rest in the hot tier)"]
    head = ["partition", "earliest", "high watermark", "tiered", "lag records", "lag bytes"]
    body = [
        [
            str(p.partition),
            str(p.earliest_offset),
            str(p.high_watermark),
            str(p.tiered_watermark),
            str(p.lag_records),
            str(p.lag_bytes),
        ]
        for p in info.partition_info
    ]
    lines += ["  " + line for line in columns([head, *body])]
    return "\n".join(lines)


def _retention_text(info: Any) -> str:
    kept = []
    if info.retention_ms:
        kept.append(f"{duration(info.retention_ms)} after append ({info.retention_ms} ms)")
    if info.retention_records:
        kept.append(f"the last {plural(info.retention_records, 'record')} per partition")
    return "records kept " + " and ".join(kept) if kept else "none (records kept for ever)"


RetentionMsOption = Annotated[
    int | None,
    typer.Option(
        help="Remove records this many milliseconds after their append (0: no limit).",
        show_default=False,
    ),
]
RetentionRecordsOption = Annotated[
    int | None,
    typer.Option(
        help="Keep only the newest N records per partition (0: no limit).", show_default=False
    ),
]


@table_app.command("create")
def table_create(
    table: TableArg,
    schema: Annotated[str, typer.Option(help="name:type,... or JSON, or @file.json.")],
    partitions: Annotated[int, typer.Option(help="Number of partitions.")] = 1,
    key: Annotated[list[str] | None, typer.Option(help="Key column (repeatable).")] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="Succeed if the table already exists.")
    ] = False,
    retention_ms: RetentionMsOption = None,
    retention_records: RetentionRecordsOption = None,
    primary_key: Annotated[
        str | None,
        typer.Option(
            help="Primary key columns, comma-separated: appends upsert, scans answer the "
            "latest row per key.",
            show_default=False,
        ),
    ] = None,
    merge_engine: Annotated[
        str | None,
        typer.Option(
            help="last_row (default), first_row, partial_update or versioned:COLUMN.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a table."""
    columns = [c.strip() for c in (primary_key or "").split(",") if c.strip()]
    engine: dict[str, str] | None = None
    if merge_engine:
        kind, _, column = merge_engine.partition(":")
        engine = {"type": kind.strip(), **({"column": column.strip()} if column else {})}
    with client_for() as c:
        info = c.create_table(
            table,
            _parse_schema(schema),
            partitions=partitions,
            key_columns=key or [],
            exist_ok=if_not_exists,
            retention_ms=retention_ms,
            retention_records=retention_records,
            primary_key=columns,
            merge_engine=engine,
        )
        typer.echo(json.dumps(_describe(info), indent=2) if as_json else _describe_text(info))


def _name_value(text: str, sep: str, option: str, example: str) -> tuple[str, str]:
    name, found, value = text.partition(sep)
    if not found or not name.strip():
        raise typer.BadParameter(
            f"expected name{sep}value, got {text!r} (e.g. {example!r})", param_hint=option
        )
    return name.strip(), value.strip()


@table_app.command("alter")
def table_alter(
    table: TableArg,
    add_column: Annotated[
        list[str] | None,
        typer.Option(help="Add a nullable column: name:type (repeatable).", show_default=False),
    ] = None,
    widen: Annotated[
        list[str] | None,
        typer.Option(
            help="Widen a column: name:int64 (from int32) or name:float64 (from float32).",
            show_default=False,
        ),
    ] = None,
    optional: Annotated[
        list[str] | None,
        typer.Option(help="Make a required column optional (repeatable).", show_default=False),
    ] = None,
    doc: Annotated[
        list[str] | None,
        typer.Option(
            help="Set a column's doc: name=text (empty text clears it).", show_default=False
        ),
    ] = None,
    changes: Annotated[
        str | None,
        typer.Option(help="Changes as JSON (the HTTP API's 'changes' list), or @file.json."),
    ] = None,
    retention_ms: RetentionMsOption = None,
    retention_records: RetentionRecordsOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Evolve a table's schema, in one step for the gateway and the Iceberg table, and
    change its retention (--retention-ms, --retention-records).

    Only changes that keep every stored row readable are accepted: add a nullable
    column, widen int32 to int64 or float32 to float64, make a column optional, change a
    doc. Rows written before read an added column as null. Anything else (drop, rename,
    narrowing, another type change) is refused and nothing changes.
    """
    todo: list[dict[str, Any]] = []
    if changes:
        text = Path(changes[1:]).read_text() if changes.startswith("@") else changes
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not JSON: {exc.msg}", param_hint="--changes") from None
        if isinstance(parsed, dict):
            parsed = parsed.get("changes")
        if not isinstance(parsed, list):
            raise typer.BadParameter(
                'expected a list of changes or {"changes": [...]}', param_hint="--changes"
            )
        todo.extend(parsed)
    for item in add_column or []:
        name, type_name = _name_value(item, ":", "--add-column", "region:string")
        todo.append({"op": "add_column", "column": name, "type": type_name})
    for item in widen or []:
        name, type_name = _name_value(item, ":", "--widen", "count:int64")
        todo.append({"op": "update_type", "column": name, "type": type_name})
    for name in optional or []:
        todo.append({"op": "make_optional", "column": name.strip()})
    for item in doc or []:
        name, text = _name_value(item, "=", "--doc", "region=Where the order was placed")
        todo.append({"op": "update_doc", "column": name, "doc": text or None})
    retain = retention_ms is not None or retention_records is not None
    if not todo and not retain:
        raise typer.BadParameter(
            "name a change: --add-column, --widen, --optional, --doc, --changes, "
            "--retention-ms or --retention-records",
            param_hint="--add-column",
        )
    with client_for() as c:
        if todo:
            info = c.alter_schema(table, todo)
        if retain:
            info = c.alter_table(
                table, retention_ms=retention_ms, retention_records=retention_records
            )
    typer.echo(json.dumps(_describe(info), indent=2) if as_json else _describe_text(info))


@table_app.command("list")
def table_list(
    namespace: Annotated[str, typer.Option(help="Only this namespace.")] = "",
    page_size: PageSizeOption = 0,
    page_token: PageTokenOption = "",
    contains: ContainsOption = "",
) -> None:
    """List tables by namespace and name: all of them, or one page with --page-size."""
    with client_for() as c:
        if page_size or page_token:
            tables, token = c.list_tables_page(
                namespace, page_size=page_size, page_token=page_token, name_contains=contains
            )
        else:
            tables, token = c.list_tables(namespace, name_contains=contains), ""
        for info in tables:
            typer.echo(f"{info.table}\t{plural(info.partitions, 'partition')}")
    next_page(token)


@table_app.command("describe")
def table_describe(table: TableArg, as_json: JsonFlag = False) -> None:
    """Schema, partitions, offsets and which offsets are tiered to Iceberg."""
    with client_for() as c:
        info = c.describe_table(table)
        typer.echo(json.dumps(_describe(info), indent=2) if as_json else _describe_text(info))


@table_app.command("drop")
def table_drop(
    table: TableArg,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Drop without asking (needed without a terminal).")
    ] = False,
) -> None:
    """Drop a table and its data, hot and tiered (asks first, unless --yes)."""
    if not yes:
        if not sys.stdin.isatty():
            raise typer.BadParameter(
                f"dropping {table} deletes all its data: add --yes to confirm", param_hint="--yes"
            )
        typer.confirm(f"Drop {table} and delete all its data?", abort=True)
    with client_for() as c:
        c.drop_table(table)
    typer.echo(f"dropped {table}")


@table_app.command("snapshots")
def table_snapshots(table: TableArg, as_json: JsonFlag = False) -> None:
    """The table's Iceberg snapshots, oldest first: what `scan --as-of` can name."""
    with client_for() as c:
        snaps = c.list_snapshots(table)
    if as_json:
        for s in snaps:
            typer.echo(json.dumps(
                {"snapshot_id": s.snapshot_id, "timestamp_ms": s.timestamp_ms,
                 "operation": s.operation, "summary": dict(s.summary)}
            ))  # fmt: skip
        return
    rows = [["snapshot", "committed at (UTC)", "operation", "added records"]]
    for s in snaps:
        when = dt.datetime.fromtimestamp(s.timestamp_ms / 1000, dt.UTC)
        rows.append(
            [
                str(s.snapshot_id),
                when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                s.operation,
                s.summary.get("added-records", "0"),
            ]
        )
    typer.echo("\n".join(columns(rows)) if snaps else f"{table} has no snapshot yet")
