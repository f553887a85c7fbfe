"""Prometheus metrics of the gateway, shared by both edges.

Names follow ``tidegate_<subsystem>_<what>_<unit>``: counters end in ``_total``, histograms
in ``_seconds`` with explicit buckets. Every label has bounded cardinality: HTTP routes are
labelled by their *template* (``/v1/tables/{namespace}/{name}``), never the raw path, and
requests that match no route share one ``route="<unmatched>"`` series. Tenants and tables
are not labels here; per-tenant counters live in :mod:`gateway.tenancy.metering`, which
names at most ``metering.metrics_max_tenants`` tenants per process and counts the rest under
``tenant="_other"``.

Everything registers in prometheus_client's default registry, which ``GET /metrics``
exposes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "APPEND_BYTES",
    "APPEND_RECORDS",
    "EDGE_CONNECTIONS_CLOSED",
    "FILE_LINK_BYTES",
    "FILE_LINK_RECORDS",
    "GRPC_DURATION",
    "GRPC_REQUESTS",
    "HTTP_DURATION",
    "HTTP_REQUESTS",
    "KAFKA_DURATION",
    "KAFKA_REQUESTS",
    "READ_RECORDS",
    "UNMATCHED_ROUTE",
    "observe_grpc_request",
    "observe_http_request",
    "observe_kafka_request",
    "on_scrape",
    "record_append",
    "record_catalog_access",
    "record_catalog_plan",
    "record_catalog_token",
    "record_connection_closed",
    "record_fenced",
    "record_file_read",
    "record_flight_sent",
    "record_group_changes",
    "record_lake_job",
    "record_move",
    "record_move_outcome",
    "record_read",
    "record_sealed_retry",
    "record_shard_append",
    "record_tiering",
    "record_tiering_failure",
    "refresh",
    "set_group_lags",
    "set_lake_stats",
    "set_shard_stats",
    "set_tiering_lag",
]

#: The ``route`` label of HTTP requests that matched no route (404s of unknown paths).
UNMATCHED_ROUTE = "<unmatched>"

APPEND_RECORDS = Counter(
    "tidegate_append_records_total",
    "Records acknowledged by appends, retried duplicates included (both edges).",
)
APPEND_BYTES = Counter(
    "tidegate_append_bytes_total",
    "Request payload bytes (Arrow IPC or JSON) of acknowledged appends (both edges).",
)
READ_RECORDS = Counter(
    "tidegate_read_records_total",
    "Records returned by stream reads, follow reads included (both edges).",
)
HTTP_REQUESTS = Counter(
    "tidegate_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "status"],
)
#: Latency buckets of both edges (long polls and follow streams reach the upper ones).
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_DURATION = Histogram(
    "tidegate_http_request_duration_seconds",
    "HTTP request latency by route template and method; long polls wait up to "
    "server.http_follow_wait_ms, hence the upper buckets.",
    ["route", "method"],
    buckets=_LATENCY_BUCKETS,
)


def record_append(records: int, nbytes: int) -> None:
    """Count one acknowledged append of ``records`` records carried in ``nbytes`` bytes."""
    APPEND_RECORDS.inc(records)
    APPEND_BYTES.inc(nbytes)


def record_read(records: int) -> None:
    """Count ``records`` records returned by a read."""
    READ_RECORDS.inc(records)


FILE_LINK_BYTES = Counter(
    "tidegate_file_link_bytes_total",
    "Bytes of data files served through read plans' links (/v1/files), metered as their "
    "tenants' reads.",
)
FILE_LINK_RECORDS = Counter(
    "tidegate_file_link_records_total",
    "Rows of the row groups served through read plans' links (/v1/files), each once per "
    "link: the rows clients read themselves, metered as their tenants' reads. Not in "
    "tidegate_read_records_total, which counts the rows the gateway decoded and sent.",
)


def record_file_read(records: int, nbytes: int) -> None:
    """Count a range of a data file served through a plan's link."""
    FILE_LINK_BYTES.inc(nbytes)
    FILE_LINK_RECORDS.inc(records)


FLIGHT_SENT = Counter(
    "tidegate_flight_sent_total",
    "What Flight DoGet answers handed to Arrow's transport, by call kind (scan, read) and "
    'how: path="arrow" counts readers over whole tables that Arrow\'s C++ sends batch by '
    'batch with no Python running, path="python" counts batches passed one at a time '
    "through Python (a scan with a limit, a stream read's last batch and its metadata).",
    ["kind", "path"],
)


