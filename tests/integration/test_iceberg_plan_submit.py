"""Issue 40: submitted scan plans, the per-table planning switch, ``use-snapshot-schema``
and ``min-rows-requested`` (docs/decisions/rest-catalog.md, "Submitted plans").

Two gateway replicas share Redis, the metadata store, the Iceberg catalog and the
warehouse folder, and seal plan ids with one operator key: a plan submitted to one is
answered by the other. ``plan_submit_records`` is 1,000, so a plan with more hot records
to write answers ``submitted`` at once and its files are written in the background; the
tests poll ``fetchPlanningResult`` over HTTP (pyiceberg 0.12 cannot: it raises
NotImplementedError on ``submitted``) and read the files of the completed plan. A replica
is paused (SIGSTOP) to stand for one that died while writing: past the grace time the
other writes what is missing itself.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.iceberg_catalog import (
    SCHEMA,
    Tenant,
    fill,
    lake_job,
    new_tenant,
    pyiceberg_catalog,
    tier,
)
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"
GRACE_S = 4
COLUMNS = ["id", "name", "_partition", "_offset"]
ORDER = [("_partition", "ascending"), ("_offset", "ascending")]


@dataclass
class Pair:
    first: GatewayProcess
    second: GatewayProcess


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("plan-submit")
    redis = RedisServer(root / "redis").start()
    bootstrap = f"t{secrets.token_hex(6)}"
    env = {
        # One table of the bootstrap tenant is planned on the client.
        "TIDEGATE_COLD__REST_CATALOG__CLIENT_PLANNING_TABLES": f'["{bootstrap}/app.off"]',
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis.url,
        "TIDEGATE_METADATA__URL": f"sqlite:///{root / 'metadata.db'}",
        "TIDEGATE_COLD__CATALOG__TYPE": "sql",
        "TIDEGATE_COLD__CATALOG__URI": f"sqlite:///{root / 'catalog.db'}",
        "TIDEGATE_COLD__WAREHOUSE": str(root / "warehouse"),
        "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_submit_{secrets.token_hex(16)}",
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_SUBMIT_RECORDS": "1000",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_SUBMIT_GRACE_S": str(GRACE_S),
    }
    first = GatewayProcess(root / "gw1", env, tenant=bootstrap).start()
    second = GatewayProcess(root / "gw2", env, tenant=first.tenant, api_key=first.api_key)
    try:
        second.start()
        yield Pair(first, second)
    finally:
        second.stop()
        first.stop()
        redis.stop()


def make_table(gw: GatewayProcess, t: Tenant, table: str, hot: int, tiered: int = 10) -> None:
    """``table``: ``tiered`` rows committed to Iceberg, then ``hot`` rows in the hot tier
    (ids in append order, spread over two partitions)."""
    with gw.client(api_key=t.key) as c:
        c.create_table(table, SCHEMA, partitions=2)
    fill(gw, t, table, 0, tiered)
    tier(gw)
    with gw.client(api_key=t.key) as c:
        for start in range(tiered, tiered + hot, 20_000):
            ids = range(start, min(start + 20_000, tiered + hot))
            for p in range(2):
                rows = pa.table(
                    {
                        "id": [i for i in ids if i % 2 == p],
                        "name": [f"n{i}" for i in ids if i % 2 == p],
                    }
                )
                c.append(table, rows, partition=p)


def plan_path(table: str) -> str:
    ns, name = table.split(".")
    return f"{CATALOG}/namespaces/{ns}/tables/{name}/plan"


def plan(h: httpx.Client, table: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = h.post(plan_path(table), json=body or {})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def fetch(h: httpx.Client, table: str, plan_id: str) -> dict[str, Any]:
    r = h.get(f"{plan_path(table)}/{plan_id}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def until_done(h: httpx.Client, table: str, plan_id: str, timeout: float = 90) -> dict[str, Any]:
    """``fetchPlanningResult`` until the plan is no longer ``submitted``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = fetch(h, table, plan_id)
        if answer["status"] != "submitted" or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def rows_of(answer: dict[str, Any]) -> pa.Table:
    """The rows of a completed plan's files (local paths), as an engine reads them."""
    assert answer["status"] == "completed", answer
    assert not answer.get("plan-tasks"), "this table's plans fit in one page"
    paths = [t["data-file"]["file-path"].removeprefix("file://") for t in answer["file-scan-tasks"]]
    return pa.concat_tables([pq.read_table(p, columns=COLUMNS) for p in paths])


