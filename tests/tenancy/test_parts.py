"""The tenancy building blocks in-process, on real backends: keys, token buckets (in
process and on the session's redis-server), fair admission and the usage meter."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from gateway.config import Settings
from gateway.server.app import build_service
from gateway.tenancy import Tenancy, keys, load_operator_key
from gateway.tenancy.buckets import LocalBuckets, RedisBuckets, TokenBuckets
from gateway.wire.errors import TenantSuspended, Throttled, Unauthenticated
from tests.services import RedisServer


def test_keys_round_trip_and_reject_tampering() -> None:
    issued = keys.issue()
    parsed = keys.parse(issued.key)
    assert parsed is not None and parsed[0] == issued.key_id
    assert keys.verify(parsed[1], issued.salt, issued.digest)
    assert not keys.verify(parsed[1] + "x", issued.salt, issued.digest)
    assert issued.key.split("_", 2)[2] not in issued.digest  # the secret is not stored
    for bad in ("", "tg_", "tg_xyz_abc", "tg_0123456789abcdeX_s", "sk_0123456789abcdef_s"):
        assert keys.parse(bad) is None


@pytest.fixture(params=["local", "redis"])
def buckets(request: pytest.FixtureRequest) -> TokenBuckets:
    if request.param == "local":
        return LocalBuckets()
    server: RedisServer = request.getfixturevalue("redis_server")
    return RedisBuckets(server.url)


def test_bucket_admits_the_burst_then_asks_to_wait(
    buckets: TokenBuckets, unique_tenant: str
) -> None:
    # 1/16 token a second: no pause of a loaded machine within the test's timeout refills
    # the 20 tokens the second take lacks (320 s), and each wait is checked against the
    # time that did pass between the two takes (it shortens a wait by that much).
    rate, burst = 1 / 16, 100.0
    started = time.monotonic()
    assert buckets.take(unique_tenant, "x", 60, rate, burst) == 0
    wait = buckets.take(unique_tenant, "x", 60, rate, burst)
    passed_ms = (time.monotonic() - started) * 1000
    assert 320_000 - passed_ms <= wait <= 320_000  # 20 tokens at 1/16 a second
    # A request larger than the burst is admitted from a full bucket, into debt.
    started = time.monotonic()
    assert buckets.take(unique_tenant, "big", 500, rate, burst) == 0
    wait = buckets.take(unique_tenant, "big", 1, rate, burst)
    passed_ms = (time.monotonic() - started) * 1000
    assert 6_416_000 - passed_ms <= wait <= 6_416_000  # 400 tokens of debt, and 1 more
    # Forced charges (bytes a read returned) always pass and leave debt behind.
    assert buckets.take(unique_tenant, "r", 300, rate, burst, force=True) == 0
    assert buckets.take(unique_tenant, "r", 1, rate, burst) > 0
    buckets.forget(unique_tenant)
    assert buckets.take(unique_tenant, "big", 100, rate, burst) == 0
    buckets.close()


def test_operator_key_is_generated_once(tmp_path: Path) -> None:
    settings = Settings.explicit(data_dir=tmp_path)
    key, generated = load_operator_key(settings)
    assert generated and key.startswith("tgop_")
    assert load_operator_key(settings) == (key, False)
    assert (tmp_path / "operator.key").stat().st_mode & 0o077 == 0
    configured = Settings.explicit(data_dir=tmp_path, auth={"operator_key": "x" * 20})
    assert load_operator_key(configured) == ("x" * 20, False)


def test_admission_bounds_each_tenant_alone(tmp_path: Path) -> None:
    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": "disk", "fsync": "never"},
        quota={"max_in_flight": 2, "max_follows": 1},
    )
    service = build_service(settings)
    tenancy = Tenancy(settings, service, "o" * 20)

    async def scenario() -> None:
        async with tenancy.admit("a"), tenancy.admit("a"):
            with pytest.raises(Throttled) as info:
                async with tenancy.admit("a"):
                    pass
            assert info.value.retry_after_ms and info.value.details["quota"] == "in_flight"
            async with tenancy.admit("b"), tenancy.admit("b"):
                assert tenancy.in_flight("b") == 2
            async with tenancy.admit("a", follow=True):  # its own pool
                with pytest.raises(Throttled):
                    async with tenancy.admit("a", follow=True):
                        pass
        assert tenancy.in_flight("a") == 0 and tenancy.in_flight("a", follow=True) == 0
        async with tenancy.admit("a"):
            pass

    try:
        asyncio.run(scenario())
    finally:
        service.close()


class _Clock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replica(tmp_path: Path, name: str, clock: _Clock, ttl: float = 1.0) -> Tenancy:
    """A gateway's tenancy of its own, on the metadata store every replica here shares."""
    settings = Settings.explicit(
        data_dir=tmp_path / name,
        hot={"type": "disk", "fsync": "never"},
        cold={"enabled": False},
        metadata={"url": f"sqlite:///{tmp_path / 'shared.db'}"},
        auth={"key_cache_ttl_s": ttl},
    )
    return Tenancy(settings, build_service(settings), "o" * 20, clock=clock)


