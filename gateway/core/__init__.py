"""The stream-table core: one logical stream-table over a hot log and a cold table.

Backend-free by rule: it talks to :class:`gateway.hot.HotLog`, :class:`gateway.cold.ColdStore`
and the metadata store through their interfaces and never imports a backend (redis,
pyiceberg, boto3, a disk layout).
"""

from gateway.core.appends import ClientStream
from gateway.core.coordinator import Answer as GroupAnswer
from gateway.core.groups import EdgeGroup, EdgeMember
from gateway.core.replicas import Replica
from gateway.core.service import StreamTables
from gateway.core.views import (
    GroupMemberView,
    GroupPartitionView,
    GroupView,
    HotRange,
    MaintenanceView,
    PartitionView,
    ReadPlan,
    ReadResult,
    ScanPart,
    ScanResult,
    TableView,
)

__all__ = [
    "ClientStream",
    "EdgeGroup",
    "EdgeMember",
    "GroupAnswer",
    "GroupMemberView",
    "GroupPartitionView",
    "GroupView",
    "HotRange",
    "MaintenanceView",
    "PartitionView",
    "ReadPlan",
    "ReadResult",
    "Replica",
    "ScanPart",
    "ScanResult",
    "StreamTables",
    "TableView",
]
