"""Tenancy's settings: authentication, quotas and metering."""

from __future__ import annotations

from pydantic import Field

from gateway.config._section import Section

__all__ = ["AuthConfig", "MeteringConfig", "QuotaConfig"]


class AuthConfig(Section):
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


class QuotaConfig(Section):
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


class MeteringConfig(Section):
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