def _wrong_secret(key: str) -> str:
    return key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")


def test_key_cache_is_dropped_by_the_replica_that_changes_a_key_and_expires_elsewhere(
    tmp_path: Path,
) -> None:
    clock = _Clock()
    here, there = _replica(tmp_path, "here", clock), _replica(tmp_path, "there", clock)
    uncached = _replica(tmp_path, "uncached", clock, ttl=0)

    async def scenario() -> None:
        await here.admin.create_tenant("acme")
        info, key = await here.admin.issue_key("acme")
        bearer = f"Bearer {key}"
        for replica in (here, there, uncached):  # each has read (and cached) the key
            assert (await replica.authenticate(bearer)).tenant == "acme"
        # A cached key id never vouches for a wrong secret: the digest is checked each time.
        with pytest.raises(Unauthenticated):
            await there.authenticate(f"Bearer {_wrong_secret(key)}")

        await here.admin.suspend("acme")
        with pytest.raises(TenantSuspended):  # at once where it was suspended
            await here.authenticate(bearer)
        with pytest.raises(TenantSuspended):  # at once without a cache
            await uncached.authenticate(bearer)
        # Another replica may go on with what it read for up to the TTL, not longer.
        assert (await there.authenticate(bearer)).tenant == "acme"
        clock.now += 1.0
        with pytest.raises(TenantSuspended):
            await there.authenticate(bearer)

        await there.admin.resume("acme")
        assert (await there.authenticate(bearer)).tenant == "acme"
        clock.now += 1.0
        assert (await here.authenticate(bearer)).tenant == "acme"

        await there.admin.revoke_key(info.key_id)
        with pytest.raises(Unauthenticated):
            await there.authenticate(bearer)
        with pytest.raises(Unauthenticated):
            await uncached.authenticate(bearer)
        assert (await here.authenticate(bearer)).tenant == "acme"
        clock.now += 1.0
        with pytest.raises(Unauthenticated):
            await here.authenticate(bearer)

    try:
        asyncio.run(scenario())
    finally:
        for replica in (here, there, uncached):
            replica.service.close()


def test_meter_adds_up_and_flushes_once(tmp_path: Path) -> None:
    settings = Settings.explicit(data_dir=tmp_path, hot={"type": "disk", "fsync": "never"})
    service = build_service(settings)
    tenancy = Tenancy(settings, service, "o" * 20)
    try:
        tenancy.tenants.create_tenant("acme")
        for _ in range(3):
            tenancy.meter.add("acme", append_bytes=10, append_records=2, requests=1)
        tenancy.meter.set_storage("acme", hot_bytes=5)
        tenancy.meter.set_storage("acme", hot_bytes=3, cold_bytes=7)
        tenancy.meter.add("ghost", requests=1)  # no such tenant: discarded at flush
        tenancy.meter.flush()
        tenancy.meter.flush()  # nothing pending: nothing added twice
        (row,) = tenancy.tenants.usage("acme")
        assert row.counters["append_bytes"] == 30
        assert row.counters["append_records"] == 6
        assert row.counters["requests"] == 3
        assert (row.counters["hot_bytes"], row.counters["cold_bytes"]) == (5, 7)
        assert tenancy.tenants.usage("ghost") == []
    finally:
        service.close()


def test_metrics_label_at_most_the_configured_number_of_tenants(tmp_path: Path) -> None:
    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": "disk", "fsync": "never"},
        metering={"metrics_max_tenants": 2},
    )
    service = build_service(settings)
    tenancy = Tenancy(settings, service, "o" * 20)
    try:
        labels = [tenancy.meter.label(t) for t in ("a", "b", "c", "a", "d")]
        assert labels == ["a", "b", "_other", "a", "_other"]
    finally:
        service.close()


def test_storage_gauges_follow_the_samples_and_sum_the_other_tenants(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": "disk", "fsync": "never"},
        metering={"metrics_max_tenants": 1},
    )
    service = build_service(settings)
    meter = Tenancy(settings, service, "o" * 20).meter
    first, second, third = (f"g{uuid.uuid4().hex[:8]}" for _ in range(3))

    def hot(label: str) -> float | None:
        return REGISTRY.get_sample_value("tidegate_tenant_hot_bytes", {"tenant": label})

    try:
        meter.set_storage(first, hot_bytes=100, cold_bytes=7)
        meter.set_storage(first, hot_bytes=40)  # a gauge: the last sample, not the largest
        assert hot(first) == 40
        assert REGISTRY.get_sample_value("tidegate_tenant_cold_bytes", {"tenant": first}) == 7
        meter.set_storage(second, hot_bytes=5)
        meter.set_storage(third, hot_bytes=6)
        assert hot("_other") == 11  # the sum of the tenants past the label cap
        meter.forget(third)
        assert hot("_other") == 5
        meter.forget(first)
        assert hot(first) is None
    finally:
        service.close()
