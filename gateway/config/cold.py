"""The cold tier's settings: the Iceberg catalog it writes to, object storage, and the
Iceberg REST catalog the gateway serves.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from gateway.config._section import Section, backend

__all__ = [
    "CatalogConfig",
    "ColdConfig",
    "RestCatalogConfig",
    "S3Config",
    "ServedCatalogConfig",
    "SqlCatalogConfig",
]


class SqlCatalogConfig(Section):
    """Iceberg SQL catalog (pyiceberg ``SqlCatalog``) over SQLAlchemy."""

    type: Literal["sql"] = "sql"
    uri: str | None = Field(
        None, description="SQLAlchemy URL (SQLite or PostgreSQL); default <data_dir>/catalog.db."
    )
    name: str = Field("tidegate", description="Catalog name (rows are keyed by it).")


class RestCatalogConfig(Section):
    """Iceberg REST catalog."""

    type: Literal["rest"] = "rest"
    uri: str = Field(description="Base URL of the REST catalog.")
    credential: str | None = Field(None, description="OAuth2 client credential 'id:secret'.")
    name: str = Field("tidegate", description="Catalog name.")
    properties: dict[str, str] = Field(
        default_factory=dict, description="Extra pyiceberg catalog properties."
    )


CatalogConfig = Annotated[SqlCatalogConfig | RestCatalogConfig, Field(discriminator="type")]


class S3Config(Section):
    """S3-compatible object storage for an ``s3://`` warehouse."""

    endpoint: str | None = Field(None, description="Endpoint URL; None: AWS itself.")
    access_key_id: str | None = Field(None, description="Access key; None: the default chain.")
    secret_access_key: str | None = Field(None, description="Secret key of access_key_id.")
    region: str = Field("us-east-1", description="Region of the bucket.")
    path_style: bool = Field(False, description="Path-style addressing (MinIO, moto).")


class ServedCatalogConfig(Section):
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
    plan_submit_records: int = Field(
        0,
        ge=0,
        description="Hot-tail records a scan plan writes within its request at most: a plan "
        "with more to write answers 'submitted' at once and writes them in the background, "
        "and fetchPlanningResult answers 'completed' once its files are there. 0 (the "
        "default): every plan completes within its request (pyiceberg 0.12 cannot poll a "
        "submitted plan; Iceberg Java can).",
    )
    plan_submit_grace_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="How long a submitted plan's files are left to the replica that "
        "submitted it; past it, the replica asked for the result writes what is missing "
        "itself (the first one died or was restarted).",
    )
    client_planning_tables: list[str] = Field(
        default_factory=list,
        description="Tables whose scans engines plan on the client, each "
        "'tenant/namespace.name' or 'tenant/*' (all of a tenant's): their loadTable config "
        "says scan-planning-mode=client (where it has a config) and a plan asked for anyway "
        "names their committed files only, writing no hot-tail file.",
    )
    plan_page_files: int = Field(
        1000,
        ge=1,
        description="Data files a scan plan's answer names at most; the rest come as plan "
        "tasks, pages of as many, that an engine fetches with fetchScanTasks.",
    )

    @field_validator("client_planning_tables")
    @classmethod
    def _tables(cls, value: list[str]) -> list[str]:
        for entry in value:
            tenant, slash, table = entry.partition("/")
            namespace, dot, name = table.partition(".")
            if not (tenant and slash and (table == "*" or (namespace and dot and name))):
                raise ValueError(
                    f"client_planning_tables entry {entry!r} is not 'tenant/namespace.name' "
                    "nor 'tenant/*'"
                )
        return value

    def server_planning(self, tenant: str, namespace: str, name: str) -> bool:
        """Whether scans of the tenant's table ``namespace.name`` are planned on the
        server (scan_planning on, and the table not in client_planning_tables)."""
        if not self.scan_planning:
            return False
        listed = set(self.client_planning_tables)
        return f"{tenant}/*" not in listed and f"{tenant}/{namespace}.{name}" not in listed


class ColdConfig(Section):
    """The cold tier: Iceberg catalog and warehouse."""

    type: Annotated[str, backend("cold tier")] = Field(
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
