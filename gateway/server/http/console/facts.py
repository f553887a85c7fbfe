"""What the console's pages show, gathered from the services the JSON API calls.

Each function takes a tenant the viewer may see (checked by the caller) and answers plain
values for the templates and the live JSON; nothing here decides who may see what.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.core import ReadResult, StreamTables, TableView
from gateway.server.calls import DataCalls
from gateway.server.http.groups import group_json
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, TidegateError
from gateway.wire.jsonrows import batch_to_rows
from gateway.wire.schema import SYSTEM_COLUMNS, TIMESTAMP_COLUMN
from gateway.wire.types import USAGE_FIELDS

__all__ = [
    "TIERING_PROPERTY",
    "Records",
    "group_lags",
    "live_table",
    "read_records",
    "table_page",
    "usage_series",
    "when",
]

#: The snapshot summary property a tiering commit writes (and compaction keeps).
TIERING_PROPERTY = "tidegate.watermarks"
#: Partitions whose lag in seconds the live view measures (one one-record read each).
_LAG_SECONDS_PARTITIONS = 64
#: Data files listed on a table's page.
_FILES_SHOWN = 200
#: Snapshots listed on a table's page, newest first.
_SNAPSHOTS_SHOWN = 20
#: Usage fields that are sampled levels (storage held), not counts per minute.
STORAGE_GAUGES = frozenset({"hot_bytes", "cold_bytes"})


def when(value: dt.datetime | None) -> str:
    """A time as the console shows it: UTC to the second (``2026-11-25 21:06:06 UTC``)."""
    if value is None:
        return ""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ms_when(ms: int | None) -> str:
    return "" if ms is None else when(dt.datetime.fromtimestamp(ms / 1000, dt.UTC))


def _ms(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


async def _lag_seconds(
    service: StreamTables, tenant: str, view: TableView, now_us: int
) -> dict[int, float]:
    """Per partition with a lag, how long ago its oldest untiered record was appended."""
    d = view.definition
    out: dict[int, float] = {}
    lagging = [p for p in view.partitions if p.lag_records > 0][:_LAG_SECONDS_PARTITIONS]
    for p in lagging:
        with contextlib.suppress(TidegateError):
            got = await service.read(
                tenant, d.namespace, d.name, p.partition, p.tiered_watermark, 1, None
            )
            if got.batches and got.batches[0].num_rows:
                stamp = got.batches[0].column(TIMESTAMP_COLUMN)[0].value
                out[p.partition] = max(0.0, (now_us - stamp) / 1e6)
    return out


async def live_table(
    service: StreamTables, tenant: str, namespace: str, name: str
) -> dict[str, Any]:
    """The table's partitions now: offsets, tiered watermarks and lag in records, bytes and
    seconds, with totals (what the table page refreshes)."""
    return await _live(service, tenant, await service.describe_table(tenant, namespace, name))


async def _live(service: StreamTables, tenant: str, view: TableView) -> dict[str, Any]:
    now = time.time()
    seconds = await _lag_seconds(service, tenant, view, int(now * 1e6))
    parts = [
        {
            "partition": p.partition,
            "earliest_offset": p.earliest_offset,
            "high_watermark": p.high_watermark,
            "tiered_watermark": p.tiered_watermark,
            "lag_records": p.lag_records,
            "lag_bytes": p.lag_bytes,
            "lag_seconds": round(seconds.get(p.partition, 0.0), 3),
            "hot_bytes": p.hot_bytes,
        }
        for p in view.partitions
    ]
    totals = {
        k: sum(p[k] for p in parts)
        for k in ("high_watermark", "tiered_watermark", "lag_records", "lag_bytes", "hot_bytes")
    }
    totals["lag_seconds"] = max((p["lag_seconds"] for p in parts), default=0.0)
    runs = view.maintenance.last_runs if view.maintenance is not None else {}
    tiered = runs.get("tier")
    return {
        "at_ms": int(now * 1000),
        "partitions": parts,
        "totals": totals,
        # When tiering last committed on this table (None: not since the gateway recorded
        # its runs, or never), and the lake jobs whose last run failed.
        "last_tiered_ms": _ms(tiered.finished_at) if tiered and tiered.outcome == "ok" else None,
        "failures": [
            {"job": job, "at_ms": _ms(r.finished_at), "detail": r.detail}
            for job, r in sorted(runs.items())
            if r.outcome != "ok"
        ],
    }


@dataclass
class TablePage:
    view: TableView
    live: dict[str, Any]
    files: list[dict[str, Any]] = field(default_factory=list)
    files_total: int = 0
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    snapshots_total: int = 0
    last_tiering: dict[str, Any] | None = None
    last_maintenance: dict[str, Any] | None = None
    groups: list[str] = field(default_factory=list)
    #: The Iceberg table's folder (file paths are shown under it).
    location: str = ""
    data_bytes: int = 0


async def table_page(calls: DataCalls, tenant: str, namespace: str, name: str) -> TablePage:
    """Everything a table's page shows: schema, partitions, data files of the current
    snapshot, snapshots with their summaries, the last tiering and maintenance commits."""
    service = calls.service
    view = await service.describe_table(tenant, namespace, name)
    page = TablePage(view, await _live(service, tenant, view))
    plan = await calls.plan(tenant, namespace, name, row_filter=None, as_of=None)
    files = sorted(plan.files, key=lambda f: (f.file.partition, f.file.min_offset))
    page.files_total = len(files)
    page.location = (view.iceberg_metadata or "").rpartition("/metadata/")[0]
    page.files = [
        {
            "partition": f.file.partition,
            "min_offset": f.file.min_offset,
            "max_offset": f.file.max_offset,
            "records": f.file.record_count,
            "bytes": f.file.file_size_bytes,
            "path": f.file.path,
            # Under the table's folder: the part that tells files apart.
            "short": f.file.path.removeprefix(page.location + "/")
            if page.location
            else f.file.path,
        }
        for f in files[:_FILES_SHOWN]
    ]
    page.data_bytes = sum(f.file.file_size_bytes for f in files)
    snaps = await service.list_snapshots(tenant, namespace, name)
    page.snapshots_total = len(snaps)
    rows = [
        {
            "snapshot_id": s.snapshot_id,
            "at": _ms_when(s.timestamp_ms),
            "operation": s.operation,
            "summary": sorted(dict(s.summary).items()),
            "tiering": TIERING_PROPERTY in s.summary and s.operation == "append",
        }
        for s in reversed(snaps)
    ]
    page.snapshots = rows[:_SNAPSHOTS_SHOWN]
    page.last_tiering = next((r for r in rows if r["tiering"]), None)
    # Compaction and expiry commit "replace"/"delete"/"overwrite" snapshots.
    page.last_maintenance = next((r for r in rows if r["operation"] != "append"), None)
    page.groups = sorted(g for g, _, _ in await service.list_groups(tenant, namespace, name))
    return page


async def group_lags(service: StreamTables, tenant: str) -> list[dict[str, Any]]:
    """Every consumer group of the tenant per table, as ``GET /v1/groups/...`` answers
    it (``tidegate group describe`` shows the same): generation and state, the live
    members with the partitions each holds and how long ago each heartbeat came, and per
    partition its member, committed offset and lag in records."""
    out = []
    for group, namespace, name in await service.list_groups(tenant):
        described = group_json(await service.describe_group(tenant, group, namespace, name))
        now = time.time() * 1000
        for m in described["members"]:
            m["heartbeat_ago_s"] = max(0.0, (now - m["last_heartbeat_ms"]) / 1000)
        out.append(described)
    return out


@dataclass
class Records:
    """One page of the record browser."""

    columns: list[str]
    rows: list[dict[str, Any]]
    next_offset: int
    high_watermark: int
    tiered_watermark: int
    offset: int


def _parse_time(text: str) -> int:
    """Epoch microseconds of an ISO-8601 time (UTC when it names no zone)."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidRequest(
            f"time {text[:40]!r} is not an ISO-8601 time such as 2026-11-24T10:00:00Z",
            field="time",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1_000_000)