def hot_paths(answer: dict[str, Any]) -> list[str]:
    return [
        t["data-file"]["file-path"]
        for t in answer["file-scan-tasks"]
        if "/tidegate-plans/" in t["data-file"]["file-path"]
    ]


def own_scan(gw: GatewayProcess, t: Tenant, table: str) -> list[dict[str, Any]]:
    with gw.client(api_key=t.key) as c:
        rows: list[dict[str, Any]] = c.scan(table, columns=COLUMNS).sort_by(ORDER).to_pylist()
    return rows


def test_a_plan_over_the_bound_is_submitted_then_completed_with_the_gateways_scan(
    pair: Pair,
) -> None:
    gw = pair.first
    t = new_tenant(gw, "s")
    make_table(gw, t, "app.big", hot=6_000)
    with gw.http_client(api_key=t.key) as h:
        first = plan(h, "app.big")
        assert first["status"] == "submitted" and first["plan-id"].startswith("tgplan.")
        assert set(first) == {"status", "plan-id"}
        done = until_done(h, "app.big", first["plan-id"])
        # Its files are there now: a plan of the same tail names them again within its
        # request (nothing left to write), as does fetching the first one again.
        again = plan(h, "app.big")
        refetched = fetch(h, "app.big", first["plan-id"])
        text = h.get("/metrics").text
    expected = own_scan(gw, t, "app.big")
    assert len(expected) == 6_010
    assert rows_of(done).sort_by(ORDER).to_pylist() == expected
    assert again["status"] == "completed"
    assert sorted(hot_paths(again)) == sorted(hot_paths(done)) and len(hot_paths(done)) == 2
    assert rows_of(refetched).sort_by(ORDER).to_pylist() == expected
    assert 'tidegate_iceberg_catalog_plans_total{outcome="submitted"}' in text


def test_pyiceberg_reads_plans_under_the_bound_and_gives_up_on_submitted_ones(pair: Pair) -> None:
    """pyiceberg 0.12 cannot poll a submitted plan; a tail under plan_submit_records (or
    one written by an earlier plan) completes within the request, so it reads it."""
    gw = pair.second
    t = new_tenant(gw, "py")
    make_table(gw, t, "app.small", hot=40)
    got = pyiceberg_catalog(gw, token=t.key).load_table("app.small").scan().to_arrow()
    assert got.select(COLUMNS).sort_by(ORDER).to_pylist() == own_scan(gw, t, "app.small")
    # Over the bound, pyiceberg 0.12 gives up on the submitted answer (what
    # docs/engines.md says, and why plan_submit_records is 0 by default); once the
    # files are written (by the plan it gave up on), its next scan completes at once.
    make_table(gw, t, "app.large", hot=3_000)
    table = pyiceberg_catalog(gw, token=t.key).load_table("app.large")
    with pytest.raises(NotImplementedError, match="Async scan planning not yet supported"):
        table.scan().to_arrow()
    deadline = time.monotonic() + 90
    while True:
        try:
            got = table.scan().to_arrow()
            break
        except NotImplementedError:
            assert time.monotonic() < deadline, "the submitted plan's files never came"
            time.sleep(0.2)
    assert got.select(COLUMNS).sort_by(ORDER).to_pylist() == own_scan(gw, t, "app.large")


