"""What every part of :class:`~gateway.server.grpc.service.TidegateServicer` stands on: the
data calls, the core and the settings, and the small conversions parts share."""

from __future__ import annotations

from typing import Any

from gateway.config import Settings
from gateway.server.calls import DataCalls
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

__all__ = ["ServicerBase", "optional", "partition_offsets"]


def optional(message: Any, name: str) -> int | None:
    """An ``optional`` integer field: None when unset."""
    return int(getattr(message, name)) if message.HasField(name) else None


def partition_offsets(offsets: dict[int, int]) -> list[pb.PartitionOffset]:
    return [pb.PartitionOffset(partition=p, offset=o) for p, o in sorted(offsets.items())]


class ServicerBase(pb_grpc.TidegateServicer):  # type: ignore[misc]
    """The data calls, the core and the settings each part of the servicer calls."""

    def __init__(self, calls: DataCalls, settings: Settings) -> None:
        self.calls = calls
        self.service = calls.service
        self.settings = settings
