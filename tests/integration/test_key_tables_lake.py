"""A primary-key table as engines see it through the Iceberg REST catalog (issue 42):
under its own name the state table (one live row per key, no ``_change``), read by
pyiceberg and DuckDB with nothing but the tenant's key, equal to a model of random
upserts and deletes once tiered; under ``<name>$changelog`` the changelog."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.iceberg_catalog import duckdb_with_extensions, pyiceberg_catalog, tier
from tests.keytables import USER, Key, replay
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

SCHEMA = {"id": "int64", "region": "string", "v": "int64", "note": "string"}


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[GatewayProcess]:
    env = {  # Redis: the tiering job runs beside the gateway
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
    }
    proc = GatewayProcess(Path(tmp_path_factory.mktemp("key-lake")), env).start()
    try:
        yield proc
    finally:
        proc.stop()


def _write(c: Any, table: str, rng: random.Random, model: dict[Key, dict[str, Any]]) -> None:
    for step in range(15):
        rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 30)):
            key = (rng.randrange(50), rng.choice(["eu", "us"]))
            if rng.random() < 0.25:
                rows.append({"id": key[0], "region": key[1], "_change": 3})
                model.pop(key, None)
            else:
                row = {"id": key[0], "region": key[1], "v": step, "note": f"{rng.random()}"}
                rows.append(row)
                model[key] = row
        c.append(table, rows)


def _by_key(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {(r["id"], r["region"]): {n: r[n] for n in USER} for r in rows}
    assert len(out) == len(rows), "a key twice"
    return out


def test_engines_read_the_state_table_under_the_tables_name(gw: GatewayProcess) -> None:
    rng = random.Random(3)
    model: dict[Key, dict[str, Any]] = {}
    with gw.client() as c:
        c.create_table("shop.kv", SCHEMA, partitions=2, primary_key=["id", "region"])
        _write(c, "shop.kv", rng, model)
        tier(gw)
        _write(c, "shop.kv", rng, model)
        tier(gw)
        assert all(p.tiered_watermark > 0 for p in c.describe_table("shop.kv").partition_info)
    catalog = pyiceberg_catalog(gw, token=gw.api_key, **{"scan-planning-mode": "client"})
    assert sorted(catalog.list_tables("shop")) == [("shop", "kv"), ("shop", "kv$changelog")]
    state = catalog.load_table("shop.kv").scan().to_arrow()
    assert "_change" not in state.column_names
    assert _by_key(state.to_pylist()) == model
    changes = catalog.load_table("shop.kv$changelog").scan().to_arrow()
    assert replay(changes.to_pylist()) == model  # everything was tiered
    con = duckdb_with_extensions()
    try:
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{gw.http_url}/iceberg', "
            f"TOKEN '{gw.api_key}')"
        )
        got = con.sql("SELECT * FROM tg.shop.kv").arrow().read_all()
        logged = con.sql('SELECT * FROM tg.shop."kv$changelog"').arrow().read_all()
    finally:
        con.close()
    assert _by_key(got.to_pylist()) == model
    assert replay(logged.to_pylist()) == model
