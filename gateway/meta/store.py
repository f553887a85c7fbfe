"""The metadata store: tenants, tables, partitions and their cached watermarks.

Synchronous and thread-safe: every call checks a connection out of the engine's pool and
runs in its own short transaction. Several processes (gateway replicas, Spark drivers) may
open the same database at once; opening runs the migrations to ``head`` under a lock
(a PostgreSQL advisory lock, or SQLite's write lock), so concurrent opens are safe.

Every lookup by name is scoped by tenant: a tenant can never see another tenant's tables.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    make_url,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from gateway.meta.models import (
    VERSION_TABLE,
    GroupOffset,
    MaintenanceRun,
    PartitionRecord,
    SegmentRecord,
    ShardPin,
    SnapshotLease,
    TableRecord,
    Tenant,
    utcnow,
)
from gateway.wire.errors import (
    CommitConflict,
    InvalidRequest,
    TableAlreadyExists,
    TableNotFound,
    TenantNotFound,
)

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "MIGRATIONS_DIR",
    "TABLE_VIEW_TTL_S",
    "JobRun",
    "Lease",
    "MetadataStore",
    "PartitionState",
    "Placement",
    "TableDef",
    "alembic_config",
]

#: One segment of a partition's chain: ``(seq, shard, start_offset, end_offset | None)``.
SegmentRow = tuple[int, str, int, int | None]

#: How long a gateway reuses a table's definition (``StreamTables.table``): a change of the
#: definition (a retention set) reaches every gateway within this time.
TABLE_VIEW_TTL_S = 2.0

#: The alembic script directory shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: Key of the PostgreSQL advisory lock held while migrating (any fixed bigint).
_MIGRATION_LOCK_KEY = 0x7469_6465_6761_7465 & 0x7FFF_FFFF_FFFF_FFFF  # "tidegate"

#: Execution option naming the SQLite BEGIN mode (DEFERRED or IMMEDIATE) of a transaction.
_SQLITE_BEGIN = "tidegate_sqlite_begin"

_SQLITE_BUSY_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class TableDef:
    """A table as stored. ``table_id`` is unique for the table's lifetime."""

    table_id: str
    tenant: str
    namespace: str
    name: str
    #: The user schema: a list of field objects, as given at creation.
    fields: list[dict[str, Any]]
    partitions: int
    key_columns: list[str]
    created_at: datetime
    #: Raised by one at every schema change (0 at create).
    schema_version: int = 0
    #: Retention by age (milliseconds since append) and by count (records behind the
    #: high watermark); None: no limit of that kind.
    retention_ms: int | None = None
    retention_records: int | None = None
    #: When a retention was last set or cleared (None: never; no partition of the table
    #: then has an earliest offset).
    retention_set_at: datetime | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Lease:
    """A snapshot kept for an open scan or a read plan until ``expires_at``."""

    lease_id: str
    table_id: str
    snapshot_id: int
    kind: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class JobRun:
    """The last run of a maintenance job on a table."""

    job: str
    finished_at: datetime
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Cached state of one partition. The watermarks are caches: the hot tier's high
    watermark and the Iceberg snapshot's ``tidegate.watermarks`` win over them."""

    partition: int
    high_watermark: int
    tiered_watermark: int
    shard: str
    epoch: int
    #: The earliest readable offset, set by retention (0: nothing removed).
    earliest_offset: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one partition's hot log lives: its chain of segments (oldest first, the last
    one active) under a placement epoch, and the target of a move under way."""

    tenant: str
    table_id: str
    namespace: str
    name: str
    partition: int
    epoch: int
    segments: tuple[SegmentRow, ...]
    move_target: str | None

    @property
    def shard(self) -> str:
        """The shard of the active segment (the one taking appends)."""
        return self.segments[-1][1]

    def to_dict(self) -> dict[str, Any]:
        """The placement as JSON (the admin API's and ``tidegate shard list --json``'s)."""
        return {
            "tenant": self.tenant,
            "table": f"{self.namespace}.{self.name}",
            "partition": self.partition,
            "shard": self.shard,
            "epoch": self.epoch,
            "move_target": self.move_target,
            "segments": [{"shard": s, "start": a, "end": b} for _, s, a, b in self.segments],
        }


def choose_shards(
    count: int,
    tenant: str,
    shards: Sequence[str],
    pins: Mapping[str, str],
    load: Mapping[str, int],
    tenant_load: Mapping[str, int],
) -> list[str]:
    """The placement policy of new partitions: a tenant with reserved shards goes only
    there; others go to shards nobody reserved. Among those, the shard holding the fewest
    of this tenant's partitions wins (spreading a tenant), then the least loaded overall.

    Raises:
        InvalidRequest: no shard may take the tenant's partitions.
    """
    own = [s for s in shards if pins.get(s) == tenant]
    candidates = own or [s for s in shards if s not in pins]
    if not candidates:
        raise InvalidRequest(
            f"every hot-tier shard is reserved for another tenant than {tenant!r}",
            tenant=tenant,
        )
    total = {s: load.get(s, 0) for s in candidates}
    mine = {s: tenant_load.get(s, 0) for s in candidates}
    out = []
    for _ in range(count):
        best = min(candidates, key=lambda s: (mine[s], total[s], s))
        out.append(best)
        mine[best] += 1
        total[best] += 1
    return out


def alembic_config(
    *, connection: Connection | None = None, engine: Engine | None = None, url: str | None = None
) -> Config:
    """An alembic ``Config`` for the packaged migrations, without any ini file.

    Args:
        connection: Run on this connection (inside its current transaction, if any).
        engine: Otherwise connect with this engine.
        url: Otherwise connect to this SQLAlchemy URL.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    if engine is not None:
        config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision``; a no-op when already there.

    Safe when several processes do it at once: the whole upgrade runs in one transaction
    that first takes a PostgreSQL advisory lock (released at commit), or on SQLite
    ``BEGIN IMMEDIATE`` (the database write lock). Whoever comes second waits, then finds
    the schema current.
    """
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch migrations recreate tables; with foreign keys on, dropping the old copy
            # would cascade. The pragma is a no-op inside a transaction: set it before.
            _sqlite_pragma(conn, "foreign_keys=OFF")
        try:
            with conn.execution_options(**{_SQLITE_BEGIN: "IMMEDIATE"}).begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
                command.upgrade(alembic_config(connection=conn), revision)
                if sqlite and conn.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise RuntimeError("metadata migration left dangling foreign keys")
        finally:
            if sqlite:
                _sqlite_pragma(conn, "foreign_keys=ON")


def _sqlite_pragma(conn: Connection, pragma: str) -> None:
    """Run a PRAGMA outside any transaction (SQLAlchemy would autobegin one)."""
    conn.connection.driver_connection.execute(f"PRAGMA {pragma}")  # type: ignore[union-attr]


def _enable_wal(dbapi_connection: Any) -> None:
    """Switch a SQLite database to WAL. The switch needs the database to itself and SQLite
    may answer "database is locked" at once, without its busy handler, while another
    process or thread opens the same new database (a gateway and a tiering job starting
    together): retry for up to the busy timeout."""
    import sqlite3

    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _create_engine(url: str, *, echo: bool) -> Engine:
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, echo=echo, pool_pre_ping=True)

    database = sa_url.database or ""
    in_memory = database in ("", ":memory:") or "mode=memory" in database
    kwargs: dict[str, Any] = {}
    if in_memory:
        # One shared connection, or every pooled connection would see its own empty DB.
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    elif not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(sa_url, echo=echo, pool_pre_ping=True, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin, so that
        # DDL is transactional and SELECTs are repeatable (SQLAlchemy's documented recipe).
        dbapi_connection.isolation_level = None
        dbapi_connection.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
        if not in_memory:
            _enable_wal(dbapi_connection)
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that reads and then
        # writes can fail with SQLITE_BUSY in WAL mode without waiting for the busy timeout.
        mode = conn.get_execution_options().get(_SQLITE_BEGIN, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


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
    )


def _not_found(namespace: str, name: str) -> TableNotFound:
    return TableNotFound(f"table {namespace}.{name} not found", namespace=namespace, name=name)


class MetadataStore:
    """Tenants, tables and partitions in a SQL database (SQLite or PostgreSQL).

    Opening migrates the database to the newest schema. Close the store when done.
    """

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self._engine = _create_engine(url, echo=echo)
        try:
            upgrade(self._engine)
        except BaseException:
            self._engine.dispose()
            raise
        self._read = sessionmaker(self._engine, expire_on_commit=False)
        self._write = sessionmaker(
            self._engine.execution_options(**{_SQLITE_BEGIN: "IMMEDIATE"}),
            expire_on_commit=False,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.metadata_url, echo=settings.metadata.echo)

    @property
    def engine(self) -> Engine:
        return self._engine

    def revision(self) -> str | None:
        """The migration revision the database is at (``None`` for an empty database)."""
        from alembic.runtime.migration import MigrationContext

        with self._engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _session(self, *, write: bool) -> Iterator[Session]:
        factory = self._write if write else self._read
        with factory() as session, session.begin():
            yield session

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
    ) -> TableDef:
        """Create a table and its partition rows ``0..partitions-1``, each placed on one of
        ``shards`` by :func:`choose_shards` (the hot tier's configured shard names).

        Raises:
            InvalidRequest: ``partitions`` is below 1.
            TenantNotFound: the tenant does not exist (see :meth:`ensure_tenant`).
            TableAlreadyExists: the tenant already has ``namespace.name``.
        """
        if partitions < 1:
            raise InvalidRequest(
                f"a table needs at least one partition, got {partitions}", partitions=partitions
            )
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
        )
        try:
            with self._session(write=True) as session:
                if session.get(Tenant, tenant) is None:
                    raise TenantNotFound(f"tenant {tenant!r} not found", tenant=tenant)
                if self._find(session, tenant, namespace, name) is not None:
                    raise self._exists(namespace, name)
                placed = ["default"] * partitions
                if list(shards) != ["default"]:
                    pins, load, mine = self._shard_loads(session, tenant)
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
            # Lost a race with a concurrent create of the same name (or tenant removal).
            with self._session(write=False) as session:
                if self._find(session, tenant, namespace, name) is not None:
                    raise self._exists(namespace, name) from None
            raise
        return _table_def(record)

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

    def list_tables(self, tenant: str, namespace: str | None = None) -> list[TableDef]:
        """The tenant's tables (in ``namespace`` only, when given), by namespace and name."""
        stmt = select(TableRecord).where(TableRecord.tenant_id == tenant)
        if namespace is not None:
            stmt = stmt.where(TableRecord.namespace == namespace)
        stmt = stmt.order_by(TableRecord.namespace, TableRecord.name)
        with self._session(write=False) as session:
            return [_table_def(r) for r in session.scalars(stmt)]

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
            session.execute(delete(SegmentRecord).where(SegmentRecord.table_id == record.id))
            deleted = session.execute(
                delete(TableRecord).where(
                    TableRecord.id == record.id, TableRecord.tenant_id == tenant
                )
            )
            if deleted.rowcount != 1:  # type: ignore[attr-defined]
                raise _not_found(namespace, name)  # a concurrent drop won
            return _table_def(record)

    # Partitions -------------------------------------------------------------------------
    def partitions(self, table_id: str) -> list[PartitionState]:
        """The table's partitions in order; empty for an unknown (or dropped) table."""
        stmt = (
            select(PartitionRecord)
            .where(PartitionRecord.table_id == table_id)
            .order_by(PartitionRecord.partition)
        )
        with self._session(write=False) as session:
            return [
                PartitionState(
                    partition=r.partition,
                    high_watermark=r.high_watermark,
                    tiered_watermark=r.tiered_watermark,
                    shard=r.shard,
                    epoch=r.epoch,
                    earliest_offset=r.earliest_offset or 0,
                )
                for r in session.scalars(stmt)
            ]

    def earliest_offset(self, table_id: str, partition: int) -> int:
        """The partition's earliest readable offset (0 when retention never removed
        anything, or for an unknown partition): one primary-key lookup, made by every
        stream read so that a new earliest offset holds on every gateway at once."""
        stmt = select(PartitionRecord.earliest_offset).where(
            PartitionRecord.table_id == table_id, PartitionRecord.partition == partition
        )
        with self._session(write=False) as session:
            return int(session.execute(stmt).scalar() or 0)

    def raise_earliest_offsets(self, table_id: str, offsets: Mapping[int, int]) -> None:
        """Raise the partitions' earliest offsets (retention); a smaller value than the
        stored one leaves it unchanged, so the earliest offset never goes backwards."""
        self._raise_cached(table_id, "earliest_offset", offsets)

    def update_high_watermarks(self, table_id: str, watermarks: Mapping[int, int]) -> None:
        """Raise the cached high watermarks to the given values.

        A cached value is only ever raised: a smaller value (a stale observation, racing
        with a newer one) leaves it unchanged. Unknown partitions are ignored.
        """
        self._raise_cached(table_id, "high_watermark", watermarks)

    # Consumer groups --------------------------------------------------------------------
    def commit_offsets(
        self, tenant: str, group: str, table_id: str, offsets: Mapping[int, int]
    ) -> None:
        """Store ``group``'s committed offsets (partition -> next offset to consume).

        The last commit wins, also when it moves an offset backwards (a consumer that
        rewinds on purpose). All partitions of one call are stored in one transaction.
        """
        if not offsets:
            return
        for attempt in range(2):
            try:
                with self._session(write=True) as session:
                    existing = {
                        r.partition: r
                        for r in session.scalars(
                            select(GroupOffset).where(
                                GroupOffset.tenant_id == tenant,
                                GroupOffset.group_id == group,
                                GroupOffset.table_id == table_id,
                                GroupOffset.partition.in_(list(offsets)),
                            )
                        )
                    }
                    now = utcnow()
                    for p, off in sorted(offsets.items()):
                        row = existing.get(p)
                        if row is None:
                            session.add(
                                GroupOffset(
                                    tenant_id=tenant,
                                    group_id=group,
                                    table_id=table_id,
                                    partition=p,
                                    offset=off,
                                    committed_at=now,
                                )
                            )
                        else:
                            row.offset = off
                            row.committed_at = now
                return
            except IntegrityError:
                if attempt:  # a concurrent first commit of the same partition: redo once
                    raise

    def fetch_offsets(self, tenant: str, group: str, table_id: str) -> dict[int, int]:
        """``group``'s committed offsets for the table; partitions never committed are absent."""
        stmt = select(GroupOffset.partition, GroupOffset.offset).where(
            GroupOffset.tenant_id == tenant,
            GroupOffset.group_id == group,
            GroupOffset.table_id == table_id,
        )
        with self._session(write=False) as session:
            return {int(p): int(o) for p, o in session.execute(stmt)}

    def list_groups(self, tenant: str, table_id: str | None = None) -> list[tuple[str, str]]:
        """``(group, table_id)`` pairs with committed offsets, of one table when given."""
        stmt = select(GroupOffset.group_id, GroupOffset.table_id).where(
            GroupOffset.tenant_id == tenant
        )
        if table_id is not None:
            stmt = stmt.where(GroupOffset.table_id == table_id)
        with self._session(write=False) as session:
            return sorted({(str(g), str(t)) for g, t in session.execute(stmt.distinct())})

    def update_tiered_watermarks(self, table_id: str, watermarks: Mapping[int, int]) -> None:
        """Raise the cached tiered watermarks (a cache of the Iceberg snapshot summary,
        which wins). Like :meth:`update_high_watermarks`, a value is only ever raised."""
        self._raise_cached(table_id, "tiered_watermark", watermarks)

    def _raise_cached(self, table_id: str, column: str, watermarks: Mapping[int, int]) -> None:
        """Raise a cached per-partition watermark column; never lower it (a smaller value
        is a stale observation racing a newer one). Unknown partitions are ignored."""
        if not watermarks:
            return
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        col = table.c[column]
        stmt = (
            update(table)
            .where(
                table.c.table_id == bindparam("b_table_id"),
                table.c.partition == bindparam("b_partition"),
                col < bindparam("b_value"),
            )
            .values({column: bindparam("b_value")})
        )
        params = [
            {"b_table_id": table_id, "b_partition": p, "b_value": v}
            for p, v in sorted(watermarks.items())  # one lock order: no deadlocks
        ]
        with self._session(write=True) as session:
            session.connection().execute(stmt, params)

    # Snapshot leases ----------------------------------------------------------------------
    def add_lease(self, table_id: str, snapshot_id: int, kind: str, ttl_s: float) -> Lease:
        """Keep ``snapshot_id`` of the table from expiry for ``ttl_s`` seconds (or until
        :meth:`release_lease`). Expired leases of the table are swept on the way."""
        now = utcnow()
        lease = Lease(
            uuid.uuid4().hex, table_id, int(snapshot_id), kind, now, now + timedelta(seconds=ttl_s)
        )
        with self._session(write=True) as session:
            session.execute(
                delete(SnapshotLease).where(
                    SnapshotLease.table_id == table_id, SnapshotLease.expires_at <= now
                )
            )
            session.add(
                SnapshotLease(
                    id=lease.lease_id,
                    table_id=table_id,
                    snapshot_id=lease.snapshot_id,
                    kind=kind,
                    created_at=now,
                    expires_at=lease.expires_at,
                )
            )
        return lease

    def release_lease(self, lease_id: str) -> None:
        """End a lease now (a scan that finished); an unknown id is ignored."""
        with self._session(write=True) as session:
            session.execute(delete(SnapshotLease).where(SnapshotLease.id == lease_id))

    def leases(self, table_id: str, *, at: datetime | None = None) -> list[Lease]:
        """The table's leases still running at ``at`` (default: now), oldest first."""
        at = at or utcnow()
        stmt = (
            select(SnapshotLease)
            .where(SnapshotLease.table_id == table_id, SnapshotLease.expires_at > at)
            .order_by(SnapshotLease.created_at, SnapshotLease.id)
        )
        with self._session(write=False) as session:
            return [
                Lease(r.id, r.table_id, int(r.snapshot_id), r.kind, r.created_at, r.expires_at)
                for r in session.scalars(stmt)
            ]

    # Maintenance runs ---------------------------------------------------------------------
    def record_run(self, table_id: str, job: str, outcome: str, detail: str = "") -> None:
        """Remember the last run of ``job`` on the table (replacing the previous one)."""
        with self._session(write=True) as session:
            row = session.get(MaintenanceRun, (table_id, job))
            if row is None:
                if session.get(TableRecord, table_id) is None:
                    return  # dropped meanwhile
                session.add(
                    MaintenanceRun(
                        table_id=table_id,
                        job=job,
                        finished_at=utcnow(),
                        outcome=outcome,
                        detail=detail[:2000],
                    )
                )
            else:
                row.finished_at = utcnow()
                row.outcome = outcome
                row.detail = detail[:2000]

    def last_runs(self, table_id: str) -> dict[str, JobRun]:
        """job -> the last run of that maintenance job on the table."""
        stmt = select(MaintenanceRun).where(MaintenanceRun.table_id == table_id)
        with self._session(write=False) as session:
            return {
                r.job: JobRun(r.job, r.finished_at, r.outcome, r.detail)
                for r in session.scalars(stmt)
            }

    # Placement (hot-tier shards) ---------------------------------------------------------
    def chain(self, table_id: str, partition: int) -> tuple[int, list[SegmentRow], str | None]:
        """A partition's placement: ``(epoch, segments, move_target)``, segments oldest
        first. A partition with no segment rows has one implicit segment ``0`` on its shard
        from offset 0. Raises KeyError for an unknown (or dropped) partition."""
        with self._session(write=False) as session:
            rec = session.get(PartitionRecord, (table_id, partition))
            if rec is None:
                raise KeyError(f"no partition {partition} of table {table_id}")
            return rec.epoch, self._segments(session, rec), rec.move_target

    @staticmethod
    def _segments(session: Session, rec: PartitionRecord) -> list[SegmentRow]:
        rows = session.scalars(
            select(SegmentRecord)
            .where(SegmentRecord.table_id == rec.table_id, SegmentRecord.partition == rec.partition)
            .order_by(SegmentRecord.seq)
        ).all()
        if not rows:
            return [(0, rec.shard, 0, None)]
        return [(r.seq, r.shard, r.start_offset, r.end_offset) for r in rows]

    def replace_chain(
        self,
        table_id: str,
        partition: int,
        expected_epoch: int,
        segments: Sequence[SegmentRow],
        finish_move: bool,
    ) -> bool:
        """Compare-and-set a partition's chain: applied (and the epoch raised by one) only
        when the epoch is still ``expected_epoch``; ``finish_move`` clears the move target.
        Returns whether it was applied."""
        if not segments or segments[-1][3] is not None:
            raise ValueError("a chain ends with one active segment")
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        values: dict[str, Any] = {"epoch": expected_epoch + 1, "shard": segments[-1][1]}
        if finish_move:
            values["move_target"] = None
        with self._session(write=True) as session:
            done = session.execute(
                update(table)
                .where(
                    table.c.table_id == table_id,
                    table.c.partition == partition,
                    table.c.epoch == expected_epoch,
                )
                .values(values)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                return False
            session.execute(
                delete(SegmentRecord).where(
                    SegmentRecord.table_id == table_id, SegmentRecord.partition == partition
                )
            )
            session.add_all(
                SegmentRecord(
                    table_id=table_id,
                    partition=partition,
                    seq=seq,
                    shard=shard,
                    start_offset=start,
                    end_offset=end,
                )
                for seq, shard, start, end in segments
            )
            return True

    def begin_move(self, table_id: str, partition: int, target: str) -> str | None:
        """Record the intent to move a partition to ``target`` unless a move is already
        under way; returns the move under way afterwards (``target`` or the older one)."""
        table = PartitionRecord.__table__
        assert isinstance(table, Table)
        with self._session(write=True) as session:
            session.execute(
                update(table)
                .where(
                    table.c.table_id == table_id,
                    table.c.partition == partition,
                    table.c.move_target.is_(None),
                )
                .values(move_target=target)
            )
            rec = session.get(PartitionRecord, (table_id, partition))
            if rec is None:
                raise KeyError(f"no partition {partition} of table {table_id}")
            return rec.move_target

    def placements(
        self, *, tenant: str | None = None, shard: str | None = None, moving: bool = False
    ) -> list[Placement]:
        """Every partition's placement (of one tenant, with an active segment or any segment
        on one shard, or with a move under way), by tenant, table and partition."""
        stmt = select(PartitionRecord, TableRecord).join(
            TableRecord, TableRecord.id == PartitionRecord.table_id
        )
        if tenant is not None:
            stmt = stmt.where(TableRecord.tenant_id == tenant)
        if moving:
            stmt = stmt.where(PartitionRecord.move_target.is_not(None))
        stmt = stmt.order_by(
            TableRecord.tenant_id,
            TableRecord.namespace,
            TableRecord.name,
            PartitionRecord.partition,
        )
        out = []
        with self._session(write=False) as session:
            for rec, t in session.execute(stmt):
                segments = tuple(self._segments(session, rec))
                if shard is not None and all(s[1] != shard for s in segments):
                    continue
                out.append(
                    Placement(
                        t.tenant_id,
                        t.id,
                        t.namespace,
                        t.name,
                        rec.partition,
                        rec.epoch,
                        segments,
                        rec.move_target,
                    )
                )
        return out

    def pin_shards(self, tenant: str, shards: Sequence[str]) -> None:
        """Reserve ``shards`` for ``tenant``: new partitions of the tenant go only there,
        nobody else's do, and rebalancing moves nobody else's partitions onto them.

        Raises:
            TenantNotFound: no such tenant.
            InvalidRequest: a shard is already reserved for another tenant.
        """
        with self._session(write=True) as session:
            if session.get(Tenant, tenant) is None:
                raise TenantNotFound(f"tenant {tenant!r} not found", tenant=tenant)
            for name in shards:
                pin = session.get(ShardPin, name)
                if pin is not None and pin.tenant_id != tenant:
                    raise InvalidRequest(
                        f"shard {name!r} is reserved for another tenant", shard=name
                    )
                if pin is None:
                    session.add(ShardPin(shard=name, tenant_id=tenant))

    def unpin_shards(self, shards: Sequence[str]) -> None:
        """Release reserved shards (their partitions stay where they are)."""
        with self._session(write=True) as session:
            session.execute(delete(ShardPin).where(ShardPin.shard.in_(list(shards))))

    def shard_pins(self) -> dict[str, str]:
        """Reserved shards: shard -> tenant."""
        with self._session(write=False) as session:
            return {p.shard: p.tenant_id for p in session.scalars(select(ShardPin))}

    @staticmethod
    def _shard_loads(
        session: Session, tenant: str
    ) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
        """Pins, partitions per active shard, and the tenant's partitions per shard."""
        pins = {p.shard: p.tenant_id for p in session.scalars(select(ShardPin))}
        rows = session.execute(
            select(PartitionRecord.shard, TableRecord.tenant_id, func.count())
            .join(TableRecord, TableRecord.id == PartitionRecord.table_id)
            .group_by(PartitionRecord.shard, TableRecord.tenant_id)
        )
        load: dict[str, int] = {}
        mine: dict[str, int] = {}
        for shard, owner, n in rows:
            load[shard] = load.get(shard, 0) + n
            if owner == tenant:
                mine[shard] = mine.get(shard, 0) + n
        return pins, load, mine

    # Helpers ----------------------------------------------------------------------------
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
