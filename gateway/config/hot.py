"""The hot tier's settings: the local-disk log, Redis (one or more shards), or a backend of
your own, chosen by ``type``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from gateway.config._section import Section
from gateway.plugins import BUILTINS

__all__ = ["CustomHotConfig", "DiskHotConfig", "HotConfig", "RedisHotConfig", "RedisShardConfig"]


class DiskHotConfig(Section):
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


class RedisShardConfig(Section):
    """One named shard of the Redis hot tier: a Redis server or a whole Redis Cluster."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Stable name recorded in partition placements; never reuse one.",
    )
    url: str = Field(description="redis:// or rediss:// URL (any node, for a cluster).")
    cluster: bool = Field(False, description="The URL names a Redis Cluster node.")


class RedisHotConfig(Section):
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


class CustomHotConfig(Section):
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
