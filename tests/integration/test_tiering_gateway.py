"""Tiering of a running gateway: the embedded schedule of `tidegate serve` (what
`make run` starts), and `tidegate tier` run beside a gateway sharing Redis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.services import REPO_ROOT, GatewayProcess, RedisServer, run_cli

pytestmark = pytest.mark.integration


def _wait_tiered(gw: GatewayProcess, table: str, want: list[int], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    with gw.client() as c:
        while True:
            info = c.describe_table(table)
            if [p.tiered_watermark for p in info.partition_info] == want:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"T(p) never reached {want}: {info}\n{gw.log()}")
            time.sleep(0.2)


def _check_reads(gw: GatewayProcess, table: str, partitions: int, per_part: int) -> None:
    with gw.client() as c:
        for p in range(partitions):
            rows = c.read(table, partition=p, offset=0, max_records=1000).to_pylist()
            assert [r["_offset"] for r in rows] == list(range(per_part))
            assert [r["n"] for r in rows] == [p * 1000 + i for i in range(per_part)]


def test_embedded_gateway_tiers_on_a_schedule(tmp_path: Path) -> None:
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_TIERING__INTERVAL_S": "0.5",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        },
    ).start()
    try:
        with gw.client() as c:
            c.create_table("app.ev", {"n": "int64"}, partitions=2)
            for p in range(2):
                c.append("app.ev", [{"n": p * 1000 + i} for i in range(5)], partition=p)
        info = _wait_tiered(gw, "app.ev", [5, 5])
        assert [p.lag_records for p in info.partition_info] == [0, 0]
        with gw.client() as c:
            for p in range(2):
                c.append("app.ev", [{"n": p * 1000 + i} for i in range(5, 8)], partition=p)
            info = c.describe_table("app.ev")
        # Read across the boundary: offsets 0..4 from Iceberg, 5..7 from the hot tier
        # (unless the schedule already moved them too).
        assert all(p.high_watermark == 8 for p in info.partition_info)
        _check_reads(gw, "app.ev", 2, 8)
        with gw.http_client() as h:
            desc = h.get("/v1/tables/app/ev").json()
            assert {"lag_records", "lag_bytes"} <= set(desc["partition_info"][0])
        _wait_tiered(gw, "app.ev", [8, 8])
        _check_reads(gw, "app.ev", 2, 8)
        deadline = time.monotonic() + 30
        with gw.http_client() as h:
            while True:  # the gauges follow each run's commit
                metrics = h.get("/metrics").text
                if "tidegate_tiering_lag_records 0.0" in metrics or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert "tidegate_tiering_records_total 16.0" in metrics
        assert "tidegate_tiering_lag_records 0.0" in metrics
    finally:
        gw.stop()


def test_tidegate_tier_beside_a_gateway(tmp_path: Path, redis_server: RedisServer) -> None:
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
    }
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        with gw.client() as c:
            c.create_table("cli.ev", {"n": "int64"}, partitions=2)
            for p in range(2):
                c.append("cli.ev", [{"n": p * 1000 + i} for i in range(4)], partition=p)
        job_env = gw.env()
        # The job tiers the tables the gateway marked, which it does once a second: a
        # run before the marks tiers nothing, and the first after them all 8 records.
        deadline = time.monotonic() + 60
        while True:
            out = run_cli(["tier"], job_env, REPO_ROOT)
            assert out.returncode == 0, out.stderr
            if "tiered 0 records" not in out.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "tiered 8 records in 1 table" in out.stdout
        _wait_tiered(gw, "cli.ev", [4, 4], timeout=5)
        _check_reads(gw, "cli.ev", 2, 4)
    finally:
        gw.stop()


def test_embedded_gateway_compacts_and_expires_on_a_schedule(tmp_path: Path) -> None:
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_TIERING__INTERVAL_S": "0.3",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
            "TIDEGATE_COMPACTION__INTERVAL_S": "1",
            "TIDEGATE_EXPIRY__INTERVAL_S": "1",
            "TIDEGATE_EXPIRY__RETENTION_S": "60",
        },
    ).start()
    try:
        with gw.client() as c:
            c.create_table("app.small", {"n": "int64"}, partitions=2)
        for i in range(4):  # four tiering commits: four small files per partition
            with gw.client() as c:
                for p in range(2):
                    c.append(
                        "app.small", [{"n": p * 1000 + 2 * i + j} for j in range(2)], partition=p
                    )
            _wait_tiered(gw, "app.small", [2 * i + 2] * 2)
        deadline = time.monotonic() + 60
        with gw.http_client() as h:
            while True:
                lake = h.get("/v1/tables/app/small").json()["maintenance"]
                runs = lake["last_runs"]
                if (lake["data_files"] == 2 and "expire" in runs) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert lake["data_files"] == 2 and lake["small_file_ratio"] == 1.0, (lake, gw.log())
            assert lake["snapshots"] >= 5 and lake["leases"] == []
            assert runs["compact"]["outcome"] == "ok" and runs["expire"]["outcome"] == "ok"
            metrics = h.get("/metrics").text
        # The SDK's describe (gRPC) carries the same health.
        with gw.client() as c:
            sdk = c.describe_table("app.small").maintenance
        assert sdk is not None
        assert (sdk.data_files, sdk.small_file_ratio, sdk.leases) == (2, 1.0, ())
        assert sdk.snapshots >= lake["snapshots"]
        assert {"compact", "expire"} <= set(sdk.last_runs)
        assert sdk.last_runs["compact"].outcome == "ok"
        assert sdk.last_runs["compact"].finished_at.tzinfo is not None
        assert 'tidegate_lake_job_last_run_timestamp_seconds{job="compact"}' in metrics
        assert 'tidegate_lake_job_last_run_timestamp_seconds{job="expire"}' in metrics
        assert "tidegate_lake_data_files 2.0" in metrics
        _check_reads(gw, "app.small", 2, 8)
    finally:
        gw.stop()
