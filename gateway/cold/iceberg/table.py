"""One stream-table's Iceberg table: its reads (``reading``), its commits (``commits``)
and its clean-up (``maintenance``) over what they share (``tablebase``)."""

from __future__ import annotations

from gateway.cold.iceberg.commits import TableCommits
from gateway.cold.iceberg.maintenance import TableMaintenance
from gateway.cold.iceberg.reading import TableReads
from gateway.cold.iceberg.summary import METADATA_PROPERTIES
from gateway.cold.iceberg.tablebase import TableHome

__all__ = ["METADATA_PROPERTIES", "IcebergColdTable", "TableHome"]


class IcebergColdTable(TableReads, TableCommits, TableMaintenance):
    """One stream-table's Iceberg table."""
