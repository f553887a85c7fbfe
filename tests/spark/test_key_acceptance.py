"""Issue 42's acceptance on both hot tiers: random upserts and deletes over many keys in
rounds, tiered and compacted between them, with the gateway killed (-9) and restarted
twice; then every reader equals a model replaying the acknowledged changes: the
gateway's scan and point lookups and the JVM Spark connector with the last round still
hot, and, once that is tiered too, pyiceberg and DuckDB through the REST catalog (the
state table under the table's name), and the changelog replayed from the gateway and from
``<name>$changelog``."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from tests.integration.iceberg_catalog import duckdb_with_extensions, pyiceberg_catalog
from tests.keytables import USER, Key, replay
from tests.spark.conftest import SOURCES, LakeGateway
from tests.spark.test_key_read import SCHEMA, _tier, _write_round
from tests.spark.test_read import spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

PARTITIONS = 3
ROUNDS = 5
#: After which rounds the gateway is killed (-9) and started again, before tiering.
KILLS = {1, 3}
#: After which rounds (once tiered) the table and its state table are compacted.
COMPACTIONS = {2, 3}


def _compact(lake: LakeGateway, table: str, disk: bool) -> int:
    """Compact ``table`` (its changelog, then its state table) as ``tidegate compact``
    does, in this process; the files it replaced."""
    from gateway.lake.compaction import compact_table
    from gateway.lake.components import Components
    from gateway.lake.keyed import compact_state

    ns, name = table.split(".")
    if disk:  # the jobs open the disk hot tier, which its gateway holds
        lake.gateway.stop()
    try:
        with Components.open(lake.settings) as c:
            d = c.meta.get_table(lake.gateway.tenant, ns, name)
            state = compact_state(c, d).removed  # the state table alone, then both
            return state + compact_table(c, d).removed
    finally:
        if disk:
            lake.gateway.start()


def _users(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {(r["id"], r["region"]): {n: r[n] for n in USER} for r in rows}
    assert len(out) == len(rows), "a key read twice"
    return out


def _check_gateway(lake: LakeGateway, table: str, model: dict[Key, dict[str, Any]]) -> None:
    """The scan, lookups of every key ever written, and the changelog replayed."""
    live = sorted(model)
    dead = [(k, r) for k in range(75) for r in ("eu", "us") if (k, r) not in model]
    with lake.gateway.client() as c:
        assert _users(c.scan(table).to_pylist()) == model
        found = c.get(table, [{"id": k, "region": r} for k, r in live + dead])
        assert _users(found.to_pylist()) == model  # deleted keys are not found
        changes = [
            r
            for p in range(PARTITIONS)
            for r in c.read(table, partition=p, offset=0, max_records=100_000).to_pylist()
        ]
    assert replay(changes) == model


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_upserts_and_deletes_through_kills_tiering_and_compaction_read_as_the_model(
    kind: str, request: pytest.FixtureRequest, tg_spark: Any
) -> None:
    disk = kind == "disk"
    lake: LakeGateway = request.getfixturevalue("disk_lake" if disk else "lake")
    table = f"keyaccept{uuid.uuid4().hex[:8]}.kv"
    rng = random.Random(4242)
    model: dict[Key, dict[str, Any]] = {}
    with lake.gateway.client() as c:
        c.create_table(table, SCHEMA, partitions=PARTITIONS, primary_key=["id", "region"])
    compacted = 0
    for step in range(ROUNDS):
        _write_round(lake, table, model, rng, step)
        if step in KILLS:
            lake.gateway.kill()
            lake.gateway.start()
        if step < ROUNDS - 1:  # the last round stays in the hot tier
            _tier(lake, table, disk)
        if step in COMPACTIONS:
            compacted += _compact(lake, table, disk)
    assert compacted > 0, "no compaction rewrote anything"
    with lake.gateway.client() as c:
        info = c.describe_table(table).partition_info
    assert all(0 < p.tiered_watermark < p.high_watermark for p in info), info

    # Stitched: state files and the hot tail above them.
    _check_gateway(lake, table, model)
    df = tg_spark.read.format(SOURCES["jvm"]).options(**lake.options(table)).load()
    assert _users(spark_rows(df)) == model

    # Everything tiered: what engines reading the catalog see is the whole table.
    _tier(lake, table, disk)
    _check_gateway(lake, table, model)
    ns, name = table.split(".")
    catalog = pyiceberg_catalog(
        lake.gateway, token=lake.gateway.api_key, **{"scan-planning-mode": "client"}
    )
    state = catalog.load_table(table).scan().to_arrow()
    assert "_change" not in state.column_names
    assert _users(state.to_pylist()) == model
    assert replay(catalog.load_table(f"{table}$changelog").scan().to_arrow().to_pylist()) == model
    con = duckdb_with_extensions()
    try:
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{lake.gateway.http_url}/iceberg', "
            f"TOKEN '{lake.gateway.api_key}')"
        )
        got = con.sql(f"SELECT * FROM tg.{ns}.{name}").arrow().read_all()
        logged = con.sql(f'SELECT * FROM tg.{ns}."{name}$changelog"').arrow().read_all()
    finally:
        con.close()
    assert _users(got.to_pylist()) == model
    assert replay(logged.to_pylist()) == model
    df = tg_spark.read.format(SOURCES["jvm"]).options(**lake.options(table)).load()
    assert _users(spark_rows(df)) == model
