"""Usage per tenant per minute: aggregated in memory, written to the metadata store.

Counters (bytes and records appended and read, requests, throttled requests) add up in a
dictionary keyed by ``(tenant, minute)``; storage figures (hot bytes, and cold bytes once
the cold tier reports them through :meth:`Meter.set_storage`) keep the largest value seen
in the minute. A flush moves everything pending into ``tg_usage`` in one transaction
(adding to what other gateways wrote); the gateway flushes every
``metering.flush_interval_s`` and once more at shutdown. A failed flush keeps the figures
for the next one.

The same figures feed Prometheus counters labelled by tenant, and the storage samples the
gauges ``tidegate_tenant_hot_bytes`` / ``tidegate_tenant_cold_bytes``. To bound the label
cardinality, each process labels at most ``metering.metrics_max_tenants`` tenants by name
(the first it sees); the others share ``tenant="_other"``. The metadata store, not
``/metrics``, is the complete per-tenant record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import Counter, Gauge

from gateway.meta.tenants import TenantStore
from gateway.wire.types import USAGE_FIELDS

__all__ = ["OTHER_TENANTS", "Meter", "minute_of"]

log = logging.getLogger(__name__)

OTHER_TENANTS = "_other"
_GAUGES = frozenset({"hot_bytes", "cold_bytes"})

TENANT_APPEND_BYTES = Counter(
    "tidegate_tenant_append_bytes_total", "Appended payload bytes per tenant.", ["tenant"]
)
TENANT_APPEND_RECORDS = Counter(
    "tidegate_tenant_append_records_total", "Appended records per tenant.", ["tenant"]
)
TENANT_READ_BYTES = Counter(
    "tidegate_tenant_read_bytes_total", "Bytes returned by reads per tenant.", ["tenant"]
)
TENANT_READ_RECORDS = Counter(
    "tidegate_tenant_read_records_total", "Records returned by reads per tenant.", ["tenant"]
)
TENANT_REQUESTS = Counter(
    "tidegate_tenant_requests_total", "Authenticated requests per tenant.", ["tenant"]
)
TENANT_THROTTLED = Counter(
    "tidegate_tenant_throttled_total", "Requests refused over a quota, per tenant.", ["tenant"]
)
TENANT_HOT_BYTES = Gauge(
    "tidegate_tenant_hot_bytes",
    "Bytes the tenant holds in the hot tier, as last sampled (at each usage flush of an "
    "active tenant).",
    ["tenant"],
)
TENANT_COLD_BYTES = Gauge(
    "tidegate_tenant_cold_bytes",
    "Bytes of the tenant's Iceberg data files in current snapshots, as last sampled.",
    ["tenant"],
)
_STORAGE_GAUGES = {"hot_bytes": TENANT_HOT_BYTES, "cold_bytes": TENANT_COLD_BYTES}
_COUNTERS = {
    "append_bytes": TENANT_APPEND_BYTES,
    "append_records": TENANT_APPEND_RECORDS,
    "read_bytes": TENANT_READ_BYTES,
    "read_records": TENANT_READ_RECORDS,
    "requests": TENANT_REQUESTS,
    "throttled": TENANT_THROTTLED,
}


def minute_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


class Meter:
    def __init__(
        self,
        store: TenantStore,
        *,
        max_label_tenants: int = 100,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: dict[tuple[str, datetime], dict[str, int]] = {}
        self._labelled: set[str] = set()
        self._max_labels = max_label_tenants
        #: Storage samples of the tenants counted under ``_other``, whose gauge is their sum.
        self._other_storage: dict[str, dict[str, int]] = {n: {} for n in _STORAGE_GAUGES}

    def label(self, tenant: str) -> str:
        """The tenant's metrics label: its name, or ``_other`` past the cap."""
        with self._lock:
            if tenant in self._labelled:
                return tenant
            if len(self._labelled) < self._max_labels:
                self._labelled.add(tenant)
                return tenant
            return OTHER_TENANTS

    def add(self, tenant: str, **counts: int) -> None:
        """Add to the tenant's counters of the current minute (and to /metrics)."""
        label = self.label(tenant)
        key = (tenant, minute_of(self._clock()))
        with self._lock:
            row = self._pending.setdefault(key, {})
            for name, value in counts.items():
                if name not in USAGE_FIELDS or name in _GAUGES:
                    raise ValueError(f"unknown usage counter {name!r}")
                row[name] = row.get(name, 0) + value
        for name, value in counts.items():
            if value:
                _COUNTERS[name].labels(tenant=label).inc(value)

    def set_storage(
        self, tenant: str, *, hot_bytes: int | None = None, cold_bytes: int | None = None
    ) -> None:
        """Record storage held by the tenant now. ``cold_bytes`` is the cold tier's hook."""
        key = (tenant, minute_of(self._clock()))
        label = self.label(tenant)
        with self._lock:
            row = self._pending.setdefault(key, {})
            for name, value in (("hot_bytes", hot_bytes), ("cold_bytes", cold_bytes)):
                if value is None:
                    continue
                row[name] = max(row.get(name, 0), value)
                if label == OTHER_TENANTS:
                    others = self._other_storage[name]
                    others[tenant] = value
                    value = sum(others.values())
                _STORAGE_GAUGES[name].labels(tenant=label).set(value)

    def active_tenants(self) -> set[str]:
        """Tenants with figures waiting for the next flush."""
        with self._lock:
            return {t for t, _ in self._pending}

    def forget(self, tenant: str) -> None:
        """Drop the tenant's pending figures (it is being deleted)."""
        with self._lock:
            for key in [k for k in self._pending if k[0] == tenant]:
                del self._pending[key]
            for name, gauge in _STORAGE_GAUGES.items():
                if tenant in self._labelled:
                    with contextlib.suppress(KeyError):
                        gauge.remove(tenant)
                elif self._other_storage[name].pop(tenant, None) is not None:
                    gauge.labels(tenant=OTHER_TENANTS).set(sum(self._other_storage[name].values()))

    def flush(self) -> None:
        """Write pending figures to the metadata store; on failure keep them for later."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            # An idle tenant whose storage was sampled at zero leaves no row behind.
            pending = {k: v for k, v in pending.items() if any(v.values())}
            if not pending:
                return
            try:
                self.store.add_usage(pending)
            except Exception:
                with self._lock:
                    for key, row in pending.items():
                        mine = self._pending.setdefault(key, {})
                        for name, value in row.items():
                            mine[name] = (
                                max(mine.get(name, 0), value)
                                if name in _GAUGES
                                else mine.get(name, 0) + value
                            )
                raise
