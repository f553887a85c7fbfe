"""Hot log tier backends, chosen by a short name or a dotted path, imported lazily."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "AppendResult",
    "HotLog",
    "LogOffsets",
    "PartitionId",
    "ProducerSequence",
    "StoredBatch",
    "load_hot_log",
]

#: Short name -> (module, class, extra that provides its dependencies).
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "disk": ("gateway.hot.disk", "DiskHotLog", "server"),
    "redis": ("gateway.hot.redis", "RedisHotLog", "server"),
}


def load_hot_log(settings: Settings) -> HotLog:
    """Build the hot log named by ``settings.hot.type``."""
    module_name, class_name, extra = _BACKENDS[settings.hot.type]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"the {settings.hot.type!r} hot tier needs extra dependencies: "
            f"pip install 'tidegate[{extra}]' ({exc})"
        ) from exc
    cls: type[HotLog] = getattr(module, class_name)
    return cls.from_settings(settings)
