"""The full-size attacks of issue 33 on a real gateway, and what they cost it.

    python -m benchmarks.attacks [--only NAMES] [--root DIR] [--label NAME] [--out DIR]

Each attack starts a gateway of its own (disk hot tier, default settings, a data folder
of its own) and measures the gateway process from ``/proc``: peak RSS growth, open
descriptors, CPU share, and the bytes its log grew by. ``tests/hostile/test_edges.py``
runs the same attacks scaled down to what proves each bound; this runs them at the sizes
the issue reported:

- ``body``: 1.5 GB sent to ``POST /v1/tables`` without a key, chunked and with a declared
  ``Content-Length`` (33.2);
- ``grpc``: 60 concurrent 60 MiB ``Append`` calls without a key, each on a connection of
  its own (33.2);
- ``bare``: 21,000 bare TCP connections (half to HTTP, half to gRPC) held for 60 s,
  from three processes (33.5);
- ``slow``: 400 connections that stop in their headers, their body, a chunked body, or
  send nothing (33.5);
- ``streams``: one ``AppendStream`` of 500 appends at ``requests_per_s`` 5, and 1,000
  streams of one tenant left idle (33.8);
- ``reject``: a tenant with a 4 MB/s append quota sending 64 KiB appends at about 1,350
  a second for 20 s, from a process of its own: the gateway's CPU share (33.9).

``--root`` runs the gateway of another checkout (e.g. ``git archive db59b53`` unpacked)
for the figures before; settings it does not know are left out. Results go to
``--out`` (default ``benchmarks/results/attacks``) as ``<label>.json`` and are printed,
with the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
HERE = Path(__file__).resolve().parent


# What the gateway process uses --------------------------------------------------------
def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Watch:
    """Peak RSS and descriptors of a process while the block runs, its CPU share, and
    how much its log grew."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid, self.log = pid, log
        self.rss0 = self.rss_peak = rss(pid)
        self.fds0 = self.fds_peak = descriptors(pid)
        self.log0 = log.stat().st_size if log.exists() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.rss_peak = max(self.rss_peak, rss(self.pid))
                self.fds_peak = max(self.fds_peak, descriptors(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> Watch:
        self.cpu0, self.wall0 = cpu_seconds(self.pid), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        wall = time.monotonic() - self.wall0
        self.figures = {
            "rss_before_mib": round(self.rss0 / MiB, 1),
            "rss_peak_growth_mib": round((self.rss_peak - self.rss0) / MiB, 1),
            "descriptors_before": self.fds0,
            "descriptors_peak": self.fds_peak,
            "cpu_share_of_a_core": round((cpu_seconds(self.pid) - self.cpu0) / wall, 3),
            "log_growth_bytes": (self.log.stat().st_size if self.log.exists() else 0) - self.log0,
            "seconds": round(wall, 1),
            "load_avg_1m": round(os.getloadavg()[0], 1),
        }


# The gateway ----------------------------------------------------------------------------
@contextlib.contextmanager
def gateway(root: Path | None, env: dict[str, str] | None = None) -> Iterator[Any]:
    import tests.services as services

    if root is not None:
        services.REPO_ROOT = root  # the checkout whose gateway runs
    folder = Path(tempfile.mkdtemp(prefix="tidegate-attack-"))
    gw = services.GatewayProcess(
        folder / "gw",
        {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_TIERING__ENABLED": "false", **(env or {})},
    ).start()
    try:
        yield gw
    finally:
        gw.stop()


def tenant(gw: Any, **quota: int) -> str:
    name = f"a{os.urandom(4).hex()}"
    with gw.admin() as admin:
        admin.create_tenant(name)
        if quota:
            admin.set_quota(name, **quota)
        key: str = admin.issue_key(name)[1]
    import httpx

    with httpx.Client(base_url=gw.http_url, headers={"authorization": f"Bearer {key}"}) as h:
        r = h.post(
            "/v1/tables",
            json={
                "namespace": "a",
                "name": "t",
                "schema": {"id": "int64", "sent_ns": "int64", "payload": "binary"},
                "partitions": 4,
            },
        )
        assert r.status_code == 201, r.text
    return key


# 33.2 ------------------------------------------------------------------------------------
def attack_body(gw: Any) -> dict[str, Any]:
    import httpx

    size = 1536 * MiB

    def chunks() -> Iterator[bytes]:
        block = b"{" * MiB
        for _ in range(size // MiB):
            yield block

    out: dict[str, Any] = {}
    for how, headers in (("chunked", {}), ("declared", {"content-length": str(size)})):
        with Watch(gw.proc.pid, gw.log_path) as w, httpx.Client(timeout=600) as http:
            try:
                r = http.post(
                    f"{gw.http_url}/v1/tables",
                    content=chunks(),
                    headers={"content-type": "application/json", **headers},
                )
                answer = f"{r.status_code} {r.text[:160]}"
            except httpx.HTTPError as exc:
                answer = f"no answer: {type(exc).__name__}: {exc}"[:200]
        out[how] = {"answer": answer, **w.figures}
    return out


def attack_grpc(gw: Any, n: int = 60, size: int = 60 * MiB) -> dict[str, Any]:
    import grpc

    from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

    body = b"\0" * size
    codes: list[str] = []

    def call() -> None:
        channel = grpc.insecure_channel(
            gw.grpc_target, options=[("grpc.max_send_message_length", 2 * size)]
        )
        try:
            pb_grpc.TidegateStub(channel).Append(
                pb.AppendRequest(table=pb.TableRef(namespace="a", name="t"), arrow_ipc=body),
                timeout=600,
            )
            codes.append("OK")
        except grpc.RpcError as exc:
            codes.append(exc.code().name)
        finally:
            channel.close()

    with Watch(gw.proc.pid, gw.log_path) as w:
        threads = [threading.Thread(target=call) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
    return {"calls": n, "message_mib": size // MiB, "codes": sorted(set(codes)), **w.figures}


# 33.5 ------------------------------------------------------------------------------------
def _hold(port: int, n: int, seconds: float, out: Any) -> None:
    """Open ``n`` connections to ``port`` and hold them ``seconds``; put how many could
    be opened and how many the server had closed by the end."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held: list[socket.socket] = []
    refused = 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setblocking(False)
            held.append(s)
        except OSError:
            refused += 1
    time.sleep(seconds)
    closed = 0
    for s in held:
        try:
            while True:
                if not s.recv(65536):
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    out.put({"opened": len(held), "refused": refused, "closed_by_server": closed})


def attack_bare(gw: Any, n: int = 21_000, seconds: float = 60) -> dict[str, Any]:
    import httpx

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ports = [gw.http_port, gw.http_port, gw.grpc_port]
    per = [n // 3 + (1 if i < n % 3 else 0) for i in range(3)]
    procs = [
        ctx.Process(target=_hold, args=(port, k, seconds, out))
        for port, k in zip(ports, per, strict=True)
    ]
    health: list[float] = []
    with Watch(gw.proc.pid, gw.log_path) as w:
        for p in procs:
            p.start()
        deadline = time.monotonic() + seconds + 30
        with httpx.Client(base_url=gw.http_url, timeout=10) as http:
            while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    ok = http.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health.append(time.monotonic() - started if ok else -1.0)
                time.sleep(0.5)
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
    error_lines = sum(
        1 for line in gw.log_path.read_text(errors="replace").splitlines() if " ERROR " in line
    )
    answered = [h for h in health if h >= 0]
    return {
        "connections": n,
        "held_s": seconds,
        "by_port": {"http": results[:2], "grpc": results[2:]},
        "health_checks": len(health),
        "health_failed": len(health) - len(answered),
        "health_max_s": round(max(answered), 3) if answered else None,
        "error_log_lines": error_lines,
        **w.figures,
    }


def attack_slow(gw: Any, key: str, n: int = 400, wait_s: float = 90) -> dict[str, Any]:
    auth = f"authorization: Bearer {key}\r\n".encode()
    post = b"POST /v1/tables/a/t/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    kinds = {
        "bare": b"",
        "half headers": b"POST /v1/tables HTTP/1.1\r\nhost: x\r\ncontent-",
        "half body": post + auth + b"content-length: 1000\r\n\r\n" + b"{" * 10,
        "unfinished chunked": post + auth + b"transfer-encoding: chunked\r\n\r\n5\r\n{{{{{\r\n",
    }
    socks: dict[str, list[socket.socket]] = {k: [] for k in kinds}
    with Watch(gw.proc.pid, gw.log_path) as w:
        for kind, opening in kinds.items():
            for _ in range(n // len(kinds)):
                s = socket.create_connection(("127.0.0.1", gw.http_port), timeout=5)
                s.sendall(opening)
                s.setblocking(False)
                socks[kind].append(s)
        started = time.monotonic()
        closed_at: dict[str, float | None] = dict.fromkeys(kinds)
        while time.monotonic() - started < wait_s and None in closed_at.values():
            for kind, group in socks.items():
                if closed_at[kind] is None and all(_closed(s) for s in group):
                    closed_at[kind] = round(time.monotonic() - started, 1)
            time.sleep(0.5)
        still_open = {k: sum(not _closed(s) for s in g) for k, g in socks.items()}
        for group in socks.values():
            for s in group:
                s.close()
    return {
        "connections": n,
        "all_closed_after_s": closed_at,
        "still_open_after_wait": still_open,
        "waited_s": wait_s,
        **w.figures,
    }


def _closed(s: socket.socket) -> bool:
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


# 33.8 ------------------------------------------------------------------------------------
def attack_streams(gw: Any, idle_streams: int = 1000, wait_s: float = 90) -> dict[str, Any]:
    import grpc

    from benchmarks.loadgen import BatchFactory
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

    key = tenant(gw, requests_per_s=5)
    body = BatchFactory(10, 100).ipc(0)
    ref = pb.TableRef(namespace="a", name="t")
    md = (("authorization", f"Bearer {key}"),)
    channel = grpc.insecure_channel(gw.grpc_target)
    stub = pb_grpc.TidegateStub(channel)

    def requests(n: int, hold: threading.Event | None = None) -> Iterator[Any]:
        for i in range(n):
            yield pb.AppendStreamRequest(
                request_id=i + 1, append=pb.AppendRequest(table=ref, arrow_ipc=body)
            )
        if hold is not None:
            hold.wait(wait_s + 60)

    started = time.monotonic()
    answers = list(stub.AppendStream(requests(500), metadata=md, timeout=300))
    one_stream = {
        "messages": 500,
        "accepted": sum(a.HasField("ok") for a in answers),
        "refused": sum(a.HasField("error") for a in answers),
        "seconds": round(time.monotonic() - started, 2),
    }
    hold = threading.Event()
    md = (("authorization", f"Bearer {tenant(gw)}"),)  # a tenant without a requests quota
    calls = [stub.AppendStream(requests(1, hold), metadata=md) for _ in range(idle_streams)]
    states: dict[int, str] = {}

    def watch(i: int, call: Any) -> None:
        try:
            for _ in call:
                pass
            states[i] = "ended"
        except grpc.RpcError as exc:
            states[i] = exc.code().name

    with Watch(gw.proc.pid, gw.log_path) as w:
        watchers = [
            threading.Thread(target=watch, args=(i, c), daemon=True) for i, c in enumerate(calls)
        ]
        for t in watchers:
            t.start()
        time.sleep(wait_s)
        open_after = idle_streams - len(states)
    hold.set()
    for c in calls:
        c.cancel()
    channel.close()
    outcomes: dict[str, int] = {}
    for s in states.values():
        outcomes[s] = outcomes.get(s, 0) + 1
    return {
        "one_stream_at_5_requests_per_s": one_stream,
        "idle_streams": idle_streams,
        "still_open_after_s": wait_s,
        "still_open": open_after,
        "outcomes": outcomes,
        **w.figures,
    }


# 33.9 ------------------------------------------------------------------------------------
def _flood(target: str, key: str, rate: float, seconds: float, out: Any) -> None:
    import grpc

    from benchmarks.loadgen import BatchFactory
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

    body = BatchFactory(655, 100).ipc(0)  # 64 KiB
    md = (("authorization", f"Bearer {key}"),)
    counts: dict[str, int] = {}

    async def run() -> None:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.TidegateStub(ch)
            ref = pb.TableRef(namespace="a", name="t")

            async def one() -> None:
                try:
                    await stub.Append(pb.AppendRequest(table=ref, arrow_ipc=body), metadata=md)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                counts[code] = counts.get(code, 0) + 1

            tasks: set[asyncio.Task[None]] = set()
            start, i = time.monotonic(), 0
            while time.monotonic() - start < seconds:
                i += 1
                task = asyncio.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            await asyncio.gather(*tasks)

    asyncio.run(run())
    out.put(counts)


def attack_reject(gw: Any, rate: float = 1350, seconds: float = 20) -> dict[str, Any]:
    key = tenant(gw, append_bytes_per_s=4_000_000)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_flood, args=(gw.grpc_target, key, rate, seconds, out))
    proc.start()
    time.sleep(3)  # the flood's process starts, then it is measured
    with Watch(gw.proc.pid, gw.log_path) as w:
        time.sleep(seconds - 5)
    counts = out.get(timeout=600)
    proc.join(30)
    return {"offered_per_s": rate, "quota_mb_per_s": 4.0, "answers": counts, **w.figures}


ATTACKS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "body": attack_body,
    "grpc": attack_grpc,
    "bare": attack_bare,
    "slow": lambda gw: attack_slow(gw, tenant(gw)),
    "streams": attack_streams,
    "reject": attack_reject,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attacks", description=__doc__)
    parser.add_argument("--only", default=",".join(ATTACKS), help="attacks, comma-separated")
    parser.add_argument("--root", type=Path, default=None, help="checkout whose gateway runs")
    parser.add_argument("--label", default="after", help="name of the results file")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "attacks")
    ns = parser.parse_args()
    results: dict[str, Any] = {"label": ns.label, "root": str(ns.root or HERE.parent)}
    for name in ns.only.split(","):
        print(f"== {name}", flush=True)
        with gateway(ns.root) as gw:
            results[name] = ATTACKS[name](gw)
        print(json.dumps(results[name], indent=2), flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    path = ns.out / f"{ns.label}.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**previous, **results}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
