"""Gateway configuration.

Loaded by pydantic-settings from, in order of precedence: explicit keyword arguments,
``TIDEGATE_*`` environment variables (nested with ``__``: ``TIDEGATE_HOT__TYPE=redis``),
then an optional YAML file named by ``TIDEGATE_CONFIG``. Every backend section has a
``type`` discriminator. The defaults are the *embedded* mode: one data folder, SQLite
metadata, the local-disk hot tier, no other service needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gateway.plugins import BUILTINS, check_name

__all__ = [
    "AuthConfig",
    "ColdConfig",
    "CompactionConfig",
    "CustomHotConfig",
    "DiskHotConfig",
    "ExpiryConfig",
    "GroupsConfig",
    "LogConfig",
    "MetadataConfig",
    "MeteringConfig",
    "QuotaConfig",
    "RedisHotConfig",
    "RestCatalogConfig",
    "S3Config",
    "ServedCatalogConfig",
    "ServerConfig",
    "Settings",
    "SqlCatalogConfig",
    "TieringConfig",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiskHotConfig(_Section):
    """Local-disk hot tier: per-partition segment files. Single node."""

    type: Literal["disk"] = "disk"
    path: Path | None = Field(None, description="Folder for segments; default <data_dir>/hot.")
    fsync: Literal["batch", "interval", "never"] = Field(
        "batch", description="fsync after every batch, every fsync_interval_ms, or never."
    )
    fsync_interval_ms: int = Field(200, ge=1, description="Period of the 'interval' policy.")
    segment_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Roll segments at this size.")
    max_open_files: int = Field(
        256,
        ge=8,
        description="Segment files kept open at most: the least recently used partitions are "
        "closed past it and reopened on demand (idle partitions hold no descriptor).",
    )
    lock: bool = Field(
        True,
        description="Take the folder's exclusive lock (a second process refuses to start). "
        "Only Spark executors that read beside the driver holding it turn it off.",
    )


class RedisShardConfig(_Section):
    """One named shard of the Redis hot tier: a Redis server or a whole Redis Cluster."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Stable name recorded in partition placements; never reuse one.",
    )
    url: str = Field(description="redis:// or rediss:// URL (any node, for a cluster).")
    cluster: bool = Field(False, description="The URL names a Redis Cluster node.")


class RedisHotConfig(_Section):
    """Redis hot tier: one stream per partition segment; several gateways may share it.

    With ``shards`` empty, ``url`` is the one implicit shard named ``default`` (a single
    Redis, as before sharding). Otherwise ``url`` is ignored; name the shard that holds data
    written before sharding ``default``.
    """

    type: Literal["redis"] = "redis"
    url: str = Field("redis://127.0.0.1:6379/0", description="redis:// or rediss:// URL.")
    shards: list[RedisShardConfig] = Field(
        default_factory=list, description="Named shards; empty: one shard 'default' at url."
    )
    socket_timeout_s: float = Field(5.0, gt=0, description="Per-command socket timeout.")
    producer_window: int = Field(16, ge=1, description="Batches remembered per producer.")

    def shard_list(self) -> list[RedisShardConfig]:
        """The configured shards, or the implicit ``default`` one at ``url``."""
        if self.shards:
            names = [s.name for s in self.shards]
            if len(set(names)) != len(names):
                raise ValueError(f"hot.shards names must be unique, got {names}")
            return list(self.shards)
        return [RedisShardConfig(name="default", url=self.url)]


class CustomHotConfig(_Section):
    """A hot tier of your own: ``type`` is the dotted path of a :class:`gateway.hot.HotLog`
    subclass, whose ``from_settings`` reads ``options``."""

    type: str = Field(
        pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[:.][A-Za-z_]\w*$",
        description="Dotted path of the backend class, e.g. 'mypkg.mymod:MyHotLog'.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Settings of the backend, as it defines them."
    )


