"""The ``tidegate`` command line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

try:
    import typer
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit(
        f"the tidegate command needs the server extra: pip install 'tidegate[server]' ({exc})"
    ) from exc

import pyarrow as pa

from gateway.wire.errors import TidegateError

app = typer.Typer(
    name="tidegate",
    help="Tidegate: a hot log and Iceberg tables served as one stream-table.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
table_app = typer.Typer(help="Create, list, describe and drop tables.", no_args_is_help=True)
app.add_typer(table_app, name="table")

tenant_app = typer.Typer(
    help="Tenants, API keys, quotas and usage (needs the operator key).", no_args_is_help=True
)
key_app = typer.Typer(help="Issue, list and revoke a tenant's API keys.", no_args_is_help=True)
quota_app = typer.Typer(help="Set and show a tenant's quotas.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")
tenant_app.add_typer(key_app, name="key")
tenant_app.add_typer(quota_app, name="quota")

Target = Annotated[
    str,
    typer.Option("--target", "-t", envvar="TIDEGATE_TARGET", help="Gateway gRPC address."),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="TIDEGATE_API_KEY", help="The tenant's API key.", show_default=False
    ),
]
OperatorKey = Annotated[
    str,
    typer.Option(
        "--operator-key",
        envvar="TIDEGATE_OPERATOR_KEY",
        help="The operator key (printed at first start, in <data_dir>/operator.key).",
        show_default=False,
    ),
]

# The target of every data command, and the key its client sends (set by the callback).
_API_KEY: dict[str, str | None] = {"key": None}


@app.callback()
def _main(api_key: ApiKey = None) -> None:
    """Tidegate: a hot log and Iceberg tables served as one stream-table."""
    _API_KEY["key"] = api_key


def _client(target: str) -> Any:
    from gateway.client import Client

    return Client(target, api_key=_API_KEY["key"])


def _admin(target: str, operator_key: str) -> Any:
    from gateway.client import AdminClient

    return AdminClient(target, operator_key=operator_key)


def _fail(err: TidegateError) -> None:
    typer.echo(f"error: {err.reason}: {err.message}", err=True)
    raise typer.Exit(2)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address of both servers.")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0 disables).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0 disables).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "INFO",
) -> None:
    """Run a gateway: gRPC and HTTP on embedded defaults unless configured otherwise."""
    import asyncio

    from gateway.config import Settings
    from gateway.server.app import serve as serve_async

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = Settings()
    server = settings.server.model_copy(
        update={
            k: v
            for k, v in {"host": host, "grpc_port": grpc_port, "http_port": http_port}.items()
            if v is not None
        }
    )
    settings = settings.model_copy(update={"server": server})
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    asyncio.run(serve_async(settings))


@app.command()
def tier(
    every: Annotated[
        float | None, typer.Option(help="Repeat every N seconds (default: run once).")
    ] = None,
    runner: Annotated[
        str, typer.Option(help="'local' (threads in this process) or 'spark'.")
    ] = "local",
    master: Annotated[
        str | None, typer.Option(help="Spark master (default: tiering.master).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "INFO",
) -> None:
    """Move every table's hot records into its Iceberg table (then trim the hot tier
    below what has been tiered for tiering.hot_retention_s)."""
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.lake.runners import make_runner
    from gateway.lake.scheduler import run_forever, run_once

    if runner not in ("local", "spark"):
        raise typer.BadParameter("--runner must be 'local' or 'spark'")
    kind: Any = runner
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = Settings()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    if every:
        run_forever(settings, every_s=every, kind=kind, master=master)
        return
    with Components.open(settings) as c:
        report = run_once(c, make_runner(c, kind, master))
    for name, err in report.failures.items():
        typer.echo(f"failed: {name}: {err}", err=True)
    typer.echo(f"tiered {report.records} records in {len(report.tables)} tables")
    if report.failures:
        raise typer.Exit(1)


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
    with _client(target) as c:
        try:
            info = c.create_table(
                table, _parse_schema(schema), partitions=partitions, key_columns=key or []
            )
        except TidegateError as err:
            _fail(err)
        typer.echo(json.dumps(_describe(info), indent=2))


@table_app.command("list")
def table_list(
    namespace: Annotated[str, typer.Option(help="Only this namespace.")] = "",
    target: Target = "127.0.0.1:50051",
) -> None:
    """List tables."""
    with _client(target) as c:
        try:
            for info in c.list_tables(namespace):
                typer.echo(
                    f"{info.table.namespace}.{info.table.name}\t{info.partitions} partitions"
                )
        except TidegateError as err:
            _fail(err)


@table_app.command("describe")
def table_describe(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    target: Target = "127.0.0.1:50051",
) -> None:
    """Schema, partitions and offsets of a table."""
    with _client(target) as c:
        try:
            typer.echo(json.dumps(_describe(c.describe_table(table)), indent=2))
        except TidegateError as err:
            _fail(err)


@table_app.command("drop")
def table_drop(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    target: Target = "127.0.0.1:50051",
) -> None:
    """Drop a table and its data."""
    with _client(target) as c:
        try:
            c.drop_table(table)
        except TidegateError as err:
            _fail(err)
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

    with _client(target) as c:
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
            _fail(err)
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

    with _client(target) as c:
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
            _fail(err)
        if output is not None:
            import pyarrow.parquet as pq

            if not batches:
                typer.echo("no records", err=True)
                raise typer.Exit(1)
            pq.write_table(pa.Table.from_batches(batches), output)
            typer.echo(f"wrote {sum(b.num_rows for b in batches)} records to {output}")


# Tenants -------------------------------------------------------------------------------
@tenant_app.command("create")
def tenant_create(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    issue_key: Annotated[
        bool, typer.Option("--issue-key", help="Also issue an API key and print it alone.")
    ] = False,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Create a tenant (with --issue-key: print only its first API key)."""
    with _admin(target, operator_key) as a:
        try:
            info = a.create_tenant(name)
            if issue_key:
                typer.echo(a.issue_key(name)[1])
                return
        except TidegateError as err:
            _fail(err)
        typer.echo(json.dumps(info))


