"""Where a gateway spends its time on one hot path: start a gateway (disk hot tier, its own
data folder), load it with one kind of request from this process, record the gateway with
py-spy meanwhile, and summarise the samples by function.

    python -m benchmarks.profile hot-read [--seconds 10] [--out DIR] [--hot disk|redis]

Paths: ``hot-read`` (gRPC Read of hot records, as the SDK reads them), ``cold-read`` (Flight
stream reads of tiered records), ``flight-hot-read`` (the same Flight reads of hot records),
``scan`` (whole-table Flight scans of tiered records), ``append`` (gRPC Append of 64 KiB
Arrow bodies to one partition). Each prints the client's
records/s, then the functions holding the most samples by themselves and the chosen frames
of the path with the share of samples under them; ``--out`` also writes the summary and the
raw samples (py-spy's collapsed stacks) there. The numbers are shares of the gateway's own
samples, so they hold on a loaded machine better than timings do.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures as cf
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa

from gateway.client import Client
from gateway.client._reading import read_response_batches
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.services import GatewayProcess, RedisServer

RECORDS = 200_000
BATCH = 10_000
FIELDS = [{"name": "k", "type": "int64"}, {"name": "d", "type": "string"}]

#: Frames reported with their inclusive share, per path (function name prefixes).
FRAMES = {
    "hot-read": [
        "ReadMethods.Read",
        "ReadOps._read",
        "DiskHotLog.read",
        "DiskHotLog.read_at",
        "ShardReads.read_at",
        "ShardReads._batch",
        "Script.__call__",
        "hot_pieces",
        "_read_messages",
        "ReadCalls._answer",
        "Tenancy.check_read",
    ],
    "cold-read": [
        "FlightReads._drain",
        "ReadOps._read",
        "TableReads.read_range",
        "ParquetFile.read_row_group",
        "ReadOps._read_snapshot",
        "cast_to",
    ],
    "flight-hot-read": [
        "FlightReads._drain",
        "FlightReads._read",
        "ReadOps._read",
        "ReadOps._spliced",
        "DiskHotLog.read_at",
        "ShardReads.read_at",
        "read_messages",
        "splice_piece",
        "LoopBridge.on_loop",
    ],
    "scan": [
        "FlightReads._drain",
        "ScanOps.scan",
        "ScanOps._pin",
        "ScanOps._lease",
        "MetadataStore.add_lease",
        "MetadataStore.release_lease",
        "TableReads._tasks",
        "TableReads.scan",
        "ParquetFile.read_row_group",
    ],
    "append": [
        "AppendMethods.Append",
        "AppendCalls.append",
        "AppendOps.append",
        "DiskHotLog.append",
        "check_request",
        "inspect_stream",
        "decode_valid",
        "conform_batch",
        "encode_batch",
    ],
}


def _batch(i: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(range(i * BATCH, (i + 1) * BATCH), pa.int64()),
            "d": pa.array(["x" * 90] * BATCH, pa.string()),
        }
    )


def _fill(c: Client, table: str) -> None:
    c.create_table(table, FIELDS, partitions=1)
    for i in range(RECORDS // BATCH):
        c.append(table, _batch(i), partition=0)


def _wait_tiered(c: Client, table: str) -> None:
    deadline = time.monotonic() + 120
    while c.describe_table(table).partition_info[0].tiered_watermark < RECORDS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{table} was not tiered within 120 s")
        time.sleep(0.5)
    time.sleep(2)  # the stream-read snapshot cache turns over


async def _hot_reads(gw: GatewayProcess, until: float) -> int:
    metadata = [("authorization", f"Bearer {gw.api_key}")]
    options = [("grpc.max_receive_message_length", 256 << 20)]
    async with grpc.aio.insecure_channel(gw.grpc_target, options=options) as ch:
        stub = pb_grpc.TidegateStub(ch)

        async def reader(r: int) -> int:
            n, offset = 0, r * RECORDS // 4
            while time.monotonic() < until:
                request = pb.ReadRequest(
                    table=pb.TableRef(namespace="p", name="t"),
                    partition=0,
                    offset=offset % RECORDS,
                    max_records=BATCH,
                    raw_hot=True,
                )
                async for msg in stub.Read(request, metadata=metadata):
                    n += sum(b.num_rows for b in read_response_batches(msg, 0))
                offset += BATCH
            return n

        return sum(await asyncio.gather(*(reader(r) for r in range(4))))


async def _appends(gw: GatewayProcess, until: float) -> int:
    metadata = [("authorization", f"Bearer {gw.api_key}")]
    sink = pa.BufferOutputStream()
    rows = _batch(0).slice(0, 640)  # about 64 KiB
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    body = sink.getvalue().to_pybytes()
    async with grpc.aio.insecure_channel(gw.grpc_target) as ch:
        stub = pb_grpc.TidegateStub(ch)
        request = pb.AppendRequest(
            table=pb.TableRef(namespace="p", name="t"), arrow_ipc=body, partition=0
        )

        async def writer() -> int:
            n = 0
            while time.monotonic() < until:
                await stub.Append(request, metadata=metadata)
                n += rows.num_rows
            return n

        return sum(await asyncio.gather(*(writer() for _ in range(8))))


def _flight_calls(
    gw: GatewayProcess, command: Callable[[int], dict[str, Any]], until: float
) -> int:
    import pyarrow.flight as fl

    client = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {gw.api_key}".encode())])

    def one(i: int) -> int:
        ticket = fl.Ticket(json.dumps(command(i)).encode())
        return int(client.do_get(ticket, options).read_all().num_rows)

    n = calls = 0
    with cf.ThreadPoolExecutor(2) as pool:
        while time.monotonic() < until:
            n += sum(pool.map(one, range(calls, calls + 2)))
            calls += 2
    client.close()
    return n


def summarise(raw: Path, frames: list[str], top: int = 15) -> str:
    """Self and inclusive shares of py-spy's collapsed stacks in ``raw``."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        names = [f.split(" (")[0] for f in stack.split(";")]
        own[names[-1]] += n
        for name in set(names):
            under[name] += n
    if total == 0:
        return (
            "samples: 0 (py-spy recorded nothing in this window: the gateway was idle or "
            "the window too short; raise --seconds)"
        )
    lines = [f"samples: {total}", "", "functions by their own samples:"]
    lines += [f"  {100 * n / max(1, total):5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "the path's frames, with everything under them:"]
    for want in frames:
        n = sum(v for k, v in under.items() if k == want)
        lines.append(f"  {100 * n / max(1, total):5.1f}%  {want}")
    return "\n".join(lines)


def profile(
    path: str,
    seconds: float,
    out: Path | None,
    hot: str = "disk",
    gateway_env: dict[str, str] | None = None,
) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy (the bench extra has it)")
    work = Path(tempfile.mkdtemp(prefix="tg-profile-"))
    tiered = path in ("cold-read", "scan")
    env = {"TIDEGATE_HOT__TYPE": hot}
    redis = None
    if hot == "redis":
        redis = RedisServer(work / "redis").start()
        env["TIDEGATE_HOT__URL"] = redis.url
    env.update(
        {"TIDEGATE_TIERING__INTERVAL_S": "1"} if tiered else {"TIDEGATE_TIERING__ENABLED": "false"}
    )
    env.update(gateway_env or {})
    gw = GatewayProcess(work / "gw", env)
    try:
        gw.start()
    except RuntimeError:  # a loaded machine may miss the start's deadline once
        gw.stop()
        gw = GatewayProcess(work / "gw2", env)
        gw.start()
    raw = work / "samples.txt"
    try:
        with gw.client() as c:
            if path == "append":
                c.create_table("p.t", FIELDS, partitions=1)
            else:
                _fill(c, "p.t")
            if tiered:
                _wait_tiered(c, "p.t")
        assert gw.proc is not None
        recorder = subprocess.Popen(
            [spy, "record", "--pid", str(gw.proc.pid), "--duration", str(int(seconds)),
             "--rate", "200", "--format", "raw", "--nonblocking", "-o", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started = time.monotonic()
        until = started + seconds + 1
        if path == "hot-read":
            n = asyncio.run(_hot_reads(gw, until))
        elif path == "append":
            n = asyncio.run(_appends(gw, until))
        elif path in ("cold-read", "flight-hot-read"):
            n = _flight_calls(
                gw,
                lambda i: {
                    "read": {"namespace": "p", "name": "t", "partition": 0,
                             "offset": i * BATCH % RECORDS, "max_records": BATCH}
                },
                until,
            )  # fmt: skip
        else:
            n = _flight_calls(gw, lambda i: {"scan": {"namespace": "p", "name": "t"}}, until)
        rate = n / (time.monotonic() - started)
        recorder.wait(timeout=seconds + 30)
    finally:
        gw.stop()
        if redis is not None:
            redis.stop()
    text = f"{path} ({hot} hot tier): {rate:,.0f} records/s at the client\n"
    text += summarise(raw, FRAMES[path])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{path}-{hot}.txt").write_text(text + "\n")
        shutil.copy(raw, out / f"{path}-{hot}.samples")
    shutil.rmtree(work, ignore_errors=True)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("path", choices=sorted(FRAMES), nargs="+")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--hot", choices=["disk", "redis"], default="disk")
    parser.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="TIDEGATE_KEY=VALUE",
        help="a gateway setting, e.g. TIDEGATE_COMPRESSION=producer",
    )
    ns = parser.parse_args(argv)
    env = dict(item.partition("=")[::2] for item in ns.gateway)
    for path in ns.path:
        print(profile(path, ns.seconds, ns.out, ns.hot, env), flush=True)


if __name__ == "__main__":
    main()
