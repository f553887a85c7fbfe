"""Tidegate's Spark work on a standalone Spark cluster (issue 26, item 6): a master and two
workers in JVMs of their own (:class:`tests.services.SparkCluster`), started once for the
module. The lake jobs are submitted as users submit them (``spark-submit`` of
``tiering/__main__.py``, ``tidegate compact --runner spark --master spark://...``), the
``tidegate`` source runs in a driver application on the cluster, and the executors get
what they need through Spark's configuration alone: the workers start with a clean
environment, and the submitting process's ``TIDEGATE_*``/``AWS_*`` never reach them.

The applications that the tests submit come first: the driver of the later tests holds
both workers' cores until the module ends.
"""

from __future__ import annotations

import datetime as dt
import decimal
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.wire.schema import parse_fields
from tests.services import REPO_ROOT, SparkCluster
from tests.sparkcluster.conftest import (
    APP_TIMEOUT_S,
    EXECUTOR_ENV_CONF,
    ClusterLake,
    SparkDriver,
    submitter_env,
)

# The first test of the module also starts the cluster (and the first driver test, the
# driver): several JVMs on two busy cores, inside pytest-timeout's budget.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

BOTH_WORKERS = {"worker0", "worker1"}


def _app_ids(cluster: SparkCluster) -> set[str]:
    """Every application the master has seen (running or done)."""
    state = cluster.state()
    return {str(a["id"]) for a in state.get("activeapps", []) + state.get("completedapps", [])}


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the job's process group (its driver JVM too), SIGKILL after 30 s."""
    import os

    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def test_tiering_and_compaction_jobs_on_the_cluster_keep_each_record_once(
    cluster: SparkCluster, cluster_lake: ClusterLake, table_name: str, tmp_path: Path
) -> None:
    lake = cluster_lake
    assert cluster.state()["activeapps"] == [], "an application holds the cluster's cores"
    apps_before = _app_ids(cluster)
    acknowledged: dict[tuple[int, int], int] = {}
    step = 0

    def produce(c: Any) -> None:
        """Ten records per partition, each acknowledged with its offsets."""
        nonlocal step
        for p in range(3):
            values = [p * 1_000_000 + step * 10 + i for i in range(10)]
            ranges = c.append(table_name, [{"n": v} for v in values], partition=p)
            assert sum(r.count for r in ranges) == 10
            offsets = [r.base_offset + i for r in ranges for i in range(r.count)]
            for offset, value in zip(offsets, values, strict=True):
                acknowledged[(p, offset)] = value
        step += 1

    def tiered(c: Any) -> tuple[int, ...]:
        info = c.describe_table(table_name)
        return tuple(p.tiered_watermark for p in info.partition_info)

    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=3)
        for _ in range(3):
            produce(c)

    # Tiering on the cluster every second, as `spark-submit tiering/__main__.py` runs it,
    # while a producer goes on appending. The job's settings are its own environment (as
    # a gateway's); its executors get them inside the tasks it ships.
    job_env = submitter_env({**lake.env, "TIDEGATE_DATA_DIR": str(tmp_path / "tier-job")})
    tier_log = tmp_path / "tier.log"
    with tier_log.open("wb") as log:
        tier = subprocess.Popen(
            [
                *cluster.submit_args(EXECUTOR_ENV_CONF),
                str(REPO_ROOT / "tiering" / "__main__.py"),
                "tier",
                "--every",
                "1",
            ],
            env=job_env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + APP_TIMEOUT_S
        with lake.gateway.client() as c:
            # Append until the job has tiered twice (so each partition gets several data
            # files, for compaction), then until everything acknowledged is tiered.
            passes = 0
            while passes < 2:
                assert tier.poll() is None, tier_log.read_text()[-5000:]
                assert time.monotonic() < deadline, tier_log.read_text()[-5000:]
                before = tiered(c)
                produce(c)
                time.sleep(0.5)
                if tiered(c) != before and all(tiered(c)):
                    passes += 1
            high = c.describe_table(table_name).high_watermarks
            while tiered(c) != high:
                assert tier.poll() is None, tier_log.read_text()[-5000:]
                assert time.monotonic() < deadline, tier_log.read_text()[-5000:]
                time.sleep(0.5)
    finally:
        _stop_group(tier)

    rows, marks, files = lake.cold(table_name)
    want = sorted((p, offset, n) for (p, offset), n in acknowledged.items())
    assert [(r["_partition"], r["_offset"], r["n"]) for r in rows] == want
    assert marks == dict(enumerate(high))
    assert all(count >= 2 for count in files), files
    (tier_app,) = _app_ids(cluster) - apps_before
    assert cluster.executors_by_app()[tier_app] == BOTH_WORKERS

    # Compaction through the CLI: `tidegate compact` starts its own SparkSession, so its
    # Spark configuration is a spark-defaults.conf (SPARK_CONF_DIR), as a user's would be.
    conf_dir = cluster.defaults_conf(tmp_path / "spark-conf", EXECUTOR_ENV_CONF)
    command = ["compact", "--runner", "spark", "--master", cluster.master_url]
    compact = subprocess.run(
        [sys.executable, "-m", "gateway", *command],
        env={
            **submitter_env({**lake.env, "TIDEGATE_DATA_DIR": str(tmp_path / "compact-job")}),
            "SPARK_CONF_DIR": str(conf_dir),
        },
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=APP_TIMEOUT_S,
    )
    assert compact.returncode == 0, compact.stdout + compact.stderr[-5000:]
    assert f"compacted {len(want)} records in 1 table\n" in compact.stdout
    after, marks_after, files_after = lake.cold(table_name)
    assert after == rows and marks_after == marks
    assert files_after == [1, 1, 1]
    (compact_app,) = _app_ids(cluster) - apps_before - {tier_app}
    assert cluster.executors_by_app()[compact_app] == BOTH_WORKERS


def test_executors_get_spark_conf_and_never_the_submitters_environment(
    driver: SparkDriver,
) -> None:
    tasks = driver.ask("probe")
    assert {t["worker"] for t in tasks} == BOTH_WORKERS
    for task in tasks:
        # spark.pyspark.python: the interpreter tidegate is installed in.
        assert task["python"] == sys.executable
        # The driver's environment holds TIDEGATE_CLUSTER_CANARY and AWS keys; executors
        # see only what spark.executorEnv.* gave them.
        ours = {k: v for k, v in task["env"].items() if k.startswith(("TIDEGATE_", "AWS_"))}
        assert ours == {"TIDEGATE_CLUSTER_NOTE": "from-spark-conf"}
        assert "VIRTUAL_ENV" not in task["env"]


SCHEMA = {"k": "string", "n": "int64", "price": "decimal128(10, 2)"}


def _batch(start: int, count: int) -> pa.Table:
    rows = [
        {"k": f"k{i % 7}", "n": i, "price": decimal.Decimal(f"{i}.25")}
        for i in range(start, start + count)
    ]
    return pa.Table.from_pylist(
        rows, schema=parse_fields([{"name": k, "type": v} for k, v in SCHEMA.items()])
    )


def _sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows in (partition, offset) order, timestamps as epoch seconds (Spark's may come
    back naive, in the session's time zone: UTC)."""

    def instant(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
        return v

    rows = [{k: instant(v) for k, v in r.items()} for r in table.to_pylist()]
    return sorted(rows, key=lambda r: (r["_partition"], r["_offset"]))


#: ``format(...)`` of each implementation on the driver (the jar is on its session).
SOURCES = {"jvm": "tidegate", "python": "tidegate_python"}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_batch_read_on_the_cluster_equals_the_gateways_scan(
    cluster_lake: ClusterLake, driver: SparkDriver, table_name: str, tmp_path: Path, source: str
) -> None:
    lake = cluster_lake
    with lake.gateway.client() as c:
        c.create_table(table_name, SCHEMA, partitions=3)
        for start in (0, 40):  # two data files per partition
            for p in range(3):
                c.append(table_name, _batch(p * 1000 + start, 40), partition=p)
            lake.tier(table_name)
        for p in range(3):  # and a hot tail
            c.append(table_name, _batch(p * 1000 + 80, 25), partition=p)
        plan = c.plan_read(table_name)
        want = _sorted_rows(c.scan(table_name))
    # The executors read the files through presigned URLs: they hold no S3 keys.
    assert len(plan.files) == 6 and all(f.url.startswith("http://") for f in plan.files)
    assert {r.from_offset for r in plan.hot_ranges} == {80}

    out = tmp_path / "read.arrow"
    # One split per file: nine splits, read by the executors of both workers.
    result = driver.ask(
        "read",
        format=SOURCES[source],
        options=lake.options(table_name, split_bytes=1),
        out=str(out),
    )
    got = pa.ipc.open_file(pa.memory_map(str(out))).read_all()
    assert got.column_names == [*SCHEMA, "_partition", "_offset", "_timestamp"]
    assert len(want) == 3 * 105
    assert _sorted_rows(got) == want
    assert result["partitions"] == 6 + 3
    assert set(result["per_worker"]) == BOTH_WORKERS
    assert sum(result["per_worker"].values()) == 3 * 105
    # The JVM connector hands Spark columnar batches; the Python source, rows.
    assert result["columnar"] == (source == "jvm")


def test_an_available_now_stream_drains_on_the_cluster_and_resumes(
    cluster_lake: ClusterLake, driver: SparkDriver, table_name: str, tmp_path: Path
) -> None:
    lake = cluster_lake

    def append(start: int, count: int) -> None:
        with lake.gateway.client() as c:
            for p in range(2):
                rows = [{"n": p * 100_000 + i} for i in range(start, start + count)]
                c.append(table_name, rows, partition=p)

    def drain(name: str) -> tuple[list[tuple[int, int, int]], list[int]]:
        out = tmp_path / f"{name}.arrow"
        result = driver.ask(
            "stream",
            options=lake.options(table_name, maxRecordsPerTrigger=70),
            checkpoint=str(tmp_path / "checkpoint"),
            out=str(out),
        )
        got = pa.ipc.open_file(pa.memory_map(str(out))).read_all() if result["rows"] else None
        rows = got.to_pylist() if got is not None else []
        return sorted((r["_partition"], r["_offset"], r["n"]) for r in rows), result["batches"]

    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=2)
    append(0, 60)
    lake.tier(table_name)
    append(60, 40)  # offsets 60..99 are hot

    rows, batches = drain("first")
    assert rows == [(p, i, p * 100_000 + i) for p in range(2) for i in range(100)]
    # At most 70 records a micro-batch: the 200 records took at least three.
    nonempty = [b for b in batches if b]
    assert len(nonempty) >= 3 and max(nonempty) <= 70 and sum(nonempty) == 200

    # From the checkpoint: only what came since, each record once.
    append(100, 15)
    rows, batches = drain("second")
    assert rows == [(p, i, p * 100_000 + i) for p in range(2) for i in range(100, 115)]
    assert sum(batches) == 30
