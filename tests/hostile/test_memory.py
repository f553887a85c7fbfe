"""Issue 18.6: many follow streams over a large backlog keep the gateway's memory within
its read budget, while appends and health checks keep answering.

A noisy tenant opens 180 follow streams from offset 0 and never reads past their first
answer (each holds what it was sent, as a stalled consumer does); a second tenant follows
the same backlog with 20 streams that read everything. The noisy tenant's streams hold at
most its share of the budget, the reader's streams are not held up by them, and the
gateway grows by less than its read budget."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import httpx
import pyarrow as pa
import pytest

from gateway.core.budget import READ_COPIES
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import encode_stream
from tests.services import GatewayProcess

MiB = 1024 * 1024
BUDGET = 192 * MiB
STREAMS = 200
READERS = 20  # streams that read everything; the rest read one answer and stall
#: A follow stream waits 60 s for room before it is refused (gateway/server/calls/reads.py):
#: until then every noisy stream that got an answer still holds its share.
UNREFUSED_S = 55


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_follow_streams_stay_within_the_read_budget(tmp_path: Path) -> None:
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_SERVER__READ_MEMORY_BYTES": str(BUDGET),
            "TIDEGATE_SERVER__TENANT_READ_MEMORY_BYTES": str(BUDGET // 2),
            # Small answers: many streams, each holding little (the default favours speed).
            "TIDEGATE_SERVER__FOLLOW_READ_BYTES": str(256 * 1024),
            "TIDEGATE_QUOTA__MAX_FOLLOWS": str(STREAMS + 10),
        },
    ).start()
    pid = gw.proc.pid  # type: ignore[union-attr]
    try:
        rows = 20_000
        # ~10 MB of Arrow data in each tenant's partition: some 40 follow answers of
        # 256 KiB for each reader, and several times what the budget lets a stalled stream
        # hold (READ_COPIES answers). It was 21 batches: the readers' reading of them was
        # most of the test's CPU, and the claim does not grow with it.
        appends = 8
        batch = pa.record_batch(
            {"n": pa.array(range(rows), pa.int64()), "s": pa.array(["x" * 50] * rows)}
        )
        body = encode_stream([batch], batch.schema, "zstd")
        with gw.admin() as admin:
            admin.create_tenant("noisy")
            noisy_key = admin.issue_key("noisy")[1]
        for key in (gw.api_key, noisy_key):
            with gw.client(api_key=key) as c:
                c.create_table("m.t", {"n": "int64", "s": "string"}, partitions=1)
                for _ in range(appends):
                    c.append_ipc("m.t", body, partition=0)
        backlog = appends * rows
        time.sleep(1.0)
        baseline = rss_bytes(pid)

        got = [0] * STREAMS
        errors: list[BaseException] = []
        refused = [False] * STREAMS

        def follow(i: int) -> None:
            stub = pb_grpc.TidegateStub(
                gw.channel(api_key=gw.api_key if i < READERS else noisy_key)
            )
            call = stub.Read(
                pb.ReadRequest(table=pb.TableRef(namespace="m", name="t"), offset=0, follow=True),
            )
            try:
                for msg in call:
                    if msg.arrow_ipc:
                        got[i] += pa.ipc.open_stream(msg.arrow_ipc).read_all().num_rows
                    if i >= READERS:
                        time.sleep(30)  # a stalled consumer: flow control holds the server
                    if got[i] >= backlog and i < READERS:
                        call.cancel()
                        return
            except grpc.RpcError as exc:
                if i >= READERS and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused[i] = True  # past its share: back-pressure, a retryable refusal
                elif exc.code() != grpc.StatusCode.CANCELLED:
                    errors.append(exc)

        threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(STREAMS)]
        started = time.monotonic()
        for t in threads:
            t.start()
        peak = baseline
        appended = health = 0
        holding = 0
        deadline = time.monotonic() + 90
        with gw.client() as c, httpx.Client(base_url=gw.http_url, timeout=10) as h:
            while time.monotonic() < deadline and min(got[:READERS]) < backlog:
                peak = max(peak, rss_bytes(pid))
                if time.monotonic() - started < UNREFUSED_S:
                    holding = max(holding, sum(1 for g in got[READERS:] if g > 0))
                c.append("m.t", [{"n": -1, "s": "live"}], partition=0)
                appended += 1
                assert h.get("/healthz").status_code == 200
                health += 1
                time.sleep(0.1)
            for _ in range(20):  # a little longer, with every stream open
                peak = max(peak, rss_bytes(pid))
                time.sleep(0.05)
        assert not errors, errors[:3]
        assert min(got[:READERS]) >= backlog, got[:READERS]
        # The noisy streams that got an answer fit the tenant's share of the budget (what a
        # 256 KiB follow answer reserves each); the others wait for room, or were refused
        # with a retry hint, instead of growing the gateway. Counted while no stream can
        # have been refused yet: a refused stream gives its share back, and a waiting one
        # then gets its first answer (on a slow machine the readers take over a minute).
        assert 0 < holding <= (BUDGET // 2) // (READ_COPIES * 256 * 1024), holding
        assert appended > 0 and health > 0
        growth = peak - baseline
        print(f"rss baseline {baseline / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, growth "
              f"{growth / MiB:.0f} MiB for a {BUDGET / MiB:.0f} MiB read budget")  # fmt: skip
        assert growth < BUDGET, f"grew {growth / MiB:.0f} MiB"
    finally:
        gw.stop()
