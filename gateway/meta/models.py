"""SQLAlchemy models of the metadata store.

Every table is prefixed ``tg_`` (and alembic's version table is ``tg_alembic_version``) so
the store can share a database with other applications, e.g. the Iceberg SQL catalog.
Constraint names come from one naming convention, so migrations (and SQLite batch mode,
which recreates tables) can always address a constraint by name.

The models are the *target* of the migrations in :mod:`gateway.meta.migrations`; a test
checks that a migrated database and these models agree. Change both together: edit a model,
then add a revision (autogenerate one with
:func:`gateway.meta.engine.alembic_config`, see the migrations' ``env.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "NAMING_CONVENTION",
    "VERSION_TABLE",
    "ApiKey",
    "Base",
    "EdgeGroupRecord",
    "GroupOffset",
    "GroupRecord",
    "LakeWork",
    "MaintenanceRun",
    "PartitionRecord",
    "QuotaRecord",
    "ReplicaRecord",
    "SegmentRecord",
    "ShardPin",
    "SnapshotLease",
    "TableRecord",
    "Tenant",
    "UTCDateTime",
    "UsageRecord",
]

#: Alembic's bookkeeping table for this store.
VERSION_TABLE = "tg_alembic_version"

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TENANT_STATUSES = ("active", "suspended")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    PostgreSQL stores ``timestamp with time zone``; SQLite has no time zones, so values are
    stored as UTC and read back as aware UTC datetimes. Naive datetimes are rejected.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: metadata timestamps must be aware")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime()}


class Tenant(Base):
    """A tenant. ``id`` is the tenant's name, as requests resolve to it."""

    __tablename__ = "tg_tenants"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in TENANT_STATUSES)),
            name="status",
        ),
    )

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    status: Mapped[str] = mapped_column(
        String(16), default="active", server_default=text("'active'")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TableRecord(Base):
    """A stream-table of one tenant. ``id`` is unique for the table's lifetime: a dropped
    and re-created table gets a new one, so hot logs and caches never mix them up."""

    __tablename__ = "tg_tables"
    __table_args__ = (UniqueConstraint("tenant_id", "namespace", "name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(255), ForeignKey("tg_tenants.id"))
    namespace: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    #: The user schema: a JSON list of field objects.
    schema_json: Mapped[str] = mapped_column(Text)
    partitions: Mapped[int] = mapped_column(Integer)
    #: JSON list of the key column names (empty: round-robin).
    key_columns_json: Mapped[str] = mapped_column(Text, default="[]")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Raised by one at every schema change (0 at create); a change commits only over
    #: the version it was planned from.
    schema_version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: Retention (as Kafka's ``retention.ms`` / ``retention.records``): records older than
    #: this many milliseconds, or more than this many behind the high watermark, are
    #: removed by the retention job. NULL: kept for ever.
    retention_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    retention_records: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: When a retention was last set (or cleared); NULL: the table never had one, so no
    #: partition has an earliest offset and stream reads need not look it up.
    retention_set_at: Mapped[datetime | None] = mapped_column(nullable=True)
    #: A primary-key table's key and merge engine as JSON (``{"columns": [...],
    #: "merge_engine": {...}}``); NULL: an append-only table. Immutable.
    primary_key_json: Mapped[str | None] = mapped_column(Text, nullable=True)


class PartitionRecord(Base):
    """One partition of a table: cached watermarks and hot-tier placement.

    The watermarks here are caches: the hot tier owns the high watermark and the Iceberg
    snapshot summary owns the tiered watermark; either wins over these values.
    """

    __tablename__ = "tg_partitions"

    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), primary_key=True
    )
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    high_watermark: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    tiered_watermark: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    #: Hot-tier shard holding the partition, and the placement epoch that fences moves.
    shard: Mapped[str] = mapped_column(
        String(255), default="default", server_default=text("'default'")
    )
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: The shard an unfinished move is taking the partition to (NULL: no move under way).
    #: Recorded before the source segment is sealed, so whoever finds the seal can finish.
    move_target: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: The earliest offset still readable: set by the retention job before it removes
    #: anything below it, and only ever raised. Not a cache: reads are refused below it.
    earliest_offset: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class SegmentRecord(Base):
    """One segment of a partition's hot log (a virtual log, as in Delos): the offsets
    ``[start_offset, end_offset)`` live on ``shard``; ``end_offset`` is NULL for the last,
    active segment, the only one that takes appends. A partition without rows here has one
    implicit segment ``0`` on its ``shard`` from offset 0 (its layout before sharding)."""

    __tablename__ = "tg_segments"

    table_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    shard: Mapped[str] = mapped_column(String(255))
    start_offset: Mapped[int] = mapped_column(BigInteger)
    end_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ShardPin(Base):
    """A hot-tier shard reserved for one tenant: only that tenant's partitions go there."""

    __tablename__ = "tg_shard_pins"

    shard: Mapped[str] = mapped_column(String(255), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id", ondelete="CASCADE")
    )


class GroupOffset(Base):
    """A consumer group's committed offset for one partition of a table: the next offset
    the group will consume. Keyed by ``table_id``, so a dropped and re-created table starts
    with no commits."""

    __tablename__ = "tg_group_offsets"

    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id"), primary_key=True
    )
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), primary_key=True
    )
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    offset: Mapped[int] = mapped_column(BigInteger)
    committed_at: Mapped[datetime] = mapped_column(default=utcnow)


