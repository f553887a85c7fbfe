"""The SDK across crashes: a gateway SIGKILLed mid-produce, a consumer SIGKILLed mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from gateway.client import ExponentialBackoff, Retry
from tests.integration.conftest import gateway_env
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORDS = 1_000_000
CHUNK = 2_000
PARTITIONS = 4


def test_a_million_records_survive_a_gateway_restart_exactly_once(tmp_path: Path) -> None:
    env = gateway_env("disk", None)
    env["TIDEGATE_SERVER__MAX_REQUEST_BYTES"] = str(8 * 1024 * 1024)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = "crash.million"
    try:
        with gw.client() as c:
            c.create_table(table, {"id": "int64", "tag": "string"}, partitions=PARTITIONS)
            acked = 0
            lock = threading.Lock()

            def count(fut: object) -> None:
                nonlocal acked
                with lock:
                    acked += CHUNK

            futures = []
            restarted = threading.Event()
            at_restart: list[int] = []

            def restart_midway() -> None:
                deadline = time.monotonic() + 120
                while acked < RECORDS // 4 and time.monotonic() < deadline:
                    time.sleep(0.005)
                at_restart.append(acked)
                gw.restart()  # SIGKILL while batches are in flight, then the same ports
                restarted.set()

            killer = threading.Thread(target=restart_midway)
            killer.start()
            with c.producer(
                table,
                batch_records=10_000,
                linger=0.005,
                compression="lz4",
                max_in_flight=5,
                buffer_records=200_000,
                retry=Retry(ExponentialBackoff(base=0.05, cap=0.5), timeout=120),
            ) as p:
                for start in range(0, RECORDS, CHUNK):
                    ids = pa.array(range(start, start + CHUNK), pa.int64())
                    fut = p.send(pa.table({"id": ids, "tag": pa.array(["t"] * CHUNK)}))
                    fut.add_done_callback(count)
                    futures.append(fut)
                p.flush()
                retries = p.retries
            killer.join(180)
            assert restarted.is_set(), "the gateway was not restarted mid-run"
            assert at_restart[0] < RECORDS, "the restart came after the last acknowledgement"
            assert retries > 0, "the restart forced no retry"
            where = {}
            for start, fut in zip(range(0, RECORDS, CHUNK), futures, strict=True):
                for k, md in enumerate(fut.result(0)):
                    where[start + k] = (md.partition, md.offset)

            # Every record exactly once, in send order per partition, where its future said.
            total = 0
            for part in range(PARTITIONS):
                ids = (
                    c.read(table, partition=part, offset=0, max_records=RECORDS)
                    .column("id")
                    .to_pylist()
                )
                total += len(ids)
                assert ids == sorted(ids), f"partition {part} is out of order"
                assert len(set(ids)) == len(ids), f"partition {part} holds duplicates"
                for offset, rid in enumerate(ids):
                    assert where[rid] == (part, offset)
            assert total == RECORDS
    finally:
        gw.stop()


CONSUMER_CHILD = """
import sys, time
from tests.services import connect

target, table, out_path, api_key = sys.argv[1:5]
with connect(target, api_key=api_key) as c, open(out_path, "a") as out:
    consumer = c.consumer(table, group="crashers", follow=True, auto_commit_interval=None,
                          max_records=300)
    for batch in consumer.batches():
        p = batch.column("_partition")[0].as_py()
        for offset in batch.column("_offset").to_pylist():
            out.write(f"{p} {offset}\\n")
        out.flush()  # in the kernel before the commit: a SIGKILL cannot lose it
        consumer.commit()
        time.sleep(0.01)
"""


def test_a_killed_group_consumer_resumes_from_its_last_commit(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw", gateway_env("disk", None)).start()
    table = "crash.consumed"
    per_partition = 6_000
    try:
        with gw.client() as c:
            c.create_table(table, {"n": "int64"}, partitions=3)
            for p in range(3):
                for start in range(0, per_partition, 1_000):
                    c.append(table, [{"n": i} for i in range(start, start + 1_000)], partition=p)
            seen_path = tmp_path / "seen.txt"
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CONSUMER_CHILD,
                    gw.grpc_target,
                    table,
                    str(seen_path),
                    gw.api_key,
                ],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if seen_path.exists() and seen_path.read_text().count("\n") >= 5_000:
                        break
                    assert child.poll() is None, "the consumer died on its own"
                    time.sleep(0.01)
                child.send_signal(signal.SIGKILL)  # mid-stream, no goodbye
                child.wait(10)
            finally:
                if child.poll() is None:
                    child.kill()
            first = [tuple(map(int, line.split())) for line in seen_path.read_text().splitlines()]
            committed = c.fetch_offsets("crashers", table)
            assert 0 < sum(committed.values()) < 3 * per_partition, "killed mid-stream"
            assert len(set(first)) == len(first), "the first consumer saw a record twice"
            for p in range(3):
                mine = sorted(o for q, o in first if q == p)
                # Everything below the commit was seen by the first consumer.
                assert mine[: committed.get(p, 0)] == list(range(committed.get(p, 0)))

            resumed = []
            with c.consumer(table, group="crashers", follow=False) as consumer:
                for batch in consumer.batches():
                    p = batch.column("_partition")[0].as_py()
                    resumed.extend((p, o) for o in batch.column("_offset").to_pylist())
            for p in range(3):
                again = [o for q, o in resumed if q == p]
                # The second consumer starts exactly at the commit: nothing after the
                # commit is seen twice by the group, and nothing is missing.
                assert again == list(range(committed.get(p, 0), per_partition))
            assert c.fetch_offsets("crashers", table) == dict.fromkeys(range(3), per_partition)
    finally:
        gw.stop()
