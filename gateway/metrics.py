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

from prometheus_client import Counter, Histogram

__all__ = [
    "APPEND_BYTES",
    "APPEND_RECORDS",
    "HTTP_DURATION",
    "HTTP_REQUESTS",
    "READ_RECORDS",
    "UNMATCHED_ROUTE",
    "observe_http_request",
    "record_append",
    "record_read",
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
HTTP_DURATION = Histogram(
    "tidegate_http_request_duration_seconds",
    "HTTP request latency by route template and method; long polls wait up to "
    "server.http_follow_wait_ms, hence the upper buckets.",
    ["route", "method"],
    buckets=(
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ),
)  # fmt: skip


def record_append(records: int, nbytes: int) -> None:
    """Count one acknowledged append of ``records`` records carried in ``nbytes`` bytes."""
    APPEND_RECORDS.inc(records)
    APPEND_BYTES.inc(nbytes)


def record_read(records: int) -> None:
    """Count ``records`` records returned by a read."""
    READ_RECORDS.inc(records)


def observe_http_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered HTTP request and its latency. ``route`` must be a template."""
    HTTP_REQUESTS.labels(route=route, method=method, status=str(status)).inc()
    HTTP_DURATION.labels(route=route, method=method).observe(seconds)