class GroupRecord(Base):
    """A consumer group's membership on one table: its generation and live members
    (:class:`gateway.meta.records.GroupState`). One row per group and table, locked by
    every heartbeat and every member's commit, so replicas of the gateway coordinate the
    group through it."""

    __tablename__ = "tg_groups"

    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id"), primary_key=True
    )
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), primary_key=True
    )
    #: Raised at every change of membership (join, leave, session timeout).
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    #: JSON list of the live members (:meth:`GroupState.to_json`).
    members_json: Mapped[str] = mapped_column(Text, default="[]")
    #: Since when (epoch ms) the current rebalance is converging; null when settled.
    rebalance_since_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    """A tenant's API key. The secret is never stored: only ``HMAC-SHA256(salt, secret)``.

    The key a client sends is ``tg_<id>_<secret>``; the id finds the row, the digest is
    compared in constant time.
    """

    __tablename__ = "tg_api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id", ondelete="CASCADE")
    )
    salt: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Set when revoked; a revoked key authenticates nothing.
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class QuotaRecord(Base):
    """A tenant's own quotas. A NULL column falls back to the configured default; a
    negative value means unlimited."""

    __tablename__ = "tg_quotas"

    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id", ondelete="CASCADE"), primary_key=True
    )
    append_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    read_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    requests_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_tables: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_partitions: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_hot_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class UsageRecord(Base):
    """Usage of one tenant in one minute (UTC, truncated). Counters add up across
    gateways; ``hot_bytes`` and ``cold_bytes`` are the largest storage seen that minute."""

    __tablename__ = "tg_usage"

    tenant_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("tg_tenants.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    append_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    append_records: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    read_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    read_records: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    throttled: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    hot_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    cold_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class SnapshotLease(Base):
    """An Iceberg snapshot an open scan or a read plan still reads: snapshot expiry keeps
    it (and so its files) until ``expires_at``. A scan releases its lease when it ends; a
    plan's lease lasts as long as its file URLs."""

    __tablename__ = "tg_snapshot_leases"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), index=True
    )
    snapshot_id: Mapped[int] = mapped_column(BigInteger)
    #: ``scan`` or ``plan``.
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()


class MaintenanceRun(Base):
    """The last run of a maintenance job (``compact``, ``expire``, ``clean``) on a table:
    what describe and the metrics show."""

    __tablename__ = "tg_maintenance_runs"

    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), primary_key=True
    )
    job: Mapped[str] = mapped_column(String(16), primary_key=True)
    finished_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: ``ok`` or ``failed``.
    outcome: Mapped[str] = mapped_column(String(16))
    #: One line: what the run did, or why it failed.
    detail: Mapped[str] = mapped_column(Text, default="")


#: The lake jobs a :class:`LakeWork` row can ask for.
LAKE_JOBS = ("tier", "trim", "compact", "expire", "orphans")


class LakeWork(Base):
    """Lake work a table needs (issue 30): what the lake jobs visit, instead of every
    table. A ``tier`` row per partition with records not yet tiered (written from what
    gateways acknowledged, see ``StreamTables``); table-level rows (``partition`` -1) for
    the jobs a change asks for later: ``trim`` (the hot tier, ``hot_retention_s`` after a
    tiering commit), ``compact``, ``expire``, ``orphans``. A job takes the rows of its
    kind that are due, and deletes a row once the work it asks for is done."""

    __tablename__ = "tg_lake_work"
    __table_args__ = (
        CheckConstraint("job IN ({})".format(", ".join(f"'{j}'" for j in LAKE_JOBS)), name="job"),
        Index("ix_tg_lake_work_job_due_at", "job", "due_at"),
    )

    table_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tg_tables.id", ondelete="CASCADE"), primary_key=True
    )
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    job: Mapped[str] = mapped_column(String(16), primary_key=True)
    #: When the oldest change still waiting was made (for ``tier``: the oldest untiered
    #: record acknowledged, as far as gateways told).
    since: Mapped[datetime] = mapped_column()
    #: When the newest change was marked.
    marked_at: Mapped[datetime] = mapped_column()
    #: From when a job should visit (the earliest mark's due time).
    due_at: Mapped[datetime] = mapped_column()
    #: ``tier``: the highest offset + 1 acknowledged; the row goes when ``T(p)`` reaches it.
    high: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class ReplicaRecord(Base):
    """A live gateway replica, as Kafka clients are told to reach it (one of the Kafka
    cluster's brokers, docs/kafka.md): each replica renews its row every few seconds and
    deletes it when it stops; a row past ``expires_at`` is a replica that died."""

    __tablename__ = "tg_replicas"

    #: The replica's name (``kafka.replica_id``, or its advertised ``host:port``).
    replica_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: Its Kafka node id, derived from ``replica_id``: stable across its restarts.
    node_id: Mapped[int] = mapped_column(Integer, unique=True)
    #: Its advertised Kafka address.
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()


class EdgeGroupRecord(Base):
    """A group an edge's own protocol coordinates (a Kafka consumer group), on one table,
    as the replica coordinating it published it last (:class:`gateway.meta.records.EdgeGroup`).
    The replica republishes its groups when they change and renews them within
    ``expires_at``; a row past it is a replica that died (or stopped uncleanly)."""

    __tablename__ = "tg_edge_groups"

    tenant_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(255), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: The replica that coordinates the group (it alone writes the row).
    coordinator: Mapped[str] = mapped_column(String(255), index=True)
    protocol: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(32))
    generation: Mapped[int] = mapped_column(BigInteger)
    #: JSON list of the members (:meth:`gateway.meta.records.EdgeMember.to_json`).
    members_json: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column()
