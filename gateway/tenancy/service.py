"""Tenancy: who is calling, what they may do, how much, and what they used.

Both edges call one :class:`Tenancy`: authenticate the ``authorization: Bearer <key>``
credential (a tenant API key or the operator key), admit the request under the tenant's
in-flight bound, charge its rates against token buckets, meter what it did, and run the
admin operations (tenants, keys, quotas, usage).

Authentication reads the key and its tenant's status from the metadata store (one indexed
query) and reuses what it read for ``auth.key_cache_ttl_s`` (1 s): the secret is still
checked against the stored digest on every request. A revoked key or a suspended tenant is
refused at once by the replica that revoked or suspended it (it drops what it cached) and by
every other replica within the TTL. Quotas are cached for a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import PartitionId
from gateway.meta.tenants import KeyInfo, KeyRecordView, TenantInfo, TenantStore, UsageRow
from gateway.tenancy import keys
from gateway.tenancy.buckets import LocalBuckets, RedisBuckets, TokenBuckets
from gateway.tenancy.metering import Meter
from gateway.wire.errors import (
    InvalidRequest,
    PermissionDenied,
    QuotaExceeded,
    TenantSuspended,
    Throttled,
    Unauthenticated,
)
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["OPERATOR_KEY_FILE", "Principal", "Quotas", "Tenancy", "load_operator_key"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

OPERATOR_KEY_FILE = "operator.key"
_TENANT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,62}$")
_QUOTA_TTL_S = 1.0
#: Most API keys whose lookup a gateway keeps (``auth.key_cache_ttl_s``); past it the
#: oldest go first.
_KEY_CACHE_MAX = 10_000
_HOT_BYTES_TTL_S = 1.0
#: Retry hint when a tenant has too much work in flight on this gateway.
_BUSY_RETRY_MS = 50
#: Longest local refusal after the shared bucket said "retry later" (see ``Tenancy._take``).
_REFUSE_LOCALLY_MAX_S = 1.0


def load_operator_key(settings: Settings) -> tuple[str, bool]:
    """The operator key and whether it was generated just now.

    From ``auth.operator_key`` when configured; otherwise read from
    ``<data_dir>/operator.key``, which is created (mode 0600) at first start.
    """
    if settings.auth.operator_key:
        return settings.auth.operator_key, False
    path = Path(settings.data_dir) / OPERATOR_KEY_FILE
    try:
        return path.read_text().strip(), False
    except FileNotFoundError:
        pass
    key = f"tgop_{secrets.token_urlsafe(32)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{OPERATOR_KEY_FILE}.{secrets.token_hex(4)}")
    tmp.touch(mode=0o600)
    tmp.write_text(key + "\n")
    try:
        os.link(tmp, path)  # atomic, and refuses to replace a key another process wrote
    except FileExistsError:
        tmp.unlink()
        return path.read_text().strip(), False
    tmp.unlink()
    return key, True


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a tenant, or the operator (``tenant is None``)."""

    tenant: str | None

    @property
    def is_operator(self) -> bool:
        return self.tenant is None


@dataclass(frozen=True, slots=True)
class Quotas:
    """Effective quotas of a tenant; None is unlimited."""

    append_bytes_per_s: int | None = None
    read_bytes_per_s: int | None = None
    requests_per_s: int | None = None
    max_tables: int | None = None
    max_partitions: int | None = None
    max_hot_bytes: int | None = None


def bearer_key(authorization: str | None) -> str:
    """The key of an ``authorization: Bearer <key>`` value.

    Raises: Unauthenticated: missing or not a bearer credential.
    """
    if not authorization:
        raise Unauthenticated("authentication required: send 'authorization: Bearer <key>'")
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("the authorization header must be 'Bearer <key>'")
    return key.strip()


