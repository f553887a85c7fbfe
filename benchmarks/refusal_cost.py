"""What one refused append costs, on each edge: ``python -m benchmarks.refusal_cost``.

A tenant is put deep into debt on its append bucket (one 64 KiB append against a quota of
1 KB/s), so that every append it sends afterwards is refused from its headers (the
``Gate.refuse_early`` path of issue 33, item 9). Then, per edge, ``calls`` such appends of
a 64 KiB Arrow body are sent ``concurrency`` at a time, and the CPU time the gateway process
(every thread) and this client process used over them is divided by the number of
refusals: CPU microseconds per refusal, server and client side, and the refusal rate the
gateway sustained. The same is done for accepted 64 KiB appends of a tenant without quota,
for comparison, and the standard health check, grpcio's own floor for a call.

Results: ``benchmarks/results/neighbours/refusal-cost.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pyarrow as pa

from benchmarks.loadgen import BatchFactory, record_schema
from benchmarks.neighbours import _cpu_s
from benchmarks.scenarios import CHANNEL_OPTIONS, fields_of
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.services import GatewayProcess, RedisServer

HERE = Path(__file__).resolve().parent
ARROW = "application/vnd.apache.arrow.stream"


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(pid: int, calls: int, concurrency: int, one: Any) -> dict[str, Any]:
    """Run ``one(i)`` ``calls`` times, ``concurrency`` at once; CPU per call on each side."""
    codes: dict[str, int] = {}
    queue = iter(range(calls))

    async def worker() -> None:
        for i in queue:
            code = await one(i)
            codes[code] = codes.get(code, 0) + 1

    server0, client0, wall0 = _cpu_s(pid), _self_cpu_s(), time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.monotonic() - wall0
    server, client = _cpu_s(pid) - server0, _self_cpu_s() - client0
    return {
        "calls": calls,
        "codes": codes,
        "wall_s": round(wall, 3),
        "calls_per_s": round(calls / wall, 1),
        "server_cpu_us_per_call": round(server / calls * 1e6, 1),
        "client_cpu_us_per_call": round(client / calls * 1e6, 1),
        "server_cpu_share": round(server / wall, 3),
        "client_share_of_cpu": round(client / (client + server), 3) if client + server else None,
    }


async def _grpc(gw: GatewayProcess, key: str, ref: Any, body: bytes, calls: int, conc: int) -> Any:
    md = (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(gw.grpc_target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        request = pb.AppendRequest(table=ref, arrow_ipc=body, partition=0)

        async def one(_: int) -> str:
            try:
                await stub.Append(request, metadata=md, timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return "OK"

        await one(0)  # the connection is up before the clock starts
        return await _measure(gw.proc.pid, calls, conc, one)  # type: ignore[union-attr]


async def _health(gw: GatewayProcess, calls: int, conc: int) -> Any:
    """grpcio's floor: the standard health check, a unary call that none of our code
    intercepts or serves (grpcio's own servicer answers it)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(gw.grpc_target, options=CHANNEL_OPTIONS) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        request = health_pb2.HealthCheckRequest()

        async def one(_: int) -> str:
            try:
                await stub.Check(request, timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return "OK"

        await one(0)
        return await _measure(gw.proc.pid, calls, conc, one)  # type: ignore[union-attr]


async def _http(gw: GatewayProcess, key: str, ref: Any, body: bytes, calls: int, conc: int) -> Any:
    headers = {"authorization": f"Bearer {key}", "content-type": ARROW}
    url = f"/v1/tables/{ref.namespace}/{ref.name}/records?partition=0"
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=gw.http_url, limits=limits, timeout=30) as http:

        async def one(_: int) -> str:
            try:
                r = await http.post(url, content=body, headers=headers)
            except httpx.HTTPError as err:
                return type(err).__name__
            return str(r.status_code)

        await one(0)
        return await _measure(gw.proc.pid, calls, conc, one)  # type: ignore[union-attr]


async def _table(gw: GatewayProcess, key: str) -> Any:
    md = (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(gw.grpc_target, options=CHANNEL_OPTIONS) as ch:
        ref = pb.TableRef(namespace="cost", name="t")
        await pb_grpc.TidegateStub(ch).CreateTable(
            pb.CreateTableRequest(table=ref, fields=fields_of(record_schema()), partitions=1),
            metadata=md,
        )
        return ref


async def run(workdir: Path, calls: int, concurrency: int) -> dict[str, Any]:
    redis = RedisServer(workdir / "redis").start()
    gw = GatewayProcess(
        workdir / "gw",
        {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis.url,
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_COMPACTION__ENABLED": "false",
            "TIDEGATE_EXPIRY__ENABLED": "false",
        },
    )
    factory = BatchFactory(655, 100)  # the noisy-neighbour workload's 64 KiB batches
    sink = pa.BufferOutputStream()
    batch = factory.batch(0)
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    body = sink.getvalue().to_pybytes()
    out: dict[str, Any] = {"body_bytes": len(body), "concurrency": concurrency}
    try:
        gw.start()
        with gw.admin() as admin:
            for name in ("loud", "calm"):
                admin.create_tenant(name)
            admin.set_quota("loud", append_bytes_per_s=1000)
            loud, calm = admin.issue_key("loud")[1], admin.issue_key("calm")[1]
        ref_loud, ref_calm = await _table(gw, loud), await _table(gw, calm)
        # Deep in debt: 64 KiB at 1 KB/s is a minute of refusals from the headers.
        async with grpc.aio.insecure_channel(gw.grpc_target, options=CHANNEL_OPTIONS) as ch:
            md = (("authorization", f"Bearer {loud}"),)
            await pb_grpc.TidegateStub(ch).Append(
                pb.AppendRequest(table=ref_loud, arrow_ipc=body, partition=0), metadata=md
            )
        out["grpc_health"] = await _health(gw, calls, concurrency)
        out["grpc_refused"] = await _grpc(gw, loud, ref_loud, body, calls, concurrency)
        out["http_refused"] = await _http(gw, loud, ref_loud, body, calls, concurrency)
        accepted = max(200, calls // 10)
        out["grpc_accepted"] = await _grpc(gw, calm, ref_calm, body, accepted, concurrency)
        out["http_accepted"] = await _http(gw, calm, ref_calm, body, accepted, concurrency)
    finally:
        gw.stop()
        redis.stop()
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "neighbours")
    ns = parser.parse_args()
    runs = []
    for i in range(ns.repeats):
        with tempfile.TemporaryDirectory(prefix="tg-refusal-") as tmp:
            runs.append(asyncio.run(run(Path(tmp), ns.calls, ns.concurrency)))
        print(json.dumps(runs[-1], indent=1), flush=True)
        print(f"run {i + 1} of {ns.repeats} done", flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    commit = os.popen(f"git -C {HERE.parent} describe --always --dirty").read().strip()
    doc = {"commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ"), "runs": runs}
    (ns.out / "refusal-cost.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
