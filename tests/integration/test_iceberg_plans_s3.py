"""Issue 40 on the S3 warehouse (moto's server, its IAM enforced), on both hot tiers:
pyiceberg 0.12 planning on the server, given only a tenant's key, reads with the plan's
vended credentials exactly what the gateway's own scan answers (filter and projection,
tiered rows and the hot tail), and appends and tiering running meanwhile never make a row
missing or repeated. A table of ``client_planning_tables`` says ``scan-planning-mode:
client`` in its ``loadTable`` config (an S3 table has a config) and its plans name its
committed files only.

The disk gateway tiers on its own every second; the Redis one is tiered by ``tidegate
tier`` when a test says (in a loop while appends run).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.iceberg_catalog import SCHEMA, Tenant, fill, pyiceberg_catalog, tier
from tests.services import GatewayProcess, MotoServer, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"
BUCKET = "tidegate-s3plans"
PREFIX = "wh"
ORDER = [("_partition", "ascending"), ("_offset", "ascending")]


@pytest.fixture(scope="module", params=["disk", "redis"])
def gw(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
) -> Iterator[GatewayProcess]:
    kind = request.param
    moto = MotoServer(tmp_path_factory.mktemp(f"moto-plans-{kind}")).start()
    try:
        moto.create_bucket(BUCKET)
        keys = moto.user_with_policy(
            "tidegate-gateway",
            [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}],
        )
        tenant = f"t{secrets.token_hex(6)}"
        moto.role_with_policy(
            f"tidegate-{tenant}",
            [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{BUCKET}/{PREFIX}/{tenant}/*"],
                }
            ],
        )
        moto.enforce_iam()
        env = {
            "TIDEGATE_HOT__TYPE": kind,
            "TIDEGATE_COLD__WAREHOUSE": f"s3://{BUCKET}/{PREFIX}",
            "TIDEGATE_COLD__S3__ENDPOINT": moto.endpoint,
            "TIDEGATE_COLD__S3__ACCESS_KEY_ID": keys[0],
            "TIDEGATE_COLD__S3__SECRET_ACCESS_KEY": keys[1],
            "TIDEGATE_COLD__S3__REGION": moto.REGION,
            "TIDEGATE_COLD__S3__PATH_STYLE": "true",
            "TIDEGATE_COLD__REST_CATALOG__ROLE_ARN": (
                f"arn:aws:iam::{moto.ACCOUNT}:role/tidegate-{{tenant}}"
            ),
            "TIDEGATE_COLD__REST_CATALOG__STS_ENDPOINT": moto.endpoint,
            "TIDEGATE_COLD__REST_CATALOG__CREDENTIALS_DURATION_S": "900",
            "TIDEGATE_COLD__REST_CATALOG__CLIENT_PLANNING_TABLES": f'["{tenant}/app.off"]',
        }
        if kind == "redis":
            env.update(
                {
                    "TIDEGATE_HOT__URL": redis_server.url,
                    "TIDEGATE_TIERING__ENABLED": "false",
                    # Trimmed at once: plans re-pin when tiering trims under them.
                    "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
                }
            )
        else:
            # Tiering every second, the tail kept a while (as shipped): the gateway's own
            # scan at the end is not cut short by a trim (it would say: scan again).
            env.update(
                {
                    "TIDEGATE_TIERING__ENABLED": "true",
                    "TIDEGATE_TIERING__INTERVAL_S": "1",
                    "TIDEGATE_TIERING__HOT_RETENTION_S": "30",
                }
            )
        proc = GatewayProcess(tmp_path_factory.mktemp(f"gw-s3-plans-{kind}"), env, tenant=tenant)
        proc.kind = kind  # type: ignore[attr-defined]
        proc.start()
        try:
            yield proc
        finally:
            proc.stop()
    finally:
        moto.stop()


def bootstrap(gw: GatewayProcess) -> Tenant:
    """The gateway's own tenant: the one whose IAM role the fixture made."""
    return Tenant(gw.tenant, gw.api_key or "", "")


