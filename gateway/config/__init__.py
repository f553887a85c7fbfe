"""Gateway configuration, one module per settings group and one loader.

- :mod:`~gateway.config.hot`: the hot tier; :mod:`~gateway.config.cold`: the cold tier and
  its catalogs; :mod:`~gateway.config.metadata`: the metadata store;
- :mod:`~gateway.config.edges`: the network edges; :mod:`~gateway.config.kafka`: the Kafka
  listener, an edge's section of its own;
- :mod:`~gateway.config.tenancy`: auth, quotas, metering;
- :mod:`~gateway.config.lake`: tiering, compaction, expiry, retention;
- :mod:`~gateway.config.log`: logging;
- :mod:`~gateway.config.settings`: :class:`Settings`, its sources and ``explicit``.

Every name is importable from ``gateway.config`` itself; how the settings load (their
sources and precedence) is told in :mod:`~gateway.config.settings`.
"""

from __future__ import annotations

from gateway.config.cold import (
    CatalogConfig,
    ColdConfig,
    RestCatalogConfig,
    S3Config,
    ServedCatalogConfig,
    SqlCatalogConfig,
)
from gateway.config.edges import GroupsConfig, ServerConfig
from gateway.config.hot import (
    CustomHotConfig,
    DiskHotConfig,
    HotConfig,
    RedisHotConfig,
    RedisShardConfig,
)
from gateway.config.kafka import KafkaConfig
from gateway.config.lake import CompactionConfig, ExpiryConfig, RetentionConfig, TieringConfig
from gateway.config.log import LogConfig, LogLevel
from gateway.config.metadata import MetadataConfig
from gateway.config.settings import Settings
from gateway.config.tenancy import AuthConfig, MeteringConfig, QuotaConfig

__all__ = [
    "AuthConfig",
    "CatalogConfig",
    "ColdConfig",
    "CompactionConfig",
    "CustomHotConfig",
    "DiskHotConfig",
    "ExpiryConfig",
    "GroupsConfig",
    "HotConfig",
    "KafkaConfig",
    "LogConfig",
    "LogLevel",
    "MetadataConfig",
    "MeteringConfig",
    "QuotaConfig",
    "RedisHotConfig",
    "RedisShardConfig",
    "RestCatalogConfig",
    "RetentionConfig",
    "S3Config",
    "ServedCatalogConfig",
    "ServerConfig",
    "Settings",
    "SqlCatalogConfig",
    "TieringConfig",
]