def test_a_cancelled_submitted_plan_answers_cancelled(pair: Pair) -> None:
    gw = pair.first
    t = new_tenant(gw, "c")
    make_table(gw, t, "app.gone", hot=6_000)
    with gw.http_client(api_key=t.key) as h:
        first = plan(h, "app.gone")
        assert first["status"] == "submitted"
        assert h.delete(f"{plan_path('app.gone')}/{first['plan-id']}").status_code == 204
        assert fetch(h, "app.gone", first["plan-id"]) == {"status": "cancelled"}
    with pair.second.http_client(api_key=t.key) as h:
        assert fetch(h, "app.gone", first["plan-id"]) == {"status": "cancelled"}


def _paused(gw: GatewayProcess) -> Any:
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGSTOP)
    return gw.proc


def test_another_replica_takes_a_submitted_plan_over_past_the_grace_time(pair: Pair) -> None:
    t = new_tenant(pair.first, "o")
    make_table(pair.first, t, "app.over", hot=60_000)
    with pair.first.http_client(api_key=t.key) as h:
        submitted = plan(h, "app.over")
    proc = _paused(pair.first)  # as if it died while writing the files
    try:
        assert submitted["status"] == "submitted"
        with pair.second.http_client(api_key=t.key) as h:
            assert fetch(h, "app.over", submitted["plan-id"]) == {"status": "submitted"}
            done = until_done(h, "app.over", submitted["plan-id"])
        expected = own_scan(pair.second, t, "app.over")
        assert len(expected) == 60_010
        assert rows_of(done).sort_by(ORDER).to_pylist() == expected
    finally:
        proc.send_signal(signal.SIGCONT)
    # The first replica finishes its own writing too: two files of the same rows, of
    # which a plan names one (the youngest), never both.
    time.sleep(2)
    with pair.second.http_client(api_key=t.key) as h:
        later = fetch(h, "app.over", submitted["plan-id"])
    assert rows_of(later).sort_by(ORDER).to_pylist() == expected


def test_a_submitted_plan_whose_tail_tiering_trimmed_first_failed(pair: Pair) -> None:
    t = new_tenant(pair.first, "f")
    make_table(pair.first, t, "app.moved", hot=60_000)
    with pair.first.http_client(api_key=t.key) as h:
        submitted = plan(h, "app.moved")
    proc = _paused(pair.first)
    try:
        assert submitted["status"] == "submitted"
        # Commits the pinned tail and trims it (hot_retention_s 0); every table, as the
        # paused replica may not have recorded its appends' marks yet.
        lake_job(pair.second, "tier", "--all")
        with pair.second.http_client(api_key=t.key) as h:
            answer = fetch(h, "app.moved", submitted["plan-id"])
    finally:
        proc.send_signal(signal.SIGCONT)
    assert answer["status"] == "failed", answer
    conforms(answer, "FetchPlanningResult")
    assert (
        "plan again: tiering committed part of this plan's hot tail" in (answer["error"]["message"])
    )
    with pair.second.http_client(api_key=t.key) as h:
        fresh = plan(h, "app.moved")  # a new plan reads it all from the lake
    assert rows_of(fresh).sort_by(ORDER).to_pylist() == own_scan(pair.second, t, "app.moved")