async def read_records(
    calls: DataCalls,
    tenant: str,
    namespace: str,
    name: str,
    partition: int,
    offset: int,
    at_time: str,
    limit: int,
) -> Records:
    """Records of a partition from an offset, or (``at_time`` not empty) from the first
    appended at or after a time, each marked with the tier that served it (below the
    answer's tiered watermark: Iceberg), through the same metered read as
    ``GET .../records``."""
    start = offset
    if at_time.strip():
        found = await calls.offsets_for_times(
            tenant, namespace, name, _parse_time(at_time), [partition]
        )
        start = found.get(partition, 0)

    def encode(result: ReadResult) -> tuple[ReadResult, int]:
        return result, result.nbytes

    result = await calls.read(tenant, namespace, name, partition, start, limit, None, encode)
    rows = batch_to_rows(result.batches)
    table = await calls.service.table(tenant, namespace, name)
    user = [c for c in table.schema.names if c not in SYSTEM_COLUMNS]
    for row in rows:
        row["_tier"] = "iceberg" if row["_offset"] < result.tiered_watermark else "hot"
    return Records(
        columns=[*SYSTEM_COLUMNS, "_tier", *user],
        rows=rows,
        next_offset=result.next_offset,
        high_watermark=result.high_watermark,
        tiered_watermark=result.tiered_watermark,
        offset=start,
    )


