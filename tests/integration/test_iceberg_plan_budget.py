"""Issue 40: the per-tenant budget of hot-tail bytes that scan plans write
(``cold.rest_catalog.plan_hot_bytes_per_s``), and the hot rows a plan materialises counted
as the tenant's reads.

A gateway whose budget is 1 byte a second (a burst of one byte): a tenant's first plan
writes its hot tail and puts the budget deep in debt; its next plan with a hot tail
fails in one sentence naming the budget (``plan_hot_overflow=refuse``), while another
tenant plans as before (the budget is per tenant).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.iceberg_catalog import SCHEMA, new_tenant
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_COLD__REST_CATALOG__PLAN_HOT_BYTES_PER_S": "1",
    }
    proc = GatewayProcess(tmp_path_factory.mktemp("iceberg-plan-budget"), env)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def plan(h: httpx.Client) -> dict[str, object]:
    r = h.post(f"{CATALOG}/namespaces/app/tables/t/plan", json={})
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_a_spent_budget_refuses_the_hot_tail_per_tenant(gw: GatewayProcess) -> None:
    spender, other = new_tenant(gw, "spend"), new_tenant(gw, "other")
    for t in (spender, other):
        with gw.client(api_key=t.key) as c:
            c.create_table("app.t", SCHEMA, partitions=1)
            c.append("app.t", [{"id": i, "name": f"n{i}"} for i in range(5)])
    with gw.http_client(api_key=spender.key) as h:
        first = plan(h)
        assert first["status"] == "completed"
        with gw.client(api_key=spender.key) as c:
            c.append("app.t", [{"id": 5, "name": "n5"}])
        second = plan(h)
    assert second["status"] == "failed", second
    message = second["error"]["message"]  # type: ignore[index]
    assert "cold.rest_catalog.plan_hot_bytes_per_s" in message and "is spent" in message
    with gw.http_client(api_key=other.key) as h:
        assert plan(h)["status"] == "completed"
    # The rows the first plan wrote are the tenant's reads.
    with gw.admin() as admin:
        usage = admin.usage(spender.name)
    assert sum(r["read_records"] for r in usage) == 5
    assert sum(r["read_bytes"] for r in usage) > 0