def _hot_kind(value: Any) -> str:
    kind = value.get("type", "disk") if isinstance(value, dict) else getattr(value, "type", "")
    return kind if kind in BUILTINS["hot tier"] else "custom"


HotConfig = Annotated[
    Annotated[DiskHotConfig, Tag("disk")]
    | Annotated[RedisHotConfig, Tag("redis")]
    | Annotated[CustomHotConfig, Tag("custom")],
    Discriminator(_hot_kind),
]


class SqlCatalogConfig(_Section):
    """Iceberg SQL catalog (pyiceberg ``SqlCatalog``) over SQLAlchemy."""

    type: Literal["sql"] = "sql"
    uri: str | None = Field(
        None, description="SQLAlchemy URL (SQLite or PostgreSQL); default <data_dir>/catalog.db."
    )
    name: str = Field("tidegate", description="Catalog name (rows are keyed by it).")


class RestCatalogConfig(_Section):
    """Iceberg REST catalog."""

    type: Literal["rest"] = "rest"
    uri: str = Field(description="Base URL of the REST catalog.")
    credential: str | None = Field(None, description="OAuth2 client credential 'id:secret'.")
    name: str = Field("tidegate", description="Catalog name.")
    properties: dict[str, str] = Field(
        default_factory=dict, description="Extra pyiceberg catalog properties."
    )


CatalogConfig = Annotated[SqlCatalogConfig | RestCatalogConfig, Field(discriminator="type")]


class S3Config(_Section):
    """S3-compatible object storage for an ``s3://`` warehouse."""

    endpoint: str | None = Field(None, description="Endpoint URL; None: AWS itself.")
    access_key_id: str | None = Field(None, description="Access key; None: the default chain.")
    secret_access_key: str | None = Field(None, description="Secret key of access_key_id.")
    region: str = Field("us-east-1", description="Region of the bucket.")
    path_style: bool = Field(False, description="Path-style addressing (MinIO, moto).")


class ServedCatalogConfig(_Section):
    """The Iceberg REST catalog the gateway serves at ``/iceberg`` on its HTTP port:
    read-only, each tenant sees its own tables (docs/engines.md)."""

    enabled: bool = Field(
        True, description="Serve the catalog (only with a cold tier: cold.enabled)."
    )
    token_ttl_s: int = Field(
        3600,
        ge=60,
        le=24 * 3600,
        description="Lifetime of the tokens /iceberg/v1/oauth/tokens issues for a tenant's "
        "key (a revoked key or suspended tenant ends them within auth.key_cache_ttl_s).",
    )
    role_arn: str | None = Field(
        None,
        description="S3 warehouse: the IAM role assumed (STS AssumeRole) to vend a tenant "
        "temporary read credentials for one table's files; '{tenant}' is replaced by the "
        "tenant's name (one role per tenant). Unset: engines get no S3 credentials.",
    )
    credentials_duration_s: int = Field(
        3600, ge=900, le=43200, description="Lifetime of vended S3 credentials."
    )
    sts_endpoint: str | None = Field(
        None, description="STS endpoint URL; None: AWS's for cold.s3.region."
    )
    external_id: str | None = Field(
        None, description="ExternalId sent with AssumeRole when the role's trust policy asks."
    )
    scan_planning: bool = Field(
        True,
        description="Serve server-side scan planning (POST .../plan) and ask engines to use "
        "it (scan-planning-mode=server in loadTable's config): their plans name the hot tail "
        "as Parquet files, so they read every acknowledged row. Off: engines plan from the "
        "metadata and read the committed rows only.",
    )
    plan_max_hot_records: int = Field(
        1_000_000,
        ge=0,
        description="Largest hot tail (records above the snapshot, all partitions) a scan "
        "plan writes as files; a larger one is handled per plan_hot_overflow.",
    )
    plan_hot_overflow: Literal["refuse", "committed"] = Field(
        "refuse",
        description="A plan whose hot tail is over plan_max_hot_records: 'refuse' (the plan "
        "fails with one sentence saying so) or 'committed' (it names the committed files "
        "only, as client-side planning would).",
    )
    plan_hot_bytes_per_s: int = Field(
        0,
        ge=0,
        description="Per tenant, the hot-tail bytes scan plans may write a second (a token "
        "bucket of quota.burst_s seconds, shared by the replicas as the quotas are); once "
        "spent, plans with a hot tail are handled per plan_hot_overflow. 0: no budget.",
    )
    plan_page_files: int = Field(
        1000,
        ge=1,
        description="Data files a scan plan's answer names at most; the rest come as plan "
        "tasks, pages of as many, that an engine fetches with fetchScanTasks.",
    )