# --------------------------------------------------------------------------------------
# The per-table switch: cold.rest_catalog.client_planning_tables
# --------------------------------------------------------------------------------------
def test_a_table_planned_on_the_client_names_its_committed_files_only(pair: Pair) -> None:
    gw = pair.first
    t = Tenant(gw.tenant, gw.api_key or "", "")
    for name in ("app.off", "app.on"):
        make_table(gw, t, name, hot=0)
    for name in ("app.off", "app.on"):
        fill(gw, t, name, 10, 6)  # a hot tail of each, after both tierings
    with gw.http_client() as h:
        off = plan(h, "app.off")
        on = plan(h, "app.on")
        # A local warehouse's table config stays empty (DuckDB reads any config for S3
        # credentials); the catalog's defaults still say server for every other table.
        assert h.get(f"{CATALOG}/namespaces/app/tables/off").json()["config"] == {}
        assert h.get(f"{CATALOG}/config").json()["defaults"] == {"scan-planning-mode": "server"}
        text = h.get("/metrics").text
    assert off["status"] == "completed" and not hot_paths(off)
    assert len(hot_paths(on)) == 2
    assert 'tidegate_iceberg_catalog_plans_total{outcome="committed_only"}' in text
    # pyiceberg asks the server (it reads the mode from the catalog's defaults only):
    # the table off reads what client-side planning reads, the other every row.
    catalog = pyiceberg_catalog(gw, token=t.key)
    committed = catalog.load_table("app.off").scan().to_arrow()
    assert sorted(committed["id"].to_pylist()) == list(range(10))
    live = catalog.load_table("app.on").scan().to_arrow()
    assert live.select(COLUMNS).sort_by(ORDER).to_pylist() == own_scan(gw, t, "app.on")
    # Another tenant's table of the same name is not switched off.
    other = new_tenant(gw, "n")
    make_table(gw, other, "app.off", hot=6)
    with gw.http_client(api_key=other.key) as h:
        assert len(hot_paths(plan(h, "app.off"))) == 2


# --------------------------------------------------------------------------------------
# use-snapshot-schema and min-rows-requested
# --------------------------------------------------------------------------------------
def snapshot_id(gw: GatewayProcess, t: Tenant, table: str) -> int:
    snap = pyiceberg_catalog(gw, token=t.key).load_table(table).current_snapshot()
    assert snap is not None
    return int(snap.snapshot_id)


def test_use_snapshot_schema_resolves_names_in_the_snapshots_schema(pair: Pair) -> None:
    gw = pair.second
    t = new_tenant(gw, "u")
    make_table(gw, t, "app.evolved", hot=0)
    old = snapshot_id(gw, t, "app.evolved")
    with gw.client(api_key=t.key) as c:
        c.alter_schema("app.evolved", [{"op": "add_column", "column": "note", "type": "string"}])
        c.append("app.evolved", [{"id": 10, "name": "n10", "note": "new"}])
    tier(gw)
    new = snapshot_id(gw, t, "app.evolved")
    note = {"type": "not-null", "term": "note"}
    with gw.http_client(api_key=t.key) as h:
        for body in (
            {"snapshot-id": old, "select": ["note"]},
            {"snapshot-id": old, "filter": note},
            {"snapshot-id": old, "stats-fields": ["note"]},
        ):
            # The table's schema (the default): the column added since reads as null.
            assert h.post(plan_path("app.evolved"), json=body).status_code == 200, body
            r = h.post(plan_path("app.evolved"), json={**body, "use-snapshot-schema": True})
            assert r.status_code == 400, (body, r.text)
            message = r.json()["error"]["message"]
            assert "unknown column 'note'" in message, message
            assert f"use-snapshot-schema: the columns of snapshot {old}" in message
            # A snapshot written with the column knows it.
            newer = {**body, "snapshot-id": new, "use-snapshot-schema": True}
            assert h.post(plan_path("app.evolved"), json=newer).status_code == 200, body
        # Without snapshot-id the plan is of the live table, in the table's schema.
        live = {"select": ["note"], "use-snapshot-schema": True}
        assert h.post(plan_path("app.evolved"), json=live).status_code == 200


