"""Issue 17: every metric the Grafana dashboard (helm/tidegate/dashboards/tidegate.json)
queries is exported by a live gateway's /metrics, with samples, once the gateway has done
what the panels show (appends, reads, a throttled request, a tiering run)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services import REPO_ROOT, GatewayProcess, running

pytestmark = pytest.mark.integration

DASHBOARD = REPO_ROOT / "helm" / "tidegate" / "dashboards" / "tidegate.json"


def queried_metrics(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name in the dashboard's panel and variable queries."""
    texts = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    texts += [str(v.get("definition", "")) for v in dashboard["templating"]["list"]]
    return {m for text in texts for m in re.findall(r"\btidegate_[a-z0-9_]+", text)}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": "disk",
        "TIDEGATE_TIERING__INTERVAL_S": "0.5",
        "TIDEGATE_METERING__FLUSH_INTERVAL_S": "1",
    }
    proc = GatewayProcess(tmp_path_factory.mktemp("dashboard-gw"), env).start()
    with running(proc):
        yield proc


def exported(gw: GatewayProcess) -> set[str]:
    with gw.http_client(api_key=None) as h:
        text = h.get("/metrics").text
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_metric_the_dashboard_queries_is_exported(gw: GatewayProcess) -> None:
    dashboard = json.loads(Path(DASHBOARD).read_text())
    wanted = queried_metrics(dashboard)
    assert len(wanted) >= 15, wanted  # the parse found the queries
    # Over HTTP (the metrics count both edges alike), one connection per credential.
    with gw.http_client() as h, gw.http_client(api_key=gw.operator_key) as op:
        table = {"namespace": "dash", "name": "ev", "schema": [{"name": "n", "type": "int64"}]}
        assert h.post("/v1/tables", json=table).status_code == 201
        rows = {"rows": [{"n": i} for i in range(10)]}
        assert h.post("/v1/tables/dash/ev/records", json=rows).status_code == 200
        assert h.get("/v1/tables/dash/ev/partitions/0/records").status_code == 200
        with gw.client() as c:  # the gRPC edge's latency panels
            c.append("dash.ev", [{"n": 10}])
            assert c.read("dash.ev", partition=0, offset=0).num_rows == 11
        quota = {"append_bytes_per_s": 1}
        assert op.put(f"/v1/admin/tenants/{gw.tenant}/quota", json=quota).status_code == 200
        # The first append is admitted from a full bucket and leaves it in debt (far more
        # than the 1 byte a second that refills it): the second is refused.
        assert h.post("/v1/tables/dash/ev/records", json=rows).status_code == 200
        assert h.post("/v1/tables/dash/ev/records", json=rows).status_code == 429
        # A usage read samples the tenant's storage now.
        assert op.get(f"/v1/admin/tenants/{gw.tenant}/usage").status_code == 200
        # A consumer group: a member joins (a rebalance that settles), commits, an
        # outsider's commit is refused, the member leaves (another rebalance).
        group = "/v1/groups/dash-readers/tables/dash/ev"
        joined = h.post(f"{group}/heartbeat", json={"session_timeout_ms": 10_000}).json()
        member = {"member_id": joined["member_id"], "generation": joined["generation"]}
        commit = {"offsets": [{"partition": 0, "offset": 5}]}
        assert h.post(f"{group}/offsets", json={**commit, **member}).status_code == 200
        assert h.post(f"{group}/offsets", json=commit).status_code == 409
        assert h.post(f"{group}/heartbeat", json={**member, "leave": True}).status_code == 200
    deadline = time.monotonic() + 60
    while True:  # the tiering schedule's first run with this table sets its counters
        missing = wanted - exported(gw)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert missing == set(), f"queried but not exported: {sorted(missing)}"
    # And the other way: a metric the dashboard would need to exist is not a typo.
    assert "tidegate_tenant_throttled_total" in wanted
    assert "tidegate_tiering_lag_records" in wanted
    assert "tidegate_tenant_hot_bytes" in wanted
    assert "tidegate_grpc_request_duration_seconds_bucket" in wanted
    assert "tidegate_groups_lag_records" in wanted
    assert "tidegate_groups_rebalances_total" in wanted