def _backend(kind: str) -> AfterValidator:
    """Accept a built-in name of ``kind`` (:data:`gateway.plugins.BUILTINS`) or a dotted path."""
    return AfterValidator(lambda name: check_name(kind, name))


class ColdConfig(_Section):
    """The cold tier: Iceberg catalog and warehouse."""

    type: Annotated[str, _backend("cold tier")] = Field(
        "iceberg",
        description="Cold tier backend: 'iceberg' or the dotted path of a "
        "gateway.cold.ColdStore subclass of your own ('mypkg.mymod:MyColdStore').",
    )
    enabled: bool = Field(True, description="Keep an Iceberg table per stream-table.")
    catalog: CatalogConfig = Field(
        default_factory=SqlCatalogConfig, description="Iceberg catalog backend."
    )
    warehouse: str | None = Field(
        None, description="Local folder or s3://bucket/prefix; default <data_dir>/warehouse."
    )
    s3: S3Config = Field(default_factory=S3Config, description="Object storage access.")
    presign_expiry_s: int = Field(
        3600, ge=1, le=7 * 24 * 3600, description="Lifetime of presigned URLs in read plans."
    )
    rest_catalog: ServedCatalogConfig = Field(
        default_factory=ServedCatalogConfig,
        description="The tenant-scoped Iceberg REST catalog served at /iceberg.",
    )
    snapshot_cache_ms: int = Field(
        500,
        ge=0,
        description="How long stream reads reuse a table's current snapshot (keep it far "
        "below tiering.hot_retention_s); scans and plans always pin afresh.",
    )


class MetadataConfig(_Section):
    """The SQLAlchemy metadata store."""

    url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/metadata.db."
    )
    echo: bool = Field(False, description="Log every SQL statement.")


