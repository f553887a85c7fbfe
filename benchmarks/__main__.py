"""Run the benchmark suite: ``python -m benchmarks [--mode quick|smoke|full]``.

Starts its own redis-server and gateway processes on free ports (nothing else on the
machine is touched), runs every workload against Tidegate on each hot tier and against its
baseline in the same run, and writes ``results.json``, ``summary.md`` and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import (
    cold,
    groups,
    kafka,
    kafka_neighbours,
    keys,
    maintenance,
    neighbours,
    sdk,
    shards,
    spark_read,
)
from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from benchmarks.passthrough import PassThroughProcess
from benchmarks.report import write_report
from benchmarks.scenarios import (
    append_via_gateway,
    append_via_redis,
    read_via_flight,
    read_via_gateway,
    read_via_redis,
)
from tests.services import GatewayProcess, RedisServer, free_port

HERE = Path(__file__).resolve().parent

Scenario = Callable[[Bench, Workload], Awaitable[list[dict[str, Any]]]]


def against_redis(baseline_fn: Any, gateway_fn: Any, flight_fn: Any = None) -> Scenario:
    """A hot-tier scenario: the Redis baseline, then on each hot tier the pass-through
    (the same client against the same gRPC edge with no Tidegate logic, over that tier's
    raw store) and Tidegate. Tidegate's rows are compared with both: to the raw store,
    and to the pass-through (what is Tidegate's own); the pass-through's with the raw
    store (what is the edge's). With ``flight_fn``, the same over the Flight edges: the
    pass-through's Flight edge over the same raw store, and Tidegate's."""

    async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
        base: Result = await baseline_fn(w, b.redis.url)
        rows = [base.summary()]
        for kind, gw in b.gateways.items():
            hot = replace(w, hot=kind)
            edge = b.passthroughs[kind]
            bare: list[Any] = [()] * w.tenants
            passed: Result = await gateway_fn(hot, edge.grpc_target, bare if w.tenants > 1 else ())
            passed.system = passthrough_system(kind, w.tenants)
            through = compare(passed.summary(), rows[:1])
            flown_through: dict[str, Any] | None = None
            if flight_fn is not None:
                bare_flown: Result = await flight_fn(hot, edge.grpc_target, edge.flight_port)
                bare_flown.system = passthrough_system(kind, w.tenants, edge="Flight")
                flown_through = compare(bare_flown.summary(), rows[:1])
            with b.tenants(gw, w.tenants) as keys:
                md = [b.auth(gw, k) for k in keys] if w.tenants > 1 else b.auth(gw)
                res: Result = await gateway_fn(hot, gw.grpc_target, md)
                flown: Result | None = None
                if flight_fn is not None:
                    flown = await flight_fn(hot, gw.grpc_target, gw.flight_port, md)
            rows += [through, compare(res.summary(), [rows[0], through])]
            if flown is not None and flown_through is not None:
                rows += [flown_through, compare(flown.summary(), [rows[0], flown_through])]
        return rows

    return run


def passthrough_system(kind: str, tenants: int = 1, edge: str = "gRPC") -> str:
    """The row name of the pass-through over ``kind``'s raw store, on ``edge``."""
    store = "Redis XADD/XRANGE" if kind == "redis" else "files"
    suffix = f", {tenants} tables" if tenants > 1 else ""
    return f"pass-through {edge} edge, {store} (baseline){suffix}"


#: workload kind -> scenario; each returns its result rows, baselines first.
SCENARIOS: dict[str, Scenario] = {
    "append": against_redis(append_via_redis, append_via_gateway),
    "read-hot": against_redis(read_via_redis, read_via_gateway, read_via_flight),
    "sdk-small": sdk.run,
    "cold": cold.run_reads,
    "read-cost": cold.run_read_cost,
    "tiering": cold.run_tiering,
    "freshness": cold.run_freshness,
    "noisy-neighbour": neighbours.run,
    "spark-read": spark_read.run,
    "compaction": maintenance.run_compaction,
    "shards": shards.run,
    "groups": groups.run,
    "kafka": kafka.run,
    "keys": keys.run,
    "kafka-neighbour": kafka_neighbours.run,
}


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE.parent
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def overridden(w: Workload, settings: list[str]) -> Workload:
    """``w`` with ``--set key=value`` settings applied (values read as YAML; a list
    becomes a tuple); a key that is no workload setting is refused, not ignored."""
    import yaml

    changes: dict[str, Any] = {}
    for item in settings:
        key, _, text = item.partition("=")
        if key not in Workload.__dataclass_fields__ or key == "name":
            raise SystemExit(f"--set {item}: {key!r} is not a workload setting")
        value = yaml.safe_load(text)
        changes[key] = tuple(value) if isinstance(value, list) else value
    return replace(w, **changes)


async def run_suite(
    mode: str,
    workdir: Path,
    only: str | None,
    settings: list[str] | None = None,
    gateway_env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    redis = RedisServer(workdir / "redis").start()
    # No embedded compaction or expiry: a scenario's table must not change under it (the
    # compaction scenario compacts its table itself).
    quiet = {"TIDEGATE_COMPACTION__ENABLED": "false", "TIDEGATE_EXPIRY__ENABLED": "false"}
    # The Kafka listener is on, as in `tidegate serve` (the test helper turns it off
    # unless given a port): the kafka-clients workload drives it.
    gateways = {
        "disk": GatewayProcess(
            workdir / "gw-disk",
            {
                "TIDEGATE_HOT__TYPE": "disk",
                "TIDEGATE_HOT__FSYNC": "batch",
                "TIDEGATE_KAFKA__PORT": str(free_port()),
                **quiet,
                **(gateway_env or {}),
            },
        ),
        "redis": GatewayProcess(
            workdir / "gw-redis",
            {
                "TIDEGATE_HOT__TYPE": "redis",
                "TIDEGATE_HOT__URL": redis.url,
                "TIDEGATE_TIERING__ENABLED": "false",
                "TIDEGATE_KAFKA__PORT": str(free_port()),
                **quiet,
                **(gateway_env or {}),
            },
        ),
    }
    passthroughs = {
        "disk": PassThroughProcess("disk", workdir / "pt-disk"),
        "redis": PassThroughProcess("redis", workdir / "pt-redis", redis.url),
    }
    bench = Bench(mode, workdir, redis, gateways, passthroughs)
    results: list[dict[str, Any]] = []
    try:
        for gw in gateways.values():
            gw.start()
        for pt in passthroughs.values():
            pt.start()
        for path in sorted((HERE / "workloads").glob("*.yaml")):
            w = overridden(Workload.load(path, mode), settings or [])
            if only and not any(part in w.name for part in only.split(",")):
                continue
            print(f"== {w.name}: {w.description}", flush=True)
            # A hang fails the run instead of stalling it (per table size, for spark-read).
            limit = (w.timeout_s or (3 * (w.warmup_s + w.duration_s) + 240)) * max(
                1, len(w.read_sizes)
            )
            rows = await asyncio.wait_for(SCENARIOS[w.kind](bench, w), limit)
            for row in rows:
                row.setdefault("workload", row.get("name") or w.name)
                print(_line(row), flush=True)
            results.extend(rows)
    finally:
        for pt in passthroughs.values():
            pt.stop()
        for gw in gateways.values():
            gw.stop()
        redis.stop()
    return results


def _line(r: dict[str, Any]) -> str:
    ack = r["ack_latency"] or {}
    e2e = r["e2e_latency"] or {}
    ratio = "".join(
        f" x{v:.2f} vs {k}" for k, v in (r.get("ratios") or {}).items() if v is not None
    )
    return (
        f"   {r['workload']:<20} {r['system']:<40} {r['records_per_s']:>10.0f} rec/s "
        f"{r['mb_per_s']:>8.1f} MB/s "
        f"ack p50={ack.get('p50_ms', 0):.2f} p99={ack.get('p99_ms', 0):.2f} ms "
        f"e2e p99={e2e.get('p99_ms', 0):.2f} ms errors={r['errors']}{ratio}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--mode", choices=["smoke", "quick", "full"], default="quick")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument(
        "--only",
        default=None,
        help="only workloads whose name contains one of these (comma-separated)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a workload setting where the workload has it, e.g. "
        "--set read_sizes=[400000,2000000,4000000] (spark-read at three table sizes)",
    )
    parser.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="TIDEGATE_KEY=VALUE",
        help="a setting of both gateways, as its environment variable, e.g. "
        "--gateway TIDEGATE_COMPRESSION=producer (store appended streams as sent, as the "
        "pass-through does, instead of compressing uncompressed ones with zstd)",
    )
    ns = parser.parse_args()
    gateway_env = dict(item.partition("=")[::2] for item in ns.gateway)
    if bad := [k for k in gateway_env if not k.startswith("TIDEGATE_")]:
        raise SystemExit(f"--gateway {bad[0]}: name a gateway setting, TIDEGATE_<KEY>=VALUE")
    out = ns.out or (
        HERE / "results" if ns.mode != "smoke" else Path(tempfile.mkdtemp()) / "results"
    )
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-") as tmp:
        started = time.monotonic()
        results = asyncio.run(run_suite(ns.mode, Path(tmp), ns.only, ns.set, gateway_env))
        elapsed = time.monotonic() - started
    failed = [r for r in results if r["batches_per_s"] == 0 and not r.get("no_traffic_ok")]
    doc = {
        "mode": ns.mode,
        "machine": machine(),
        "elapsed_s": round(elapsed, 1),
        "gateway_env": gateway_env,
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    write_report(doc, out)
    print(f"wrote {out}/results.json, summary.md and plots in {elapsed:.0f} s")
    if failed:
        print(
            f"no traffic measured for: {[r['system'] + ' / ' + r['workload'] for r in failed]}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
