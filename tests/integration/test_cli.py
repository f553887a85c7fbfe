"""The tidegate command against a live gateway: table admin, append from files, read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.services import FIRST_CONTACT_S, GatewayProcess, run_cli

pytestmark = pytest.mark.integration


def tidegate(
    gateway: GatewayProcess,
    *args: str,
    ok: bool = True,
    api_key: str | None = None,
    interpreter: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI with the gateway's bootstrap tenant key (or ``api_key``) and its
    operator key in the environment, as a user would export them: forked (``run_cli``),
    or with ``interpreter`` in a new interpreter of its own, as a user's shell runs it
    (the round trip: a forked command skips the interpreter's teardown, where a hang at
    exit was once found)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env["TIDEGATE_API_KEY"] = api_key if api_key is not None else str(gateway.api_key)
    env["TIDEGATE_OPERATOR_KEY"] = gateway.operator_key
    env["TIDEGATE_CONNECT_TIMEOUT"] = str(FIRST_CONTACT_S)  # a gateway we started: see there
    argv = [*args, "--target", gateway.grpc_target]
    if interpreter:
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    else:
        proc = run_cli(argv, env, timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_round_trip(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    def user(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return tidegate(gateway, *args, ok=ok, interpreter=True)

    table = f"{namespace}.people"
    out = user(
        "table",
        "create",
        table,
        "--schema",
        "id:int64,name:string,score:decimal128(6, 2)",
        "--partitions",
        "1",
        "--json",
    )
    assert json.loads(out.stdout)["partitions"] == 1
    assert f"{table}\t1 partition" in user("table", "list", "--namespace", namespace).stdout

    csv = tmp_path / "people.csv"
    csv.write_text("id,name,score\n1,ada,9.50\n2,alan,7.25\n")
    jsonl = tmp_path / "people.jsonl"
    jsonl.write_text('{"id": 3, "name": "grace", "score": "8.00"}\n')
    parquet = tmp_path / "people.parquet"
    pq.write_table(
        pa.table(
            {
                "id": pa.array([4], pa.int32()),
                "name": ["edsger"],
                "score": pa.array([1], pa.decimal128(6, 2)),
            }
        ),
        parquet,
    )
    for f, n in ((csv, "2 records"), (jsonl, "1 record"), (parquet, "1 record")):
        assert f"appended {n} to" in user("append", table, str(f)).stdout

    lines = user("read", table, "--partition", "0", "--offset", "1").stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["_offset"], r["id"], r["name"], r["score"]) for r in rows] == [
        (1, 2, "alan", "7.25"),
        (2, 3, "grace", "8.00"),
        (3, 4, "edsger", "1.00"),
    ]
    out_file = tmp_path / "out.parquet"
    user("read", table, "--output", str(out_file))
    assert pq.read_table(out_file).column("name").to_pylist() == ["ada", "alan", "grace", "edsger"]

    described = json.loads(user("table", "describe", table, "--json").stdout)
    assert described["partition_info"][0]["high_watermark"] == 4
    lake = described["maintenance"]  # the lake's health, from the gRPC describe
    assert lake["data_files"] == len(lake["leases"]) == 0 and lake["snapshots"] >= 0
    text = user("table", "describe", table).stdout
    assert "lake        0 data files (0 small)" in text and "\nlake jobs   " in text
    user("table", "drop", table, "--yes")
    missing = user("table", "describe", table, ok=False)
    assert missing.returncode == 2 and "TABLE_NOT_FOUND" in missing.stderr


def test_cli_rejects_bad_file_without_writing(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    table = f"{namespace}.strict"
    tidegate(gateway, "table", "create", table, "--schema", "id:int64")
    bad = tmp_path / "bad.csv"
    bad.write_text("id\n1\nnot-a-number\n")
    res = tidegate(gateway, "append", table, str(bad), ok=False)
    assert res.returncode == 2 and "cannot read" in res.stderr
    extra = tmp_path / "extra.parquet"
    pq.write_table(pa.table({"id": [1], "other": [2]}), extra)
    res = tidegate(gateway, "append", table, str(extra), ok=False)
    assert res.returncode == 2 and "SCHEMA_MISMATCH" in res.stderr
    assert (
        json.loads(tidegate(gateway, "table", "describe", table, "--json").stdout)[
            "partition_info"
        ][0]["high_watermark"]
        == 0
    )


def test_cli_tenant_admin(gateway: GatewayProcess, namespace: str) -> None:
    name = f"cli{namespace}"
    created = json.loads(tidegate(gateway, "tenant", "create", name).stdout)
    assert created["name"] == name and created["status"] == "active"
    assert f"{name}\tactive" in tidegate(gateway, "tenant", "list").stdout
    key = tidegate(gateway, "tenant", "key", "issue", name).stdout.strip()
    assert key.startswith("tg_")
    quota = json.loads(
        tidegate(gateway, "tenant", "quota", "set", name, "--max-tables", "1").stdout
    )
    assert quota["max_tables"] == 1
    assert json.loads(tidegate(gateway, "tenant", "quota", "get", name).stdout)["max_tables"] == 1

    tidegate(gateway, "table", "create", f"{namespace}.a", "--schema", "v:int64", api_key=key)
    over = tidegate(
        gateway, "table", "create", f"{namespace}.b", "--schema", "v:int64", api_key=key, ok=False
    )
    assert over.returncode == 2 and "QUOTA_EXCEEDED" in over.stderr
    listed = tidegate(gateway, "table", "list", api_key=key).stdout
    assert f"{namespace}.a" in listed
    assert f"{namespace}.a" not in tidegate(gateway, "table", "list").stdout  # other tenant

    usage = tidegate(gateway, "tenant", "usage", name).stdout.splitlines()
    assert json.loads(usage[-1])["total"]["requests"] >= 3

    tidegate(gateway, "tenant", "suspend", name)
    refused = tidegate(gateway, "table", "list", api_key=key, ok=False)
    assert refused.returncode == 2 and "TENANT_SUSPENDED" in refused.stderr
    tidegate(gateway, "tenant", "resume", name)
    tidegate(gateway, "table", "list", api_key=key)

    key_id = key[3:19]
    assert f"{key_id}\tactive" in tidegate(gateway, "tenant", "key", "list", name).stdout
    tidegate(gateway, "tenant", "key", "revoke", key_id)
    revoked = tidegate(gateway, "table", "list", api_key=key, ok=False)
    assert revoked.returncode == 2 and "UNAUTHENTICATED" in revoked.stderr

    tidegate(gateway, "tenant", "delete", name)
    assert name not in tidegate(gateway, "tenant", "list").stdout


def test_cli_without_a_key_is_refused(gateway: GatewayProcess) -> None:
    res = tidegate(gateway, "table", "list", api_key="", ok=False)
    assert res.returncode == 2 and "UNAUTHENTICATED" in res.stderr