class ServerConfig(_Section):
    """Network edges."""

    host: str = Field("127.0.0.1", description="Bind address of both servers.")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 disables gRPC.")
    http_port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 disables HTTP.")
    flight_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Arrow Flight port for bulk reads (scans and stream reads as DoGet "
        "streams; the SDK uses it when offered); 0 disables Flight.",
    )
    flight_advertise: str = Field(
        "",
        description="The Flight location told to clients (e.g. grpc+tls://flight.example:443 "
        "behind a proxy); empty: the host the client dialled, at flight_port.",
    )
    http_advertise: str = Field(
        "",
        description="The gateway's HTTP address as executors reach it (e.g. "
        "http://gateway.internal:8080), for the file links of read plans over gRPC on a "
        "local warehouse; empty: http://<host>:<http_port> (127.0.0.1 for a wildcard host).",
    )
    max_request_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest append body accepted."
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        description="Largest HTTP body of any other request (table and schema definitions, "
        "scans, plans, group commits, admin calls); a body is read only once its caller "
        "is authenticated, and at most 64 KiB before.",
    )
    max_read_records: int = Field(100_000, ge=1, description="Cap on records per read call.")
    default_read_records: int = Field(10_000, ge=1, description="max_records when not given.")
    max_read_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Cap on the bytes of one read's answer (Arrow data, uncompressed).",
    )
    follow_read_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Cap on each answer of a follow read (a stream pushes many small ones).",
    )
    read_memory_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024 * 1024,
        description="Read data the gateway holds at once, all tenants together; past it "
        "reads wait (streams) or are refused with a retry-after (RESOURCE_EXHAUSTED / 429).",
    )
    max_follows: int = Field(
        1024,
        ge=1,
        description="Follow reads (streams, long polls) of all tenants together on one "
        "gateway; quota.max_follows bounds each tenant's.",
    )
    max_streams: int = Field(
        1024,
        ge=1,
        description="Append streams (gRPC AppendStream) of all tenants together open on one "
        "gateway; quota.max_streams bounds each tenant's.",
    )
    stream_idle_s: float = Field(
        60.0,
        gt=0,
        description="An append stream that sends no message for this long is ended (cleanly: "
        "the SDK opens a new one when it next sends).",
    )
    tenant_read_memory_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Share of read_memory_bytes one tenant's reads may hold at once.",
    )
    follow_poll_ms: int = Field(
        100, ge=5, description="How often a follow read re-checks a log written elsewhere."
    )
    http_follow_wait_ms: int = Field(30_000, ge=0, description="Longest HTTP long-poll wait.")
    shutdown_grace_s: float = Field(5.0, ge=0, description="Drain time after SIGTERM.")
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Serve /metrics on this port of its own (e.g. not exposed by the public "
        "Service) instead of the HTTP port; 0: on the HTTP port.",
    )
    metrics_token: str | None = Field(
        None,
        min_length=16,
        description="When set, /metrics answers only 'authorization: Bearer <token>' "
        "(it names every tenant); unset: open to whoever reaches its port.",
    )
    max_connections: int = Field(
        4096,
        ge=16,
        description="Connections each edge (HTTP, gRPC) keeps open at once; past it a new "
        "one is closed at once (HTTP answers 503). Lowered at start to fit the process's "
        "descriptor limit.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send a request's headers (HTTP) or finish its "
        "HTTP/2 handshake (gRPC) within this long, or it is closed.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Longest pause while an HTTP request's body is received."
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="An idle HTTP keep-alive connection is closed after this long."
    )
    grpc_max_connection_idle_s: float = Field(
        300.0,
        gt=0,
        description="A gRPC connection with no call for this long is closed (GOAWAY; clients "
        "reconnect by themselves).",
    )
    grpc_max_connection_age_s: float = Field(
        0.0,
        ge=0,
        description="Close gRPC connections older than this (GOAWAY, then "
        "server.shutdown_grace_s for their calls), to rebalance long-lived clients; 0: never "
        "(follow streams live long).",
    )
    grpc_keepalive_s: float = Field(
        60.0,
        gt=0,
        description="The gateway pings a gRPC connection silent for this long, and closes it "
        "when the ping is not answered within grpc_keepalive_timeout_s (a vanished peer).",
    )
    grpc_keepalive_timeout_s: float = Field(
        20.0, gt=0, description="How long a keepalive ping may go unanswered."
    )
    io_threads: int = Field(32, ge=1, description="Threads for blocking hot-tier calls.")
    max_filter_chars: int = Field(
        64 * 1024, ge=16, description="Longest scan or plan filter text accepted."
    )
    max_filter_terms: int = Field(
        4096, ge=1, description="Most predicates plus literals in one filter."
    )
    max_filter_depth: int = Field(
        64, ge=1, le=200, description="Deepest nesting of parentheses and 'not' in a filter."
    )


class AuthConfig(_Section):
    """Authentication: tenant API keys (in the metadata store) and the operator key."""

    operator_key: str | None = Field(
        None,
        min_length=16,
        description="Key of the admin API. Unset: generated once at first start, stored in "
        "<data_dir>/operator.key and printed.",
    )
    key_cache_ttl_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="How long a gateway reuses what it read about an API key (tenant, "
        "tenant status, revocation); a revocation or suspension done through another "
        "replica is seen here within it. 0 reads the metadata store on every request.",
    )


