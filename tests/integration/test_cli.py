"""The tidegate command against a live gateway: table admin, append from files, read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


def tidegate(
    gateway: GatewayProcess, *args: str, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--target", gateway.grpc_target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_round_trip(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    table = f"{namespace}.people"
    out = tidegate(
        gateway,
        "table",
        "create",
        table,
        "--schema",
        "id:int64,name:string,score:decimal128(6, 2)",
        "--partitions",
        "1",
    )
    assert json.loads(out.stdout)["partitions"] == 1
    assert (
        f"{table}\t1 partitions"
        in tidegate(gateway, "table", "list", "--namespace", namespace).stdout
    )

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
    for f, n in ((csv, 2), (jsonl, 1), (parquet, 1)):
        assert f"appended {n} records" in tidegate(gateway, "append", table, str(f)).stdout

    lines = tidegate(
        gateway, "read", table, "--partition", "0", "--offset", "1"
    ).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["_offset"], r["id"], r["name"], r["score"]) for r in rows] == [
        (1, 2, "alan", "7.25"),
        (2, 3, "grace", "8.00"),
        (3, 4, "edsger", "1.00"),
    ]
    out_file = tmp_path / "out.parquet"
    tidegate(gateway, "read", table, "--output", str(out_file))
    assert pq.read_table(out_file).column("name").to_pylist() == ["ada", "alan", "grace", "edsger"]

    described = json.loads(tidegate(gateway, "table", "describe", table).stdout)
    assert described["partition_info"][0]["high_watermark"] == 4
    tidegate(gateway, "table", "drop", table)
    missing = tidegate(gateway, "table", "describe", table, ok=False)
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
        json.loads(tidegate(gateway, "table", "describe", table).stdout)["partition_info"][0][
            "high_watermark"
        ]
        == 0
    )
