"""``tidegate append``, ``read``, ``scan`` and ``group ...``: records and consumer groups."""

from __future__ import annotations

import datetime as dt
import enum
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import pyarrow as pa
import typer

from gateway.cli._common import JsonFlag, TableArg, app, client_for, columns, group_app, plural
from gateway.wire.errors import InvalidRequest
from gateway.wire.retry import Retry
from gateway.wire.schema import SYSTEM_COLUMNS
from gateway.wire.values import to_decimal


def _json_lines(
    stream: IO[str], schema: pa.Schema, batch_rows: int, omittable: frozenset[str] = frozenset()
) -> Iterator[pa.RecordBatch]:
    """A file of JSON lines as batches, each line checked as HTTP checks a JSON row (a
    column added by a schema change may be left out)."""
    from gateway.wire.jsonrows import rows_to_batch

    rows: list[Any] = []
    first = 1
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(
                f"line {number} is not JSON ({exc.msg}): this input is read as JSON lines, "
                "one object per line; for CSV or Parquet say --format csv or --format parquet"
            ) from None
        if isinstance(rows[-1], dict):
            for name in SYSTEM_COLUMNS:
                rows[-1].pop(name, None)
        if len(rows) == batch_rows:
            yield rows_to_batch(rows, schema, first=first, unit="line", omittable=omittable)
            rows, first = [], number + 1
    if rows:
        yield rows_to_batch(rows, schema, first=first, unit="line", omittable=omittable)


def _format_of(path: Path | None, fmt: str) -> str:
    if fmt != "auto":
        if fmt not in ("csv", "jsonl", "parquet"):
            raise typer.BadParameter(f"unknown format {fmt!r}: use csv, jsonl or parquet")
        return fmt
    if path is None:
        return "auto"  # stdin: told by its first bytes, see _sniff_stdin
    suffix = path.suffix.lower()
    known = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
    if suffix in known:
        return known[suffix]
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise typer.BadParameter(
        f"cannot tell the format of {path.name} from its name: use a .csv, .jsonl or "
        ".parquet file, or say --format csv|jsonl|parquet"
    )


def _sniff_stdin(columns: list[str]) -> str:
    """The format of stdin from its first bytes, without consuming them: Parquet by its
    magic number, CSV when the first line is a header of the table's columns (system
    columns too, as ``read --output`` writes them), else JSON lines."""
    peek = getattr(sys.stdin.buffer, "peek", None)
    if peek is None:  # pragma: no cover - stdin is always buffered in a process
        return "jsonl"
    head = bytes(peek(64 * 1024))[: 64 * 1024]
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.lstrip()
    if text.startswith((b"{", b"[")) or not text:
        return "jsonl"
    first = text.split(b"\n", 1)[0].decode("utf-8", "replace").strip().strip("\ufeff")
    names = [n.strip().strip('"') for n in first.split(",")]
    known = set(columns) | set(SYSTEM_COLUMNS)
    if names and set(names) <= known and set(columns) & set(names):
        return "csv"
    return "jsonl"


def _file_batches(
    path: Path | None,
    fmt: str,
    schema: pa.Schema,
    batch_rows: int,
    omittable: frozenset[str] = frozenset(),
) -> Iterator[pa.RecordBatch]:
    """The rows of ``path`` (stdin when None) as batches, system columns dropped."""
    where = "stdin" if path is None else str(path)
    if fmt == "jsonl":
        if path is None:
            yield from _json_lines(sys.stdin, schema, batch_rows, omittable)
        else:
            with path.open(encoding="utf-8") as f:
                yield from _json_lines(f, schema, batch_rows, omittable)
        return
    source: Any = sys.stdin.buffer if path is None else path
    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            # Decimals are read as text and made exact in Python: Arrow's own CSV decimal
            # parser crashes the process on an extreme exponent (0E-999999999).
            simple = {
                f.name: pa.string() if pa.types.is_decimal(f.type) else f.type
                for f in schema
                if not pa.types.is_nested(f.type)
            }
            data = pacsv.read_csv(source, convert_options=pacsv.ConvertOptions(column_types=simple))
            data = _csv_decimals(data, schema, where)
        else:
            import pyarrow.parquet as pq

            data = pq.read_table(pa.BufferReader(source.read()) if path is None else source)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        reason = _arrow_reason(exc, _csv_header(path) if fmt == "csv" else [])
        raise InvalidRequest(f"cannot read {where} as {fmt.upper()}: {reason}") from None
    present = [n for n in SYSTEM_COLUMNS if n in data.column_names]
    if present:
        data = data.drop_columns(present)
    yield from data.to_batches(max_chunksize=batch_rows)