class QuotaConfig(_Section):
    """Per-tenant quotas: defaults for tenants without their own, and the limiter."""

    redis_url: str | None = Field(
        None,
        description="Redis shared by every replica for the token buckets; default the Redis "
        "hot tier's URL, or in-process buckets with the disk hot tier.",
    )
    burst_s: float = Field(1.0, gt=0, le=60, description="Bucket capacity, in seconds of the rate.")
    max_in_flight: int = Field(
        16, ge=1, description="Requests of one tenant in progress at once on one gateway."
    )
    max_follows: int = Field(
        64, ge=1, description="Follow reads (long polls, streams) of one tenant per gateway."
    )
    max_streams: int = Field(
        64, ge=1, description="Append streams of one tenant open at once on one gateway."
    )
    append_bytes_per_s: int | None = Field(None, ge=1, description="Default; None: unlimited.")
    read_bytes_per_s: int | None = Field(None, ge=1, description="Default; None: unlimited.")
    requests_per_s: int | None = Field(None, ge=1, description="Default; None: unlimited.")
    max_tables: int | None = Field(None, ge=0, description="Default; None: unlimited.")
    max_partitions: int | None = Field(
        16384,
        ge=0,
        description="Default partitions of one tenant, over all its tables; None: unlimited.",
    )
    max_table_partitions: int = Field(
        1024,
        ge=1,
        le=4096,
        description="Partitions one table may have (for every tenant; 4096 at most).",
    )
    max_hot_bytes: int | None = Field(None, ge=0, description="Default; None: unlimited.")


class MeteringConfig(_Section):
    """Per-tenant, per-minute usage records."""

    flush_interval_s: float = Field(
        10.0, gt=0, description="How often usage aggregated in memory is written."
    )
    storage_sample_s: float = Field(
        60.0,
        ge=0,
        description="Each active tenant's hot and cold bytes are sampled (a look at each of "
        "its tables) at most this often by the periodic flush.",
    )
    metrics_max_tenants: int = Field(
        100,
        ge=0,
        description="Tenants labelled by name in /metrics per process; later ones share "
        'tenant="_other".',
    )


class GroupsConfig(_Section):
    """Consumer groups: the bounds of a member's session timeout, and group metrics."""

    min_session_timeout_ms: int = Field(
        500, ge=100, description="Shortest session timeout a member may ask for."
    )
    max_session_timeout_ms: int = Field(
        1_800_000, ge=100, description="Longest session timeout a member may ask for."
    )
    metrics_max_groups: int = Field(
        100,
        ge=0,
        description="Groups labelled by name in tidegate_groups_lag_records (those with the "
        'largest lag); the others share group="_other".',
    )


class TieringConfig(_Section):
    """Tiering: moving each partition's hot range into the Iceberg table (``tiering/``)."""

    enabled: bool = Field(
        True, description="Tier on a schedule inside `tidegate serve` (the embedded mode)."
    )
    interval_s: float = Field(30.0, gt=0, description="Period of the embedded schedule.")
    sweep_interval_s: float = Field(
        3600.0,
        ge=0,
        description="The embedded schedule visits every table once at start and then every "
        "this many seconds (0: at start only), for appends a crashed gateway acknowledged "
        "but had not yet marked; otherwise it visits only the tables marked for it.",
    )
    runner: Annotated[str, _backend("tiering runner")] = Field(
        "local",
        description="Embedded schedule's runner: threads in the gateway ('local'), Spark "
        "('spark'), or the dotted path of a gateway.lake.runners.Runner of your own.",
    )
    master: str = Field("local[2]", description="Spark master of the spark runner.")
    embedded_parallel_tenants: int | None = Field(
        None,
        ge=1,
        description="Tenants the embedded schedule's lake jobs work on at once; default 1 with "
        "the local runner (each more is a thread of the gateway competing with requests for "
        "the interpreter lock), 4 with Spark (one fair-scheduler pool each).",
    )
    target_file_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="Roll a new Parquet file at about this size."
    )
    hot_retention_s: float = Field(
        300.0,
        ge=0,
        description="Keep tiered records in the hot tier this long after their commit.",
    )
    commit_attempts: int = Field(6, ge=1, description="Tries of a conflicting commit.")