def tier_now(gw: GatewayProcess, t: Tenant, table: str) -> None:
    """One tiering pass (Redis), or the disk gateway's own tiering caught up."""
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


def keyed(rows: Any) -> list[tuple[int, int]]:
    return sorted(zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True))


def test_pyiceberg_reads_the_gateways_scan_while_appends_and_tiering_run(
    gw: GatewayProcess,
) -> None:
    from pyiceberg.expressions import GreaterThanOrEqual

    t = bootstrap(gw)
    with gw.client(api_key=t.key) as c:
        c.create_table("app.busy", SCHEMA, partitions=2)
    fill(gw, t, "app.busy", 0, 20)
    tier_now(gw, t, "app.busy")
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
    catalog = pyiceberg_catalog(gw, token=t.key)  # the catalog's default: server
    snapshots: set[int | None] = set()
    try:
        # Plans for 3 s at least, and on until tiering committed under them (it was 10 s:
        # the Redis gateway's tiering job ran back to back all that time).
        deadline = time.monotonic() + 3
        plans = 0
        while time.monotonic() < deadline or len(snapshots) < 2 or plans < 3:
            before = acked[0]
            table = catalog.load_table("app.busy")
            assert (
                table.io.properties["s3.access-key-id"]
                != gw.env()["TIDEGATE_COLD__S3__ACCESS_KEY_ID"]
            )
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
            assert time.monotonic() < deadline + 90
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors
    assert plans >= 3 and len(snapshots) >= 2  # tiering committed while plans ran
    # Appends stopped: a filter and a projection, row for row the gateway's own scan,
    # with a hot tail above the last commit.
    fill(gw, t, "app.busy", acked[0], 6)
    columns = ("id", "name", "_partition", "_offset")
    got = (
        catalog.load_table("app.busy")
        .scan(row_filter=GreaterThanOrEqual("id", 7), selected_fields=columns)
        .to_arrow()
    )
    with gw.client(api_key=t.key) as c:
        expected = c.scan("app.busy", columns=list(columns), filter="id >= 7")
    assert expected.num_rows == acked[0] + 6 - 7
    assert got.sort_by(ORDER).to_pylist() == expected.sort_by(ORDER).to_pylist()


def test_a_table_planned_on_the_client_says_so_in_its_config(gw: GatewayProcess) -> None:
    t = bootstrap(gw)
    with gw.client(api_key=t.key) as c:
        for name in ("app.off", "app.on"):
            c.create_table(name, SCHEMA, partitions=2)
    for name in ("app.off", "app.on"):
        fill(gw, t, name, 0, 6)
        tier_now(gw, t, name)
    for name in ("app.off", "app.on"):
        fill(gw, t, name, 6, 4)
    with gw.http_client(api_key=t.key) as h:
        configs = {
            name: h.get(f"{CATALOG}/namespaces/app/tables/{name}").json()["config"]
            for name in ("off", "on")
        }
        plans = {
            name: h.post(f"{CATALOG}/namespaces/app/tables/{name}/plan", json={}).json()
            for name in ("off", "on")
        }
    assert configs["off"]["scan-planning-mode"] == "client"
    assert configs["on"]["scan-planning-mode"] == "server"

    def hot(answer: dict[str, Any]) -> list[str]:
        paths = [f["data-file"]["file-path"] for f in answer["file-scan-tasks"]]
        return [p for p in paths if "/tidegate-plans/" in p]

    assert plans["off"]["status"] == "completed" and not hot(plans["off"])
    if gw.kind != "redis":  # type: ignore[attr-defined]
        return  # the disk gateway tiers a new hot tail within a second: no tail to name
    assert len(hot(plans["on"])) == 2
    catalog = pyiceberg_catalog(gw, token=t.key)
    off = catalog.load_table("app.off").scan().to_arrow()
    assert sorted(off["id"].to_pylist()) == list(range(6))  # the committed rows
    on = catalog.load_table("app.on").scan().to_arrow()
    assert sorted(on["id"].to_pylist()) == list(range(10))
