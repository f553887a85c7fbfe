"""Tenants and tables in the metadata store: create, look up, change and drop.

Every lookup by name is scoped by tenant: a tenant can never see another tenant's tables.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.meta.base import MetaBase
from gateway.meta.models import (
    GroupOffset,
    GroupRecord,
    PartitionRecord,
    SegmentRecord,
    TableRecord,
    Tenant,
    utcnow,
)
from gateway.meta.placement import choose_shards, shard_loads
from gateway.meta.records import TableDef, TableLimits
from gateway.wire.changes import PrimaryKey, engine_from_json, engine_to_json
from gateway.wire.errors import (
    CommitConflict,
    InvalidRequest,
    QuotaExceeded,
    TableAlreadyExists,
    TableNotFound,
    TenantNotFound,
)

__all__ = ["TableOps"]


#: Ids of one ``IN`` list (SQLite takes at most 32,766 bound values a statement).
_IDS_PER_QUERY = 500


def _table_def(record: TableRecord) -> TableDef:
    return TableDef(
        table_id=record.id,
        tenant=record.tenant_id,
        namespace=record.namespace,
        name=record.name,
        fields=json.loads(record.schema_json),
        partitions=record.partitions,
        key_columns=json.loads(record.key_columns_json),
        created_at=record.created_at,
        schema_version=record.schema_version or 0,
        retention_ms=record.retention_ms,
        retention_records=record.retention_records,
        retention_set_at=record.retention_set_at,
        primary_key=primary_key_from_json(record.primary_key_json),
    )


def primary_key_to_json(key: PrimaryKey | None) -> str | None:
    if key is None:
        return None
    return json.dumps({"columns": list(key.columns), "merge_engine": engine_to_json(key.engine)})


def primary_key_from_json(value: str | None) -> PrimaryKey | None:
    if value is None:
        return None
    raw = json.loads(value)
    return PrimaryKey(tuple(raw["columns"]), engine_from_json(raw["merge_engine"]))


def _check_limits(session: Session, tenant: str, partitions: int, limits: TableLimits) -> None:
    """Raises: QuotaExceeded when one more table of ``partitions`` passes ``limits``."""
    if limits.max_tables is None and limits.max_partitions is None:
        return
    tables, parts = session.execute(
        select(
            func.count(TableRecord.id), func.coalesce(func.sum(TableRecord.partitions), 0)
        ).where(TableRecord.tenant_id == tenant)
    ).one()
    if limits.max_tables is not None and tables + 1 > limits.max_tables:
        raise QuotaExceeded(
            f"the tenant has {tables} tables; its quota is {limits.max_tables}",
            quota="max_tables",
        )
    if limits.max_partitions is not None and parts + partitions > limits.max_partitions:
        raise QuotaExceeded(
            f"the tenant has {parts} partitions; {partitions} more would pass its quota "
            f"of {limits.max_partitions}",
            quota="max_partitions",
        )


def _not_found(namespace: str, name: str) -> TableNotFound:
    return TableNotFound(f"table {namespace}.{name} not found", namespace=namespace, name=name)


class TableOps(MetaBase):
    # Tenants ----------------------------------------------------------------------------
    def ensure_tenant(self, tenant: str) -> None:
        """Create ``tenant`` (status ``active``) unless it exists. Safe to race."""
        try:
            with self._session(write=True) as session:
                if session.get(Tenant, tenant) is None:
                    session.add(Tenant(id=tenant, status="active", created_at=utcnow()))
        except IntegrityError:
            # Another process created it between our check and our insert.
            with self._session(write=False) as session:
                if session.get(Tenant, tenant) is None:
                    raise

    # Tables -----------------------------------------------------------------------------
    def create_table(
        self,
        tenant: str,
        namespace: str,
        name: str,
        fields: Sequence[Mapping[str, Any]],
        partitions: int,
        key_columns: Sequence[str] = (),
        shards: Sequence[str] = ("default",),
        retention_ms: int | None = None,
        retention_records: int | None = None,
        *,
        create_tenant: bool = False,
        limits: TableLimits | None = None,
        primary_key: PrimaryKey | None = None,
    ) -> TableDef:
        """Create a table and its partition rows ``0..partitions-1``, each placed on one of
        ``shards`` by :func:`choose_shards` (the hot tier's configured shard names), in one
        transaction: with ``create_tenant`` the tenant too when it does not exist yet (as
        :meth:`ensure_tenant`), and with ``limits`` the tenant's table and partition counts
        checked in the same transaction as the insert.

        Raises:
            InvalidRequest: ``partitions`` is below 1.
            TenantNotFound: the tenant does not exist (and ``create_tenant`` is false).
            TableAlreadyExists: the tenant already has ``namespace.name``.
            QuotaExceeded: the table would pass one of ``limits``.
        """
        if partitions < 1:
            raise InvalidRequest(
                f"a table needs at least one partition, got {partitions}", partitions=partitions
            )
        for attempt in (1, 2):
            record = TableRecord(
                id=str(uuid.uuid4()),
                tenant_id=tenant,
                namespace=namespace,
                name=name,
                schema_json=json.dumps([dict(f) for f in fields]),
                partitions=partitions,
                key_columns_json=json.dumps(list(key_columns)),
                created_at=utcnow(),
                retention_ms=retention_ms,
                retention_records=retention_records,
                retention_set_at=utcnow() if retention_ms or retention_records else None,
                primary_key_json=primary_key_to_json(primary_key),
            )
            try:
                with self._session(write=True) as session:
                    # With limits, the tenant's row is locked (PostgreSQL; SQLite's write
                    # transactions are serial anyway): two creates racing at the edge of
                    # a quota count one after the other.
                    lock = True if limits is not None else None
                    if session.get(Tenant, tenant, with_for_update=lock) is None:
                        if not create_tenant:
                            raise TenantNotFound(f"tenant {tenant!r} not found", tenant=tenant)
                        session.add(Tenant(id=tenant, status="active", created_at=utcnow()))
                        session.flush()
                    if self._find(session, tenant, namespace, name) is not None:
                        raise self._exists(namespace, name)
                    if limits is not None:
                        _check_limits(session, tenant, partitions, limits)
                    placed = ["default"] * partitions
                    if list(shards) != ["default"]:
                        pins, load, mine = shard_loads(session, tenant)
                        placed = choose_shards(partitions, tenant, shards, pins, load, mine)
                    session.add(record)
                    session.flush()  # the table row first: partitions reference it
                    session.add_all(
                        PartitionRecord(
                            table_id=record.id,
                            partition=p,
                            high_watermark=0,
                            tiered_watermark=0,
                            shard=placed[p],
                            epoch=0,
                        )
                        for p in range(partitions)
                    )
            except IntegrityError:
                # Lost a race with a concurrent create of the same name (or tenant removal),
                # or of the tenant itself: once more, finding the tenant there.
                with self._session(write=False) as session:
                    if self._find(session, tenant, namespace, name) is not None:
                        raise self._exists(namespace, name) from None
                    raced = create_tenant and session.get(Tenant, tenant) is not None
                if attempt == 2 or not raced:
                    raise
                continue
            return _table_def(record)
        raise AssertionError("unreachable")

    def get_table(self, tenant: str, namespace: str, name: str) -> TableDef:
        """Raises: TableNotFound."""
        with self._session(write=False) as session:
            record = self._find(session, tenant, namespace, name)
            if record is None:
                raise _not_found(namespace, name)
            return _table_def(record)

    def set_fields(
        self, table_id: str, version: int, fields: Sequence[Mapping[str, Any]]
    ) -> TableDef:
        """Replace the table's user schema if its schema version is still ``version``,
        raising the version by one (compare-and-set: of two racing changes planned from
        one version, one commits).

        Raises:
            TableNotFound: the table was dropped.
            CommitConflict: another change committed since ``version`` (retryable).
        """
        stmt = (
            update(TableRecord)
            .where(TableRecord.id == table_id, TableRecord.schema_version == version)
            .values(
                schema_json=json.dumps([dict(f) for f in fields]),
                schema_version=version + 1,
            )
        )
        with self._session(write=True) as session:
            changed = session.execute(stmt).rowcount  # type: ignore[attr-defined]
            record = session.get(TableRecord, table_id)
            if record is None:
                raise TableNotFound(f"table {table_id} not found", table_id=table_id)
            if not changed:
                raise CommitConflict(
                    f"the schema of {record.namespace}.{record.name} changed concurrently "
                    f"(now version {record.schema_version}); describe the table and retry",
                    version=str(record.schema_version),
                )
            return _table_def(record)

    def set_retention(
        self, table_id: str, retention_ms: int | None, retention_records: int | None
    ) -> TableDef:
        """Replace the table's retention (None: no limit of that kind).

        Raises:
            TableNotFound: the table was dropped.
        """
        with self._session(write=True) as session:
            record = session.get(TableRecord, table_id)
            if record is None:
                raise TableNotFound(f"table {table_id} not found", table_id=table_id)
            record.retention_ms = retention_ms
            record.retention_records = retention_records
            record.retention_set_at = utcnow()
            session.flush()
            return _table_def(record)

    def list_tables(
        self,
        tenant: str,
        namespace: str | None = None,
        *,
        after: tuple[str, str] | None = None,
        limit: int | None = None,
        contains: str | None = None,
    ) -> list[TableDef]:
        """The tenant's tables (in ``namespace`` only, when given), by namespace and name:
        those after ``(namespace, name)`` when ``after`` is given, at most ``limit``, whose
        name holds ``contains`` (any case) when given. Keyset pages on the unique index
        (tenant, namespace, name): a page costs the same at any depth."""
        stmt = select(TableRecord).where(TableRecord.tenant_id == tenant)
        if namespace is not None:
            stmt = stmt.where(TableRecord.namespace == namespace)
        if after is not None:
            stmt = stmt.where(
                or_(
                    TableRecord.namespace > after[0],
                    and_(TableRecord.namespace == after[0], TableRecord.name > after[1]),
                )
            )
        if contains:
            stmt = stmt.where(
                func.lower(TableRecord.name).contains(contains.lower(), autoescape=True)
            )
        stmt = stmt.order_by(TableRecord.namespace, TableRecord.name)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._session(write=False) as session:
            return [_table_def(r) for r in session.scalars(stmt)]

    def tables_by_id(self, tenant: str, ids: Collection[str]) -> dict[str, TableDef]:
        """Table id -> definition, for those of ``ids`` that are the tenant's (primary-key
        lookups, :data:`_IDS_PER_QUERY` ids a query): what a caller holding a few ids of a
        tenant with thousands of tables reads instead of the whole list."""
        wanted = sorted(set(ids))
        out: dict[str, TableDef] = {}
        with self._session(write=False) as session:
            for at in range(0, len(wanted), _IDS_PER_QUERY):
                stmt = select(TableRecord).where(
                    TableRecord.tenant_id == tenant,
                    TableRecord.id.in_(wanted[at : at + _IDS_PER_QUERY]),
                )
                out.update((r.id, _table_def(r)) for r in session.scalars(stmt))
        return out

    def all_tables(self) -> list[TableDef]:
        """Every tenant's tables, by tenant, namespace and name (for the operator's jobs,
        such as tiering; never exposed to a tenant)."""
        stmt = select(TableRecord).order_by(
            TableRecord.tenant_id, TableRecord.namespace, TableRecord.name
        )
        with self._session(write=False) as session:
            return [_table_def(r) for r in session.scalars(stmt)]

    def drop_table(self, tenant: str, namespace: str, name: str) -> TableDef:
        """Delete the table and its partition rows; returns what was dropped.

        Raises: TableNotFound.
        """
        with self._session(write=True) as session:
            record = self._find(session, tenant, namespace, name)
            if record is None:
                raise _not_found(namespace, name)
            # Explicit, not only ON DELETE CASCADE, so it holds whatever the backend enforces.
            session.execute(delete(PartitionRecord).where(PartitionRecord.table_id == record.id))
            session.execute(delete(GroupOffset).where(GroupOffset.table_id == record.id))
            session.execute(delete(GroupRecord).where(GroupRecord.table_id == record.id))
            session.execute(delete(SegmentRecord).where(SegmentRecord.table_id == record.id))
            deleted = session.execute(
                delete(TableRecord).where(
                    TableRecord.id == record.id, TableRecord.tenant_id == tenant
                )
            )
            if deleted.rowcount != 1:  # type: ignore[attr-defined]
                raise _not_found(namespace, name)  # a concurrent drop won
            return _table_def(record)

    @staticmethod
    def _find(session: Session, tenant: str, namespace: str, name: str) -> TableRecord | None:
        return session.scalars(
            select(TableRecord).where(
                TableRecord.tenant_id == tenant,
                TableRecord.namespace == namespace,
                TableRecord.name == name,
            )
        ).one_or_none()

    @staticmethod
    def _exists(namespace: str, name: str) -> TableAlreadyExists:
        return TableAlreadyExists(
            f"table {namespace}.{name} already exists", namespace=namespace, name=name
        )
