"""``tidegate table ...``, ``append`` and ``read``: tables and records through a gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from gateway.cli._common import (
    Target,
    app,
    client_for,
    fail,
    table_app,
)
from gateway.wire.errors import TidegateError


def _parse_schema(spec: str) -> list[dict[str, Any]]:
    """``name:type,name:type`` or a JSON document (inline or ``@file.json``)."""
    text = Path(spec[1:]).read_text() if spec.startswith("@") else spec
    if text.lstrip().startswith(("[", "{")):
        doc = json.loads(text)
        if isinstance(doc, dict):
            return [{"name": k, "type": v} for k, v in doc.items()]
        return list(doc)
    fields = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in parts:
        name, sep, type_name = part.strip().partition(":")
        if not sep:
            raise typer.BadParameter(f"expected name:type, got {part!r}")
        fields.append({"name": name.strip(), "type": type_name.strip()})
    return fields


def _describe(info: Any) -> dict[str, Any]:
    return {
        "table": f"{info.table.namespace}.{info.table.name}",
        "table_id": info.table_id,
        "schema": [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields],
        "partitions": info.partitions,
        "key_columns": list(info.key_columns),
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


@table_app.command("create")
def table_create(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    schema: Annotated[str, typer.Option(help="name:type,... or JSON, or @file.json")],
    partitions: Annotated[int, typer.Option(help="Number of partitions.")] = 1,
    key: Annotated[list[str] | None, typer.Option(help="Key column (repeatable).")] = None,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Create a table."""
    with client_for(target) as c:
        try:
            info = c.create_table(
                table, _parse_schema(schema), partitions=partitions, key_columns=key or []
            )
        except TidegateError as err:
            fail(err)
        typer.echo(json.dumps(_describe(info), indent=2))


@table_app.command("list")
def table_list(
    namespace: Annotated[str, typer.Option(help="Only this namespace.")] = "",
    target: Target = "127.0.0.1:50051",
) -> None:
    """List tables."""
    with client_for(target) as c:
        try:
            for info in c.list_tables(namespace):
                typer.echo(
                    f"{info.table.namespace}.{info.table.name}\t{info.partitions} partitions"
                )
        except TidegateError as err:
            fail(err)


@table_app.command("describe")
def table_describe(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    target: Target = "127.0.0.1:50051",
) -> None:
    """Schema, partitions and offsets of a table."""
    with client_for(target) as c:
        try:
            typer.echo(json.dumps(_describe(c.describe_table(table)), indent=2))
        except TidegateError as err:
            fail(err)


@table_app.command("drop")
def table_drop(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    target: Target = "127.0.0.1:50051",
) -> None:
    """Drop a table and its data."""
    with client_for(target) as c:
        try:
            c.drop_table(table)
        except TidegateError as err:
            fail(err)
        typer.echo(f"dropped {table}")


def _load_file(path: Path, fmt: str, schema: pa.Schema) -> pa.Table:
    if fmt == "auto":
        fmt = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}.get(
            path.suffix.lower(), "parquet"
        )
    if fmt == "csv":
        import pyarrow.csv as pacsv

        simple = {f.name: f.type for f in schema if not pa.types.is_nested(f.type)}
        data = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=simple))
    elif fmt == "jsonl":
        import pyarrow.json as pajson

        data = pajson.read_json(
            path,
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="error"
            ),
        )
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        data = pq.read_table(path)
    else:
        raise typer.BadParameter(f"unknown format {fmt!r}: use csv, jsonl or parquet")
    return data


@app.command()
def append(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="CSV, JSON lines or Parquet file.")
    ],
    format: Annotated[str, typer.Option("--format", help="auto, csv, jsonl or parquet.")] = "auto",
    partition: Annotated[int | None, typer.Option(help="Send every row to this partition.")] = None,
    batch_rows: Annotated[int, typer.Option(help="Rows per append request.")] = 10_000,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Append the rows of a file (columns are converted to the table's types)."""
    from gateway.wire.schema import parse_fields

    with client_for(target) as c:
        try:
            info = c.describe_table(table)
            schema = parse_fields(
                [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields]
            )
            try:
                data = _load_file(path, format, schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
                typer.echo(f"error: cannot read {path}: {exc}", err=True)
                raise typer.Exit(2) from None
            total = 0
            for batch in data.to_batches(max_chunksize=batch_rows):
                ranges = c.append(table, batch, partition=partition)
                total += sum(r.count for r in ranges)
        except TidegateError as err:
            fail(err)
        typer.echo(f"appended {total} records to {table}")


@app.command()
def read(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    partition: Annotated[int, typer.Option(help="Partition to read.")] = 0,
    offset: Annotated[int, typer.Option(help="First offset.")] = 0,
    max_records: Annotated[int, typer.Option(help="Records at most (0: server default).")] = 0,
    output: Annotated[
        Path | None, typer.Option(help="Write Parquet here instead of printing.")
    ] = None,
    follow: Annotated[bool, typer.Option(help="Keep waiting for new records.")] = False,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Read records of a partition from an offset: print JSON lines or write Parquet."""
    from gateway.wire.jsonrows import batch_to_rows

    with client_for(target) as c:
        try:
            batches: list[pa.RecordBatch] = []
            for chunk, _, _ in c.read_batches(
                table, partition=partition, offset=offset, max_records=max_records, follow=follow
            ):
                if output is None:
                    for row in batch_to_rows(chunk):
                        sys.stdout.write(json.dumps(row) + "\n")
                    sys.stdout.flush()
                else:
                    batches.extend(chunk)
        except TidegateError as err:
            fail(err)
        if output is not None:
            import pyarrow.parquet as pq

            if not batches:
                typer.echo("no records", err=True)
                raise typer.Exit(1)
            pq.write_table(pa.Table.from_batches(batches), output)
            typer.echo(f"wrote {sum(b.num_rows for b in batches)} records to {output}")


# Tenants -------------------------------------------------------------------------------
