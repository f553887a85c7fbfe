"""Hot log tier backends, chosen by a short name or a dotted path, imported lazily.

``hot.type`` names a built-in backend (``disk``, ``redis``) or a class of your own by its
dotted path, ``TIDEGATE_HOT__TYPE=mypkg.mymod:MyHotLog``, which must subclass
:class:`HotLog`; its settings go under ``hot.options``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    ShardedHotLog,
    StoredBatch,
    sharded,
)
from gateway.plugins import load_class

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "AppendResult",
    "HotLog",
    "LogOffsets",
    "PartitionId",
    "ProducerSequence",
    "ShardedHotLog",
    "StoredBatch",
    "load_hot_log",
    "sharded",
]


def load_hot_log(settings: Settings) -> HotLog:
    """Build the hot log named by ``settings.hot.type``.

    Raises:
        BackendError: an unknown name, a missing extra, or a class that is not a HotLog.
    """
    cls: type[HotLog] = load_class("hot tier", settings.hot.type, HotLog)
    return cls.from_settings(settings)
