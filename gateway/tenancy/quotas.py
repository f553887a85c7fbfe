"""How much a tenant may do: fair admission on this gateway and quotas with back-pressure.

Ordinary requests share ``quota.max_in_flight`` slots per tenant per gateway and follow
reads ``quota.max_follows``; rates (append bytes/s, read bytes/s, requests/s) are token
buckets shared by every replica through Redis (or in-process with the disk hot tier);
counts (tables, partitions, hot bytes) are checked against the store. Quotas are cached for
a second.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NoReturn

from gateway.config import Settings
from gateway.core.base import LruDict
from gateway.meta import TableLimits
from gateway.meta.tenants import TenantStore
from gateway.tenancy.auth import run_blocking
from gateway.tenancy.buckets import TokenBuckets
from gateway.tenancy.metering import Meter
from gateway.wire.errors import Throttled
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["QuotaGuard", "Quotas"]

_QUOTA_TTL_S = 1.0
#: Tenants whose quotas, hot bytes and refusals a gateway keeps at most.
TENANT_CACHE_MAX = 4096
_HOT_BYTES_TTL_S = 1.0
#: Retry hint when a tenant has too much work in flight on this gateway.
_BUSY_RETRY_MS = 50
#: Longest local refusal after the shared bucket said "retry later" (see ``QuotaGuard._take``).
_REFUSE_LOCALLY_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class Quotas:
    """Effective quotas of a tenant; None is unlimited."""

    append_bytes_per_s: int | None = None
    read_bytes_per_s: int | None = None
    requests_per_s: int | None = None
    max_tables: int | None = None
    max_partitions: int | None = None
    max_hot_bytes: int | None = None


class QuotaGuard:
    """Admission and quota checks of one gateway, over buckets shared by every replica."""

    def __init__(
        self,
        settings: Settings,
        tenants: TenantStore,
        buckets: TokenBuckets,
        meter: Meter,
        sample_hot: Callable[[str], int],
    ) -> None:
        self.settings = settings
        self.tenants = tenants
        self.buckets = buckets
        self.meter = meter
        #: The tenant's bytes in the hot tier, read from the hot tier (blocking).
        self._sample_hot = sample_hot
        # Per-tenant caches: bounded, whatever the number of tenants (a miss costs a
        # lookup again).
        self._quotas: LruDict[str, tuple[float, Quotas]] = LruDict(TENANT_CACHE_MAX)
        self._hot_bytes: LruDict[str, tuple[float, int]] = LruDict(TENANT_CACHE_MAX)
        #: (tenant, pool) -> calls holding a slot of that pool here.
        self._in_flight: dict[tuple[str, str], int] = {}
        #: pool -> calls of every tenant holding one of its slots here (``server.max_*``).
        self._gateway_slots: dict[str, int] = {}
        #: (tenant, quota) -> (monotonic time until which this replica refuses at once,
        #: after the shared bucket refused with a retry-after (see ``_take``), the rate).
        self._refusing: LruDict[tuple[str, str], tuple[float, int]] = LruDict(TENANT_CACHE_MAX)

    def _pool(self, follow: bool, stream: bool) -> tuple[str, int, int]:
        """(pool name, per-tenant limit, per-gateway limit or 0 for none) of a call."""
        q, server = self.settings.quota, self.settings.server
        if stream:
            return "stream", q.max_streams, server.max_streams
        if follow:
            return "follow", q.max_follows, server.max_follows
        return "request", q.max_in_flight, 0

    def _check_slot(
        self, tenant: str, follow: bool, stream: bool
    ) -> tuple[tuple[str, str], str, int]:
        """The pool key of the call, after refusing it when the pool is full.

        Raises: Throttled."""
        pool, limit, everyone = self._pool(follow, stream)
        if everyone and self._gateway_slots.get(pool, 0) >= everyone:
            self.meter.add(tenant, throttled=1)
            kind = "append streams" if stream else "follow reads"
            raise Throttled(
                f"the gateway serves {self._gateway_slots[pool]} {kind}, its most; retry "
                "later or on another replica",
                retry_after_ms=_BUSY_RETRY_MS,
                quota=f"server.max_{pool}s",
            )
        n = self._in_flight.get((tenant, pool), 0)
        if n >= limit:
            self.meter.add(tenant, throttled=1)
            held = {"stream": "append streams open", "follow": "follow reads in progress"}
            raise Throttled(
                f"the tenant has {n} {held.get(pool, 'requests in progress')} on this "
                "gateway; retry later",
                retry_after_ms=_BUSY_RETRY_MS,
                quota={"stream": "max_streams", "follow": "max_follows"}.get(pool, "in_flight"),
            )
        return (tenant, pool), pool, n

    @contextlib.asynccontextmanager
    async def admit(
        self, tenant: str, *, follow: bool = False, stream: bool = False
    ) -> AsyncIterator[None]:
        """Hold one of the tenant's slots on this gateway for the call.

        Ordinary requests share ``quota.max_in_flight`` slots per tenant; follow reads (long
        polls and open streams, which wait by design) have their own ``quota.max_follows``
        (and ``server.max_follows`` for the gateway), append streams theirs
        (``quota.max_streams``, ``server.max_streams``).

        Raises: Throttled: the tenant has no free slot here.
        """
        key, pool, n = self._check_slot(tenant, follow, stream)
        self._in_flight[key] = n + 1
        self._gateway_slots[pool] = self._gateway_slots.get(pool, 0) + 1
        try:
            yield
        finally:
            self._gateway_slots[pool] -= 1
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]

    def refuse_early(
        self,
        tenant: str,
        *,
        follow: bool = False,
        stream: bool = False,
        append: bool = False,
        slot: bool = True,
    ) -> None:
        """Refuse at once, with no I/O and before any body is read, a call this gateway
        would refuse anyway: no free slot for it (with ``slot``), or (``append``) the
        tenant's appends are refused here for a while after a throttle (see :meth:`_take`).

        Raises: Throttled."""
        if slot:
            self._check_slot(tenant, follow, stream)
        if append:
            self._refused_locally(tenant, "append_bytes")

    def in_flight(self, tenant: str, *, follow: bool = False, stream: bool = False) -> int:
        return self._in_flight.get((tenant, self._pool(follow, stream)[0]), 0)

    async def quotas(self, tenant: str) -> Quotas:
        now = time.monotonic()
        hit = self._quotas.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]
        own = await run_blocking(self.tenants.get_quota, tenant)
        defaults = self.settings.quota
        values: dict[str, int | None] = {}
        for f in QUOTA_FIELDS:
            v = own.get(f)
            if v is None:
                v = getattr(defaults, f)
            values[f] = None if v is None or v < 0 else int(v)
        q = Quotas(**values)
        self._quotas[tenant] = (now + _QUOTA_TTL_S, q)
        return q

    async def _take(
        self, tenant: str, kind: str, amount: float, rate: int, *, force: bool = False
    ) -> None:
        """Take ``amount`` from the tenant's ``kind`` bucket, or raise Throttled.

        Once the shared bucket has refused with "retry in W ms", this replica refuses the
        tenant's further requests of that kind locally for W ms (at most
        ``_REFUSE_LOCALLY_MAX_S``) without asking the bucket again: the client was told to
        wait that long anyway, and a tenant sending far over its quota then costs no
        thread hop and no Redis round trip per refusal, which would otherwise queue in
        front of every other tenant's requests (Kafka mutes a throttled client for the
        throttle time in the same spirit). Refusals take no tokens, so the tenant's
        accepted rate is unchanged.

        The refusal also tells how deep the bucket is in debt: it held
        ``need - W * rate`` tokens, ``need`` being ``min(amount, burst)``. While it cannot
        have come back above zero at ``rate`` a second, every request of the kind would
        be refused whatever its size (each needs more than nothing; other replicas only
        take tokens), so the replica refuses locally for that whole time too, however
        long: that is what lets an edge refuse before it reads a body whose size it does
        not know yet (:meth:`refuse_early`). Only a refund made elsewhere (an append
        that failed after its charge) can end the debt sooner; ``set_quota`` clears all.
        """
        if not force:
            self._refused_locally(tenant, kind)
        burst = rate * self.settings.quota.burst_s
        wait = await run_blocking(self.buckets.take, tenant, kind, amount, rate, burst, force)
        if wait:
            tokens = min(amount, burst) - wait * rate / 1000
            refuse_s = max(min(wait / 1000, _REFUSE_LOCALLY_MAX_S), -tokens / rate)
            self._refusing[(tenant, kind)] = (time.monotonic() + refuse_s, rate)
            self._throttled(tenant, kind, rate, wait)

    def _refused_locally(self, tenant: str, kind: str) -> None:
        """Raise Throttled while this replica refuses the tenant's ``kind`` by itself."""
        found = self._refusing.get((tenant, kind))
        if found is None:
            return
        until, rate = found
        left = until - time.monotonic()
        if left > 0:
            self._throttled(tenant, kind, rate, max(1, math.ceil(left * 1000)))
        del self._refusing[(tenant, kind)]

    def _throttled(self, tenant: str, kind: str, rate: int, wait_ms: int) -> NoReturn:
        self.meter.add(tenant, throttled=1)
        raise Throttled(
            f"over the tenant's {kind.replace('_', ' ')} quota of {rate}/s; retry in {wait_ms} ms",
            retry_after_ms=wait_ms,
            quota=f"{kind}_per_s",
        )

    async def charge_append(self, tenant: str, nbytes: int) -> None:
        """Admit an append of ``nbytes`` payload bytes, or raise Throttled."""
        q = await self.quotas(tenant)
        if q.max_hot_bytes is not None:
            held = await self.hot_bytes(tenant)
            if held + nbytes > q.max_hot_bytes:
                self.meter.add(tenant, throttled=1)
                raise Throttled(
                    f"the tenant holds {held} bytes in the hot tier; its quota is "
                    f"{q.max_hot_bytes}",
                    retry_after_ms=1000,
                    quota="max_hot_bytes",
                )
        if q.append_bytes_per_s is not None:
            await self._take(tenant, "append_bytes", nbytes, q.append_bytes_per_s)

    @contextlib.asynccontextmanager
    async def append_charge(self, tenant: str, nbytes: int) -> AsyncIterator[None]:
        """Charge an append's bytes on entry (or raise Throttled) and refund them if the
        append then fails: a batch that is not stored (bad rows, a sequence that arrives
        after a throttled one) must not use up the quota, or a pipelining producer whose
        later batches keep being charged and refused never gets its first one through."""
        await self.charge_append(tenant, nbytes)
        try:
            yield
        except BaseException:
            q = await self.quotas(tenant)
            if q.append_bytes_per_s is not None:
                rate = q.append_bytes_per_s
                burst = rate * self.settings.quota.burst_s
                await run_blocking(
                    self.buckets.take, tenant, "append_bytes", -nbytes, rate, burst, True
                )
            raise

    async def charge_request(self, tenant: str) -> None:
        """Charge one request to the tenant's requests/s bucket, or raise Throttled."""
        quotas = await self.quotas(tenant)
        if quotas.requests_per_s is not None:
            await self._take(tenant, "requests", 1, quotas.requests_per_s)

    async def check_read(self, tenant: str) -> None:
        """Refuse a read while the tenant's read bucket is in debt."""
        q = await self.quotas(tenant)
        if q.read_bytes_per_s is not None:
            await self._take(tenant, "read_bytes", 1, q.read_bytes_per_s)

    async def charge_read(self, tenant: str, nbytes: int) -> None:
        """Charge the bytes a read returned to the tenant's read bucket (it may go into
        debt: the next read is refused until it is paid back)."""
        q = await self.quotas(tenant)
        if q.read_bytes_per_s is not None and nbytes:
            await self._take(tenant, "read_bytes", nbytes, q.read_bytes_per_s, force=True)

    async def plan_hot_allowed(self, tenant: str, rate: int) -> bool:
        """Whether the tenant's budget of hot-tail bytes written by scan plans
        (``cold.rest_catalog.plan_hot_bytes_per_s``, shared by the replicas as every
        bucket) is not in debt: a plan may write its hot tail."""
        burst = rate * self.settings.quota.burst_s
        wait = await run_blocking(self.buckets.take, tenant, "plan_hot_bytes", 0, rate, burst)
        return wait == 0

    async def charge_plan_hot(self, tenant: str, nbytes: int, rate: int) -> None:
        """Charge the hot-tail bytes a plan wrote to that budget (it may go into debt:
        the next plans fall back until it is paid back)."""
        if nbytes:
            burst = rate * self.settings.quota.burst_s
            await run_blocking(
                self.buckets.take, tenant, "plan_hot_bytes", nbytes, rate, burst, True
            )

    async def table_limits(self, tenant: str) -> TableLimits | None:
        """The tenant's count quotas (None when neither is set), checked by the create
        itself in the transaction that inserts the table (``MetaStore.create_table``):
        counted there, two creates racing at the quota's edge cannot both pass it."""
        q = await self.quotas(tenant)
        if q.max_tables is None and q.max_partitions is None:
            return None
        return TableLimits(q.max_tables, q.max_partitions)

    async def hot_bytes(self, tenant: str) -> int:
        """Bytes the tenant holds in the hot tier (cached for a second); also metered."""
        now = time.monotonic()
        hit = self._hot_bytes.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]

        size = await run_blocking(self._sample_hot, tenant)
        self._hot_bytes[tenant] = (now + _HOT_BYTES_TTL_S, size)
        self.meter.set_storage(tenant, hot_bytes=size)
        return size

    def changed(self, tenant: str) -> None:
        """Forget what is cached about the tenant's quotas (they were just set)."""
        self._quotas.pop(tenant, None)
        for key in [k for k in self._refusing if k[0] == tenant]:
            del self._refusing[key]

    def forget(self, tenant: str) -> None:
        """Drop everything held about a deleted tenant (its shared buckets too)."""
        self.changed(tenant)
        self._hot_bytes.pop(tenant, None)
        self.buckets.forget(tenant)