async def usage_series(tenancy: Tenancy, tenant: str, minutes: int) -> dict[str, Any]:
    """The tenant's usage per minute over the last ``minutes``, as columns for the charts:
    ``minutes`` (epoch seconds) and one list per usage field."""
    since = int(time.time() // 60 * 60 - minutes * 60) * 1000
    rows = await tenancy.admin.usage(tenant, since, None)
    by_minute = {int(r.minute.timestamp()): r.counters for r in rows}
    # Every minute of the window once anything was recorded in it (the charts always span
    # the same time): a minute without a row used nothing (0 for the counters), and storage
    # not sampled in a minute is unknown (null: a gap in the chart, never a fall to 0).
    now = int(time.time() // 60 * 60)
    axis = list(range(since // 1000, now + 1, 60)) if by_minute else []
    series: dict[str, Any] = {"minutes": axis}
    for f in USAGE_FIELDS:
        gauge = f in STORAGE_GAUGES
        series[f] = [by_minute.get(m, {}).get(f, None if gauge else 0) for m in axis]
    return series


def engine_snippets(catalog_uri: str, tenant: str, namespace: str, name: str) -> dict[str, str]:
    """Copy-paste code that reads the table through the gateway's Iceberg REST catalog
    (docs/engines.md), with a placeholder where the tenant's API key goes: the page never
    shows a key."""
    key = "<your API key>"
    table = f"{namespace}.{name}"
    return {
        "duckdb": (
            "INSTALL iceberg; LOAD iceberg;\n"
            f"CREATE SECRET tidegate (TYPE iceberg, CLIENT_ID '{tenant}', "
            f"CLIENT_SECRET '{key}',\n"
            f"    OAUTH2_SERVER_URI '{catalog_uri}/v1/oauth/tokens');\n"
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{catalog_uri}', "
            "SECRET tidegate);\n"
            f"SELECT * FROM tg.{table} ORDER BY _partition, _offset LIMIT 10;"
        ),
        "pyiceberg": (
            "from pyiceberg.catalog.rest import RestCatalog\n\n"
            f'catalog = RestCatalog("tidegate", uri="{catalog_uri}", token="{key}")\n'
            f'rows = catalog.load_table("{table}").scan().to_arrow()'
        ),
        "spark": (
            "spark-sql --packages org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0,"
            "org.apache.iceberg:iceberg-aws-bundle:1.10.0 \\\n"
            "  --conf spark.sql.catalog.tg=org.apache.iceberg.spark.SparkCatalog \\\n"
            "  --conf spark.sql.catalog.tg.type=rest \\\n"
            f"  --conf spark.sql.catalog.tg.uri={catalog_uri} \\\n"
            f"  --conf spark.sql.catalog.tg.credential={tenant}:{key} \\\n"
            f"  --conf spark.sql.catalog.tg.oauth2-server-uri={catalog_uri}/v1/oauth/tokens \\\n"
            "  --conf spark.sql.catalog.tg.header.X-Iceberg-Access-Delegation="
            "vended-credentials \\\n"
            f'  -e "SELECT * FROM tg.{table} LIMIT 10"'
        ),
    }
