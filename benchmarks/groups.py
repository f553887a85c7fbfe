"""Consumer groups, through the SDK, on each hot tier:

- **throughput**: a table of ``read_records`` records of ``record_bytes`` read by one
  member of a group, then by a group of three members (each a process of its own, as
  members are), from the moment the group is stable (every member holds its share) until
  its committed offsets reach the high watermarks (auto-commit every 50 ms): the backlog
  left at that moment over the time it took. The ratio is the group's records/s to the
  single member's.
- **rebalance when a member joins**: two members (processes) hold the partitions; a third
  joins (here, in the benchmark's process) and the time until it holds its share is
  measured.
- **rebalance when a member dies**: one of three members is SIGKILLed; the time until the
  group is stable again with every partition held (it includes the member's session
  timeout, ``session_timeout_s``, which is what notices the death).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from gateway.client import Client
from tests.services import REPO_ROOT, GatewayProcess

MEMBER = """
import signal, sys
from gateway.client import Client

target, api_key, table, group, session, follow = sys.argv[1:7]
state = {"stop": False}
signal.signal(signal.SIGTERM, lambda *_: state.update(stop=True))
print("ready", flush=True)
sys.stdin.readline()  # go
with Client(target, api_key=api_key) as client:
    with client.consumer(
        table, group=group, follow=follow == "1", session_timeout=float(session),
        heartbeat_interval=0.2, poll_interval=0.01, auto_commit_interval=0.05,
    ) as consumer:
        if follow == "1":
            while not state["stop"]:
                consumer.poll(timeout=0.1)
        else:
            for batch in consumer.batches():
                pass
print("done", flush=True)
"""


def _member(gw: GatewayProcess, table: str, group: str, w: Workload, follow: bool) -> Any:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            MEMBER,
            gw.grpc_target,
            str(gw.api_key),
            table,
            group,
            str(w.session_timeout_s),
            "1" if follow else "0",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _go(procs: list[Any]) -> None:
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()


def _wait(what: str, done: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out waiting for {what}")
        time.sleep(0.02)


def _stable(c: Client, group: str, table: str, members: int) -> bool:
    info = c.describe_group(group, table)
    return (
        info.state == "stable"
        and len(info.members) == members
        and all(p.member_id for p in info.partitions)
    )


def _fill(c: Client, table: str, w: Workload) -> int:
    payload = "x" * max(1, w.record_bytes - 8)
    chunk = 10_000
    for start in range(0, w.read_records, chunk):
        rows = [
            {"n": i, "payload": payload} for i in range(start, min(w.read_records, start + chunk))
        ]
        c.append(table, rows, partition=(start // chunk) % w.partitions)
    return w.read_records


def _throughput(
    gw: GatewayProcess, c: Client, table: str, w: Workload, kind: str, n: int
) -> Result:
    """Records/s of ``n`` members reading the table, from the moment the group is stable
    (every member joined and holds its share) until it has committed everything: what
    the group reads once it has settled, not how fast it settles (the rebalance rows)."""
    group = f"g{n}-{uuid.uuid4().hex[:6]}"
    procs = [_member(gw, table, group, w, follow=True) for _ in range(n)]
    label = "1 consumer" if n == 1 else f"group of {n} members"
    result = Result(f"{w.name}-throughput", f"{label} ({kind} hot tier)")
    total = sum(c.table_info(table).high_watermarks)

    def left() -> int:  # one query of the metadata store: the benchmark loads little
        return total - sum(c.fetch_offsets(group, table).values())

    measured_from = "settled"
    try:
        went = time.perf_counter()
        _go(procs)
        _wait("the group to settle", lambda: _stable(c, group, table, n), timeout=300)
        started = time.perf_counter()
        backlog = left()
        if backlog == 0:
            # A table small enough (the smoke size) to be read before the group settled:
            # its time from the start, settling included, rather than no figure at all.
            started, backlog, measured_from = went, total, "start"
        _wait("the group to commit everything", lambda: left() == 0)
        result.seconds = time.perf_counter() - started
    finally:
        _stop(procs)
    result.extra["measured_from"] = measured_from
    result.records = backlog
    result.bytes = backlog * w.record_bytes
    result.batches = backlog // max(1, w.batch_records)
    result.extra["settled_with_backlog"] = backlog
    return result


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def _join_time(gw: GatewayProcess, table: str, group: str, w: Workload) -> float:
    """Seconds from a third member's join until it holds its share."""
    with Client(gw.grpc_target, api_key=gw.api_key) as client:
        share = w.partitions // 3
        started = time.perf_counter()
        with client.consumer(
            table, group=group, session_timeout=w.session_timeout_s, heartbeat_interval=0.2,
            poll_interval=0.01,
        ) as consumer:  # fmt: skip
            while len(consumer.assignment()) < share:
                consumer.poll(timeout=0.01)
            return time.perf_counter() - started


def _rebalance_row(w: Workload, system: str, seconds: float, **extra: Any) -> dict[str, Any]:
    r = Result(f"{w.name}-rebalance", system, batches=1, records=0)
    r.seconds = seconds
    r.extra = {"rebalance_s": seconds, "no_traffic_ok": True, **extra}
    return r.summary()


def _tier(gw: GatewayProcess, w: Workload, kind: str) -> list[dict[str, Any]]:
    table = f"bench{uuid.uuid4().hex[:8]}.grouped"
    with Client(gw.grpc_target, api_key=gw.api_key) as c:
        c.create_table(table, {"n": "int64", "payload": "string"}, partitions=w.partitions)
        _fill(c, table, w)
        solo = _throughput(gw, c, table, w, kind, 1).summary()
        trio = _throughput(gw, c, table, w, kind, 3).summary()
        rows = [solo, compare(trio, [solo])]

        group = f"live-{uuid.uuid4().hex[:6]}"
        members = [_member(gw, table, group, w, follow=True) for _ in range(2)]
        try:
            _go(members)
            _wait("two members", lambda: _stable(c, group, table, 2))
            joined = _join_time(gw, table, group, w)
            rows.append(_rebalance_row(w, f"a member joins ({kind} hot tier)", joined))
            members.append(_member(gw, table, group, w, follow=True))
            _go(members[-1:])
            _wait("three members", lambda: _stable(c, group, table, 3))
            started = time.perf_counter()
            members[0].send_signal(signal.SIGKILL)
            _wait("the dead member's partitions", lambda: _stable(c, group, table, 2))
            died = time.perf_counter() - started
            rows.append(
                _rebalance_row(
                    w,
                    f"a member is SIGKILLed ({kind} hot tier)",
                    died,
                    session_timeout_s=w.session_timeout_s,
                )
            )
        finally:
            _stop(members)
        c.drop_table(table)
    return rows


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for kind, gw in b.gateways.items():
        rows += await asyncio.to_thread(_tier, gw, w, kind)
    return rows
