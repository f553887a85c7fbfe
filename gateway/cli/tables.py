"""``tidegate table ...``: create, list, describe, snapshot and drop tables."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli._common import JsonFlag, TableArg, client_for, columns, table_app
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
        "schema": [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields],
        "partitions": info.partitions,
        "key_columns": list(info.key_columns),
        "iceberg_table": info.iceberg_table,
        "iceberg_metadata": info.iceberg_metadata,
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
    }


def _describe_text(info: Any) -> str:
    keys = ", ".join(info.key_columns) or "none (round robin)"
    lines = [
        f"table       {info.table}",
        f"table id    {info.table_id}",
        f"partitions  {info.partitions}, keyed by {keys}",
        f"iceberg     {info.iceberg_table or '-'}",
        f"metadata    {info.iceberg_metadata or '-'}",
        "",
        "columns",
    ]
    lines += [
        "  " + line
        for line in columns(
            [[f.name, f.type, "nullable" if f.nullable else "not null"] for f in info.fields]
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


@table_app.command("create")
def table_create(
    table: TableArg,
    schema: Annotated[str, typer.Option(help="name:type,... or JSON, or @file.json.")],
    partitions: Annotated[int, typer.Option(help="Number of partitions.")] = 1,
    key: Annotated[list[str] | None, typer.Option(help="Key column (repeatable).")] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="Succeed if the table already exists.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create a table."""
    with client_for() as c:
        info = c.create_table(
            table,
            _parse_schema(schema),
            partitions=partitions,
            key_columns=key or [],
            exist_ok=if_not_exists,
        )
        typer.echo(json.dumps(_describe(info), indent=2) if as_json else _describe_text(info))


@table_app.command("list")
def table_list(
    namespace: Annotated[str, typer.Option(help="Only this namespace.")] = "",
) -> None:
    """List tables."""
    with client_for() as c:
        for info in c.list_tables(namespace):
            typer.echo(f"{info.table}\t{info.partitions} partitions")


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
