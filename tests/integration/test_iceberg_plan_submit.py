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
        return c.scan(table, columns=COLUMNS).sort_by(ORDER).to_pylist()


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


def test_pyiceberg_plans_under_the_bound_complete_within_the_request(pair: Pair) -> None:
    """pyiceberg 0.12 cannot poll a submitted plan; a tail under plan_submit_records (or
    one written by an earlier plan) completes within the request, so it reads it."""
    gw = pair.second
    t = new_tenant(gw, "py")
    make_table(gw, t, "app.small", hot=40)
    got = pyiceberg_catalog(gw, token=t.key).load_table("app.small").scan().to_arrow()
    assert got.select(COLUMNS).sort_by(ORDER).to_pylist() == own_scan(gw, t, "app.small")


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
    assert (
        "plan again: tiering committed part of this plan's hot tail" in (answer["error"]["message"])
    )
    with pair.second.http_client(api_key=t.key) as h:
        fresh = plan(h, "app.moved")  # a new plan reads it all from the lake
    assert rows_of(fresh).sort_by(ORDER).to_pylist() == own_scan(pair.second, t, "app.moved")
