"""The data source ``tidegate`` and its batch reader."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from gateway.client import TableInfo
from gateway.spark._options import Options
from gateway.spark._plan import fetch_plan
from gateway.spark._pushdown import bounds_of, translate
from gateway.spark._splits import ReadSpec, plan_splits, read_spec, read_split
from gateway.wire.errors import SchemaMismatch
from gateway.wire.filters import And

__all__ = ["TidegateDataSource", "TidegatePythonSource", "TidegateReader"]


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of Arrow columns (naive timestamps as TIMESTAMP_NTZ)."""
    out: StructType = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    return out


class TidegateReader(DataSourceReader):
    """Batch reads of one pinned view: one split per data file (or group of small files up
    to ``split_bytes``) plus one per hot range, filters pushed to the plan and the rows."""

    def __init__(self, options: Options, schema: StructType, info: TableInfo | None = None) -> None:
        self.spec, self.table_partitions = read_spec(options, schema, info)
        self.as_of = options.get("as_of")
        self.split_bytes = options.integer("split_bytes", 128 << 20)
        self.min_partitions = options.integer("min_partitions", 2)
        self.hot_split_records = options.integer("hot_split_records", 1_000_000)

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        pushed, rest = translate(filters, self.spec.stored)
        if pushed is not None:
            current = self.spec.filter
            combined = pushed if current is None else And((current, pushed))
            self.spec = replace(self.spec, filter=combined)
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        from gateway.wire.filters import bind

        if self.spec.keyed:
            return self._state_partitions()
        plan = fetch_plan(self.spec.connection, self.spec.filter, self.as_of)
        check_schema(self.spec, plan.schema)
        bounds = bounds_of(
            None if self.spec.filter is None else bind(self.spec.filter, self.spec.stored)
        )
        splits = plan_splits(
            plan.files,
            plan.hot_splits(bounds),
            split_bytes=self.split_bytes,
            min_partitions=self.min_partitions,
            hot_split_records=self.hot_split_records,
        )
        # Spark wants at least one partition; an empty one reads nothing.
        return splits or [InputPartition(None)]

    def _state_partitions(self) -> Sequence[InputPartition]:
        """A key table's current state: no read plan (its hot ranges are changes, not
        rows), one split per table partition scanned by the gateway."""
        from gateway.spark._state import state_splits
        from gateway.wire.filters import bind

        bounds = bounds_of(
            None if self.spec.filter is None else bind(self.spec.filter, self.spec.stored)
        )
        splits = state_splits(self.table_partitions, bounds, self.as_of)
        return splits or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if type(partition) is InputPartition:
            return iter(())
        from gateway.spark._state import StateSplit, read_state

        if isinstance(partition, StateSplit):
            return read_state(self.spec, partition)
        return read_split(self.spec, partition)


def check_schema(spec: ReadSpec, current: pa.Schema) -> None:
    """Refuse, in one sentence, to read a column whose type has changed (or that is gone)
    since the read's schema was described: Spark's schema of the DataFrame is that one."""
    for name in spec.columns:
        was = spec.stored.field(name).type
        now = current.field(name).type if name in current.names else None
        if now is None or not now.equals(was):
            change = "is gone" if now is None else f"is {now} now, was {was}"
            raise SchemaMismatch(
                f"tidegate: the schema of {spec.connection.table} changed since the "
                f"DataFrame was loaded (column {name!r} {change}); load it again"
            )


class TidegateDataSource(DataSource):
    """``spark.read.format("tidegate")``: see :mod:`gateway.spark`."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        #: The table as described for :meth:`schema` (at ``load()``). Spark pickles the
        #: source after that call and hands the copy to every planning of the DataFrame,
        #: so planning a query does not describe the table again; the read plan's schema
        #: tells whether it changed since (:func:`check_schema`).
        self.described: TableInfo | None = None

    @classmethod
    def name(cls) -> str:
        return "tidegate"

    def schema(self) -> StructType:
        options = Options(self.options)
        self.described = options.connection().table_info()
        spec, _ = read_spec(options, info=self.described)
        return spark_schema(spec.output)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidegateReader(Options(self.options), schema, self.described)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from gateway.spark._stream import TidegateStreamReader

        return TidegateStreamReader(Options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from gateway.spark._write import TidegateWriter, check_mode

        check_mode(overwrite)
        return TidegateWriter(Options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from gateway.spark._write import TidegateStreamWriter, check_mode

        check_mode(overwrite)
        return TidegateStreamWriter(Options(self.options), schema)


class TidegatePythonSource(TidegateDataSource):
    """The Python source under its own name, ``tidegate_python``: a way to pick this
    implementation when the jar is on the session."""

    @classmethod
    def name(cls) -> str:
        return "tidegate_python"
