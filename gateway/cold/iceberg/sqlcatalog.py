"""pyiceberg's SQL catalog, reading each table metadata file once.

A table's metadata file is written once, under a new name at every commit, and never
changed; the catalog's row names the current one. pyiceberg's ``SqlCatalog.load_table``
reads the row, then reads and parses the whole file, every time: most of the cost of
pinning a snapshot for a scan or a read plan (``docs/decisions/lake.md``). This catalog
keeps the last parsed files by location, so a load is the row's lookup, and a file is
parsed again only when a commit has named a new one.

Imported only where the SQL catalog is configured (it imports SQLAlchemy's ORM).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

__all__ = ["METADATA_KEPT", "ParsedOnceSqlCatalog"]

#: Parsed metadata files kept (the tables in use; one file each once nothing commits).
METADATA_KEPT = 256


class ParsedOnceSqlCatalog(SqlCatalog):
    """A :class:`SqlCatalog` whose loads parse a metadata file only the first time they
    meet its location. Each load still returns a new :class:`Table` (its own file IO,
    its metadata replaced on its own commits): only the parsed, immutable metadata
    object is shared."""

    def __init__(self, name: str, **properties: Any) -> None:
        super().__init__(name, **properties)
        self._parsed: OrderedDict[str, TableMetadata] = OrderedDict()
        self._parsed_lock = threading.Lock()

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        location = orm_table.metadata_location
        with self._parsed_lock:
            metadata = self._parsed.get(location) if location else None
            if metadata is not None:
                self._parsed.move_to_end(location)  # type: ignore[arg-type]
        if metadata is None or not orm_table.table_namespace or not orm_table.table_name:
            table = super()._convert_orm_to_iceberg(orm_table)  # reads and checks it
            with self._parsed_lock:
                self._parsed[table.metadata_location] = table.metadata
                while len(self._parsed) > METADATA_KEPT:
                    self._parsed.popitem(last=False)
            return table
        assert location is not None
        return Table(
            identifier=(
                *Catalog.identifier_to_tuple(orm_table.table_namespace),
                orm_table.table_name,
            ),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )
