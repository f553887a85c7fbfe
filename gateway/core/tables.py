"""Creating, describing, listing and dropping stream-tables."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.cold.base import SnapshotInfo
from gateway.core.base import CoreBase, StorageSample
from gateway.core.names import check_ident, check_retention
from gateway.core.paging import Page, check_search, decode_token, encode_token, size_of
from gateway.core.views import MaintenanceView, PartitionView, TableView
from gateway.hot import PartitionId
from gateway.meta import StorageMark, TableDef, TableLimits
from gateway.wire.changes import (
    LastRow,
    PrimaryKey,
    Versioned,
    check_primary_key,
    engine_from_json,
)
from gateway.wire.errors import (
    InvalidRequest,
    InvalidSchema,
    QuotaExceeded,
    SchemaChangeRefused,
    TidegateError,
)
from gateway.wire.evolution import ACCEPTED, apply_changes
from gateway.wire.schema import fields_to_json, parse_fields

MAX_PARTITIONS = 4096

__all__ = ["TableOps"]

log = logging.getLogger(__name__)


def declared_key(columns: Sequence[str], merge_engine: Any) -> PrimaryKey | None:
    """The primary key a create declares (None: an append-only table).

    Raises:
        InvalidSchema: a merge engine without a key, or not one of the engines.
    """
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidSchema("primary_key is a list of column names")
    if not columns:
        if merge_engine not in (None, ""):
            raise InvalidSchema(
                "a merge engine is declared with a primary key; give primary_key too"
            )
        return None
    return PrimaryKey(tuple(columns), engine_from_json(merge_engine or LastRow.name))


def never_null(pk: PrimaryKey | None) -> dict[str, str]:
    """The columns of a primary-key table that a schema change may not make optional,
    and why: the key's and a versioned engine's version column."""
    if pk is None:
        return {}
    why = dict.fromkeys(pk.columns, "it is a primary key column, and a key is never null")
    if isinstance(pk.engine, Versioned):
        why[pk.engine.column] = (
            "it is the versioned merge engine's version column, and every write has a version"
        )
    return why


class TableOps(CoreBase):
    async def create_table(
        self,
        tenant: str,
        namespace: str,
        name: str,
        fields: Any,
        partitions: int,
        key_columns: Sequence[str] = (),
        retention_ms: int | None = None,
        retention_records: int | None = None,
        limits: TableLimits | None = None,
        primary_key: Sequence[str] = (),
        merge_engine: Any = None,
    ) -> TableView:
        """Create a table, with a retention by age (``retention_ms``) and/or by count
        (``retention_records``) when given (None or 0: no limit); the tenant too when it
        does not exist yet.

        Raises:
            InvalidRequest: bad names, partition count or retention.
            InvalidSchema: the schema or key columns cannot be stored.
            TableAlreadyExists: the name is taken in this tenant.
            QuotaExceeded: the tenant would pass one of ``limits`` (its count quotas).
        """
        check_ident("namespace", namespace)
        check_ident("table name", name)
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not (1 <= partitions <= MAX_PARTITIONS)
        ):
            raise InvalidRequest(f"partitions must be an integer from 1 to {MAX_PARTITIONS}")
        per_table = self.settings.quota.max_table_partitions
        if partitions > per_table:
            raise QuotaExceeded(
                f"a table may have at most {per_table} partitions on this gateway "
                f"(quota.max_table_partitions); {namespace}.{name} asks for {partitions}",
                quota="max_table_partitions",
            )
        ms = check_retention("retention_ms", retention_ms) or None
        records = check_retention("retention_records", retention_records) or None
        keys = list(key_columns)
        # Parsing and checking a schema costs up to its bounds (MAX_FIELDS fields): on
        # the I/O pool, so that the event loop serves other tenants meanwhile, in the same
        # hop as the one metadata transaction (tenant, quota counts, table, partitions).

        pk = declared_key(primary_key, merge_engine)
        if pk is not None and not keys:
            keys = list(pk.columns)  # every version of a key meets in one partition

        def insert() -> TableDef:
            _, stored = self._checked_schema(fields, keys, pk)
            return self.meta.create_table(
                tenant,
                namespace,
                name,
                stored,
                partitions,
                keys,
                self.hot.shard_names(),
                ms,
                records,
                create_tenant=True,
                limits=limits,
                primary_key=pk,
            )

        d = await self._run(insert)
        # No Iceberg table yet: the cold store creates it when the table is first used
        # (tiered, described, scanned, planned or loaded through the REST catalog), so a
        # create costs the same with 10 tables or 50,000 (docs/decisions/serverless.md).
        # The hot tier learns the partitions exist, at offset 0: an append to a partition
        # it holds no state for means the state was lost (see AppendOps._hot_append). A
        # failure here is not the caller's: the first append opens them then.
        parts = [PartitionId(d.tenant, d.table_id, p) for p in range(partitions)]
        try:
            await self._run(self.hot.open_partitions, parts)
        except TidegateError as exc:
            log.info("opening the partitions of %s.%s later: %s", namespace, name, exc)
        else:
            for part in parts:
                self._hot_checked.add(part)
        # What a describe would show, without asking the tiers: every partition is empty.
        return TableView(
            d,
            parse_fields(d.fields, stored=True),
            tuple(PartitionView(p, 0, 0, 0, 0, 0) for p in range(partitions)),
            iceberg_table=".".join((tenant, namespace, name)) if self.cold is not None else "",
        )

    def _checked_schema(
        self, fields: Any, keys: Sequence[str], pk: PrimaryKey | None = None
    ) -> tuple[pa.Schema, list[dict[str, Any]]]:
        """The schema of a new table from its JSON form, checked (bounds, key columns,
        the primary key, storable in the cold tier) before any metadata is written, so
        that an unstorable schema leaves nothing behind; with the JSON form the metadata
        store keeps (a primary key's columns made non-null)."""
        schema = parse_fields(fields)
        if pk is not None:
            schema = check_primary_key(schema, pk, keys)
        for k in keys:
            if k not in schema.names:
                raise InvalidSchema(f"key column {k!r} is not a column of the schema")
        if len(set(keys)) != len(keys):
            raise InvalidSchema("a key column is named twice")
        if self.cold is not None:
            self.cold.check_schema(schema)
        return schema, fields_to_json(schema, fields if isinstance(fields, list) else ())

    def _evolved_schema(
        self,
        fields: list[dict[str, Any]],
        changes: Any,
        keys: Sequence[str],
        not_null: Mapping[str, str] | None = None,
    ) -> tuple[list[dict[str, Any]], pa.Schema | None]:
        """The stored fields after ``changes`` and their schema (None when nothing
        changes), checked against the whole-schema bounds and the cold tier."""
        changed = apply_changes(fields, changes, keys, not_null)
        if changed == [dict(f) for f in fields]:
            return changed, None
        try:
            schema = parse_fields(changed, stored=True, bounded=True)
            if self.cold is not None:
                self.cold.check_schema(schema)
        except InvalidSchema as exc:
            raise SchemaChangeRefused(f"{exc.message}; {ACCEPTED}") from None
        return changed, schema

    async def alter_schema(self, tenant: str, namespace: str, name: str, changes: Any) -> TableView:
        """Evolve the table's schema by ``changes`` (:mod:`gateway.wire.evolution`):
        the Iceberg schema first, then the metadata store, whose schema version the
        change was planned from must still be current (compare-and-set).

        Appends are validated against the metadata store's schema, so a column is
        accepted in appends only once the Iceberg table can hold it; rows appended under
        the older schema meanwhile read under the new one (added columns as null).

        Raises:
            TableNotFound: no such table in this tenant.
            SchemaChangeRefused: a change that is not admitted; nothing is changed.
            CommitConflict: another schema change committed first (retryable).
        """
        table = await self.table(tenant, namespace, name, fresh=True)
        d = table.definition
        fields, schema = await self._run(
            self._evolved_schema,
            [dict(f) for f in d.fields],
            changes,
            d.key_columns,
            never_null(d.primary_key),
        )
        if schema is None:
            # Every change asked for is already so (a type it has, an optional column
            # made optional): nothing to commit, and the schema version stays.
            return await self.describe_table(tenant, namespace, name)
        cold = self.cold
        if cold is not None:
            docs = {f["name"]: f["doc"] for f in fields if f.get("doc")}
            await self._run(self._cold_table(table).evolve_schema, schema, docs)
        await self._run(self.meta.set_fields, d.table_id, d.schema_version, fields)
        self._tables.pop((tenant, namespace, name), None)
        return await self.describe_table(tenant, namespace, name)

    async def set_retention(
        self,
        tenant: str,
        namespace: str,
        name: str,
        retention_ms: int | None = None,
        retention_records: int | None = None,
    ) -> TableView:
        """Change the table's retention: a value given replaces the current one (0 removes
        that limit), None leaves it as it is. The retention job applies it at its next run;
        offsets already removed stay removed.

        Raises:
            TableNotFound: no such table in this tenant.
            InvalidRequest: a value that is not a retention.
        """
        ms = check_retention("retention_ms", retention_ms)
        records = check_retention("retention_records", retention_records)
        table = await self.table(tenant, namespace, name, fresh=True)
        d = table.definition
        await self._run(
            self.meta.set_retention,
            d.table_id,
            d.retention_ms if ms is None else (ms or None),
            d.retention_records if records is None else (records or None),
        )
        self._tables.pop((tenant, namespace, name), None)
        return await self.describe_table(tenant, namespace, name)

    async def describe_table(self, tenant: str, namespace: str, name: str) -> TableView:
        """The table with live per-partition offsets.

        Raises:
            TableNotFound: no such table in this tenant.
        """
        self._tables.pop((tenant, namespace, name), None)
        table = await self.table(tenant, namespace, name)
        d = table.definition

        where = ["", ""]
        schema_id = [-1]

        def offsets() -> list[PartitionView]:
            views = []
            cached = {p.partition: p for p in self.meta.partitions(d.table_id)}
            # The snapshot summary is the source of truth of T(p); the store caches it.
            snap = None
            if self.cold is not None:
                cold = self._cold_table(table)
                snap = cold.snapshot()
                where[:] = [cold.name, cold.metadata_location]
                schema_id[0] = cold.schema_id()
            for p in range(d.partitions):
                part = PartitionId(d.tenant, d.table_id, p)
                o = self.hot.offsets(part)
                if snap is not None:
                    tiered = snap.watermark(p)
                else:
                    tiered = cached[p].tiered_watermark if p in cached else 0
                if p in cached:
                    o = self._unless_lost(table, part, o, cached[p].high_watermark, tiered)
                    if snap is not None and o.low > tiered:  # the loss was recorded
                        snap = cold.snapshot()
                        tiered = snap.watermark(p)
                recorded = cached[p].earliest_offset if p in cached else 0
                earliest = max(recorded, 0 if tiered > 0 else o.low)
                high = max(o.high, tiered)
                views.append(
                    PartitionView(p, earliest, high, tiered, o.size_bytes, o.bytes_from(tiered))
                )
            self.meta.update_high_watermarks(
                d.table_id, {v.partition: v.high_watermark for v in views}
            )
            if snap is not None:
                self.meta.update_tiered_watermarks(
                    d.table_id, {v.partition: v.tiered_watermark for v in views}
                )
            return views

        def maintenance() -> MaintenanceView | None:
            if self.cold is None:
                return None
            cold = self._cold_table(table)
            return MaintenanceView(
                cold.file_stats(d.partitions, self.settings.compaction.small_file_bytes),
                tuple(self.meta.leases(d.table_id)),
                self.meta.last_runs(d.table_id),
            )

        parts = tuple(await self._run(offsets))
        lake = await self._run(maintenance)
        return TableView(
            d,
            table.schema,
            parts,
            iceberg_table=where[0],
            iceberg_metadata=where[1],
            iceberg_schema_id=schema_id[0],
            maintenance=lake,
        )

    async def list_snapshots(self, tenant: str, namespace: str, name: str) -> list[SnapshotInfo]:
        """The table's Iceberg snapshots, oldest first (none without a cold tier).

        Raises:
            TableNotFound: no such table in this tenant.
        """
        table = await self.table(tenant, namespace, name)
        if self.cold is None:
            return []
        return await self._run(self._cold_table(table).snapshots)

    async def list_tables(self, tenant: str, namespace: str | None = None) -> list[TableView]:
        if namespace:
            check_ident("namespace", namespace)

        def views() -> list[TableView]:  # parsing every schema: off the event loop too
            defs = self.meta.list_tables(tenant, namespace or None)
            return [TableView(d, parse_fields(d.fields, stored=True)) for d in defs]

        return await self._run(views)

    async def list_tables_page(
        self,
        tenant: str,
        namespace: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
        contains: str | None = None,
    ) -> Page[TableView]:
        """One page of the tenant's tables by namespace and name (see
        :mod:`gateway.core.paging`), whose name holds ``contains`` when given.

        Raises:
            InvalidRequest: a bad namespace, page size, token or search string.
        """
        if namespace:
            check_ident("namespace", namespace)
        size = size_of(page_size)
        after = decode_token(page_token, 2)
        search = check_search(contains)

        def page() -> Page[TableView]:
            defs = self.meta.list_tables(
                tenant,
                namespace or None,
                after=(after[0], after[1]) if after else None,
                limit=size + 1,
                contains=search,
            )
            views = [TableView(d, parse_fields(d.fields, stored=True)) for d in defs[:size]]
            last = defs[size - 1] if len(defs) > size else None
            return Page(views, encode_token((last.namespace, last.name)) if last else "")

        return await self._run(page)

    async def drop_table(self, tenant: str, namespace: str, name: str) -> None:
        """Drop the table and its hot data.

        Raises:
            TableNotFound: no such table in this tenant.
        """
        d = await self._run(self.meta.drop_table, tenant, namespace, name)
        self._tables.pop((tenant, namespace, name), None)
        self._cold_tables.pop(d.table_id, None)
        self._state_tables.pop(d.table_id, None)
        cold = self.cold

        def drop_logs() -> None:
            for p in range(d.partitions):
                self.hot.drop(PartitionId(d.tenant, d.table_id, p))
            if cold is not None:
                cold.drop_table(d)

        await self._run(drop_logs)

    def storage_of(self, tenant: str) -> tuple[int, int]:
        """The tenant's bytes in the hot tier and in its Iceberg tables' current snapshots
        (blocking: the metering sampler and the hot-bytes quota call it from a worker
        thread). A table is sampled again only when its storage mark moved (an append,
        a tiering, a trim, a retention, a maintenance run: ``storage_marks``) or this
        process acknowledged appends to it not yet recorded; an idle table costs no
        hot-tier call and no Iceberg metadata read, whatever the tenant's number of
        tables (issue 30)."""
        marks = self.meta.storage_marks(tenant)
        with self._storage_lock:
            known = self._storage.get(tenant) or {}
        pending = self._marks  # appends acknowledged here, not yet in the marks
        kept: dict[str, StorageSample] = {}
        stale: dict[str, StorageMark] = {}
        for table_id, mark in marks.items():
            if table_id in pending:
                stale[table_id] = mark
            elif not mark.written:
                continue  # never written: no byte anywhere, nothing to keep either
            elif (had := known.get(table_id)) is not None and had.mark == mark:
                kept[table_id] = had
            else:
                stale[table_id] = mark
        if stale:
            for d in self.meta.tables_by_id(tenant, stale).values():
                now = stale[d.table_id]
                hot = sum(
                    self.hot.offsets(PartitionId(tenant, d.table_id, p)).size_bytes
                    for p in range(d.partitions)
                )
                had = known.get(d.table_id)
                # Appends move the hot bytes only: the lake's are read again when a
                # tiering, a retention or a maintenance run may have changed them.
                cold = (
                    had.cold_bytes
                    if had is not None and had.mark.lake == now.lake
                    else self._cold_bytes(d)
                )
                kept[d.table_id] = StorageSample(now, hot, cold)
        # Held: the written tables of the tenants sampled last (about 100 bytes each).
        with self._storage_lock:
            self._storage[tenant] = kept
        return (
            sum(s.hot_bytes for s in kept.values()),
            sum(s.cold_bytes for s in kept.values()),
        )

    def _cold_bytes(self, d: TableDef) -> int:
        if self.cold is None:
            return 0
        view = TableView(d, parse_fields(d.fields, stored=True))
        return self._cold_table(view).data_bytes()
