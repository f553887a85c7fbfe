"""What the Iceberg REST catalog's tests share: tenants with tables, tiering on demand, the
gateway's own view of the tiered rows, and the two engines (pyiceberg, DuckDB) reading
through the catalog with nothing but a tenant's key."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tests.cold.helpers import extension_file
from tests.integration.test_tenancy import Tenant, new_tenant
from tests.services import REPO_ROOT, GatewayProcess, run_cli

__all__ = [
    "SCHEMA",
    "Tenant",
    "duckdb_with_extensions",
    "fill",
    "lake_job",
    "new_tenant",
    "pyiceberg_catalog",
    "rows_of",
    "tier",
    "tiered_rows",
    "watermarks",
]

SCHEMA = {"id": "int64", "name": "string"}
ORDER = [("_partition", "ascending"), ("_offset", "ascending")]


def tier(gw: GatewayProcess) -> str:
    """One tiering pass of every table, as a job beside the gateway (``tidegate tier
    --all``: every table up to its high watermark now, not only those the gateway has
    marked yet, which it does once a second)."""
    return lake_job(gw, "tier", "--all")


def lake_job(gw: GatewayProcess, *argv: str) -> str:
    """``tidegate <argv>`` once, as a job beside the gateway; its output."""
    out = run_cli(argv, gw.env(), REPO_ROOT, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout


def fill(gw: GatewayProcess, t: Tenant, table: str, first: int, count: int) -> None:
    """Append ids ``first .. first+count-1`` spread over both partitions."""
    with gw.client(api_key=t.key) as c:
        for p in range(2):
            ids = range(first + p, first + count, 2)
            c.append(table, [{"id": i, "name": f"{t.name}-{i}"} for i in ids], partition=p)


def watermarks(load_result: dict[str, Any]) -> dict[int, int]:
    """``tidegate.watermarks`` of the current snapshot of a ``loadTable`` answer."""
    meta = load_result["metadata"]
    current = meta.get("current-snapshot-id")
    for snap in meta.get("snapshots", []):
        if snap["snapshot-id"] == current:
            raw = snap["summary"].get("tidegate.watermarks", "{}")
            return {int(k): int(v) for k, v in json.loads(raw).items()}
    return {}


def tiered_rows(gw: GatewayProcess, t: Tenant, table: str, marks: dict[int, int]) -> pa.Table:
    """The gateway's own scan of ``table`` cut to the offsets below ``T(p)``: the rows an
    engine reading the Iceberg table must see, in (_partition, _offset) order."""
    with gw.client(api_key=t.key) as c:
        rows = c.scan(table)
    keep = pa.array([False] * rows.num_rows)
    for p, mark in marks.items():
        here = pc.and_(pc.equal(rows["_partition"], p), pc.less(rows["_offset"], mark))
        keep = pc.or_(keep, here)
    return rows.filter(keep).sort_by(ORDER)


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """Rows for comparison across readers: the same columns, by (_partition, _offset)."""
    names = ["id", "name", "_partition", "_offset", "_timestamp"]
    return table.select(names).sort_by(ORDER).to_pylist()


def pyiceberg_catalog(gw: GatewayProcess, **auth: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog("tidegate", uri=f"{gw.http_url}/iceberg", **auth)


def duckdb_with_extensions() -> Any:
    """A DuckDB connection with the Iceberg extension and what it needs, installed from
    their PyPI packages (no download)."""
    import duckdb

    con = duckdb.connect()
    for name in ("avro", "httpfs", "aws", "iceberg"):
        con.execute(f"INSTALL '{extension_file(name)}'")
        con.execute(f"LOAD {name}")
    return con
