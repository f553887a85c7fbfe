"""The loader: :class:`Settings`, every section in one object, and its sources.

Loaded by pydantic-settings from, in order of precedence: explicit keyword arguments,
``TIDEGATE_*`` environment variables (nested with ``__``: ``TIDEGATE_HOT__TYPE=redis``),
then an optional YAML file named by ``TIDEGATE_CONFIG``. Every backend section has a
``type`` discriminator. The defaults are the *embedded* mode: one data folder, SQLite
metadata, the local-disk hot tier, no other service needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gateway.config.cold import ColdConfig
from gateway.config.edges import GroupsConfig, ServerConfig
from gateway.config.hot import DiskHotConfig, HotConfig, RedisHotConfig
from gateway.config.kafka import KafkaConfig
from gateway.config.lake import CompactionConfig, ExpiryConfig, RetentionConfig, TieringConfig
from gateway.config.log import LogConfig
from gateway.config.metadata import MetadataConfig
from gateway.config.tenancy import AuthConfig, MeteringConfig, QuotaConfig

__all__ = ["Settings"]


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
    # The edges (gateway.config.edges): a new edge's section (kafka) goes beside server.
    server: ServerConfig = Field(default_factory=ServerConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig, description="Kafka listener.")
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
