"""What the SDK reads of the lake itself, as the gateway sees it (issue 43): reads through a
plan's file links are metered as the tenant's reads, the way the gateway's own scan is.

Real gateway processes on both hot tiers (disk, Redis) over a local warehouse, whose plans
give their files as links through the gateway (``/v1/files/<token>``), tiering on their own
schedule every 0.3 s while the tests append and read.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import gateway_env
from tests.integration.test_lake_scans import (
    BATCH,
    SCHEMA,
    _row,
    _tiering_env,
    _wait_tiered,
)
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["disk", "redis"])
def gw(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp(f"reads-{request.param}")
    env = {**gateway_env(request.param, redis_server), **_tiering_env()}
    gateway = GatewayProcess(tmp, env).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def _tenant(gw: GatewayProcess) -> tuple[str, str]:
    tenant = f"rd{uuid.uuid4().hex[:8]}"
    with gw.admin() as admin:
        admin.create_tenant(tenant)
        return tenant, admin.issue_key(tenant)[1]


def _usage(gw: GatewayProcess, tenant: str) -> dict[str, int]:
    with gw.admin() as admin:
        rows = admin.usage(tenant)
    return {k: sum(r[k] for r in rows) for k in ("read_records", "read_bytes", "throttled")}


def _link_metrics(gw: GatewayProcess) -> dict[str, float]:
    text = httpx.get(f"{gw.http_url}/metrics", timeout=10).text

    def one(name: str) -> float:
        found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    return {
        "bytes": one("tidegate_file_link_bytes_total"),
        "records": one("tidegate_file_link_records_total"),
        "read_records": one("tidegate_read_records_total"),
    }


def _filled(gw: GatewayProcess, key: str, records: int) -> str:
    """A table of ``records`` rows, tiered, then a hot tail of ``BATCH`` more."""
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with gw.client(api_key=key) as c:
        c.create_table(table, SCHEMA, partitions=3)
        for start in range(0, records, BATCH):
            c.append(table, [_row(v) for v in range(start, start + BATCH)])
        _wait_tiered(c, table, records)
        c.append(table, [_row(v) for v in range(records, records + BATCH)])
    return table


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: after[k] - before[k] for k in before}


def test_scans_through_file_links_are_metered_as_the_gateways_scan(gw: GatewayProcess) -> None:
    tenant, key = _tenant(gw)
    table = _filled(gw, key, 600)
    total = 600 + BATCH
    with gw.client(api_key=key) as c:
        base = _usage(gw, tenant)
        assert c.scan(table, mode="server").num_rows == total
        server = _delta(base, _usage(gw, tenant))
        assert server["read_records"] == total and server["read_bytes"] > 0

        # The same scan read by the client through the plan's links: the files' rows are
        # metered when their footers are served, the hot rows as the gateway sends them.
        base, links = _usage(gw, tenant), _link_metrics(gw)
        assert c.plan_read(table).files, "nothing tiered: no link would be read"
        assert c.scan(table, mode="client").num_rows == total
        client = _delta(base, _usage(gw, tenant))
        served = _delta(links, _link_metrics(gw))
        assert client["read_records"] == server["read_records"], (client, server)
        assert served["records"] > 0 and served["bytes"] > 0, served
        assert served["records"] + served["read_records"] == total, served
        # Every byte a link served is charged, with the hot rows' bytes on top (tiering
        # may have moved them all to the files by now).
        assert client["read_bytes"] >= served["bytes"], (client, served)
        assert (client["read_bytes"] > served["bytes"]) == (served["read_records"] > 0)

        # Batch by batch (the dataset reader, a filter): each file's rows once.
        base, links = _usage(gw, tenant), _link_metrics(gw)
        streamed = sum(b.num_rows for b in c.scan_batches(table, mode="client", filter="v >= 0"))
        assert streamed == total
        assert _delta(base, _usage(gw, tenant))["read_records"] == total

    # A client that reads the warehouse folder itself passes nothing through the
    # gateway: only the hot rows it fetched are metered.
    folder = str(gw.data_dir / "warehouse")
    with gw.client(api_key=key, warehouse=folder) as c:
        base, links = _usage(gw, tenant), _link_metrics(gw)
        assert c.scan(table, mode="client").num_rows == total
        local = _delta(base, _usage(gw, tenant))
        served = _delta(links, _link_metrics(gw))
        assert served["bytes"] == 0 and served["records"] == 0, served
        assert local["read_records"] == served["read_records"] < total, (local, served)


def test_reads_through_file_links_wait_out_the_read_quota(gw: GatewayProcess) -> None:
    """Links charge the tenant's read bucket: over its quota they answer 429 with a
    Retry-After, which the SDK waits out, and the scan still answers every row."""
    tenant, key = _tenant(gw)
    table = _filled(gw, key, 600)
    with gw.client(api_key=key) as c:
        plan = c.plan_read(table)
        size = sum(f.file_size_bytes for f in plan.files)
        with gw.admin() as admin:
            admin.set_quota(tenant, read_bytes_per_s=max(1, size // 2))
        first = httpx.get(plan.files[0].url, timeout=10)
        assert first.status_code == 200
        for f in list(plan.files) * 3:  # drain the bucket: it goes into debt (~5 s of it)
            httpx.get(f.url, timeout=10)
        # A link's bytes are charged once sent: the next request may come before that.
        deadline = time.monotonic() + 3
        while (refused := httpx.get(plan.files[0].url, timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "the links never ran into the read quota"
            time.sleep(0.05)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["reason"] == "THROTTLED"
        got = c.scan(table, mode="client")
        assert got.num_rows == 600 + BATCH
        assert sorted(got.column("v").to_pylist()) == list(range(600 + BATCH))
    assert _usage(gw, tenant)["throttled"] >= 1
