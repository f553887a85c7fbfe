"""Issue 40: server-side scan planning in the Iceberg REST catalog, hot tail included.

pyiceberg 0.12's ``RestCatalog`` with ``scan-planning-mode=server``, given only a tenant's
key, reads exactly what the gateway's own scan answers (tiered rows and the hot tail),
with a filter and a projection, on both hot tiers and a folder warehouse; rows appended
just before are in; appends and tiering running meanwhile never make a row missing or
repeated. Plan ids are bound to the tenant and the table; forged or foreign ones, and any
plan task, answer as unknown.

One gateway per hot tier. The Redis one has no embedded tiering (``tidegate tier`` runs
when a test says), so its tables keep a hot tail as long as a test needs; the disk one
owns its hot tier, so it tiers on its own every second: there the hot tail moves into
Iceberg under the tests, and the tests that look at a given tail's files run on Redis only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from tests.integration.iceberg_catalog import (
    SCHEMA,
    Tenant,
    duckdb_with_extensions,
    fill,
    lake_job,
    new_tenant,
    pyiceberg_catalog,
    tier,
)
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"
ORDER = [("_partition", "ascending"), ("_offset", "ascending")]


@pytest.fixture(scope="module", params=["redis", "disk"])
def gw(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": request.param,
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_PAGE_FILES": "3",  # plans of 4+ files page
        # The tests count data files: the embedded compaction (first run 600 s after the
        # start, which a module on a loaded machine outlasts) would merge them under them.
        "TIDEGATE_COMPACTION__ENABLED": "false",
    }
    if request.param == "redis":
        env.update({"TIDEGATE_HOT__URL": redis_server.url, "TIDEGATE_TIERING__ENABLED": "false"})
    else:
        env.update({"TIDEGATE_TIERING__ENABLED": "true", "TIDEGATE_TIERING__INTERVAL_S": "1"})
    proc = GatewayProcess(tmp_path_factory.mktemp(f"iceberg-plans-{request.param}"), env)
    proc.kind = request.param  # type: ignore[attr-defined]
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def tier_now(gw: GatewayProcess, t: Tenant, table: str) -> None:
    """One tiering pass (Redis), or the disk gateway's own tiering caught up with the
    table's high watermarks."""
    if gw.kind == "redis":  # type: ignore[attr-defined]
        tier(gw)
        return
    ns, name = table.split(".")
    deadline = time.monotonic() + 60
    with gw.http_client(api_key=t.key) as h:
        while time.monotonic() < deadline:
            parts = h.get(f"/v1/tables/{ns}/{name}").json()["partition_info"]
            if all(p["tiered_watermark"] == p["high_watermark"] for p in parts):
                return
            time.sleep(0.2)
    raise AssertionError(f"{table} was not tiered within 60 s")


#: Tests that need a hot tail that stays put run on the Redis gateway only: the disk
#: gateway tiers every second, so its tail moves under them (not a skip: not collected).
redis_only = pytest.mark.parametrize("gw", ["redis"], indirect=True)


def server_planning(gw: GatewayProcess, key: str) -> Any:
    return pyiceberg_catalog(gw, token=key, **{"scan-planning-mode": "server"})


def plan(h: httpx.Client, table: str, body: dict[str, Any] | None = None) -> httpx.Response:
    ns, name = table.split(".")
    return h.post(f"{CATALOG}/namespaces/{ns}/tables/{name}/plan", json=body or {})


def keyed(rows: pa.Table) -> list[tuple[int, int]]:
    return sorted(zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True))


def own_scan(gw: GatewayProcess, t: Tenant, table: str, **kw: Any) -> pa.Table:
    with gw.client(api_key=t.key) as c:
        return c.scan(table, **kw)


@pytest.fixture(scope="module")
def tiered(gw: GatewayProcess) -> Tenant:
    """shop.orders: 10 rows tiered, then 6 hot."""
    t = new_tenant(gw, "p")
    with gw.client(api_key=t.key) as c:
        c.create_table("shop.orders", SCHEMA, partitions=2)
    fill(gw, t, "shop.orders", 0, 10)
    tier_now(gw, t, "shop.orders")
    fill(gw, t, "shop.orders", 10, 6)
    return t


