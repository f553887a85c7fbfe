"""The cold tier on Apache Iceberg through pyiceberg (SQL or REST catalog, local or S3
warehouse): :class:`IcebergColdStore` and its tables. The type mapping is in
:mod:`~gateway.cold.iceberg.schema`, the filter pushdown in
:mod:`~gateway.cold.iceberg.filters`."""

import pyiceberg  # noqa: F401 - the dependency of this backend: fail at load when absent

from gateway.cold.iceberg.schema import arrow_to_iceberg
from gateway.cold.iceberg.store import TABLE_PROPERTIES, IcebergColdStore
from gateway.cold.iceberg.table import IcebergColdTable

__all__ = ["TABLE_PROPERTIES", "IcebergColdStore", "IcebergColdTable", "arrow_to_iceberg"]
