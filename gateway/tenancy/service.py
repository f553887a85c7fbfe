"""Tenancy: who is calling, what they may do, how much, and what they used.

Both edges call one :class:`Tenancy` (a :class:`~gateway.tenancy.gate.Gate`): it
authenticates the ``authorization: Bearer <key>`` credential
(:class:`~gateway.tenancy.auth.Authenticator`), admits the request under the tenant's
in-flight bound and charges its rates (:class:`~gateway.tenancy.quotas.QuotaGuard`), meters
what it did (:class:`~gateway.tenancy.metering.Meter`), and runs the operator's admin
operations (:attr:`Tenancy.admin`, a :class:`~gateway.tenancy.admin.TenantAdmin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.meta import TableLimits
from gateway.meta.tenants import TenantStore
from gateway.tenancy.admin import TenantAdmin
from gateway.tenancy.auth import Authenticator, Principal, bearer_key, run_blocking
from gateway.tenancy.buckets import LocalBuckets, RedisBuckets, TokenBuckets
from gateway.tenancy.gate import Gate
from gateway.tenancy.metering import Meter
from gateway.tenancy.quotas import QuotaGuard
from gateway.tenancy.tokens import TOKEN_PREFIX, CatalogTokens, FileTokens
from gateway.wire.errors import PermissionDenied, Throttled, TidegateError, Unauthenticated

__all__ = ["Tenancy"]

log = logging.getLogger(__name__)


class Tenancy(Gate):
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
        self.service = service
        self.tenants = TenantStore(service.meta)
        if buckets is None:
            url = settings.quota_redis_url
            buckets = RedisBuckets(url) if url else LocalBuckets()
        self.buckets = buckets
        self.meter = Meter(self.tenants, max_label_tenants=settings.metering.metrics_max_tenants)
        self.auth = Authenticator(self.tenants, operator_key, settings.auth.key_cache_ttl_s, clock)
        self.guard = QuotaGuard(settings, self.tenants, buckets, self.meter, self.hot_bytes_of)
        self.admin = TenantAdmin(
            settings=settings,
            service=service,
            tenants=self.tenants,
            auth=self.auth,
            guard=self.guard,
            meter=self.meter,
            flush_usage=self.sample_and_flush,
        )
        #: Tokens of the Iceberg REST catalog's OAuth2 exchange.
        self.catalog_tokens = CatalogTokens(
            self.auth.derive_secret("iceberg-catalog-token"),
            settings.cold.rest_catalog.token_ttl_s,
        )
        #: Links to a local warehouse's data files in read plans.
        self.file_tokens = FileTokens(
            self.auth.derive_secret("plan-files"), settings.cold.presign_expiry_s
        )
        self._flusher: asyncio.Task[None] | None = None
        #: Tenant -> when its storage was last sampled (monotonic), for the tenants
        #: sampled within ``metering.storage_sample_s``.
        self._sampled: dict[str, float] = {}
        #: Storage samplers run for every active tenant before a usage flush; each returns
        #: ``{"hot_bytes": n}`` / ``{"cold_bytes": n}``. Both tiers' come from one walk of
        #: the tenant's tables that samples only the tables whose storage moved.
        self.storage_samplers: list[Callable[[str], dict[str, int]]] = [self._storage_sample]

    # Lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the periodic usage flush (call from the running event loop)."""
        self._flusher = asyncio.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        interval = self.settings.metering.flush_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await run_blocking(self.sample_and_flush, None)
            except Exception:
                log.exception("writing usage failed; will retry")

    def hot_bytes_of(self, tenant: str) -> int:
        """The tenant's bytes in the hot tier (blocking; see ``StreamTables.storage_of``)."""
        return self.service.storage_of(tenant)[0]

    def _storage_sample(self, tenant: str) -> dict[str, int]:
        hot, cold = self.service.storage_of(tenant)
        return {"hot_bytes": hot, "cold_bytes": cold}

    def sample_and_flush(self, only: str | None) -> None:
        """Sample the storage of active tenants not sampled for ``storage_sample_s`` (or
        of ``only``, whatever its last sample), then flush usage. Sampling looks at each of
        a tenant's tables' storage marks, once a minute, not at every flush; only the tables
        whose storage moved are sampled again."""
        now = time.monotonic()
        every = self.settings.metering.storage_sample_s
        if only is not None:
            tenants = {only}
        else:
            tenants = {
                t
                for t in self.meter.active_tenants()
                if now - self._sampled.get(t, -math.inf) >= every
            }
            # Bounded by the tenants active within the last period.
            self._sampled = {t: at for t, at in self._sampled.items() if now - at < every}
        for tenant in tenants:
            self._sampled[tenant] = now
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
            await run_blocking(self.sample_and_flush, None)
        except Exception:
            log.exception("writing usage at shutdown failed")
        self.buckets.close()

    # Authentication -----------------------------------------------------------------------
    async def authenticate(self, authorization: str | None) -> Principal:
        """See :meth:`Authenticator.authenticate`."""
        return await self.auth.authenticate(authorization)

    async def tenant_of(self, authorization: str | None) -> str:
        principal = await self.auth.authenticate(authorization)
        if principal.tenant is None:
            raise PermissionDenied(
                "the operator key manages tenants; use a tenant's API key for tables and data"
            )
        tenant = principal.tenant
        self.meter.add(tenant, requests=1)
        await self.guard.charge_request(tenant)
        return tenant

    async def catalog_tenant(self, authorization: str | None) -> str:
        """The tenant of an Iceberg catalog request: its credential is the tenant's API
        key or a token of :meth:`catalog_token`, sent as ``Bearer``; counts the request
        as :meth:`tenant_of` does.

        Raises:
            Unauthenticated: no, a bad, an expired or a revoked credential.
            TenantSuspended, PermissionDenied (the operator key), Throttled.
        """
        key = bearer_key(authorization)
        if key.startswith(TOKEN_PREFIX):
            opened = self.catalog_tokens.open(key)
            if opened is None:
                raise Unauthenticated("the catalog token is invalid or has expired")
            key = opened
        return await self.tenant_of(f"Bearer {key}")

    async def catalog_token(self, client_id: str | None, secret: str) -> tuple[str, str]:
        """The OAuth2 client-credentials exchange of the Iceberg catalog: ``secret`` is a
        tenant's API key (or a token of this method, to refresh it), ``client_id`` the
        tenant's name or empty. Answers the new token and the tenant.

        Raises:
            Unauthenticated: a bad key, or a client_id that is not the key's tenant.
            TenantSuspended, PermissionDenied (the operator key), Throttled.
        """
        key = secret.strip()
        if key.startswith(TOKEN_PREFIX):
            opened = self.catalog_tokens.open(key)
            if opened is None:
                raise Unauthenticated("the catalog token is invalid or has expired")
            key = opened
        if not key:
            raise Unauthenticated("the client secret must be a tenant's API key")
        tenant = await self.tenant_of(f"Bearer {key}")
        if client_id and client_id != tenant:
            # Not the key's tenant: refused like a wrong key, naming nothing of it.
            raise Unauthenticated("the client id must be the API key's tenant (or empty)")
        return self.catalog_tokens.issue(key), tenant

    async def still_allowed(self, authorization: str | None, tenant: str) -> None:
        principal = await self.auth.authenticate(authorization)
        if principal.tenant != tenant:
            raise Unauthenticated("invalid API key")

    async def operator(self, authorization: str | None) -> None:
        """Raises: Unauthenticated; PermissionDenied for a tenant key."""
        principal = await self.auth.authenticate(authorization)
        if not principal.is_operator:
            raise PermissionDenied("the admin API needs the operator key")

    # Admission, quotas, metering ----------------------------------------------------------
    def admit(
        self, tenant: str, *, follow: bool = False, stream: bool = False
    ) -> AbstractAsyncContextManager[None]:
        return self.guard.admit(tenant, follow=follow, stream=stream)

    async def append_refusal(self, authorization: str | None) -> TidegateError | None:
        try:
            principal = await self.auth.authenticate(authorization)
        except TidegateError:
            return None  # the route answers it, as any request
        tenant = principal.tenant
        if tenant is None:
            return None
        try:
            self.guard.refuse_early(tenant, append=True, slot=False)
        except Throttled as err:
            self.meter.add(tenant, requests=1)
            return err
        return None

    def count_refused(self, tenant: str) -> None:
        self.meter.add(tenant, requests=1, throttled=1)

    def refuse_early(
        self,
        tenant: str,
        *,
        follow: bool = False,
        stream: bool = False,
        append: bool = False,
        slot: bool = True,
    ) -> None:
        self.guard.refuse_early(tenant, follow=follow, stream=stream, append=append, slot=slot)

    def in_flight(self, tenant: str, *, follow: bool = False, stream: bool = False) -> int:
        return self.guard.in_flight(tenant, follow=follow, stream=stream)

    async def table_limits(self, tenant: str) -> TableLimits | None:
        return await self.guard.table_limits(tenant)

    def append_charge(self, tenant: str, nbytes: int) -> AbstractAsyncContextManager[None]:
        return self.guard.append_charge(tenant, nbytes)

    def record_append(self, tenant: str, records: int, nbytes: int) -> None:
        self.meter.add(tenant, append_records=records, append_bytes=nbytes)

    async def check_read(self, tenant: str) -> None:
        await self.guard.check_read(tenant)

    async def record_read(self, tenant: str, records: int, nbytes: int) -> None:
        self.meter.add(tenant, read_records=records, read_bytes=nbytes)
        await self.guard.charge_read(tenant, nbytes)