class CompactionConfig(_Section):
    """Compaction: rewriting runs of small data files into files near the target size
    (``tidegate compact``, ``gateway/lake/compaction.py``)."""

    enabled: bool = Field(
        True, description="Compact on a schedule inside `tidegate serve` (the embedded mode)."
    )
    interval_s: float = Field(600.0, gt=0, description="Period of the embedded schedule.")
    target_file_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        description="Size on storage a run of small files is rewritten into (one file per run).",
    )
    small_file_bytes: int = Field(
        96 * 1024 * 1024,
        ge=1,
        description="A data file below this size on storage is small: a compaction input.",
    )
    min_files: int = Field(
        2, ge=2, description="Fewest adjacent small files worth rewriting into one."
    )

    @model_validator(mode="after")
    def _small_below_target(self) -> CompactionConfig:
        if self.small_file_bytes > self.target_file_bytes:
            raise ValueError(
                f"compaction.small_file_bytes ({self.small_file_bytes}) must not exceed "
                f"compaction.target_file_bytes ({self.target_file_bytes})"
            )
        return self


class ExpiryConfig(_Section):
    """Snapshot expiry, file deletion and orphan clean-up (``tidegate expire``,
    ``tidegate clean-orphans``, ``gateway/lake/expiry.py``)."""

    enabled: bool = Field(
        True,
        description="Expire snapshots (and delete their files) on a schedule inside "
        "`tidegate serve`.",
    )
    interval_s: float = Field(3600.0, gt=0, description="Period of the embedded schedule.")
    retention_s: float = Field(
        24 * 3600.0,
        ge=60,
        description="Expire a snapshot once it has not been the current one for this long "
        "(never below tiering.hot_retention_s).",
    )
    keep_last: int = Field(5, ge=1, description="Always keep this many newest snapshots.")
    scan_lease_s: float = Field(
        3600.0,
        gt=0,
        description="Longest a scan keeps its snapshot from expiry (a finished scan releases "
        "it at once; a plan keeps it for cold.presign_expiry_s).",
    )
    orphans_enabled: bool = Field(
        False, description="Also remove orphan files on the embedded schedule."
    )
    orphan_age_s: float = Field(
        3 * 24 * 3600.0,
        ge=0,
        description="Remove a file no snapshot references only once it is this old (a job "
        "still writing it may commit it until then).",
    )


class RetentionConfig(_Section):
    """Table retention: removing the records older than a table's ``retention_ms`` or
    beyond its ``retention_records`` (``tidegate retention``, ``gateway/lake/retention.py``).
    Tables without a retention are left alone."""

    enabled: bool = Field(
        True, description="Apply table retention on a schedule inside `tidegate serve`."
    )
    interval_s: float = Field(300.0, gt=0, description="Period of the embedded schedule.")
    settle_s: float = Field(
        5.0,
        ge=0,
        description="Leave a table alone for this long after its retention was set, so "
        "every gateway knows it has one before an earliest offset is recorded (gateways "
        "reuse a table's definition for 2 s: keep it above that; 0 only for tests).",
    )


LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v),
]


