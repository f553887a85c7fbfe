"""``make soak``: a bounded mixed workload for a while (10 minutes by default) against the
fault suite's Redis cluster (two gateways), sampling each gateway's RSS, open files and the
append latency over time. Writes ``summary.json`` and ``soak.png`` (RSS against the memory
budget, open files, latency) to ``--out``, then checks the whole history as a fault seed
does: the soak is also a long run with no faults.

The memory budget is the gateway container's memory request in the Helm chart
(``resources.requests.memory``, 1 GiB): what a gateway is scheduled with.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.faults.checker import check
from tests.faults.cluster import Cluster
from tests.faults.history import History
from tests.faults.runner import read_back
from tests.faults.workload import DEFAULT_MIX, SCHEMA, TABLES, Context, start_operations

MiB = 1024 * 1024
BUDGET_BYTES = 1024 * MiB
#: Flat memory: over the last half of the run, each gateway's RSS grows by at most this
#: much a minute (the least-squares slope of its samples: a leak of a few hundred bytes
#: per request shows up, the noise of request bursts does not).
FLAT_MIB_PER_MIN = 2.0
#: Compaction every 30 s, expiry every 30 s of snapshots replaced over a minute ago.
MAINTENANCE_ENV = {
    "TIDEGATE_COMPACTION__INTERVAL_S": "30",
    "TIDEGATE_EXPIRY__INTERVAL_S": "30",
    "TIDEGATE_EXPIRY__RETENTION_S": "60",
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_minute(rows: list[dict[str, Any]], key: str) -> float:
    """The least-squares slope of ``key`` against time, per minute."""
    xs = [r["t_s"] / 60 for r in rows]
    ys = [r[key] for r in rows]
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def sample(cluster: Cluster, history: History, since: int, t0: float) -> tuple[dict[str, Any], int]:
    events = list(history)
    took = [e["took"] for e in events[since:] if e["type"] == "append" and "took" in e]
    acked = sum(
        len(e["rids"]) for e in events[since:] if e["type"] == "append" and e["outcome"] == "ok"
    )
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "append_p50_ms": round(percentile(took, 0.5) * 1000, 2),
        "append_p99_ms": round(percentile(took, 0.99) * 1000, 2),
        "acked_records": acked,
    }
    for i, gw in enumerate(cluster.gateways):
        assert gw.proc is not None
        row[f"gateway{i}_rss_mib"] = round(rss_bytes(gw.proc.pid) / MiB, 1)
        row[f"gateway{i}_open_files"] = open_files(gw.proc.pid)
    return row, len(events)


def plot(rows: list[dict[str, Any]], gateways: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["t_s"] / 60 for r in rows]
    fig, (rss, fds, lat) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for i in range(gateways):
        rss.plot(minutes, [r[f"gateway{i}_rss_mib"] for r in rows], label=f"gateway {i} RSS")
        fds.plot(minutes, [r[f"gateway{i}_open_files"] for r in rows], label=f"gateway {i}")
    rss.axhline(BUDGET_BYTES / MiB, color="red", linestyle="--", label="memory budget (1 GiB)")
    rss.set_ylim(0, BUDGET_BYTES / MiB * 1.1)
    rss.set_ylabel("RSS (MiB)")
    rss.legend(loc="lower right")
    rss.set_title(title)
    fds.set_ylabel("open files")
    fds.set_ylim(bottom=0)
    fds.legend(loc="lower right")
    lat.plot(minutes, [r["append_p50_ms"] for r in rows], label="append p50")
    lat.plot(minutes, [r["append_p99_ms"] for r in rows], label="append p99")
    lat.set_ylabel("latency (ms)")
    lat.set_xlabel("minutes")
    lat.set_yscale("log")
    lat.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak"))
    parser.add_argument(
        "--no-maintenance",
        action="store_true",
        help="leave compaction and snapshot expiry at their hourly defaults",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="have each gateway dump its heap's growth (tracemalloc), Arrow's pool and "
        "glibc's arenas to this folder every 30 s (slows the gateways down)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="tidegate-soak-"))
    # Tiering commits every second: without compaction and expiry each table would hold
    # 600 snapshots and files after ten minutes, and the metadata every reader loads
    # grows with them. A deployment runs both; so does the soak, often.
    env = {} if args.no_maintenance else dict(MAINTENANCE_ENV)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        env["TIDEGATE_FAULTS_PROFILE_DIR"] = str(args.profile.resolve())
    cluster = Cluster("redis", root, extra_env=env)
    history = History()
    rows: list[dict[str, Any]] = []
    try:
        cluster.start()
        cluster.create_tables(TABLES, SCHEMA)
        ctx = Context(cluster, history, 0, pace=0.05, scan_every=(10, 20), record_scans=False)
        # Every kind of client, paced: a few hundred records/s in all, scans every 10-20 s.
        ops = start_operations(ctx, DEFAULT_MIX)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        seen = 0
        while time.monotonic() < end:
            time.sleep(args.sample)
            row, seen = sample(cluster, history, seen, t0)
            rows.append(row)
            print(json.dumps(row), flush=True)
        ctx.stop.set()
        for op in ops:
            op.finish(90)
        verdict = check(history, read_back(cluster, history))
    finally:
        cluster.stop()
    n = len(cluster.gateways)
    warm = rows[len(rows) // 5 :] or rows  # the first fifth is the warm-up
    rss = {i: [r[f"gateway{i}_rss_mib"] for r in warm] for i in range(n)}
    half = len(warm) // 2
    summary = {
        "minutes": args.minutes,
        "maintenance": {} if args.no_maintenance else MAINTENANCE_ENV,
        "tier": "redis",
        "gateways": n,
        "memory_budget_mib": BUDGET_BYTES // MiB,
        "peak_rss_mib": {i: max(r[f"gateway{i}_rss_mib"] for r in rows) for i in range(n)},
        # Flat: the median RSS of the last half of the run against the first (after warm-up).
        "rss_growth_mib": {
            i: round(statistics.median(v[half:]) - statistics.median(v[:half]), 1)
            for i, v in rss.items()
        },
        # Flat: the RSS slope over the last half of the run, MiB a minute.
        "rss_slope_last_half_mib_per_min": {
            i: round(slope_per_minute(rows[len(rows) // 2 :], f"gateway{i}_rss_mib"), 2)
            for i in range(n)
        },
        "flat_bound_mib_per_min": FLAT_MIB_PER_MIN,
        "open_files_first_last": {
            i: [rows[0][f"gateway{i}_open_files"], rows[-1][f"gateway{i}_open_files"]]
            for i in range(n)
        },
        "append_p99_ms_median": statistics.median(r["append_p99_ms"] for r in rows),
        "records_acknowledged": verdict.acknowledged,
        "records_checked": verdict.records_checked,
        "lost": verdict.lost,
        "duplicated": verdict.duplicated,
        "violations": len(verdict.violations),
        "samples": rows,
    }
    summary["within_budget"] = all(v < BUDGET_BYTES / MiB for v in summary["peak_rss_mib"].values())
    summary["flat"] = all(
        v <= FLAT_MIB_PER_MIN for v in summary["rss_slope_last_half_mib_per_min"].values()
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"soak: {args.minutes:g} min, Redis tier, two gateways, {verdict.acknowledged} records"
    plot(rows, n, args.out / "soak.png", title)
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}))
    if not summary["flat"]:
        print(
            f"memory is not flat: RSS grew by {summary['rss_slope_last_half_mib_per_min']} "
            f"MiB a minute over the last half of the run (at most {FLAT_MIB_PER_MIN} allowed)",
            file=sys.stderr,
        )
    ok = summary["within_budget"] and summary["flat"] and not verdict.violations
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