def _csv_decimals(data: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``data`` with its decimal columns (read as text) converted to their types.

    Raises:
        InvalidRequest: naming the line and column of a value the type cannot hold.
    """
    for f in schema:
        at = data.schema.get_field_index(f.name)
        if at < 0 or not pa.types.is_decimal(f.type):
            continue
        values = []
        for line, text in enumerate(data.column(at).to_pylist(), 2):
            try:
                values.append(
                    None if text is None else to_decimal(text, f.type.precision, f.type.scale)
                )
            except ValueError as exc:
                raise InvalidRequest(
                    f"cannot read {where} as CSV: line {line}, column {f.name!r}: {exc}",
                    column=f.name,
                ) from None
        data = data.set_column(at, pa.field(f.name, f.type), pa.array(values, f.type))
    return data


def _csv_header(path: Path | None) -> list[str]:
    if path is None:
        return []
    with path.open(encoding="utf-8", errors="replace") as f:
        return f.readline().strip().split(",")


def _arrow_reason(exc: Exception, header: list[str]) -> str:
    """pyarrow's message for a file that is not what its name says, in plain words, with
    a CSV column named rather than numbered."""
    import re

    text = str(exc).strip().splitlines()[0]
    if "magic bytes" in text or "minimum file footer" in text or "file size is 0" in text:
        return "it is not a Parquet file"
    # "In CSV column #1: Row #3: CSV conversion error to int64: invalid value 'x'"
    found = re.match(r"In CSV column #(\d+): (.*)", text)
    if found:
        index, rest = int(found.group(1)), found.group(2)
        name = header[index] if index < len(header) else f"#{index}"
        rest = re.sub(r"^Row #(\d+): ", lambda m: f"line {int(m.group(1)) + 1}: ", rest)
        return f"column {name!r}: {rest}"
    return text


@app.command()
def append(
    table: TableArg,
    path: Annotated[
        str,
        typer.Argument(
            help="A CSV, JSON lines or Parquet file; '-' reads stdin (CSV with a header of "
            "the table's columns, Parquet or JSON lines, told by its first bytes)."
        ),
    ],
    format: Annotated[str, typer.Option("--format", help="auto, csv, jsonl or parquet.")] = "auto",
    partition: Annotated[int | None, typer.Option(help="Send every row to this partition.")] = None,
    batch_rows: Annotated[int, typer.Option(help="Rows per append request.")] = 10_000,
) -> None:
    """Append the rows of a file (or stdin): every column of the table needs a value (null
    for a nullable one); system columns (_partition, _offset, _timestamp) are ignored."""
    from gateway.wire.schema import parse_fields

    source = None if path == "-" else Path(path)
    if source is not None and not source.is_file():
        raise typer.BadParameter(f"{path} is not a file", param_hint="PATH")
    fmt = _format_of(source, format)
    with client_for() as c:
        info = c.describe_table(table)
        schema = parse_fields(
            [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in info.fields],
            bounded=False,
        )
        if fmt == "auto":
            fmt = _sniff_stdin(schema.names)
        # The SDK's producer routes the rows, numbers each request and resends what the
        # gateway refused for a while: THROTTLED is waited out for as long as its
        # retry-after says (a file larger than the tenant's quota loads at the quota's
        # pace), and no row is stored twice.
        sent = []
        retry = Retry(timeout=APPEND_RETRY_S)
        with c.producer(table, batch_records=batch_rows, retry=retry) as producer:
            for batch in _file_batches(source, fmt, schema, batch_rows, info.added_columns):
                sent.append(producer.send(batch, partition=partition))
        total = sum(len(f.result()) for f in sent if f.exception() is None)
        failed = next((f.exception() for f in sent if f.exception() is not None), None)
    if failed is not None:
        typer.echo(f"appended {plural(total, 'record')} to {table} before an error", err=True)
        raise failed
    typer.echo(f"appended {plural(total, 'record')} to {table}")


#: Seconds a request of ``append`` keeps being resent (throttled, gateway unreachable).
APPEND_RETRY_S = 600.0


def _start_at(start: str) -> Any:
    """``--from`` as the SDK's start position."""
    if start in ("earliest", "latest"):
        return start
    if start.isdigit():
        return int(start)
    try:
        return dt.datetime.fromisoformat(start.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{start!r} is not a start: use earliest, latest, an offset or an ISO-8601 time "
            "such as 2026-11-21T10:00:00Z",
            param_hint="--from",
        ) from None


def _partitions(info: Any, table: str, asked: list[int] | None) -> list[int]:
    for p in asked or ():
        if not 0 <= p < info.partitions:
            raise typer.BadParameter(
                f"{table} has partitions 0 to {info.partitions - 1}, not {p}",
                param_hint="--partition",
            )
    return sorted(set(asked)) if asked else list(range(info.partitions))


class ScanModeArg(enum.StrEnum):
    """``--mode`` of ``tidegate scan`` and ``read`` (see ``Client.scan``, ``Client.read``)."""

    auto = "auto"
    client = "client"
    server = "server"


_WAREHOUSE_HELP = (
    "The gateway's local warehouse folder as this host sees it: the tiered files are read "
    "there instead of through the gateway's links."
)


@app.command()
def read(
    table: TableArg,
    partition: Annotated[
        list[int] | None, typer.Option(help="Partition to read (repeatable; default: all).")
    ] = None,
    start: Annotated[
        str,
        typer.Option("--from", help="Where to start: earliest, latest, an offset or a time."),
    ] = "earliest",
    offset: Annotated[
        int | None, typer.Option(help="First offset (the same as --from OFFSET).")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="Consumer group: start at its committed offsets, commit at the end."),
    ] = None,
    max_records: Annotated[
        int, typer.Option(help="Records at most, all partitions together (0: all).")
    ] = 0,
    output: Annotated[
        Path | None, typer.Option(help="Write Parquet here instead of printing JSON lines.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            help="Keep waiting for new records; through a gateway restart it reconnects and "
            "goes on where it was (one line on stderr per outage)."
        ),
    ] = False,
    reconnect_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds to keep reconnecting to a gateway that went away before giving up "
            "(default: for ever with --follow, else 30).",
            show_default=False,
        ),
    ] = None,
    show_tier: Annotated[
        bool,
        typer.Option(
            help="Add _tier to each record: 'iceberg' or 'hot', the tier that served it "
            "(the gateway then reads every record)."
        ),
    ] = False,
    mode: Annotated[
        ScanModeArg,
        typer.Option(
            help="Who reads the records below the tiered watermark: auto (this host reads "
            "the tiered files itself when it can reach them, else the gateway), client "
            "(always this host), server (the gateway)."
        ),
    ] = ScanModeArg.auto,
    warehouse: Annotated[str | None, typer.Option(help=_WAREHOUSE_HELP)] = None,
) -> None:
    """Read records as JSON lines (or into Parquet): every partition unless told one, from
    --from to the end (or --max-records); with --follow, keep waiting for new ones."""
    from gateway.wire.jsonrows import batch_to_rows

    batches: list[pa.RecordBatch] = []
    total = 0
    begin = _start_at(str(offset) if offset is not None else start)
    say_outages()
    with client_for(warehouse) as c:
        parts = _partitions(c.describe_table(table), table, partition)
        with c.consumer(
            table,
            group=group,
            partitions=parts,
            start=begin,
            follow=follow,
            auto_commit_interval=None,
            with_tier=show_tier,
            mode=mode.value,
            reconnect_timeout=reconnect_timeout,
        ) as consumer:
            for batch in consumer.batches():
                if max_records and total + batch.num_rows > max_records:
                    batch = batch.slice(0, max_records - total)
                    consumer.seek(
                        batch.column("_partition")[0].as_py(),
                        batch.column("_offset")[-1].as_py() + 1,
                    )
                total += batch.num_rows
                if output is None:
                    for row in batch_to_rows([batch]):
                        sys.stdout.write(json.dumps(row) + "\n")
                    sys.stdout.flush()
                else:
                    batches.append(batch)
                if max_records and total >= max_records:
                    typer.echo(
                        f"stopped after {plural(total, 'record')} (--max-records); more may follow",
                        err=True,
                    )
                    break
            if group:
                consumer.commit()
    if output is not None:
        import pyarrow.parquet as pq

        if not batches:
            typer.echo("no records", err=True)
            raise typer.Exit(1)
        pq.write_table(pa.Table.from_batches(batches), output)
        typer.echo(f"wrote {plural(total, 'record')} to {output}")