def test_min_rows_requested_names_files_enough_for_that_many_rows(pair: Pair) -> None:
    gw = pair.second
    t = new_tenant(gw, "m")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.few", SCHEMA, partitions=2)
    for n in range(3):  # three tierings of two partitions: six files of 5 rows
        fill(gw, t, "app.few", 10 * n, 10)
        tier(gw)
    fill(gw, t, "app.few", 30, 8)  # and a hot tail of 4 records per partition
    with gw.http_client(api_key=t.key) as h:
        every = plan(h, "app.few")
        one = plan(h, "app.few", {"min-rows-requested": 1})
        twelve = plan(h, "app.few", {"min-rows-requested": 12})
        tail = plan(h, "app.few", {"min-rows-requested": 33})
        filtered = plan(
            h,
            "app.few",
            {"min-rows-requested": 1, "filter": {"type": "gt", "term": "id", "value": 0}},
        )
        none = plan(h, "app.few", {"min-rows-requested": 0})
        negative = h.post(plan_path("app.few"), json={"min-rows-requested": -1})

    def counts(answer: dict[str, Any]) -> list[int]:
        return [int(t["data-file"]["record-count"]) for t in answer["file-scan-tasks"]]

    assert sum(counts(every)) == 38 and len(hot_paths(every)) == 2
    # The committed files first: one file (5 rows) holds 1 row; three hold 12.
    assert counts(one) == [5] and not hot_paths(one)
    assert counts(twelve) == [5, 5, 5] and not hot_paths(twelve)
    # 30 committed rows, then the first 3 records of partition 0's tail as one file.
    assert sorted(counts(tail)) == [3, 5, 5, 5, 5, 5, 5]
    (cut,) = hot_paths(tail)
    assert "/_partition=0/" in cut and cut.rsplit("/", 1)[1].startswith(f"{15:020d}-{18:020d}-")
    assert rows_of(tail).num_rows == 33
    # With a filter a record count is no count of matching rows: every file is named.
    assert sum(counts(filtered)) == 38
    assert sum(counts(none)) == 38  # 0: no hint
    assert negative.status_code == 400
    assert "min-rows-requested is -1" in negative.json()["error"]["message"]


# --------------------------------------------------------------------------------------
# The answers as the official specification describes them
# --------------------------------------------------------------------------------------
def conforms(answer: dict[str, Any], result: str) -> None:
    """``answer`` validates against the spec's schema that ``result``'s discriminator maps
    its status to (``PlanTableScanResult`` or ``FetchPlanningResult``): a ``oneOf`` whose
    members overlap (a submitted answer also fits ``EmptyPlanningResult``), which the
    discriminator decides, as the spec means it. ``FailedPlanningResult`` is ``allOf``
    ``IcebergErrorResponse`` (``additionalProperties: false``) and ``{status}``, which no
    object satisfies under JSON Schema (``status`` is additional to the first): it is
    checked without that ``additionalProperties``."""
    import jsonschema
    import yaml
    from referencing import Registry, Resource

    from tests.hostile.test_iceberg_spec import SPEC

    doc = yaml.safe_load(SPEC.read_text())
    primitive = doc["components"]["schemas"]["PrimitiveTypeValue"]
    primitive["anyOf"] = primitive.pop("oneOf")  # as tests/hostile/test_iceberg_spec.py
    doc["components"]["schemas"]["IcebergErrorResponse"].pop("additionalProperties")
    mapping = doc["components"]["schemas"][result]["discriminator"]["mapping"]
    ref = mapping[answer["status"]]
    registry: Registry[Any] = Registry().with_resource("spec", Resource.opaque(doc))
    schema = {"$ref": f"spec{ref}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(answer)


def test_submitted_cancelled_and_failed_answers_conform_to_the_specification(
    pair: Pair,
) -> None:
    t = new_tenant(pair.first, "v")
    make_table(pair.first, t, "app.spec", hot=6_000)
    make_table(pair.first, t, "app.undone", hot=6_000)
    with pair.first.http_client(api_key=t.key) as h:
        submitted = plan(h, "app.spec")
        conforms(submitted, "PlanTableScanResult")
        conforms(fetch(h, "app.spec", submitted["plan-id"]), "FetchPlanningResult")
        done = until_done(h, "app.spec", submitted["plan-id"])
        conforms(done, "FetchPlanningResult")
        undone = plan(h, "app.undone")
        h.delete(f"{plan_path('app.undone')}/{undone['plan-id']}")
        cancelled = fetch(h, "app.undone", undone["plan-id"])
        conforms(cancelled, "FetchPlanningResult")
    assert done["status"] == "completed" and cancelled["status"] == "cancelled"
    # A failed answer: test_a_submitted_plan_whose_tail_tiering_trimmed_first_failed.
