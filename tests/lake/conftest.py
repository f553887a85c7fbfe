"""Tiering tests: real hot tiers (disk, and the session's redis-server), a real Iceberg
SQL catalog on SQLite with a local warehouse, and one local[2] SparkSession per session."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.config import Settings
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.meta import TableDef
from gateway.wire.codec import encode_batch
from gateway.wire.errors import NotFound
from gateway.wire.jsonrows import rows_to_batch
from gateway.wire.schema import parse_fields
from tests.conftest import hot_settings
from tests.services import RedisServer

FIELDS = [
    {"name": "k", "type": "string", "nullable": True},
    {"name": "n", "type": "int64", "nullable": True},
]


def tier_settings(kind: str, tmp_path: Path, redis: RedisServer | None, **tiering: Any) -> Settings:
    base = hot_settings(kind, tmp_path, redis)
    values = base.model_dump()
    values["tiering"] = {"hot_retention_s": 0, **tiering}
    # The retention tests apply a retention right after setting it (one process).
    values["retention"] = {"settle_s": 0}
    return Settings.explicit(**values)


class Harness:
    """Backends of one data folder, plus the few moves tests need."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.c = Components.open(settings)

    def close(self) -> None:
        self.c.close()

    def create_table(
        self, partitions: int = 2, tenant: str | None = None, fields: Sequence[Any] = FIELDS
    ) -> TableDef:
        tenant = tenant or f"t{uuid.uuid4().hex[:8]}"
        self.c.meta.ensure_tenant(tenant)
        d = self.c.meta.create_table(
            tenant, "ns", f"tb{uuid.uuid4().hex[:8]}", list(fields), partitions
        )
        try:
            self.c.cold.table(d).snapshot()
        except NotFound:
            self.c.cold.create_table(d, parse_fields(list(fields)))
        return d

    def append(self, d: TableDef, partition: int, rows: list[dict[str, Any]]) -> int:
        batch = rows_to_batch(rows, parse_fields(d.fields, stored=True))
        res = self.c.hot.append(
            PartitionId(d.tenant, d.table_id, partition),
            encode_batch(batch),
            batch.num_rows,
            time.time_ns() // 1000,
        )
        # What the gateway records of what it acknowledged: the lake jobs' marks.
        self.c.meta.record_appends(
            {d.table_id: {partition: (res.base_offset + res.count, dt.datetime.now(dt.UTC))}}
        )
        return res.base_offset

    def cold_rows(self, d: TableDef) -> list[dict[str, Any]]:
        table = self.c.cold.table(d)
        snap = table.snapshot()
        batches = list(table.scan(snap))
        if not batches:
            return []
        rows = pa.Table.from_batches(batches).to_pylist()
        return sorted(rows, key=lambda r: (r["_partition"], r["_offset"]))

    def watermarks(self, d: TableDef) -> dict[int, int]:
        return dict(self.c.cold.table(d).snapshot().watermarks)


@pytest.fixture(params=["disk", "redis"])
def hot_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def harness(hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    redis = request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    h = Harness(tier_settings(hot_kind, tmp_path, redis))
    try:
        yield h
    finally:
        h.close()
