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
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Workload
from benchmarks.report import write_report
from benchmarks.scenarios import (
    append_via_gateway,
    append_via_redis,
    read_via_gateway,
    read_via_redis,
)
from tests.services import GatewayProcess, RedisServer

HERE = Path(__file__).resolve().parent

#: workload kind -> (baseline, Tidegate) runners.
SCENARIOS: dict[str, tuple[Any, Any]] = {
    "append": (append_via_redis, append_via_gateway),
    "read-hot": (read_via_redis, read_via_gateway),
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
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent
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


async def run_suite(mode: str, workdir: Path, only: str | None) -> list[dict[str, Any]]:
    redis = RedisServer(workdir / "redis").start()
    gateways = {
        "disk": GatewayProcess(
            workdir / "gw-disk", {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_HOT__FSYNC": "batch"}
        ),
        "redis": GatewayProcess(
            workdir / "gw-redis", {"TIDEGATE_HOT__TYPE": "redis", "TIDEGATE_HOT__URL": redis.url}
        ),
    }
    results: list[dict[str, Any]] = []
    try:
        for gw in gateways.values():
            gw.start()
        for path in sorted((HERE / "workloads").glob("*.yaml")):
            w = Workload.load(path, mode)
            if only and only not in w.name:
                continue
            print(f"== {w.name}: {w.description}", flush=True)
            baseline_fn, gateway_fn = SCENARIOS[w.kind]
            limit = w.warmup_s + w.duration_s + 120  # a hang fails the run instead of stalling it
            base = (await asyncio.wait_for(baseline_fn(w, redis.url), limit)).summary()
            base["workload"] = w.name
            results.append(base)
            print(_line(base), flush=True)
            for kind, gw in gateways.items():
                auth = (("authorization", f"Bearer {gw.api_key}"),)
                run = gateway_fn(_with_hot(w, kind), gw.grpc_target, auth)
                res = (await asyncio.wait_for(run, limit)).summary()
                res["workload"] = w.name
                res["baseline"] = base["system"]
                res["throughput_ratio"] = (
                    res["mb_per_s"] / base["mb_per_s"] if base["mb_per_s"] else None
                )
                results.append(res)
                print(_line(res), flush=True)
    finally:
        for gw in gateways.values():
            gw.stop()
        redis.stop()
    return results


def _with_hot(w: Workload, kind: str) -> Workload:
    from dataclasses import replace

    return replace(w, hot=kind)


def _line(r: dict[str, Any]) -> str:
    ack = r["ack_latency"] or {}
    e2e = r["e2e_latency"] or {}
    ratio = f" ratio={r['throughput_ratio']:.2f}" if r.get("throughput_ratio") else ""
    return (
        f"   {r['system']:<32} {r['records_per_s']:>10.0f} rec/s {r['mb_per_s']:>8.1f} MB/s "
        f"ack p50={ack.get('p50_ms', 0):.2f} p99={ack.get('p99_ms', 0):.2f} ms "
        f"e2e p99={e2e.get('p99_ms', 0):.2f} ms errors={r['errors']}{ratio}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--mode", choices=["smoke", "quick", "full"], default="quick")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--only", default=None, help="only workloads whose name contains this")
    ns = parser.parse_args()
    out = ns.out or (
        HERE / "results" if ns.mode != "smoke" else Path(tempfile.mkdtemp()) / "results"
    )
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-") as tmp:
        started = time.monotonic()
        results = asyncio.run(run_suite(ns.mode, Path(tmp), ns.only))
        elapsed = time.monotonic() - started
    failed = [r for r in results if r["batches_per_s"] == 0]
    doc = {
        "mode": ns.mode,
        "machine": machine(),
        "elapsed_s": round(elapsed, 1),
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