def test_config_and_load_table_ask_for_server_planning(gw: GatewayProcess, tiered: Tenant) -> None:
    with gw.http_client(api_key=tiered.key) as h:
        config = h.get(f"{CATALOG}/config").json()
    endpoints = config["endpoints"]
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan" in endpoints
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/tasks" in endpoints
    assert config["defaults"] == {"scan-planning-mode": "server"}
    # pyiceberg plans on the server by default, and on the client when told so.
    assert pyiceberg_catalog(gw, token=tiered.key).supports_server_side_planning()
    client = pyiceberg_catalog(gw, token=tiered.key, **{"scan-planning-mode": "client"})
    assert not client.supports_server_side_planning()


def test_pyiceberg_reads_exactly_the_gateways_scan_with_filter_and_projection(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    from pyiceberg.expressions import GreaterThanOrEqual

    catalog = server_planning(gw, tiered.key)
    table = catalog.load_table("shop.orders")
    columns = ("name", "_partition", "_offset")
    got = table.scan(row_filter=GreaterThanOrEqual("id", 3), selected_fields=columns).to_arrow()
    expected = own_scan(gw, tiered, "shop.orders", columns=list(columns), filter="id >= 3")
    assert got.column_names == list(columns)
    assert expected.num_rows == 13  # 7 tiered, 6 hot
    assert got.sort_by(ORDER).to_pylist() == expected.sort_by(ORDER).to_pylist()
    if gw.kind != "redis":  # type: ignore[attr-defined]
        return
    # Client-side planning reads the committed rows only.
    client = pyiceberg_catalog(gw, token=tiered.key, **{"scan-planning-mode": "client"})
    committed = client.load_table("shop.orders").scan()
    assert committed.to_arrow().num_rows == 10


@redis_only
def test_duckdb_plans_on_the_client_and_reads_the_tiered_rows(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    """What docs/engines.md says of DuckDB: its extension (1.4) does not call the plan
    route, even when the catalog asks for server-side planning."""
    con = duckdb_with_extensions()
    try:
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{gw.http_url}/iceberg', "
            f"TOKEN '{tiered.key}')"
        )
        got = con.sql("SELECT _partition, _offset FROM tg.shop.orders").fetchall()
    finally:
        con.close()
    assert sorted(got) == [(p, o) for p in range(2) for o in range(5)]  # the 10 tiered


@redis_only
def test_the_hot_tail_is_files_written_once_and_extended(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    t = new_tenant(gw, "x")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.tail", SCHEMA, partitions=1)
        c.append("app.tail", [{"id": i, "name": f"n{i}"} for i in range(5)])
    with gw.http_client(api_key=t.key) as h:
        first = plan(h, "app.tail").json()
        again = plan(h, "app.tail").json()
        with gw.client(api_key=t.key) as c:
            c.append("app.tail", [{"id": i, "name": f"n{i}"} for i in range(5, 8)])
        grown = plan(h, "app.tail").json()
        text = h.get("/metrics").text
    paths = [[task["data-file"]["file-path"] for task in p["file-scan-tasks"]]
             for p in (first, again, grown)]  # fmt: skip
    assert 'tidegate_iceberg_catalog_plans_total{outcome="completed"}' in text
    (written,) = [line for line in text.splitlines()
                  if line.startswith("tidegate_iceberg_catalog_plan_hot_bytes_total ")]  # fmt: skip
    assert float(written.split()[1]) > 0
    assert len(paths[0]) == 1 and "/tidegate-plans/" in paths[0][0]
    assert paths[1] == paths[0]  # named again, not rewritten
    assert paths[2][0] == paths[0][0] and len(paths[2]) == 2  # only [5, 8) is new
    assert paths[2][1].rsplit("/", 1)[1].startswith(f"{5:020d}-{8:020d}-")
    data = grown["file-scan-tasks"][1]["data-file"]
    assert data["record-count"] == 3 and data["partition"] == [0]
    assert data["content"] == "data" and data["file-format"] == "parquet"


def test_stats_fields_give_bounds(gw: GatewayProcess, tiered: Tenant) -> None:
    with gw.http_client(api_key=tiered.key) as h:
        r = plan(h, "shop.orders", {"stats-fields": ["id"]}).json()
    ids = set()
    for task in r["file-scan-tasks"]:
        f = task["data-file"]
        ids.update(f["lower-bounds"]["keys"])
        lo, hi = f["lower-bounds"]["values"][0], f["upper-bounds"]["values"][0]
        assert isinstance(lo, int) and lo <= hi
        assert f["value-counts"]["keys"] == f["lower-bounds"]["keys"]
    assert len(ids) == 1  # the id column's field id, nothing else


@redis_only
def test_a_filter_prunes_files_of_both_tiers(gw: GatewayProcess, tiered: Tenant) -> None:
    with gw.http_client(api_key=tiered.key) as h:
        everything = plan(h, "shop.orders").json()["file-scan-tasks"]
        one = {"type": "eq", "term": "_partition", "value": 1}
        pruned = plan(h, "shop.orders", {"filter": one}).json()["file-scan-tasks"]
    assert {t["data-file"]["partition"][0] for t in everything} == {0, 1}
    assert {t["data-file"]["partition"][0] for t in pruned} == {1}


def test_time_travel_plans_the_committed_files_only(gw: GatewayProcess, tiered: Tenant) -> None:
    catalog = server_planning(gw, tiered.key)
    table = catalog.load_table("shop.orders")
    snap = table.current_snapshot()
    assert snap is not None
    rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
    expected = own_scan(gw, tiered, "shop.orders", as_of=snap.snapshot_id)
    assert keyed(rows) == keyed(expected) and len(keyed(rows)) >= 10


def test_rows_appended_just_before_are_in_the_plan(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "f")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.live", SCHEMA, partitions=2)
    catalog = server_planning(gw, t.key)
    for i in range(3):
        fill(gw, t, "app.live", 4 * i, 4)
        rows = catalog.load_table("app.live").scan().to_arrow()
        assert sorted(rows["id"].to_pylist()) == list(range(4 * i + 4))


def test_load_table_answers_304_while_the_table_is_unchanged(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "etag")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.tagged", SCHEMA, partitions=2)
    fill(gw, t, "app.tagged", 0, 4)
    tier_now(gw, t, "app.tagged")
    path = f"{CATALOG}/namespaces/app/tables/tagged"
    with gw.http_client(api_key=t.key) as h:
        first = h.get(path)
        etag = first.headers["ETag"]
        again = h.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.headers["ETag"] == etag and not again.content
        other = h.get(path, headers={"If-None-Match": '"something-else"'})
        assert other.status_code == 200 and other.json() == first.json()
        fill(gw, t, "app.tagged", 4, 2)
        tier_now(gw, t, "app.tagged")  # a new snapshot: a new metadata file, a new ETag
        moved = h.get(path, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["ETag"] != etag
    assert moved.json()["metadata-location"] != first.json()["metadata-location"]


def test_appends_and_tiering_meanwhile_never_miss_or_repeat_a_row(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "c")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.busy", SCHEMA, partitions=2)
    fill(gw, t, "app.busy", 0, 20)
    stop = threading.Event()
    acked = [20]
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            while not stop.is_set():
                fill(gw, t, "app.busy", acked[0], 10)
                acked[0] += 10
                time.sleep(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def tierer() -> None:
        try:
            while not stop.is_set():
                tier(gw)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=appender)]
    if gw.kind == "redis":  # type: ignore[attr-defined]
        threads.append(threading.Thread(target=tierer))  # the disk gateway tiers itself
    for th in threads:
        th.start()
    catalog = server_planning(gw, t.key)
    snapshots = set()
    try:
        # Plans for 3 s at least, and on until tiering committed under them (it was 10 s:
        # the Redis gateway's tiering job ran back to back all that time).
        deadline = time.monotonic() + 3
        plans = 0
        while time.monotonic() < deadline or len(snapshots) < 2 or plans < 3:
            before = acked[0]
            table = catalog.load_table("app.busy")
            rows = table.scan().to_arrow()
            snap = table.current_snapshot()
            snapshots.add(snap.snapshot_id if snap else None)
            keys = keyed(rows)
            assert len(keys) == len(set(keys)), "a row is repeated"
            for p in range(2):
                offsets = [o for q, o in keys if q == p]
                assert offsets == list(range(len(offsets))), f"partition {p} has a gap"
            ids = set(rows["id"].to_pylist())
            assert set(range(before)) <= ids, "an acknowledged row is missing"
            plans += 1
            assert time.monotonic() < deadline + 60
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors
    assert plans >= 3 and len(snapshots) >= 2  # tiering committed while plans ran


def test_plan_ids_and_tasks_are_bound_to_the_tenant_and_table(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    other = new_tenant(gw, "o")
    with gw.client(api_key=other.key) as c:
        c.create_table("shop.orders", SCHEMA, partitions=2)
        c.create_table("shop.other", SCHEMA, partitions=2)
    fill(gw, other, "shop.orders", 0, 2)
    base = f"{CATALOG}/namespaces/shop/tables"
    with gw.http_client(api_key=tiered.key) as h:
        r = plan(h, "shop.orders")
        assert r.status_code == 200 and r.json()["status"] == "completed"
        plan_id = r.json()["plan-id"]
        fetched = h.get(f"{base}/orders/plan/{plan_id}").json()
        assert fetched.get("status") == "completed", fetched
        assert len(fetched["file-scan-tasks"]) == len(r.json()["file-scan-tasks"])
        assert len(fetched.get("plan-tasks", [])) == len(r.json().get("plan-tasks", []))
        forged = plan_id[:-4] + ("AAAA" if not plan_id.endswith("AAAA") else "BBBB")
        for pid in (forged, "nope", "tgplan." + "A" * 60):
            bad = h.get(f"{base}/orders/plan/{pid}")
            assert bad.status_code == 404
            assert bad.json()["error"]["type"] == "NoSuchPlanIdException"
        for forged_task in (plan_id, "tgplan.AAAA", "x"):  # a plan id is not a plan task
            task = h.post(f"{base}/orders/tasks", json={"plan-task": forged_task})
            assert task.status_code == 404
            assert task.json()["error"]["type"] == "NoSuchPlanTaskException"
        assert h.delete(f"{base}/orders/plan/{plan_id}").status_code == 204
        assert h.get(f"{base}/orders/plan/{plan_id}").json() == {"status": "cancelled"}
        second = plan(h, "shop.orders").json()["plan-id"]
        # Another tenant's table, under names this tenant does not have.
        nope = plan(h, "shop.other")
        assert nope.status_code == 404
        assert nope.json()["error"]["type"] == "NoSuchTableException"
    with gw.http_client(api_key=other.key) as h:
        # The other tenant's own table of the same name: the plan is not its.
        for method in ("GET", "DELETE"):
            r = h.request(method, f"{base}/orders/plan/{second}")
            assert r.status_code == 404
            assert r.json()["error"]["type"] == "NoSuchPlanIdException"
        r = h.get(f"{base}/other/plan/{second}")
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "NoSuchPlanIdException"


@redis_only
def test_a_large_plan_comes_in_pages_of_plan_tasks(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "g")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.pages", SCHEMA, partitions=2)
    for n in range(4):  # four tierings of two partitions: eight data files
        fill(gw, t, "app.pages", 10 * n, 10)
        tier(gw)
    fill(gw, t, "app.pages", 40, 4)  # and a hot tail
    one = {"type": "lt", "term": "id", "value": 30}
    with gw.http_client(api_key=t.key) as h:
        answer = plan(h, "app.pages", {"filter": one, "stats-fields": ["id"]}).json()
        first = answer["file-scan-tasks"]
        # The hot files hold ids 40 to 43 only: pruned by their stats, as are the four
        # data files of ids 30 to 39; six data files are left, three per page.
        assert len(answer["plan-tasks"]) == 1 and len(first) == 3
        pages = [
            h.post(f"{CATALOG}/namespaces/app/tables/pages/tasks", json={"plan-task": task})
            for task in answer["plan-tasks"]
        ]
        assert all(p.status_code == 200 for p in pages)
        rest = [f for p in pages for f in p.json()["file-scan-tasks"]]
        # Another tenant cannot use the task on its own table of that name.
        other = new_tenant(gw, "h")
        with gw.client(api_key=other.key) as c:
            c.create_table("app.pages", SCHEMA, partitions=2)
    with gw.http_client(api_key=other.key) as h:
        r = h.post(
            f"{CATALOG}/namespaces/app/tables/pages/tasks",
            json={"plan-task": answer["plan-tasks"][0]},
        )
        assert r.status_code == 404
    paths = [f["data-file"]["file-path"] for f in first + rest]
    assert len(paths) == len(set(paths)) == 6
    assert not any("/tidegate-plans/" in p for p in paths)
    assert all("lower-bounds" in f["data-file"] for f in rest)
    catalog = server_planning(gw, t.key)
    from pyiceberg.expressions import LessThan

    got = catalog.load_table("app.pages").scan(row_filter=LessThan("id", 30)).to_arrow()
    assert sorted(got["id"].to_pylist()) == list(range(30))
    every = catalog.load_table("app.pages").scan().to_arrow()
    assert sorted(every["id"].to_pylist()) == list(range(44))


def test_bad_plan_requests_are_one_sentence(gw: GatewayProcess, tiered: Tenant) -> None:
    with gw.http_client(api_key=tiered.key) as h:
        for body, words in (
            ({"select": ["nope"]}, "unknown column 'nope'"),
            ({"filter": {"type": "gt", "term": "nope", "value": 1}}, "unknown column 'nope'"),
            ({"filter": {"type": "gt", "term": "id", "value": "x"}}, "column 'id' is int64"),
            ({"filter": {"type": "bogus"}}, "unknown expression type 'bogus'"),
            ({"start-snapshot-id": 1}, "needs both start-snapshot-id and end-snapshot-id"),
            ({"end-snapshot-id": 1}, "needs both start-snapshot-id and end-snapshot-id"),
            (
                {"snapshot-id": 1, "start-snapshot-id": 1, "end-snapshot-id": 2},
                "cannot be given with start-snapshot-id",
            ),
            ({"stats-fields": ["nope"]}, "unknown column 'nope'"),
        ):
            r = plan(h, "shop.orders", body)
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["type"] == "BadRequestException" and words in err["message"], err
        r = plan(h, "shop.orders", {"snapshot-id": 12345})
        assert r.status_code == 404, r.text


def snapshot_id(gw: GatewayProcess, t: Tenant, table: str) -> int:
    snap = pyiceberg_catalog(gw, token=t.key).load_table(table).current_snapshot()
    assert snap is not None
    return int(snap.snapshot_id)


def read_tasks(tasks: Any) -> pa.Table:
    """The rows of pyiceberg's file scan tasks (local Parquet files, read as they are)."""
    import pyarrow.parquet as pq

    tables = [pq.read_table(t.file.file_path.removeprefix("file://")) for t in tasks]
    return pa.concat_tables(tables) if tables else pa.table({"_partition": [], "_offset": []})


def test_incremental_plans_name_the_appends_between_two_tierings(gw: GatewayProcess) -> None:
    from pyiceberg.catalog.rest.scan_planning import PlanTableScanRequest

    t = new_tenant(gw, "inc")
    with gw.client(api_key=t.key) as c:
        c.create_table("app.inc", SCHEMA, partitions=2)
    fill(gw, t, "app.inc", 0, 10)
    tier_now(gw, t, "app.inc")
    first = snapshot_id(gw, t, "app.inc")
    fill(gw, t, "app.inc", 10, 7)
    tier_now(gw, t, "app.inc")
    second = snapshot_id(gw, t, "app.inc")
    fill(gw, t, "app.inc", 17, 3)  # hot (on Redis): in no snapshot, so in no increment
    catalog = server_planning(gw, t.key)
    request = PlanTableScanRequest(start_snapshot_id=first, end_snapshot_id=second)
    rows = read_tasks(catalog.plan_scan("app.inc", request))
    at_first = set(keyed(own_scan(gw, t, "app.inc", as_of=first)))
    at_second = set(keyed(own_scan(gw, t, "app.inc", as_of=second)))
    assert keyed(rows) == sorted(at_second - at_first)
    assert sorted(rows["id"].to_pylist()) == list(range(10, 17))
    # A plan id of it answers the same files again; start == end is empty.
    with gw.http_client(api_key=t.key) as h:
        body = {"start-snapshot-id": first, "end-snapshot-id": second}
        planned = plan(h, "app.inc", body).json()
        again = h.get(f"{CATALOG}/namespaces/app/tables/inc/plan/{planned['plan-id']}").json()
        assert again["file-scan-tasks"] == [
            {"data-file": f["data-file"]} for f in planned["file-scan-tasks"]
        ]
        same = plan(h, "app.inc", {"start-snapshot-id": second, "end-snapshot-id": second})
        assert same.json()["file-scan-tasks"] == []
        backwards = plan(h, "app.inc", {"start-snapshot-id": second, "end-snapshot-id": first})
        assert backwards.status_code == 400
        assert "is not an ancestor of end-snapshot-id" in backwards.json()["error"]["message"]
        for body in (
            {"start-snapshot-id": 12345, "end-snapshot-id": second},
            {"start-snapshot-id": first, "end-snapshot-id": 12345},
        ):
            unknown = plan(h, "app.inc", body)
            assert unknown.status_code == 404, unknown.text
            assert "12345" in unknown.json()["error"]["message"]


def test_case_insensitive_names(gw: GatewayProcess, tiered: Tenant) -> None:
    body = {
        "select": ["ID"],
        "case-sensitive": False,
        "filter": {"type": "lt", "term": "Id", "value": 2},
    }
    with gw.http_client(api_key=tiered.key) as h:
        assert plan(h, "shop.orders", body).status_code == 200
        assert plan(h, "shop.orders", {**body, "case-sensitive": True}).status_code == 400


@pytest.mark.parametrize("overflow", ["refuse", "committed"])
def test_a_hot_tail_over_the_limit(
    overflow: str, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> None:
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_MAX_HOT_RECORDS": "5",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_HOT_OVERFLOW": overflow,
    }
    gw = GatewayProcess(tmp_path_factory.mktemp(f"iceberg-plans-{overflow}"), env).start()
    try:
        t = new_tenant(gw, "l")
        with gw.client(api_key=t.key) as c:
            c.create_table("app.big", SCHEMA, partitions=2)
        fill(gw, t, "app.big", 0, 4)
        tier(gw)
        fill(gw, t, "app.big", 4, 6)  # six hot records, one more than a plan writes
        catalog = server_planning(gw, t.key)
        scan = catalog.load_table("app.big").scan()
        if overflow == "refuse":
            with pytest.raises(RuntimeError, match="plan_max_hot_records"):
                scan.to_arrow()
            with gw.http_client(api_key=t.key) as h:
                answer = plan(h, "app.big").json()
            assert answer["status"] == "failed"
            assert (
                "the hot tail of app.big is 6 records, more than the 5"
                in (answer["error"]["message"])
            )
        else:
            assert sorted(scan.to_arrow()["id"].to_pylist()) == [0, 1, 2, 3]
    finally:
        gw.stop()


def test_the_orphan_clean_up_removes_hot_tail_files_and_plans_write_them_again(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> None:
    """Hot-tail files are files no snapshot names: the orphan clean-up removes them once
    older than expiry.orphan_age_s. A plan never names a file that may be removed within
    its life: here (orphan_age_s 0) it writes its files afresh every time."""
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_EXPIRY__ORPHAN_AGE_S": "0",
    }
    gw = GatewayProcess(tmp_path_factory.mktemp("iceberg-plans-orphans"), env).start()
    try:
        t = new_tenant(gw, "r")
        with gw.client(api_key=t.key) as c:
            c.create_table("app.gone", SCHEMA, partitions=1)
            c.append("app.gone", [{"id": i, "name": f"n{i}"} for i in range(4)])
        tier(gw)  # the Iceberg table exists: the clean-up visits its folder
        with gw.client(api_key=t.key) as c:
            c.append("app.gone", [{"id": i, "name": f"n{i}"} for i in range(4, 7)])
        with gw.http_client(api_key=t.key) as h:
            first = plan(h, "app.gone").json()["file-scan-tasks"]

        def hot_path(tasks: list[dict[str, Any]]) -> Path:
            (hot,) = [f["data-file"]["file-path"] for f in tasks if "/tidegate-plans/" in str(f)]
            return Path(hot.removeprefix("file://"))

        path = hot_path(first)
        time.sleep(0.01)
        with gw.http_client(api_key=t.key) as h:
            again = hot_path(plan(h, "app.gone").json()["file-scan-tasks"])
        # Written afresh, under a name of its own: a clean-up deleting the first file
        # meanwhile cannot take the one this plan names.
        assert again != path and again.parent == path.parent and path.exists()
        lake_job(gw, "clean-orphans", "--all")
        assert not path.exists() and not again.exists()
        rows = server_planning(gw, t.key).load_table("app.gone").scan().to_arrow()
        assert sorted(rows["id"].to_pylist()) == list(range(7))
        assert len(list(path.parent.iterdir())) == 1
    finally:
        gw.stop()