@tenant_app.command("list")
def tenant_list(operator_key: OperatorKey, target: Target = "127.0.0.1:50051") -> None:
    """List tenants and their status."""
    with _admin(target, operator_key) as a:
        try:
            for t in a.list_tenants():
                typer.echo(f"{t['name']}\t{t['status']}")
        except TidegateError as err:
            _fail(err)


def _tenant_action(action: str, name: str, operator_key: str, target: str) -> None:
    with _admin(target, operator_key) as a:
        try:
            getattr(a, f"{action}_tenant")(name)
        except TidegateError as err:
            _fail(err)
    typer.echo(f"{action}{'d' if action.endswith('e') else 'ed'} {name}")


@tenant_app.command("suspend")
def tenant_suspend(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Refuse every request of the tenant, on every gateway, at once."""
    _tenant_action("suspend", name, operator_key, target)


@tenant_app.command("resume")
def tenant_resume(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Serve a suspended tenant again."""
    _tenant_action("resume", name, operator_key, target)


@tenant_app.command("delete")
def tenant_delete(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Delete the tenant with its tables (every tier), keys, quotas and usage."""
    _tenant_action("delete", name, operator_key, target)


@key_app.command("issue")
def key_issue(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Issue an API key and print it (alone: it is never shown again)."""
    with _admin(target, operator_key) as a:
        try:
            typer.echo(a.issue_key(tenant)[1])
        except TidegateError as err:
            _fail(err)


@key_app.command("revoke")
def key_revoke(
    key_id: Annotated[str, typer.Argument(help="Key id (the part after 'tg_').")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Revoke a key: it authenticates nothing from now on."""
    with _admin(target, operator_key) as a:
        try:
            a.revoke_key(key_id)
        except TidegateError as err:
            _fail(err)
    typer.echo(f"revoked {key_id}")


@key_app.command("list")
def key_list(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """The tenant's key ids (never the keys)."""
    with _admin(target, operator_key) as a:
        try:
            for k in a.list_keys(tenant):
                typer.echo(f"{k['key_id']}\t{'revoked' if k['revoked'] else 'active'}")
        except TidegateError as err:
            _fail(err)


@quota_app.command("set")
def quota_set(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    append_bytes_per_s: Annotated[int | None, typer.Option(help="Append bytes/s.")] = None,
    read_bytes_per_s: Annotated[int | None, typer.Option(help="Read bytes/s.")] = None,
    requests_per_s: Annotated[int | None, typer.Option(help="Requests/s.")] = None,
    max_tables: Annotated[int | None, typer.Option(help="Tables.")] = None,
    max_partitions: Annotated[int | None, typer.Option(help="Partitions, all tables.")] = None,
    max_hot_bytes: Annotated[int | None, typer.Option(help="Hot-tier bytes.")] = None,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Set quotas (a negative value means unlimited); prints the tenant's quotas."""
    values = {
        k: v
        for k, v in {
            "append_bytes_per_s": append_bytes_per_s,
            "read_bytes_per_s": read_bytes_per_s,
            "requests_per_s": requests_per_s,
            "max_tables": max_tables,
            "max_partitions": max_partitions,
            "max_hot_bytes": max_hot_bytes,
        }.items()
        if v is not None
    }
    with _admin(target, operator_key) as a:
        try:
            typer.echo(json.dumps(a.set_quota(tenant, **values)))
        except TidegateError as err:
            _fail(err)


@quota_app.command("get")
def quota_get(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """The tenant's own quotas (null: the gateway's default)."""
    with _admin(target, operator_key) as a:
        try:
            typer.echo(json.dumps(a.get_quota(tenant)))
        except TidegateError as err:
            _fail(err)


@tenant_app.command("usage")
def tenant_usage(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Usage per minute as JSON lines, then the totals."""
    with _admin(target, operator_key) as a:
        try:
            rows = a.usage(tenant)
        except TidegateError as err:
            _fail(err)
    totals: dict[str, int] = {}
    for row in rows:
        typer.echo(json.dumps(row))
        for k, v in row.items():
            if k in ("hot_bytes", "cold_bytes"):
                totals[k] = max(totals.get(k, 0), v)
            elif k != "minute_ms":
                totals[k] = totals.get(k, 0) + v
    typer.echo(json.dumps({"total": totals}))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
