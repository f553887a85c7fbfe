"""Issue 30.4: what a gateway holds per tenant stays bounded with 10,000 tenants: quota
caches, token buckets, refusals, metering, and the core's per-table caches."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config import Settings
from gateway.core.base import TABLE_CACHE_MAX, LruDict
from gateway.server.app import build_service
from gateway.tenancy import Tenancy
from gateway.tenancy.buckets import BUCKETS_MAX, LocalBuckets
from gateway.tenancy.quotas import TENANT_CACHE_MAX

TENANTS = 10_000


def test_per_tenant_state_is_bounded_with_10000_tenants(tmp_path: Path) -> None:
    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": "disk", "fsync": "never"},
        cold={"enabled": False},
        quota={
            "requests_per_s": 1000,
            "append_bytes_per_s": 10**9,
            "read_bytes_per_s": 10**9,
        },
        metering={"metrics_max_tenants": 50},
    )
    service = build_service(settings)
    tenancy = Tenancy(settings, service, "o" * 20)
    names = [f"m{i:05d}" for i in range(TENANTS)]

    async def traffic() -> None:
        for name in names:  # three buckets each: 30,000 buckets asked for
            await tenancy.guard.charge_request(name)
            await tenancy.guard.charge_append(name, 100)
            await tenancy.guard.charge_read(name, 100)
            tenancy.meter.add(name, requests=1, append_bytes=100)

    try:
        asyncio.run(traffic())
        guard = tenancy.guard
        assert isinstance(tenancy.buckets, LocalBuckets)
        assert len(tenancy.buckets._buckets) == BUCKETS_MAX < 3 * TENANTS
        assert len(guard._quotas) == TENANT_CACHE_MAX < TENANTS
        assert len(guard._refusing) <= TENANT_CACHE_MAX
        assert len(tenancy.meter._labelled) <= 50
        # Metering holds a minute's counters until its flush, then nothing.
        tenancy.meter.flush()
        assert not tenancy.meter._pending
        # A tenant whose bucket went is served again (a fresh bucket, at its burst).
        asyncio.run(tenancy.guard.charge_request(names[0]))
    finally:
        service.close()


def test_lru_dict_keeps_the_most_recently_used() -> None:
    d: LruDict[int, int] = LruDict(3)
    for i in range(3):
        d[i] = i
    assert d.get(0) == 0  # a use: 1 is now the oldest
    d[3] = 3
    assert list(d) == [2, 0, 3] and 1 not in d
    assert d.setdefault(4, 4) == 4 and len(d) == 3
    assert TABLE_CACHE_MAX >= 1024