def record_flight_sent(kind: str, readers: int, batches: int) -> None:
    """Count ``readers`` C++ readers and ``batches`` single batches a Flight call sent."""
    if readers:
        FLIGHT_SENT.labels(kind, "arrow").inc(readers)
    if batches:
        FLIGHT_SENT.labels(kind, "python").inc(batches)


GRPC_REQUESTS = Counter(
    "tidegate_grpc_requests_total",
    "gRPC calls answered, by method and status code.",
    ["method", "code"],
)
GRPC_DURATION = Histogram(
    "tidegate_grpc_request_duration_seconds",
    "gRPC call latency by method, to the end of the answer (a follow stream: its life).",
    ["method"],
    buckets=_LATENCY_BUCKETS,
)


def observe_grpc_request(method: str, code: str, seconds: float) -> None:
    """Count one answered gRPC call (``method``: its short name, e.g. ``Append``)."""
    GRPC_REQUESTS.labels(method=method, code=code).inc()
    GRPC_DURATION.labels(method=method).observe(seconds)


KAFKA_REQUESTS = Counter(
    "tidegate_kafka_requests_total",
    "Kafka requests answered, by API and the first error code of the answer (none: "
    "every part succeeded).",
    ["api", "error"],
)
KAFKA_DURATION = Histogram(
    "tidegate_kafka_request_duration_seconds",
    "Kafka request latency by API, from the whole request read to its answer written "
    "(a Fetch's long poll included).",
    ["api"],
    buckets=_LATENCY_BUCKETS,
)


def observe_kafka_request(api: str, error: str, seconds: float) -> None:
    """Count one answered Kafka request (``api``: Kafka's name, e.g. ``Produce``)."""
    KAFKA_REQUESTS.labels(api=api, error=error).inc()
    KAFKA_DURATION.labels(api=api).observe(seconds)


EDGE_CONNECTIONS_CLOSED = Counter(
    "tidegate_edge_connections_closed_total",
    "Connections the gateway closed on its own, by edge and reason: over_cap (more open "
    "than server.max_connections), header_timeout, body_timeout, linger (a refused "
    "request's unread body kept coming); the Kafka edge's also idle, too_large, "
    "unanswerable (not a request Kafka would answer), unauthenticated, auth_failed, "
    "over_tenant_cap.",
    ["edge", "reason"],
)


def record_connection_closed(edge: str, reason: str) -> None:
    """Count one connection the gateway closed on its own."""
    EDGE_CONNECTIONS_CLOSED.labels(edge=edge, reason=reason).inc()