class LogConfig(_Section):
    """Logging of the process (``gateway/logs.py``): one stream, stderr."""

    level: LogLevel = Field("INFO", description="Level of Tidegate's own loggers.")
    format: Literal["text", "json"] = Field(
        "text",
        description="'text' (one line per record) or 'json' (one JSON object per line: "
        "time, level, logger, message, exception).",
    )
    library_level: LogLevel = Field(
        "WARNING",
        description="Level of the libraries' loggers (pyiceberg, alembic, botocore, urllib3, "
        "py4j...); INFO brings back their chatter.",
    )
    levels: dict[str, LogLevel] = Field(
        default_factory=dict,
        description="Level per logger name, over the two above, e.g. {'pyiceberg.io': 'INFO'}.",
    )


class Settings(BaseSettings):
    """Everything a gateway process needs."""

    model_config = SettingsConfigDict(
        env_prefix="TIDEGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    data_dir: Path = Field(Path("tidegate-data"), description="Embedded-mode data folder.")
    tenant: str = Field(
        "default",
        description="Tenant of requests to an edge built without authentication (in-process "
        "tests); served gateways always authenticate.",
    )
    hot: HotConfig = Field(default_factory=DiskHotConfig, description="Hot log tier backend.")
    compression: Literal["producer", "zstd", "lz4", "none"] = Field(
        "zstd",
        description="Arrow IPC compression of hot-tier batches. An appended Arrow stream "
        "already compressed so (zstd by default, as the SDK producer sends) is stored as it "
        "came; any other is compressed again. `producer` keeps whatever the client sent, "
        "none included (Kafka's compression.type=producer), and uses zstd for what the "
        "gateway encodes itself.",
    )
    metadata: MetadataConfig = Field(default_factory=MetadataConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    metering: MeteringConfig = Field(default_factory=MeteringConfig)
    groups: GroupsConfig = Field(default_factory=GroupsConfig)
    tiering: TieringConfig = Field(default_factory=TieringConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    expiry: ExpiryConfig = Field(default_factory=ExpiryConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    cold: ColdConfig = Field(default_factory=ColdConfig, description="Iceberg cold tier.")
    log: LogConfig = Field(default_factory=LogConfig, description="Log level and format.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("TIDEGATE_CONFIG")
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    # Resolved locations ---------------------------------------------------------------
    @property
    def metadata_url(self) -> str:
        if self.metadata.url:
            return self.metadata.url
        return f"sqlite:///{(self.data_dir / 'metadata.db').resolve()}"

    @property
    def cold_catalog_uri(self) -> str:
        c = self.cold.catalog
        if c.uri:
            return c.uri
        return f"sqlite:///{(self.data_dir / 'catalog.db').resolve()}"

    @property
    def cold_warehouse(self) -> str:
        """The warehouse as a URI: ``s3://...`` or ``file:///abs/path``."""
        w = self.cold.warehouse
        if w and "://" in w:
            return w.rstrip("/")
        path = Path(w) if w else self.data_dir / "warehouse"
        return path.resolve().as_uri()

    @property
    def http_url(self) -> str | None:
        """The gateway's HTTP address for the links it hands out (None without HTTP)."""
        s = self.server
        if s.http_advertise:
            return s.http_advertise.rstrip("/")
        if not s.http_port:
            return None
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
        return f"http://[{host}]:{s.http_port}" if ":" in host else f"http://{host}:{s.http_port}"

    @property
    def hot_path(self) -> Path:
        if isinstance(self.hot, DiskHotConfig) and self.hot.path is not None:
            return self.hot.path
        return self.data_dir / "hot"

    @property
    def quota_redis_url(self) -> str | None:
        """Where the shared token buckets live, or None for in-process buckets."""
        if self.quota.redis_url:
            return self.quota.redis_url
        if isinstance(self.hot, RedisHotConfig):
            first = self.hot.shard_list()[0]
            return None if first.cluster else first.url
        return None

    @classmethod
    def explicit(cls, **values: Any) -> Settings:
        """Settings from ``values`` and defaults only, ignoring environment and files.

        Tests use this so that a developer's ``TIDEGATE_*`` variables never leak in.
        """
        return _ExplicitSettings(**values)


class _ExplicitSettings(Settings):
    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)