@app.command()
def scan(
    table: TableArg,
    columns: Annotated[
        list[str] | None, typer.Option("--column", "-c", help="Column to return (repeatable).")
    ] = None,
    filter: Annotated[str, typer.Option(help='SQL-like filter, e.g. "amount >= 10".')] = "",
    as_of: Annotated[
        str | None,
        typer.Option(help="Read this Iceberg snapshot (its id, or an ISO-8601 time) only."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Rows at most.")] = None,
    mode: Annotated[
        ScanModeArg,
        typer.Option(
            help="Where the scan runs: auto (this host reads the tiered files itself when it "
            "can reach them, else the gateway scans), client (always this host), server "
            "(the gateway reads and sends every row)."
        ),
    ] = ScanModeArg.auto,
    warehouse: Annotated[str | None, typer.Option(help=_WAREHOUSE_HELP)] = None,
) -> None:
    """The whole table, hot and tiered rows alike, as JSON lines (one consistent view)."""
    from gateway.wire.jsonrows import batch_to_rows

    when: int | str | None = int(as_of) if as_of is not None and as_of.isdigit() else as_of
    with client_for(warehouse) as c:
        for batch in c.scan_batches(
            table,
            columns=columns or (),
            filter=filter,
            as_of=when,
            limit=limit,
            mode=mode.value,
        ):
            for row in batch_to_rows([batch]):
                sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


@group_app.command("list")
def group_list(
    table: Annotated[
        str | None, typer.Argument(help="Only this table's groups.", show_default=False)
    ] = None,
) -> None:
    """Consumer groups with committed offsets, and their tables."""
    with client_for() as c:
        for group, ref in c.list_groups(table):
            typer.echo(f"{group}\t{ref}")


def say_outages() -> None:
    """Show the SDK's one line per gateway outage on stderr, as it is (no traceback)."""
    import logging

    sdk = logging.getLogger("tidegate.client")
    if any(getattr(h, "tidegate_cli", False) for h in sdk.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tidegate: %(message)s"))
    handler.tidegate_cli = True  # type: ignore[attr-defined]
    sdk.addHandler(handler)
    sdk.setLevel(logging.WARNING)
    sdk.propagate = False


def _ago(when: dt.datetime) -> str:
    return f"{max(0.0, (dt.datetime.now(dt.UTC) - when).total_seconds()):.1f} s ago"


def _describe_group_text(info: Any) -> str:
    members = len(info.members)
    lines = [
        f"group {info.group} on {info.table}: generation {info.generation}, {info.state}, "
        f"{members} member{'' if members == 1 else 's'}, lag {info.lag}"
    ]
    if info.members:
        rows = [["member", "client", "generation", "partitions", "last heartbeat", "protocol"]]
        for m in info.members:
            held = ",".join(map(str, m.assigned)) or "-"
            if m.revoking:
                held += " (giving up " + ",".join(map(str, m.revoking)) + ")"
            if m.pending:
                held += " (waiting for " + ",".join(map(str, m.pending)) + ")"
            rows.append(
                [
                    m.member_id,
                    m.client_id or "-",
                    str(m.generation),
                    held,
                    _ago(m.last_heartbeat),
                    m.protocol,
                ]
            )
        lines += ["", *columns(rows)]
    rows = [["partition", "member", "committed", "high watermark", "lag"]]
    for p in info.partitions:
        rows.append(
            [
                str(p.partition),
                p.member_id or "-",
                "-" if p.committed is None else str(p.committed),
                str(p.high_watermark),
                str(p.lag),
            ]
        )
    return "\n".join([*lines, "", *columns(rows)])


@group_app.command("describe")
def group_describe(
    group: Annotated[str, typer.Argument(help="The consumer group.")],
    table: TableArg,
    as_json: JsonFlag = False,
) -> None:
    """The group on a table: generation and state, its live members with the partitions
    each holds, and per partition its member, committed offset and lag."""
    with client_for() as c:
        info = c.describe_group(group, table)
    if not as_json:
        typer.echo(_describe_group_text(info))
        return
    body = {
        "group": info.group,
        "table": str(info.table),
        "generation": info.generation,
        "state": info.state,
        "lag": info.lag,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "generation": m.generation,
                "assigned": list(m.assigned),
                "revoking": list(m.revoking),
                "pending": list(m.pending),
                "last_heartbeat": m.last_heartbeat.isoformat(),
                "protocol": m.protocol,
            }
            for m in info.members
        ],
        "partitions": [
            {
                "partition": p.partition,
                "member_id": p.member_id,
                "committed": p.committed,
                "high_watermark": p.high_watermark,
                "lag": p.lag,
            }
            for p in info.partitions
        ],
    }
    typer.echo(json.dumps(body, indent=2))


@group_app.command("reset")
def group_reset(
    group: Annotated[str, typer.Argument(help="The consumer group.")],
    table: TableArg,
    to: Annotated[
        str, typer.Option("--to", help="earliest, latest, an offset or an ISO-8601 time.")
    ] = "earliest",
    partition: Annotated[
        list[int] | None, typer.Option(help="Partition to reset (repeatable; default: all).")
    ] = None,
) -> None:
    """Move the group's committed offsets (its consumers start there when they next start)."""
    begin = _start_at(to)
    with client_for() as c:
        parts = _partitions(c.describe_table(table), table, partition)
        # A consumer without the group computes where --to points, per partition.
        with c.consumer(table, partitions=parts, start=begin, follow=False) as positions:
            offsets = dict(positions.positions)
        c.commit_offsets(group, table, offsets)
    typer.echo(
        f"reset {group} on {table}: "
        + ", ".join(f"partition {p} at {o}" for p, o in sorted(offsets.items()))
    )