def observe_http_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered HTTP request and its latency. ``route`` must be a template."""
    HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
    HTTP_DURATION.labels(route=route, method=method).observe(seconds)


GROUP_REBALANCES = Counter(
    "tidegate_groups_rebalances_total",
    "Consumer-group rebalances this gateway started, by the change of membership that "
    "caused them: join, leave, expire (a member's session timed out).",
    ["reason"],
)
GROUP_REBALANCE_SECONDS = Histogram(
    "tidegate_groups_rebalance_duration_seconds",
    "From a change of membership until every member holds its new target, observed by the "
    "gateway that saw the group settle.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
GROUP_FENCED = Counter(
    "tidegate_groups_fenced_requests_total",
    "Consumer-group heartbeats and commits refused, by reason: ILLEGAL_GENERATION and "
    "UNKNOWN_MEMBER_ID (a fenced member), NON_EMPTY_GROUP (a commit from outside a live group).",
    ["reason"],
)
GROUP_MEMBERS = Gauge(
    "tidegate_groups_members",
    "Live consumer-group members of every tenant, as stored in the metadata store.",
)
GROUP_LAG = Gauge(
    "tidegate_groups_lag_records",
    "Records appended and not yet committed, per consumer group and table (the "
    'groups.metrics_max_groups largest; the others are summed under group="_other").',
    ["tenant", "group", "table"],
)
#: The label value that stands for every group past ``groups.metrics_max_groups``.
OTHER_GROUPS = "_other"


def record_group_changes(rebalances: Sequence[str], settled_after_ms: int | None) -> None:
    """Count the rebalances a group call started, and the one it saw complete."""
    for reason in rebalances:
        GROUP_REBALANCES.labels(reason=reason).inc()
    if settled_after_ms is not None:
        GROUP_REBALANCE_SECONDS.observe(settled_after_ms / 1000)


def record_fenced(reason: str) -> None:
    """Count one group request refused with ``reason``."""
    GROUP_FENCED.labels(reason=reason).inc()


def set_group_lags(lags: Sequence[tuple[str, str, str, int]], members: int, most: int) -> None:
    """Set the group gauges: ``lags`` is ``(tenant, group, table, lag)`` of every group;
    the ``most`` largest are labelled, the rest summed into one ``_other`` series."""
    GROUP_MEMBERS.set(members)
    GROUP_LAG.clear()
    ranked = sorted(lags, key=lambda row: (-row[3], row[:3]))
    for tenant, group, table, lag in ranked[:most]:
        GROUP_LAG.labels(tenant=tenant, group=group, table=table).set(lag)
    rest = ranked[most:]
    if rest:
        GROUP_LAG.labels(tenant=OTHER_GROUPS, group=OTHER_GROUPS, table=OTHER_GROUPS).set(
            sum(row[3] for row in rest)
        )


CATALOG_TOKENS = Counter(
    "tidegate_iceberg_catalog_tokens_total",
    "Access tokens the Iceberg REST catalog issued for tenants' keys (/iceberg/v1/oauth/tokens).",
)
CATALOG_ACCESS = Counter(
    "tidegate_iceberg_catalog_table_access_total",
    "Table loads and credential requests of the Iceberg REST catalog, by what the engine "
    "was given to read the files ('credentials': vended temporary ones, 'none': a local "
    "warehouse or no role to vend with). Requests per route are "
    'tidegate_http_requests_total{route=~"/iceberg/.*"}.',
    ["access"],
)


def record_catalog_token() -> None:
    """Count one access token issued by the Iceberg catalog."""
    CATALOG_TOKENS.inc()


def record_catalog_access(vended: bool) -> None:
    """Count one table load or credential request of the Iceberg catalog."""
    CATALOG_ACCESS.labels(access="credentials" if vended else "none").inc()


CATALOG_PLANS = Counter(
    "tidegate_iceberg_catalog_plans_total",
    "Scan plans of the Iceberg REST catalog (POST .../plan), by outcome: 'completed', "
    "'committed_only' (a hot tail over cold.rest_catalog.plan_max_hot_records, or of a "
    "table of client_planning_tables, left out), 'failed' (refused for it, or a submitted "
    "plan whose tail was trimmed first) or 'submitted' (its files written in the "
    "background; counted 'completed' again once written).",
    ["outcome"],
)
CATALOG_PLAN_HOT_BYTES = Counter(
    "tidegate_iceberg_catalog_plan_hot_bytes_total",
    "Bytes of hot-tail Parquet files scan plans wrote (a file named again by a later plan "
    "is counted once, when written).",
)


def record_catalog_plan(outcome: str, written_bytes: int) -> None:
    """Count one scan plan of the Iceberg catalog and the hot-tail bytes it wrote."""
    CATALOG_PLANS.labels(outcome=outcome).inc()
    if written_bytes:
        CATALOG_PLAN_HOT_BYTES.inc(written_bytes)


TIERING_RECORDS = Counter(
    "tidegate_tiering_records_total",
    "Records committed to Iceberg by tiering runs.",
)
TIERING_BYTES = Counter(
    "tidegate_tiering_bytes_total",
    "Parquet bytes committed to Iceberg by tiering runs.",
)
TIERING_TABLES = Counter(
    "tidegate_tiering_tables_total",
    "Tables handled by tiering runs, by outcome (ok, failed).",
    ["outcome"],
)
TIERING_CONFLICTS = Counter(
    "tidegate_tiering_commit_conflicts_total",
    "Tiering commits that lost a race to a concurrent commit and were re-planned.",
)
HOT_TRIMMED = Counter(
    "tidegate_hot_trims_total",
    "Partitions trimmed in the hot tier after tiering (below the retained watermark).",
)
HOT_DISK_FSYNC_SECONDS = Histogram(
    "tidegate_hot_disk_fsync_duration_seconds",
    "Duration of the disk hot tier's group commits: one fsync of a partition's files makes "
    "every batch written to it before the fsync started durable.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
HOT_DISK_EVICTIONS = Counter(
    "tidegate_hot_disk_evictions_total",
    "Partitions the disk hot tier closed to keep its open files within hot.max_open_files "
    "(reopened on their next use).",
)
HOT_DISK_OPEN_FILES = Gauge(
    "tidegate_hot_disk_open_files",
    "Files the disk hot tier's partitions hold open (bounded by hot.max_open_files).",
)
HOT_DISK_FSYNC_BATCHES = Counter(
    "tidegate_hot_disk_fsync_batches_total",
    "Batches the disk hot tier's group commits made durable (divided by the fsync count of "
    "tidegate_hot_disk_fsync_duration_seconds: batches per fsync).",
)
TIERING_LAG_RECORDS = Gauge(
    "tidegate_tiering_lag_records",
    "Records in the hot tier not yet tiered (sum of HW(p) - T(p) over every partition "
    "this gateway last looked at).",
)
TIERING_LAG_BYTES = Gauge(
    "tidegate_tiering_lag_bytes",
    "Estimated hot-tier bytes not yet tiered (same scope as tidegate_tiering_lag_records).",
)
TIERING_RUN_SECONDS = Histogram(
    "tidegate_tiering_run_duration_seconds",
    "Duration of whole tiering runs (every table).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0),
)


def record_tiering(result: Any) -> None:
    """Count one table tiered (a :class:`gateway.lake.tiering.TableResult`)."""
    TIERING_TABLES.labels(outcome="ok").inc()
    TIERING_RECORDS.inc(result.records)
    TIERING_BYTES.inc(result.bytes)
    TIERING_CONFLICTS.inc(result.conflicts)
    HOT_TRIMMED.inc(len(result.trimmed))


def record_tiering_failure() -> None:
    TIERING_TABLES.labels(outcome="failed").inc()


def set_tiering_lag(records: int, nbytes: int) -> None:
    TIERING_LAG_RECORDS.set(records)
    TIERING_LAG_BYTES.set(nbytes)


LAKE_JOB_TABLES = Counter(
    "tidegate_lake_job_tables_total",
    "Tables handled by maintenance runs (compact, expire, orphans), by job and outcome.",
    ["job", "outcome"],
)
LAKE_JOB_LAST_RUN = Gauge(
    "tidegate_lake_job_last_run_timestamp_seconds",
    "When each maintenance job (compact, expire, orphans) last finished a run (Unix time).",
    ["job"],
)
LAKE_DATA_FILES = Gauge(
    "tidegate_lake_data_files",
    "Data files of the current snapshots, over every table (per table: describe).",
)
LAKE_SMALL_FILES = Gauge(
    "tidegate_lake_small_files",
    "Data files below compaction.small_file_bytes, over every table.",
)
LAKE_SMALL_FILE_RATIO_MAX = Gauge(
    "tidegate_lake_small_file_ratio_max",
    "The highest small-file ratio of any table (small files / data files).",
)
LAKE_SNAPSHOTS = Gauge(
    "tidegate_lake_snapshots",
    "Snapshots retained in the tables' metadata, over every table.",
)


def record_lake_job(job: str, ok: int, failed: int, finished_at: float) -> None:
    """Count one run of a maintenance job over ``ok + failed`` tables."""
    LAKE_JOB_TABLES.labels(job=job, outcome="ok").inc(ok)
    LAKE_JOB_TABLES.labels(job=job, outcome="failed").inc(failed)
    LAKE_JOB_LAST_RUN.labels(job=job).set(finished_at)


def set_lake_stats(stats: list[Any]) -> None:
    """Totals of the tables' :class:`gateway.cold.base.FileStats`."""
    LAKE_DATA_FILES.set(sum(s.data_files for s in stats))
    LAKE_SMALL_FILES.set(sum(s.small_files for s in stats))
    LAKE_SNAPSHOTS.set(sum(s.snapshots for s in stats))
    LAKE_SMALL_FILE_RATIO_MAX.set(max((s.small_file_ratio for s in stats), default=0.0))


