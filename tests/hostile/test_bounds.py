"""Issue 18.5, 18.10, 18.11: filters cannot crash or freeze the gateway, /metrics can be
protected, and the disk hot tier has one owner."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from tests.hostile.conftest import Tenant, grpc_error, http_error, table_ref
from tests.services import REPO_ROOT, GatewayProcess, free_port
from tests.services import run_cli as tidegate_cli

# 5. Filters ----------------------------------------------------------------------------
HUGE_FILTERS = {
    "tens of thousands of terms": " or ".join(f"v = {i}" for i in range(30_000)),
    "a 700 KB in list": "v in (" + ", ".join(str(i) for i in range(120_000)) + ")",
    "deep nesting": "(" * 5_000 + "v = 1" + ")" * 5_000,
    "deep negation": "not " * 5_000 + "v = 1",
}


@pytest.mark.parametrize("kind", sorted(HUGE_FILTERS))
def test_huge_filters_are_refused_while_the_gateway_keeps_answering(
    tenant: Tenant, kind: str
) -> None:
    text = HUGE_FILTERS[kind]
    with tenant.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "f", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
        )
        assert r.status_code == 201
        http.post("/v1/tables/f/t/records", json={"rows": [{"v": 1}]})
    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:  # the health check must keep answering quickly meanwhile
        with tenant.gw.http_client(api_key=None) as h:
            while not stop.is_set():
                started = time.monotonic()
                assert h.get("/healthz").status_code == 200
                health.append(time.monotonic() - started)
                time.sleep(0.01)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for _ in range(3):
            with tenant.http() as http:
                status, reason, _ = http_error(
                    http.post("/v1/tables/f/t/scan", json={"filter": text})
                )
                assert (status, reason) == (400, "INVALID_REQUEST")
                r = http.post("/v1/tables/f/t/plan", json={"filter": text})
                assert r.status_code == 400
            code, _, _ = grpc_error(
                lambda: list(
                    tenant.stub().Scan(pb.ScanRequest(table=table_ref("f", "t"), filter=text))
                )
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        stop.set()
        prober.join(5)
    assert health and max(health) < 2.0, max(health)


# 10. Metrics -----------------------------------------------------------------------------
def test_metrics_can_be_behind_a_token_or_on_a_port_of_their_own(tmp_path: Path) -> None:
    token = "m" * 32
    port = free_port()
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_SERVER__METRICS_TOKEN": token,
            "TIDEGATE_SERVER__METRICS_PORT": str(port),
            "TIDEGATE_TIERING__ENABLED": "false",
        },
    ).start()
    try:
        with gw.http_client(api_key=None) as http:
            assert http.get("/metrics").status_code == 404  # not on the API's port
        metrics = f"http://127.0.0.1:{port}/metrics"
        r = httpx.get(metrics)
        assert r.status_code == 401 and r.json()["error"]["reason"] == "UNAUTHENTICATED"
        assert (
            httpx.get(metrics, headers={"authorization": "Bearer " + "x" * 32}).status_code == 401
        )
        r = httpx.get(metrics, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "tidegate_append_records_total" in r.text
    finally:
        gw.stop()


# 11. One owner of the disk hot tier -----------------------------------------------------
def run_cli(
    gw: GatewayProcess, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return tidegate_cli(args, env or gw.env(), REPO_ROOT)


def test_the_disk_hot_tier_has_one_owner(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw", {"TIDEGATE_HOT__TYPE": "disk"}).start()
    try:
        with gw.client() as c:
            c.create_table("o.t", {"v": "int64"}, partitions=1)
            c.append("o.t", [{"v": 1}])
        # A second gateway on the same folder refuses to start, naming the owner.
        env = {
            **gw.env(),
            "TIDEGATE_SERVER__GRPC_PORT": str(free_port()),
            "TIDEGATE_SERVER__HTTP_PORT": str(free_port()),
            "TIDEGATE_SERVER__FLIGHT_PORT": str(free_port()),
        }
        second = run_cli(gw, "serve", env=env)
        assert second.returncode == 2, second.stderr
        assert f"pid {gw.proc.pid}" in second.stderr  # type: ignore[union-attr]
        assert "Traceback" not in second.stderr
        # `tidegate tier` beside it says what to do instead of tiering nothing.
        tier = run_cli(gw, "tier")
        assert tier.returncode == 2
        assert "HOT_TIER_BUSY" in tier.stderr and "own schedule" in tier.stderr
        assert "Traceback" not in tier.stderr
        # The owner goes on serving what it acknowledged.
        with gw.client() as c:
            assert c.read("o.t", partition=0, offset=0).column("v").to_pylist() == [1]
        # A killed owner leaves no stale lock: the next one starts on the same folder.
        os.kill(gw.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        gw.proc.wait(10)  # type: ignore[union-attr]
        gw.start()
        with gw.client() as c:
            assert c.read("o.t", partition=0, offset=0).column("v").to_pylist() == [1]
    finally:
        gw.stop()
