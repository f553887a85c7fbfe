"""The stream-table service: every operation both edges (gRPC, HTTP) expose.

It talks to the hot log, the cold store and the metadata store only through their
interfaces and knows nothing of wire formats: edges hand it Arrow batches and get Arrow
batches back. Blocking backend calls run on a dedicated thread pool so the event loop never
waits on disk or network I/O.

The operations come in groups, one module each, over one shared :class:`CoreBase` (the way
redis-py composes its command groups): tables, appends, reads, scans, consumer groups,
the Iceberg catalog's view, the live replicas.
"""

from __future__ import annotations

from gateway.core.appends import AppendOps
from gateway.core.catalog import CatalogOps
from gateway.core.catalog_submits import SubmittedPlanOps
from gateway.core.groups import GroupOps
from gateway.core.keyed import LookupOps
from gateway.core.reads import ReadOps
from gateway.core.replicas import ReplicaOps
from gateway.core.scans import ScanOps
from gateway.core.tables import TableOps

__all__ = ["StreamTables"]


class StreamTables(
    TableOps,
    AppendOps,
    ReadOps,
    SubmittedPlanOps,
    ScanOps,
    GroupOps,
    CatalogOps,
    LookupOps,
    ReplicaOps,
):
    """Create, describe, list, drop, append to, read, scan and plan stream-tables, show
    a tenant's tables as an Iceberg catalog does, and keep this gateway among the live
    replicas of its metadata store."""