SHARD_APPEND_RECORDS = Counter(
    "tidegate_hot_shard_append_records_total",
    "Records stored by this process in each Redis hot-tier shard (retried duplicates not).",
    ["shard"],
)
SHARD_APPEND_BYTES = Counter(
    "tidegate_hot_shard_append_bytes_total",
    "Payload bytes stored by this process in each Redis hot-tier shard.",
    ["shard"],
)
SHARD_SEALED_RETRIES = Counter(
    "tidegate_hot_shard_sealed_retries_total",
    "Appends a shard refused because a move had sealed the segment (sent again elsewhere).",
    ["shard"],
)
HOT_RESEEDS = Counter(
    "tidegate_hot_reseeds_total",
    "Partitions re-seeded because the hot tier had lost (or rolled back) their state.",
)
MOVES = Counter(
    "tidegate_hot_moves_total",
    "Partition moves between hot-tier shards run or finished by this process.",
    ["source", "target"],
)
MOVE_SECONDS = Histogram(
    "tidegate_hot_move_duration_seconds",
    "Duration of partition moves (intent, seal, open, record), whatever the backlog.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def record_shard_append(shard: str, records: int, nbytes: int) -> None:
    SHARD_APPEND_RECORDS.labels(shard=shard).inc(records)
    SHARD_APPEND_BYTES.labels(shard=shard).inc(nbytes)


def record_hot_reseed() -> None:
    HOT_RESEEDS.inc()


def record_sealed_retry(shard: str) -> None:
    SHARD_SEALED_RETRIES.labels(shard=shard).inc()


def record_move(source: str, target: str, seconds: float) -> None:
    MOVES.labels(source=source, target=target).inc()
    MOVE_SECONDS.observe(seconds)


MOVE_REQUESTS = Counter(
    "tidegate_hot_move_requests_total",
    "Partition moves asked of this gateway's admin API, by outcome (done, failed).",
    ["outcome"],
)
SHARD_PARTITIONS = Gauge(
    "tidegate_hot_shard_partitions",
    "Partitions whose active segment (the one taking appends) is on each hot-tier shard.",
    ["shard"],
)
SHARD_SEGMENTS = Gauge(
    "tidegate_hot_shard_segments",
    "Segments, active and sealed, held by each hot-tier shard.",
    ["shard"],
)
SHARD_HOT_BYTES = Gauge(
    "tidegate_hot_shard_bytes",
    "Payload bytes each hot-tier shard holds (every segment on it, not yet trimmed).",
    ["shard"],
)


def record_move_outcome(outcome: str) -> None:
    MOVE_REQUESTS.labels(outcome=outcome).inc()


def set_shard_stats(stats: dict[str, tuple[int, int, int | None]]) -> None:
    """``shard -> (partitions, segments, bytes)`` of every configured shard (bytes None:
    the gauge keeps its last value)."""
    for shard, (partitions, segments, nbytes) in stats.items():
        SHARD_PARTITIONS.labels(shard=shard).set(partitions)
        SHARD_SEGMENTS.labels(shard=shard).set(segments)
        if nbytes is not None:
            SHARD_HOT_BYTES.labels(shard=shard).set(nbytes)


#: Refreshers of gauges that are read from the backends when /metrics is scraped.
_SCRAPE_HOOKS: list[Callable[[], None]] = []
_SCRAPE_LOCK = threading.Lock()
_SCRAPED_AT = [0.0]
#: A scrape within this many seconds of the last refresh shows the same gauges.
SCRAPE_REFRESH_S = 5.0
#: The hot-tier bytes of each shard (one read per segment) are read at most this often.
SHARD_BYTES_REFRESH_S = 60.0


def on_scrape(hook: Callable[[], None]) -> None:
    """Run ``hook`` (which sets gauges) before a /metrics answer, at most every
    :data:`SCRAPE_REFRESH_S` seconds."""
    _SCRAPE_HOOKS.append(hook)


def refresh() -> None:
    """Run the scrape hooks (blocking: call it off the event loop). A failing hook is
    logged and leaves its gauges as they were."""
    with _SCRAPE_LOCK:
        now = time.monotonic()
        if now - _SCRAPED_AT[0] < SCRAPE_REFRESH_S:
            return
        _SCRAPED_AT[0] = now
        for hook in _SCRAPE_HOOKS:
            try:
                hook()
            except Exception:
                logging.getLogger(__name__).exception("refreshing metrics failed")