class Tenancy:
    def __init__(
        self,
        settings: Settings,
        service: StreamTables,
        operator_key: str,
        buckets: TokenBuckets | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        #: Monotonic seconds; the key cache's TTL is measured with it.
        self._clock = clock
        self.service = service
        self.tenants = TenantStore(service.meta)
        self._operator_key = operator_key
        if buckets is None:
            url = settings.quota_redis_url
            buckets = RedisBuckets(url) if url else LocalBuckets()
        self.buckets = buckets
        self.meter = Meter(self.tenants, max_label_tenants=settings.metering.metrics_max_tenants)
        self._quotas: dict[str, tuple[float, Quotas]] = {}
        self._hot_bytes: dict[str, tuple[float, int]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        #: (tenant, quota) -> monotonic time until which this replica refuses at once,
        #: after the shared bucket refused with a retry-after (see ``_take``).
        self._refusing: dict[tuple[str, str], float] = {}
        #: key_id -> (expiry, what the store said). Never a secret: every request's secret
        #: is checked against the cached digest. Misses (unknown ids) are not cached.
        self._keys: dict[str, tuple[float, KeyRecordView]] = {}
        #: Lookups under way, shared by concurrent requests of the same key.
        self._key_lookups: dict[str, asyncio.Task[KeyRecordView | None]] = {}
        #: Bumped when the cache is dropped, so a lookup that started before cannot refill it.
        self._keys_generation = 0
        self._flusher: asyncio.Task[None] | None = None
        #: Storage samplers run for every active tenant before a usage flush; each returns
        #: ``{"hot_bytes": n}`` / ``{"cold_bytes": n}``. The hot tier's is built in; the cold
        #: tier registers its own here (the metering hook for cold bytes).
        self.storage_samplers: list[Callable[[str], dict[str, int]]] = [self._sample_hot]

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))

    # Lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the periodic usage flush (call from the running event loop)."""
        self._flusher = asyncio.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        interval = self.settings.metering.flush_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self._run(self._sample_and_flush, None)
            except Exception:
                log.exception("writing usage failed; will retry")

    def _sample_hot(self, tenant: str) -> dict[str, int]:
        total = 0
        for d in self.service.meta.list_tables(tenant):
            for p in range(d.partitions):
                total += self.service.hot.offsets(PartitionId(tenant, d.table_id, p)).size_bytes
        return {"hot_bytes": total}

    def _sample_and_flush(self, only: str | None) -> None:
        """Sample the storage of active tenants (or of ``only``), then flush usage."""
        tenants = {only} if only is not None else self.meter.active_tenants()
        for tenant in tenants:
            for sampler in self.storage_samplers:
                try:
                    self.meter.set_storage(tenant, **sampler(tenant))
                except Exception:
                    log.exception("sampling the storage of tenant %s failed", tenant)
        self.meter.flush()

    async def close(self) -> None:
        """Stop the flush loop and write what is pending."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        try:
            await self._run(self._sample_and_flush, None)
        except Exception:
            log.exception("writing usage at shutdown failed")
        self.buckets.close()

    # Authentication -----------------------------------------------------------------------
    async def authenticate(self, authorization: str | None) -> Principal:
        """Resolve a credential to a tenant or the operator.

        Raises:
            Unauthenticated: missing, malformed, unknown, wrong or revoked key.
            TenantSuspended: the key's tenant is suspended.
        """
        key = bearer_key(authorization)
        if hmac.compare_digest(key.encode(), self._operator_key.encode()):
            return Principal(None)
        parsed = keys.parse(key)
        if parsed is None:
            raise Unauthenticated("invalid API key")
        key_id, secret = parsed
        record = await self._key_record(key_id)
        if record is None or not keys.verify(secret, record.salt, record.digest):
            raise Unauthenticated("invalid API key")
        if record.revoked:
            raise Unauthenticated("invalid API key")
        if record.tenant_status != "active":
            raise TenantSuspended(f"tenant {record.tenant!r} is suspended")
        return Principal(record.tenant)

    async def _key_record(self, key_id: str) -> KeyRecordView | None:
        """What the store says about ``key_id``, reused for ``auth.key_cache_ttl_s``."""
        if self.settings.auth.key_cache_ttl_s <= 0:
            return await self._run(self.tenants.key_for_auth, key_id)
        hit = self._keys.get(key_id)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        lookup = self._key_lookups.get(key_id)
        if lookup is None:
            lookup = asyncio.create_task(self._look_up_key(key_id))
            # Retrieve a failure even when every waiter was cancelled (no asyncio warning).
            lookup.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._key_lookups[key_id] = lookup
        # Shielded: a cancelled request must not cancel the lookup other requests share.
        return await asyncio.shield(lookup)

    async def _look_up_key(self, key_id: str) -> KeyRecordView | None:
        generation = self._keys_generation
        # The expiry counts from before the read: the entry is never older than the TTL.
        expires = self._clock() + self.settings.auth.key_cache_ttl_s
        try:
            record = await self._run(self.tenants.key_for_auth, key_id)
        finally:
            if self._key_lookups.get(key_id) is asyncio.current_task():
                del self._key_lookups[key_id]
        if record is not None and generation == self._keys_generation:
            self._keys.pop(key_id, None)  # re-inserted last: the oldest entries come first
            self._keys[key_id] = (expires, record)
            self._prune_keys()
        return record

    def _prune_keys(self) -> None:
        """Drop the oldest entries while they are expired or the cache is over
        ``_KEY_CACHE_MAX``; an expired entry further on is replaced at its next lookup."""
        now = self._clock()
        while self._keys:
            key_id, (expires, _) = next(iter(self._keys.items()))
            if expires > now and len(self._keys) <= _KEY_CACHE_MAX:
                return
            del self._keys[key_id]

    def forget_keys(self) -> None:
        """Drop everything cached about keys: the next request of any key reads the store.

        Called after every change of a key or a tenant's status made through this
        gateway, so this gateway applies it from its next request on.
        """
        self._keys.clear()
        self._key_lookups.clear()
        self._keys_generation += 1

    async def tenant_of(self, authorization: str | None) -> str:
        """The tenant of a data-plane request; counts it and charges requests/s.

        Raises: Unauthenticated, TenantSuspended, PermissionDenied (the operator key,
        which belongs to no tenant), Throttled.
        """
        principal = await self.authenticate(authorization)
        if principal.tenant is None:
            raise PermissionDenied(
                "the operator key manages tenants; use a tenant's API key for tables and data"
            )
        tenant = principal.tenant
        self.meter.add(tenant, requests=1)
        quotas = await self.quotas(tenant)
        if quotas.requests_per_s is not None:
            await self._take(tenant, "requests", 1, quotas.requests_per_s)
        return tenant

    async def operator(self, authorization: str | None) -> None:
        """Raises: Unauthenticated; PermissionDenied for a tenant key."""
        principal = await self.authenticate(authorization)
        if not principal.is_operator:
            raise PermissionDenied("the admin API needs the operator key")

    # Admission and quotas -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admit(self, tenant: str, *, follow: bool = False) -> AsyncIterator[None]:
        """Hold one of the tenant's slots on this gateway for the request.

        Ordinary requests share ``quota.max_in_flight`` slots per tenant; follow reads (long
        polls and open streams, which wait by design) have their own ``quota.max_follows``.

        Raises: Throttled: the tenant has no free slot here.
        """
        key = (tenant, "follow" if follow else "request")
        limit = self.settings.quota.max_follows if follow else self.settings.quota.max_in_flight
        n = self._in_flight.get(key, 0)
        if n >= limit:
            self.meter.add(tenant, throttled=1)
            what = "follow reads" if follow else "requests"
            raise Throttled(
                f"the tenant has {n} {what} in progress on this gateway; retry later",
                retry_after_ms=_BUSY_RETRY_MS,
                quota="max_follows" if follow else "in_flight",
            )
        self._in_flight[key] = n + 1
        try:
            yield
        finally:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]

    def in_flight(self, tenant: str, *, follow: bool = False) -> int:
        return self._in_flight.get((tenant, "follow" if follow else "request"), 0)

    async def quotas(self, tenant: str) -> Quotas:
        now = time.monotonic()
        hit = self._quotas.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]
        own = await self._run(self.tenants.get_quota, tenant)
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
        """
        key = (tenant, kind)
        if not force:
            until = self._refusing.get(key)
            if until is not None:
                left = until - time.monotonic()
                if left > 0:
                    self._throttled(tenant, kind, rate, max(1, math.ceil(left * 1000)))
                del self._refusing[key]
        burst = rate * self.settings.quota.burst_s
        wait = await self._run(self.buckets.take, tenant, kind, amount, rate, burst, force)
        if wait:
            self._refusing[key] = time.monotonic() + min(wait / 1000, _REFUSE_LOCALLY_MAX_S)
            self._throttled(tenant, kind, rate, wait)

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
                await self._run(
                    self.buckets.take, tenant, "append_bytes", -nbytes, rate, burst, True
                )
            raise

    def record_append(self, tenant: str, records: int, nbytes: int) -> None:
        self.meter.add(tenant, append_records=records, append_bytes=nbytes)

    async def check_read(self, tenant: str) -> None:
        """Refuse a read while the tenant's read bucket is in debt."""
        q = await self.quotas(tenant)
        if q.read_bytes_per_s is not None:
            await self._take(tenant, "read_bytes", 1, q.read_bytes_per_s)

    async def record_read(self, tenant: str, records: int, nbytes: int) -> None:
        """Meter a read and charge the bytes it returned to the read bucket."""
        self.meter.add(tenant, read_records=records, read_bytes=nbytes)
        q = await self.quotas(tenant)
        if q.read_bytes_per_s is not None and nbytes:
            await self._take(tenant, "read_bytes", nbytes, q.read_bytes_per_s, force=True)

    async def check_create_table(self, tenant: str, partitions: int) -> None:
        """Raises: QuotaExceeded over the table or partition count quota."""
        q = await self.quotas(tenant)
        if q.max_tables is None and q.max_partitions is None:
            return
        tables, parts = await self._run(self.tenants.counts, tenant)
        if q.max_tables is not None and tables + 1 > q.max_tables:
            raise QuotaExceeded(
                f"the tenant has {tables} tables; its quota is {q.max_tables}",
                quota="max_tables",
            )
        if q.max_partitions is not None and parts + partitions > q.max_partitions:
            raise QuotaExceeded(
                f"the tenant has {parts} partitions; {partitions} more would pass its quota "
                f"of {q.max_partitions}",
                quota="max_partitions",
            )

    async def hot_bytes(self, tenant: str) -> int:
        """Bytes the tenant holds in the hot tier (cached for a second); also metered."""
        now = time.monotonic()
        hit = self._hot_bytes.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]

        size = (await self._run(self._sample_hot, tenant))["hot_bytes"]
        self._hot_bytes[tenant] = (now + _HOT_BYTES_TTL_S, size)
        self.meter.set_storage(tenant, hot_bytes=size)
        return size

    # Admin --------------------------------------------------------------------------------
    @staticmethod
    def _check_name(name: str) -> None:
        if not isinstance(name, str) or not _TENANT_RE.match(name):
            raise InvalidRequest(
                f"tenant name {name!r} must start with a letter and hold only letters, "
                "digits, '_' and '-' (at most 63)"
            )

    async def create_tenant(self, name: str) -> TenantInfo:
        self._check_name(name)
        return await self._run(self.tenants.create_tenant, name)

    async def get_tenant(self, name: str) -> TenantInfo:
        return await self._run(self.tenants.get_tenant, name)

    async def list_tenants(self) -> list[TenantInfo]:
        return await self._run(self.tenants.list_tenants)

    async def _change_keys(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a change of keys or of a tenant's status, and drop the key cache once the
        change is written: never before (a lookup in between would cache the old state),
        and even when the request that asked for it is cancelled meanwhile (the write
        goes on in its thread). The caller resumes after the cache was dropped."""
        written = asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))

        def forget(done: asyncio.Future[R]) -> None:
            self.forget_keys()
            if not done.cancelled():
                done.exception()  # retrieved here when no caller waits for it any more

        written.add_done_callback(forget)
        return await asyncio.shield(written)

    async def suspend(self, name: str) -> TenantInfo:
        """Refused from the next request on here, within ``auth.key_cache_ttl_s`` elsewhere."""
        return await self._change_keys(self.tenants.set_status, name, "suspended")

    async def resume(self, name: str) -> TenantInfo:
        return await self._change_keys(self.tenants.set_status, name, "active")

    async def delete_tenant(self, name: str) -> None:
        """Suspend, wait until every replica refuses the tenant (the key cache's TTL), drop
        every table through the service (so every tier lets go of the data), then remove
        buckets, usage, keys and rows."""
        await self.suspend(name)
        # Other replicas may accept the tenant's keys for up to the TTL after the suspension;
        # a table created there meanwhile would outlive the deletion.
        await asyncio.sleep(self.settings.auth.key_cache_ttl_s)
        for _ in range(100):  # let this gateway's requests of the tenant finish
            if not self.in_flight(name) and not self.in_flight(name, follow=True):
                break
            await asyncio.sleep(0.05)
        for view in await self.service.list_tables(name):
            d = view.definition
            with contextlib.suppress(Exception):
                await self.service.drop_table(name, d.namespace, d.name)
        await self._run(self.service.hot.drop_tenant, name)
        if self.service.cold is not None:
            await self._run(self.service.cold.drop_tenant, name)
        await self._run(self.buckets.forget, name)
        self.meter.forget(name)
        self._quotas.pop(name, None)
        self._hot_bytes.pop(name, None)
        await self._change_keys(self.tenants.delete_tenant, name)

    async def issue_key(self, tenant: str) -> tuple[KeyInfo, str]:
        """A new key for ``tenant``: its info and the full key (shown once)."""
        issued = keys.issue()
        info = await self._run(
            self.tenants.add_key, tenant, issued.key_id, issued.salt, issued.digest
        )
        return info, issued.key

    async def revoke_key(self, key_id: str, tenant: str | None = None) -> None:
        """Refused from the next request on here, within ``auth.key_cache_ttl_s`` elsewhere."""
        await self._change_keys(self.tenants.revoke_key, key_id, tenant)

    async def list_keys(self, tenant: str) -> list[KeyInfo]:
        await self.get_tenant(tenant)
        return await self._run(self.tenants.list_keys, tenant)

    async def get_quota(self, tenant: str) -> dict[str, int | None]:
        await self.get_tenant(tenant)
        return await self._run(self.tenants.get_quota, tenant)

    async def set_quota(self, tenant: str, values: dict[str, int | None]) -> dict[str, int | None]:
        unknown = set(values) - set(QUOTA_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown quota fields {sorted(unknown)}")
        out = await self._run(self.tenants.set_quota, tenant, values)
        self._quotas.pop(tenant, None)
        for key in [k for k in self._refusing if k[0] == tenant]:
            del self._refusing[key]
        return out

    async def usage(
        self, tenant: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[UsageRow]:
        """The tenant's usage per minute; this gateway's pending figures are written first."""
        await self.get_tenant(tenant)
        try:
            await self._run(self._sample_and_flush, tenant)
        except Exception:
            # What was written stays readable; the pending figures go with the next flush.
            log.exception("writing usage before a usage read failed")
        return await self._run(self.tenants.usage, tenant, since, until)
