"""The Spark connector: ``spark.read``, ``spark.readStream`` and ``df.write`` of Tidegate
stream-tables, on PySpark's Python Data Source API.

    import gateway.spark

    gateway.spark.register(spark)
    df = (
        spark.read.format("tidegate")
        .option("endpoint", "gateway:50051")
        .option("api_key", key)
        .load("shop.orders")
    )

Reads plan on the driver with the gateway's read plan (one pinned Iceberg snapshot plus
the hot range per partition); executors read the data files directly with pyarrow
(presigned URLs on object storage, never the warehouse's keys) and the hot ranges through
the gateway. Writes append through the idempotent producer, exactly once across task
retries. See ``docs/spark.md``.

Needs ``pip install 'tidegate[spark]'`` (PySpark >= 4.2). Imports only
:mod:`gateway.wire`, :mod:`gateway.client`, pyarrow and pyspark.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"gateway.spark needs PySpark: pip install 'tidegate[spark]' ({exc})"
    ) from exc

from gateway.spark._options import SparkOptionError
from gateway.spark._source import TidegateDataSource

__all__ = ["SparkOptionError", "TidegateDataSource", "register"]


def register(spark: Any, *, filter_pushdown: bool = True) -> None:
    """Register the ``tidegate`` format on ``spark``.

    ``filter_pushdown`` sets ``spark.sql.python.filterPushdown.enabled``, which the
    connector needs to prune files. PySpark 4.3 reuses a DataFrame's first pushed-down plan
    for its later queries that push no filter (see docs/spark.md): load one DataFrame per
    query, or pass ``False`` to leave all filtering to Spark.
    """
    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(filter_pushdown).lower())
    spark.dataSource.register(TidegateDataSource)
