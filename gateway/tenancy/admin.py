"""Tenant administration: tenants, API keys, quotas and usage (the operator's API)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from gateway.core.paging import Page, check_search, decode_token, encode_token, size_of
from gateway.lake import shards
from gateway.meta.tenants import KeyInfo, TenantInfo, UsageRow
from gateway.tenancy import keys
from gateway.tenancy.auth import run_blocking
from gateway.tenancy.moves import MoveLog
from gateway.wire.errors import InvalidRequest, TidegateError
from gateway.wire.types import QUOTA_FIELDS

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.core import StreamTables
    from gateway.meta.tenants import TenantStore
    from gateway.tenancy.auth import Authenticator
    from gateway.tenancy.metering import Meter
    from gateway.tenancy.quotas import QuotaGuard

__all__ = ["TenantAdmin"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: Matched in full: a final newline would otherwise pass "$" and name another tenant's
#: folder and Iceberg namespace once stripped.
_TENANT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,62}")
_INT64_MAX = 2**63 - 1


def _minute_bound(name: str, ms: int | None) -> datetime | None:
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        raise InvalidRequest(
            f"{name} {ms} is not a time in epoch milliseconds within years 1 to 9999",
            field=name,
        ) from None


class TenantAdmin:
    """The admin operations, run for the operator through one gateway's tenancy: handed
    the parts of :class:`~gateway.tenancy.service.Tenancy` it works with, never the whole
    (a part never imports the whole that holds it)."""

    def __init__(
        self,
        *,
        settings: Settings,
        service: StreamTables,
        tenants: TenantStore,
        auth: Authenticator,
        guard: QuotaGuard,
        meter: Meter,
        flush_usage: Callable[[str | None], None],
    ) -> None:
        self.settings = settings
        self.service = service
        self.tenants = tenants
        self.auth = auth
        self.guard = guard
        self.meter = meter
        #: Samples the storage of a tenant (None: every active one) and writes usage.
        self.flush_usage = flush_usage
        self._moves = MoveLog()

    @staticmethod
    def _check_name(name: str) -> None:
        if not isinstance(name, str) or not _TENANT_RE.fullmatch(name):
            raise InvalidRequest(
                f"tenant name {name!r} must start with a letter and hold only letters, "
                "digits, '_' and '-' (at most 63)"
            )

    async def create_tenant(self, name: str) -> TenantInfo:
        self._check_name(name)
        return await run_blocking(self.tenants.create_tenant, name)

    async def get_tenant(self, name: str) -> TenantInfo:
        self._check_name(name)
        return await run_blocking(self.tenants.get_tenant, name)

    async def list_tenants(self) -> list[TenantInfo]:
        return await run_blocking(self.tenants.list_tenants)

    async def list_tenants_page(
        self,
        page_size: int | None = None,
        page_token: str | None = None,
        contains: str | None = None,
    ) -> Page[TenantInfo]:
        """One page of tenants by name (see :mod:`gateway.core.paging`), whose name holds
        ``contains`` when given.

        Raises:
            InvalidRequest: a bad page size, token or search string.
        """
        size = size_of(page_size)
        after = decode_token(page_token, 1)
        found = await run_blocking(
            lambda: self.tenants.list_tenants(
                after=after[0] if after else None, limit=size + 1, contains=check_search(contains)
            )
        )
        last = found[size - 1].name if len(found) > size else None
        return Page(found[:size], encode_token((last,)) if last else "")

    async def _change_keys(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a change of keys or of a tenant's status, and drop the key cache once the
        change is written: never before (a lookup in between would cache the old state),
        and even when the request that asked for it is cancelled meanwhile (the write
        goes on in its thread). The caller resumes after the cache was dropped."""
        written = asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))

        def forget(done: asyncio.Future[R]) -> None:
            self.auth.forget_keys()
            if not done.cancelled():
                done.exception()  # retrieved here when no caller waits for it any more

        written.add_done_callback(forget)
        return await asyncio.shield(written)

    async def suspend(self, name: str) -> TenantInfo:
        """Refused from the next request on here, within ``auth.key_cache_ttl_s`` elsewhere."""
        self._check_name(name)
        return await self._change_keys(self.tenants.set_status, name, "suspended")

    async def resume(self, name: str) -> TenantInfo:
        self._check_name(name)
        return await self._change_keys(self.tenants.set_status, name, "active")

    async def delete_tenant(self, name: str) -> None:
        """Suspend, wait until every replica refuses the tenant (the key cache's TTL), drop
        every table through the service (so every tier lets go of the data), then remove
        buckets, usage, keys and rows. Each tier removes only what it can tell belongs to
        the tenant (the cold tier checks its catalog, not a path prefix)."""
        await self.suspend(name)
        # Other replicas may accept the tenant's keys for up to the TTL after the suspension;
        # a table created there meanwhile would outlive the deletion.
        await asyncio.sleep(self.settings.auth.key_cache_ttl_s)
        for _ in range(100):  # let this gateway's requests of the tenant finish
            guard = self.guard
            if not guard.in_flight(name) and not guard.in_flight(name, follow=True):
                break
            await asyncio.sleep(0.05)
        for view in await self.service.list_tables(name):
            d = view.definition
            with contextlib.suppress(Exception):
                await self.service.drop_table(name, d.namespace, d.name)
        await run_blocking(self.service.hot.drop_tenant, name)
        if self.service.cold is not None:
            await run_blocking(self.service.cold.drop_tenant, name)
        await run_blocking(self.guard.forget, name)
        self.meter.forget(name)
        await self._change_keys(self.tenants.delete_tenant, name)

    async def issue_key(self, tenant: str) -> tuple[KeyInfo, str]:
        """A new key for ``tenant``: its info and the full key (shown once)."""
        self._check_name(tenant)
        issued = keys.issue()
        info = await run_blocking(
            self.tenants.add_key, tenant, issued.key_id, issued.salt, issued.digest
        )
        return info, issued.key

    async def revoke_key(self, key_id: str, tenant: str | None = None) -> None:
        """Refused from the next request on here, within ``auth.key_cache_ttl_s`` elsewhere."""
        await self._change_keys(self.tenants.revoke_key, key_id, tenant)

    async def list_keys(self, tenant: str) -> list[KeyInfo]:
        await self.get_tenant(tenant)
        return await run_blocking(self.tenants.list_keys, tenant)

    async def get_quota(self, tenant: str) -> dict[str, int | None]:
        await self.get_tenant(tenant)
        return await run_blocking(self.tenants.get_quota, tenant)

    # Hot-tier placement --------------------------------------------------------------------
    async def placements(self, tenant: str | None = None) -> dict[str, Any]:
        """Every partition's placement (of one tenant) and the reserved shards."""
        meta = self.service.meta
        rows = await run_blocking(meta.placements, tenant=tenant)
        return {
            "shards": self.service.hot.shard_names(),
            "pins": await run_blocking(meta.shard_pins),
            "placements": [p.to_dict() for p in rows],
        }

    async def move_partition(
        self, tenant: str, table: str, partition: int, target: str
    ) -> dict[str, Any]:
        """Move one partition's appends to shard ``target`` without copying (see
        :mod:`gateway.hot.placement`); returns its placement afterwards and the move's
        record (``move``), which :meth:`moves` lists from then on.

        Raises:
            TableNotFound: no such table. InvalidRequest: no such partition or shard, or a
            shard reserved for another tenant, or a hot tier without shards.
        """
        self._check_name(tenant)
        record = self._moves.begin(tenant, table, partition, target)

        def move() -> shards.MoveResult:
            # Recorded in the thread, so a request cancelled meanwhile still leaves the
            # move's outcome (the move itself goes on to its end).
            try:
                result = shards.move_partition(self.service, tenant, table, partition, target)
            except TidegateError as err:
                self._moves.fail(record, err)
                raise
            except Exception as exc:
                self._moves.fail(record, TidegateError(f"{type(exc).__name__}: {exc}"))
                raise
            self._moves.done(record, result)
            return result

        result = await run_blocking(move)
        rows = await run_blocking(self.service.meta.placements, tenant=tenant)
        (after,) = [
            p.to_dict()
            for p in rows
            if f"{p.namespace}.{p.name}" == table and p.partition == partition
        ]
        return {**after, "seconds": result.seconds, "move": record.to_dict()}

    async def moves(self) -> list[dict[str, Any]]:
        """Moves under way (intents in the metadata store, whoever runs them) and this
        gateway's recent moves with their outcome, newest first."""
        pending = await run_blocking(self.service.meta.placements, moving=True)
        return self._moves.listing(pending)

    async def pin_shards(self, tenant: str, names: list[str]) -> dict[str, Any]:
        """Reserve ``names`` for ``tenant`` (see :meth:`MetadataStore.pin_shards`).

        Raises:
            InvalidRequest: no shard named, a shard not configured, or reserved for another
            tenant. TenantNotFound: no such tenant.
        """
        self._check_name(tenant)
        if not names:
            raise InvalidRequest("name at least one shard to reserve", field="shards")
        configured = self.service.hot.shard_names()
        for name in names:
            if name not in configured:
                raise InvalidRequest(
                    f"no hot-tier shard {name!r}: the shards are {', '.join(configured)}",
                    shard=name,
                )
        await run_blocking(self.service.meta.pin_shards, tenant, names)
        return await self.placements(tenant)

    async def unpin_shards(self, tenant: str, names: list[str]) -> dict[str, Any]:
        """Release ``tenant``'s reserved shards ``names`` (every one when empty); its
        partitions stay where they are.

        Raises:
            InvalidRequest: a named shard is not reserved for ``tenant``.
        """
        self._check_name(tenant)
        meta = self.service.meta
        pins = await run_blocking(meta.shard_pins)
        own = [s for s, t in pins.items() if t == tenant]
        for name in names:
            if name not in own:
                raise InvalidRequest(
                    f"shard {name!r} is not reserved for {tenant}: its reserved shards are "
                    f"{', '.join(own) or 'none'}",
                    shard=name,
                )
        await run_blocking(meta.unpin_shards, names or own)
        return await self.placements(tenant)

    async def set_quota(self, tenant: str, values: dict[str, int | None]) -> dict[str, int | None]:
        unknown = set(values) - set(QUOTA_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown quota fields {sorted(unknown)}")
        self._check_name(tenant)
        for field, value in values.items():
            if value is not None and not -_INT64_MAX <= value <= _INT64_MAX:
                raise InvalidRequest(
                    f"quota {field} = {value} is out of range: give at most {_INT64_MAX}, "
                    "or a negative value for unlimited",
                    field=field,
                )
        out = await run_blocking(self.tenants.set_quota, tenant, values)
        self.guard.changed(tenant)
        return out

    async def usage(
        self, tenant: str, since_ms: int | None = None, until_ms: int | None = None
    ) -> list[UsageRow]:
        """The tenant's usage per minute from ``since_ms`` to before ``until_ms`` (epoch
        milliseconds; 0 or None: unbounded); this gateway's pending figures are written
        first."""
        since, until = _minute_bound("since_ms", since_ms), _minute_bound("until_ms", until_ms)
        await self.get_tenant(tenant)
        try:
            await run_blocking(self.flush_usage, tenant)
        except Exception:
            # What was written stays readable; the pending figures go with the next flush.
            log.exception("writing usage before a usage read failed")
        return await run_blocking(self.tenants.usage, tenant, since, until)
