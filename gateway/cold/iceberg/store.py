"""The Iceberg catalog (SQL or REST) and warehouse (a local folder or S3) holding every
stream-table's table."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.cold.base import (
    ColdStore,
    DataAccess,
    DataFile,
    PlannedFile,
    StorageOptions,
    fs_path,
)
from gateway.cold.iceberg.schema import arrow_to_iceberg
from gateway.cold.iceberg.state import IcebergStateTable
from gateway.cold.iceberg.table import METADATA_PROPERTIES, IcebergColdTable
from gateway.cold.iceberg.vending import StsVendor
from gateway.wire.changes import CHANGE_COLUMN, CHANGE_TYPE
from gateway.wire.errors import PermissionDenied, SnapshotNotFound
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN, parse_fields

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from gateway.config import Settings
    from gateway.meta import TableDef

__all__ = ["STATE_SUFFIX", "TABLE_PROPERTIES", "IcebergColdStore"]

#: A primary-key table's state table is ``<tenant>.<namespace>.<name>$state`` in the
#: warehouse's catalog, at ``<table folder>-state`` (beside the changelog's folder, never
#: in it: each table's orphan clean-up lists its own folder).
STATE_SUFFIX = "$state"

#: How often, and how far apart, a first use that finds a table's metadata files but no
#: catalog entry looks again before it calls the table dropped (another creator may be
#: between the two writes).
_CREATE_RACE_CHECKS = 20
#: The name of a table's first metadata file (``00000-<uuid>.metadata.json``): written by
#: its creator before the catalog row, and by nothing else.
_FIRST_METADATA = re.compile(r"00000-[0-9a-f-]+\.metadata\.json")
_CREATE_RACE_PAUSE_S = 0.1

log = logging.getLogger(__name__)

TABLE_PROPERTIES = {
    "write.delete.isolation-level": "snapshot",
    "write.parquet.compression-codec": "zstd",
    # Full bounds for the system columns whatever the column count, so pruning by offset
    # always works.
    "write.metadata.metrics.column._partition": "full",
    "write.metadata.metrics.column._offset": "full",
    "tidegate.layout": "1",
    # Tiering commits merge small manifests (Iceberg's default for appends; pyiceberg's is
    # off): without it every commit adds one manifest to the list, and planning a table
    # of a day of tiering commits decodes thousands of them until compaction runs.
    "commit.manifest-merge.enabled": "true",
    # No silent re-apply of a conflicting commit by pyiceberg: commit_tiered must raise
    # CommitConflict so the tiering job re-plans (else a racing run commits twice).
    "commit.retry.num-retries": "0",
    # Superseded metadata files are deleted at each commit, keeping the last few.
    **METADATA_PROPERTIES,
}

#: Iceberg namespaces a store remembers having made (beyond it, it forgets them all).
_NAMESPACES_KEPT = 20_000


def _state_layout(ice: Any, table: TableDef) -> tuple[Any, Any, dict[str, str]]:
    """A state table's Iceberg schema (the primary key as its identifier fields), sort
    order (``_partition``, then the key) and properties (full column statistics of the
    key, so the bounds of a file's keys are exact)."""
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    assert table.primary_key is not None
    key = table.primary_key.columns
    ids = [ice.find_field(c).field_id for c in key]
    ice = Schema(*ice.fields, schema_id=ice.schema_id, identifier_field_ids=ids)
    order = SortOrder(
        SortField(
            source_id=ice.find_field(PARTITION_COLUMN).field_id, transform=IdentityTransform()
        ),
        *(SortField(source_id=i, transform=IdentityTransform()) for i in ids),
    )
    props = {f"write.metadata.metrics.column.{c}": "full" for c in key}
    props["tidegate.kind"] = "state"
    return ice, order, props


class IcebergColdStore(ColdStore):
    """A pyiceberg catalog (SQL or REST) and a warehouse (local folder or S3)."""

    def __init__(
        self,
        catalog: Catalog,
        warehouse: str,
        io_properties: Mapping[str, str],
        presign_expiry_s: int = 3600,
        vendor: StsVendor | None = None,
    ) -> None:
        self.catalog = catalog
        self.warehouse = warehouse.rstrip("/")
        self.io_properties = dict(io_properties)
        self.presign_expiry_s = presign_expiry_s
        #: Vends engines temporary S3 credentials (None: a local warehouse, or no role).
        self.vendor = vendor
        self._s3: Any = None
        self._fs: Any = None
        self._lock = threading.Lock()
        self._creating = threading.Lock()
        #: Namespaces known to exist (bounded; forgotten when a tenant is dropped).
        self._namespaces: set[tuple[str, ...]] = set()

    @classmethod
    def from_settings(cls, settings: Settings) -> IcebergColdStore:
        from gateway.config import SqlCatalogConfig

        cfg = settings.cold
        warehouse = settings.cold_warehouse
        io: dict[str, str] = {}
        if warehouse.startswith(("s3://", "s3a://")):
            s3 = cfg.s3
            io["s3.region"] = s3.region
            if s3.endpoint:
                io["s3.endpoint"] = s3.endpoint
            if s3.access_key_id:
                io["s3.access-key-id"] = s3.access_key_id
            if s3.secret_access_key:
                io["s3.secret-access-key"] = s3.secret_access_key
            io["s3.force-virtual-addressing"] = "false" if s3.path_style else "true"
        else:
            from pathlib import Path

            Path(fs_path(warehouse)).mkdir(parents=True, exist_ok=True)
        props = {"warehouse": warehouse, "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", **io}
        c = cfg.catalog
        catalog: Catalog
        if isinstance(c, SqlCatalogConfig):
            from gateway.cold.iceberg.sqlcatalog import ParsedOnceSqlCatalog

            uri = settings.cold_catalog_uri
            if uri.startswith("sqlite:///"):
                from pathlib import Path

                Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            catalog = ParsedOnceSqlCatalog(c.name, uri=uri, **props)
        else:
            from pyiceberg.catalog.rest import RestCatalog

            rest = {"uri": c.uri, **props, **c.properties}
            if c.credential:
                rest["credential"] = c.credential
            catalog = RestCatalog(c.name, **rest)
        vendor = None
        served = cfg.rest_catalog
        if served.role_arn and warehouse.startswith(("s3://", "s3a://")):
            sts: dict[str, Any] = {"region_name": cfg.s3.region}
            if served.sts_endpoint:
                sts["endpoint_url"] = served.sts_endpoint
            if cfg.s3.access_key_id:
                sts["aws_access_key_id"] = cfg.s3.access_key_id
                sts["aws_secret_access_key"] = cfg.s3.secret_access_key
            vendor = StsVendor(
                served.role_arn, served.credentials_duration_s, sts, served.external_id
            )
        return cls(catalog, warehouse, io, cfg.presign_expiry_s, vendor)

    def _identifier(self, table: TableDef, *, state: bool = False) -> tuple[str, str, str]:
        name = table.name + STATE_SUFFIX if state else table.name
        return (table.tenant, table.namespace, name)

    def create_table(self, table: TableDef, schema: pa.Schema) -> IcebergColdTable:
        if table.primary_key is not None and CHANGE_COLUMN not in schema.names:
            schema = schema.append(pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False))
        self._create_iceberg(table, schema)
        return self.table(table)

    def _location(self, table: TableDef, *, state: bool = False) -> str:
        folder = f"{self.warehouse}/{table.tenant}/{table.namespace}/{table.name}-{table.table_id}"
        return folder + "-state" if state else folder

    def _create_missing(
        self, table: TableDef, schema: pa.Schema, *, state: bool = False
    ) -> Table | None:
        """Create the Iceberg table of a stream-table at its first use and return it;
        ``None`` when one was created meanwhile (by another gateway or a job): that one
        is the one used.

        Never one that existed: a table whose metadata files are in its folder was made
        and then dropped from the catalog behind the gateway's back, and an empty table in
        its place would say nothing was ever tiered (the hot tier may have let those
        records go).

        Raises:
            SnapshotNotFound: the table was made, and dropped from the catalog since.
        """
        from pyarrow import fs
        from pyiceberg.exceptions import TableAlreadyExistsError

        with self._creating:  # first uses in this process one at a time (they are rare)
            folder = fs_path(self._location(table, state=state) + "/metadata")
            found = self.filesystem().get_file_info(fs.FileSelector(folder, allow_not_found=True))
            files = [f for f in found if f.type == fs.FileType.File]
            if files:
                # Files and no catalog entry: dropped behind our back, or another creator
                # (a gateway, a job) is between writing the metadata file and its catalog
                # row. Give that creator a moment before calling it a drop.
                identifier = self._identifier(table, state=state)
                for _ in range(_CREATE_RACE_CHECKS):
                    if self.catalog.table_exists(identifier):
                        return None
                    time.sleep(_CREATE_RACE_PAUSE_S)
                # Only first metadata files: a creator that died (killed, its machine
                # gone) between writing its metadata file and its catalog row. Such a table
                # never held a snapshot, so nothing was tiered into it: it is made below,
                # beside the files it left. Anything more: it was committed to.
                if not all(_first_metadata(f.base_name) for f in files):
                    name = ".".join(identifier)
                    raise SnapshotNotFound(
                        f"the Iceberg table {name} was dropped from the catalog outside "
                        "Tidegate (its files remain); register it again, or drop the "
                        "stream-table",
                        missing_iceberg_table=name,
                    )
            try:
                return self._create_iceberg(table, schema, state=state)
            except TableAlreadyExistsError:
                return None

    def _create_iceberg(self, table: TableDef, schema: pa.Schema, *, state: bool = False) -> Table:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchNamespaceError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.table.sorting import SortField, SortOrder
        from pyiceberg.transforms import IdentityTransform

        ice = arrow_to_iceberg(schema)
        pid = ice.find_field(PARTITION_COLUMN).field_id
        oid = ice.find_field(OFFSET_COLUMN).field_id
        spec = PartitionSpec(
            PartitionField(
                source_id=pid, field_id=1000, transform=IdentityTransform(), name=PARTITION_COLUMN
            )
        )
        order = SortOrder(
            SortField(source_id=pid, transform=IdentityTransform()),
            SortField(source_id=oid, transform=IdentityTransform()),
        )
        extra: dict[str, str] = {}
        if state:
            ice, order, extra = _state_layout(ice, table)
        known = False
        for ns in ((table.tenant,), (table.tenant, table.namespace)):
            if ns in self._namespaces:
                known = True
                continue  # made by this process: pyiceberg's check scans the catalog
            try:
                self.catalog.create_namespace(ns)
            except NamespaceAlreadyExistsError:
                pass
            except Exception:
                # Two creates of a tenant's first tables at once: the SQL catalog checks,
                # then inserts, so the loser of the race fails on the unique key.
                if not self.catalog.namespace_exists(ns):
                    raise
            with self._lock:
                if len(self._namespaces) >= _NAMESPACES_KEPT:
                    self._namespaces.clear()
                self._namespaces.add(ns)
        location = self._location(table, state=state)
        props = {
            **TABLE_PROPERTIES,
            **extra,
            "tidegate.table-id": table.table_id,
            "schema.name-mapping.default": ice.name_mapping.model_dump_json(),
        }
        try:
            return self.catalog.create_table(
                self._identifier(table, state=state),
                schema=ice,
                location=location,
                partition_spec=spec,
                sort_order=order,
                properties=props,
            )
        except NoSuchNamespaceError:
            if not known:
                raise
            # Remembered, but dropped since by another process: made again.
            with self._lock:
                self._namespaces.clear()
            return self._create_iceberg(table, schema, state=state)

    def check_schema(self, schema: pa.Schema) -> None:
        arrow_to_iceberg(schema)

    def table(self, table: TableDef) -> IcebergColdTable:
        """The stream's cold storage; a primary-key table's is its changelog, with
        ``_change`` after the user columns."""
        schema = parse_fields(table.fields, stored=True)
        if table.primary_key is not None:
            schema = schema.append(pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False))
        return IcebergColdTable(
            self,
            self._identifier(table),
            schema,
            create=lambda: self._create_missing(table, schema),
        )

    def state_table(self, table: TableDef) -> IcebergStateTable:
        if table.primary_key is None:
            raise ValueError(f"table {table.qualified_name} has no primary key, so no state table")
        schema = parse_fields(table.fields, stored=True)
        return IcebergStateTable(
            self,
            self._identifier(table, state=True),
            schema,
            table.primary_key.columns,
            create=lambda: self._create_missing(table, schema, state=True),
        )

    def drop_table(self, table: TableDef) -> None:
        self._drop(table, self._identifier(table))
        if table.primary_key is not None:
            self._drop(table, self._identifier(table, state=True))

    def _drop(self, table: TableDef, ident: tuple[str, str, str]) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        location = None
        try:
            found = self.catalog.load_table(ident)
        except NoSuchTableError:
            return
        if found.properties.get("tidegate.table-id") != table.table_id:
            # Not this stream-table's Iceberg table (created outside Tidegate, or another
            # incarnation): checked against the catalog, never dropped by name alone.
            log.warning("not dropping %s: it is not table %s", ".".join(ident), table.table_id)
            return
        location = str(found.location())
        with contextlib.suppress(NoSuchTableError):
            self.catalog.drop_table(ident)
        if location:
            # Every file of the table is under its folder (data, manifests, metadata, and
            # orphans of crashed jobs): one recursive delete. pyiceberg's purge_table
            # would read every snapshot's manifests without de-duplicating them, which is
            # quadratic in the snapshot count (hours for 1,000 tiering commits).
            filesystem, _ = self.storage_options().filesystem()
            with contextlib.suppress(OSError):
                filesystem.delete_dir(fs_path(location))

    def drop_tenant(self, tenant: str) -> None:
        """Remove what is left of a deleted tenant once its tables were dropped: its empty
        Iceberg namespaces, then its folder (orphans of crashed jobs).

        Only what the catalog shows to be the tenant's: namespaces whose name is exactly
        the tenant's (never one a catalog normalised to it), and the folder only when no
        table of the catalog, in any namespace, still lives under it.
        """
        from pyiceberg.exceptions import NamespaceNotEmptyError, NoSuchNamespaceError

        with self._lock:
            self._namespaces = {ns for ns in self._namespaces if ns[0] != tenant}
        owned: list[tuple[str, ...]] = []
        with contextlib.suppress(NoSuchNamespaceError):
            owned = [tuple(ns) for ns in self.catalog.list_namespaces((tenant,))]
        kept = False
        for ns in [*(ns for ns in owned if ns[:1] == (tenant,)), (tenant,)]:
            try:
                self.catalog.drop_namespace(ns)
            except NoSuchNamespaceError:
                pass
            except NamespaceNotEmptyError:
                kept = True
        prefix = f"{self.warehouse}/{tenant}"
        holders = self._tables_under(prefix)
        if kept or holders:
            log.warning(
                "tenant %s: left %s in place: the catalog still holds tables there (%s)",
                tenant,
                prefix,
                ", ".join(holders) or "in its namespaces",
            )
            return
        filesystem, _ = self.storage_options().filesystem()
        with contextlib.suppress(OSError):
            filesystem.delete_dir(fs_path(prefix))

    def _tables_under(self, prefix: str) -> list[str]:
        """Tables of the whole catalog whose location lies under the folder ``prefix``."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        found: list[str] = []
        pending: list[tuple[str, ...]] = [()]
        while pending:
            parent = pending.pop()
            with contextlib.suppress(NoSuchNamespaceError):
                children = [tuple(ns) for ns in self.catalog.list_namespaces(parent)]
                pending.extend(ns for ns in children if ns != parent)
            if not parent:
                continue
            with contextlib.suppress(NoSuchNamespaceError):
                for ident in self.catalog.list_tables(parent):
                    with contextlib.suppress(NoSuchTableError):
                        location = str(self.catalog.load_table(ident).location())
                        if location == prefix or location.startswith(prefix + "/"):
                            found.append(".".join(ident))
        return found

    def storage_options(self) -> StorageOptions:
        return StorageOptions(self.warehouse, self.io_properties)

    def data_access(self, tenant: str, location: str) -> DataAccess:
        location = location.rstrip("/")
        if not location.startswith(f"{self.warehouse}/{tenant}/"):
            # Every table of a tenant lives under its prefix (create_table); anything else
            # was not made by this gateway for this tenant: hand out nothing for it.
            raise PermissionDenied(
                "this table's files are outside the tenant's folder of the warehouse; "
                "no access to them can be vended"
            )
        if not location.startswith(("s3://", "s3a://")):
            return DataAccess(prefix=location)
        # What an engine needs to reach the bucket, and never a key: the warehouse's own
        # keys stay in io_properties.
        p = self.io_properties
        config = {"s3.region": p.get("s3.region", ""), "client.region": p.get("s3.region", "")}
        if p.get("s3.endpoint"):
            config["s3.endpoint"] = p["s3.endpoint"]
        path_style = p.get("s3.force-virtual-addressing") != "true"
        config["s3.path-style-access"] = "true" if path_style else "false"
        config["s3.force-virtual-addressing"] = "false" if path_style else "true"
        if self.vendor is None:
            return DataAccess(config=config, prefix=location)
        return self.vendor.vend(tenant, location, config)

    def filesystem(self) -> Any:
        """The warehouse's pyarrow filesystem, built once (thread-safe to share)."""
        with self._lock:
            if self._fs is None:
                self._fs, _ = self.storage_options().filesystem()
            return self._fs

    def _s3_client(self) -> Any:
        with self._lock:
            if self._s3 is None:
                import boto3
                from botocore.config import Config

                p = self.io_properties
                self._s3 = boto3.client(
                    "s3",
                    endpoint_url=p.get("s3.endpoint"),
                    aws_access_key_id=p.get("s3.access-key-id"),
                    aws_secret_access_key=p.get("s3.secret-access-key"),
                    region_name=p.get("s3.region"),
                    config=Config(
                        signature_version="s3v4",
                        s3={
                            "addressing_style": "virtual"
                            if p.get("s3.force-virtual-addressing") == "true"
                            else "path"
                        },
                    ),
                )
            return self._s3

    def planned(self, f: DataFile) -> PlannedFile:
        """A data file with a URL an executor can read without warehouse credentials."""
        if f.path.startswith(("s3://", "s3a://")):
            bucket, _, key = f.path.split("://", 1)[1].partition("/")
            url = self._s3_client().generate_presigned_url(
                "get_object",
                Params={"Bucket": bucket, "Key": key},
                ExpiresIn=self.presign_expiry_s,
            )
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.presign_expiry_s)
            return PlannedFile(f, str(url), expires)
        return PlannedFile(f, fs_path(f.path), None)

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()


def _first_metadata(name: str) -> bool:
    return _FIRST_METADATA.fullmatch(name) is not None
