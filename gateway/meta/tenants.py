"""Tenants, API keys, quotas and usage in the metadata store.

A thin layer over :class:`~gateway.meta.store.MetadataStore`'s engine: the same short
transactions, the same databases. Key secrets never reach this module, only their salted
HMAC digests (see :mod:`gateway.tenancy.keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.meta.models import (
    ApiKey,
    GroupOffset,
    GroupRecord,
    PartitionRecord,
    QuotaRecord,
    TableRecord,
    Tenant,
    UsageRecord,
    utcnow,
)
from gateway.meta.store import MetadataStore
from gateway.wire.errors import KeyNotFound, TenantAlreadyExists, TenantNotFound
from gateway.wire.types import QUOTA_FIELDS, USAGE_FIELDS

__all__ = ["KeyInfo", "KeyRecordView", "TenantInfo", "TenantStore", "UsageRow"]

#: Counters that keep the largest value seen in a minute instead of a sum.
_GAUGES = frozenset({"hot_bytes", "cold_bytes"})


@dataclass(frozen=True, slots=True)
class TenantInfo:
    name: str
    status: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: str
    tenant: str
    created_at: datetime
    revoked: bool


@dataclass(frozen=True, slots=True)
class KeyRecordView:
    """What authentication needs about a key, read in one query."""

    key_id: str
    tenant: str
    tenant_status: str
    salt: str
    digest: str
    revoked: bool


@dataclass(frozen=True, slots=True)
class UsageRow:
    tenant: str
    minute: datetime
    counters: dict[str, int]


def _tenant_not_found(name: str) -> TenantNotFound:
    return TenantNotFound(f"tenant {name!r} not found", tenant=name)


class TenantStore:
    """Tenant administration on top of a metadata store (which owns the engine)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def _session(self, *, write: bool) -> AbstractContextManager[Session]:
        # The store's own short transactions: same engine, same SQLite locking rules.
        return self.store._session(write=write)

    # Tenants ----------------------------------------------------------------------------
    def create_tenant(self, name: str) -> TenantInfo:
        """Raises: TenantAlreadyExists."""
        row = Tenant(id=name, status="active", created_at=utcnow())
        try:
            with self._session(write=True) as session:
                if session.get(Tenant, name) is not None:
                    raise TenantAlreadyExists(f"tenant {name!r} already exists", tenant=name)
                session.add(row)
        except IntegrityError:
            raise TenantAlreadyExists(f"tenant {name!r} already exists", tenant=name) from None
        return TenantInfo(row.id, row.status, row.created_at)

    def get_tenant(self, name: str) -> TenantInfo:
        """Raises: TenantNotFound."""
        with self._session(write=False) as session:
            row = session.get(Tenant, name)
            if row is None:
                raise _tenant_not_found(name)
            return TenantInfo(row.id, row.status, row.created_at)

    def list_tenants(
        self, *, after: str | None = None, limit: int | None = None, contains: str | None = None
    ) -> list[TenantInfo]:
        """Tenants by name: those after ``after`` when given, at most ``limit``, whose name
        holds ``contains`` (any case) when given (keyset pages on the primary key)."""
        stmt = select(Tenant)
        if after is not None:
            stmt = stmt.where(Tenant.id > after)
        if contains:
            stmt = stmt.where(func.lower(Tenant.id).contains(contains.lower(), autoescape=True))
        stmt = stmt.order_by(Tenant.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._session(write=False) as session:
            return [TenantInfo(r.id, r.status, r.created_at) for r in session.scalars(stmt)]

    def set_status(self, name: str, status: str) -> TenantInfo:
        """Raises: TenantNotFound."""
        with self._session(write=True) as session:
            row = session.get(Tenant, name)
            if row is None:
                raise _tenant_not_found(name)
            row.status = status
            return TenantInfo(row.id, row.status, row.created_at)

    def delete_tenant(self, name: str) -> None:
        """Delete every row of the tenant: usage, quotas, keys, tables, partitions, itself.

        Call it after the tenant's tables were dropped through the service (so their data
        is gone from every tier); rows of tables left behind are removed here too.

        Raises: TenantNotFound.
        """
        with self._session(write=True) as session:
            if session.get(Tenant, name) is None:
                raise _tenant_not_found(name)
            table_ids = select(TableRecord.id).where(TableRecord.tenant_id == name)
            session.execute(delete(PartitionRecord).where(PartitionRecord.table_id.in_(table_ids)))
            # Explicit, not only ON DELETE CASCADE, as drop_table does.
            session.execute(delete(GroupOffset).where(GroupOffset.tenant_id == name))
            session.execute(delete(GroupRecord).where(GroupRecord.tenant_id == name))
            session.execute(delete(TableRecord).where(TableRecord.tenant_id == name))
            session.execute(delete(UsageRecord).where(UsageRecord.tenant_id == name))
            session.execute(delete(QuotaRecord).where(QuotaRecord.tenant_id == name))
            session.execute(delete(ApiKey).where(ApiKey.tenant_id == name))
            session.execute(delete(Tenant).where(Tenant.id == name))

    # Keys -------------------------------------------------------------------------------
    def add_key(self, tenant: str, key_id: str, salt: str, digest: str) -> KeyInfo:
        """Raises: TenantNotFound."""
        now = utcnow()
        with self._session(write=True) as session:
            if session.get(Tenant, tenant) is None:
                raise _tenant_not_found(tenant)
            session.add(
                ApiKey(id=key_id, tenant_id=tenant, salt=salt, digest=digest, created_at=now)
            )
        return KeyInfo(key_id, tenant, now, False)

    def revoke_key(self, key_id: str, tenant: str | None = None) -> None:
        """Revoke a key (of ``tenant`` only, when given). Idempotent.

        Raises: KeyNotFound.
        """
        stmt = update(ApiKey).where(ApiKey.id == key_id)
        if tenant is not None:
            stmt = stmt.where(ApiKey.tenant_id == tenant)
        with self._session(write=True) as session:
            row = session.get(ApiKey, key_id)
            if row is None or (tenant is not None and row.tenant_id != tenant):
                raise KeyNotFound(f"key {key_id!r} not found", key_id=key_id)
            if row.revoked_at is None:
                row.revoked_at = utcnow()

    def list_keys(self, tenant: str) -> list[KeyInfo]:
        stmt = select(ApiKey).where(ApiKey.tenant_id == tenant).order_by(ApiKey.created_at)
        with self._session(write=False) as session:
            return [
                KeyInfo(k.id, k.tenant_id, k.created_at, k.revoked_at is not None)
                for k in session.scalars(stmt)
            ]

    def key_for_auth(self, key_id: str) -> KeyRecordView | None:
        stmt = (
            select(ApiKey, Tenant.status)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.id == key_id)
        )
        with self._session(write=False) as session:
            found = session.execute(stmt).one_or_none()
            if found is None:
                return None
            key, status = found
            return KeyRecordView(
                key.id, key.tenant_id, status, key.salt, key.digest, key.revoked_at is not None
            )

    # Quotas -----------------------------------------------------------------------------
    def get_quota(self, tenant: str) -> dict[str, int | None]:
        """The tenant's own quota values (None: the configured default)."""
        with self._session(write=False) as session:
            row = session.get(QuotaRecord, tenant)
            return {f: (getattr(row, f) if row is not None else None) for f in QUOTA_FIELDS}

    def set_quota(self, tenant: str, values: Mapping[str, int | None]) -> dict[str, int | None]:
        """Set the given quota fields (None: back to the default). Raises: TenantNotFound."""
        with self._session(write=True) as session:
            if session.get(Tenant, tenant) is None:
                raise _tenant_not_found(tenant)
            row = session.get(QuotaRecord, tenant)
            if row is None:
                row = QuotaRecord(tenant_id=tenant)
                session.add(row)
            for f, v in values.items():
                if f not in QUOTA_FIELDS:
                    raise ValueError(f"unknown quota {f!r}")
                setattr(row, f, v)
            session.flush()
            return {f: getattr(row, f) for f in QUOTA_FIELDS}

    # Usage ------------------------------------------------------------------------------
    def add_usage(self, rows: Mapping[tuple[str, datetime], Mapping[str, int]]) -> None:
        """Add counters to the per-minute rows (gauges keep the largest value).

        Rows of tenants that no longer exist are discarded.
        """
        if not rows:
            return
        for attempt in range(3):
            try:
                self._add_usage(rows)
                return
            except IntegrityError:
                # Another gateway inserted one of the same minutes first; the transaction
                # rolled back whole, and the next attempt finds the row and adds to it.
                if attempt == 2:
                    raise

    def _add_usage(self, rows: Mapping[tuple[str, datetime], Mapping[str, int]]) -> None:
        # Increments in SQL (``c = c + v``), never read-modify-write: under PostgreSQL's
        # READ COMMITTED two gateways adding to one minute at once would lose an update.
        table = UsageRecord.__table__
        assert isinstance(table, Table)
        with self._session(write=True) as session:
            tenants = {t for t, _ in rows}
            alive = set(session.scalars(select(Tenant.id).where(Tenant.id.in_(tenants))))
            for (tenant, minute), counters in sorted(rows.items()):
                if tenant not in alive or not counters:
                    continue
                values = {}
                for f, v in counters.items():
                    col = table.c[f]
                    values[f] = case((col < v, v), else_=col) if f in _GAUGES else col + v
                updated = session.execute(
                    update(table)
                    .where(table.c.tenant_id == tenant, table.c.minute == minute)
                    .values(**values)
                )
                if updated.rowcount == 0:  # type: ignore[attr-defined]
                    fresh = dict.fromkeys(USAGE_FIELDS, 0)
                    fresh.update(counters)
                    session.execute(insert(table).values(tenant_id=tenant, minute=minute, **fresh))

    def usage(
        self, tenant: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[UsageRow]:
        stmt = select(UsageRecord).where(UsageRecord.tenant_id == tenant)
        if since is not None:
            stmt = stmt.where(UsageRecord.minute >= since)
        if until is not None:
            stmt = stmt.where(UsageRecord.minute < until)
        with self._session(write=False) as session:
            return [
                UsageRow(r.tenant_id, r.minute, {f: int(getattr(r, f)) for f in USAGE_FIELDS})
                for r in session.scalars(stmt.order_by(UsageRecord.minute))
            ]
