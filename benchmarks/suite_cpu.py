"""Where the test suite's CPU goes, by kind of process (issue 28, item 8).

``python -m benchmarks.suite_cpu --out FILE -- make pytest`` runs the command and, every
``--every`` seconds, reads the CPU time (user + system) of every process on the machine from
``/proc``; a process's last reading is what it used (one that lived less than the interval
may be missed: the pytest workers' own rusage counts those of their children they waited
for). At the end it writes, per kind of process (a gateway, a CLI command, Spark's JVMs,
redis-server, PostgreSQL, moto, Chromium, the pytest workers...), the processes seen and
their CPU seconds, and the command's wall time; and per test, the CPU of the processes the
test started (a child's environment names the test running when it was spawned:
``PYTEST_CURRENT_TEST``), with how many gateways it started: which tests to make share.

The suite is CPU-bound on 2 cores (four xdist workers, load average 7 to 9), so its wall
time follows its total CPU: this says which kind of process to make cheaper.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def kind_of(cmd: list[str]) -> str:
    """A short name for the kind of process ``cmd`` (its argv) is."""
    line = " ".join(cmd)
    exe = os.path.basename(cmd[0]) if cmd else ""
    if "java" in exe:
        for name in ("SparkSubmit", "deploy.master", "deploy.worker", "ExecutorBackend"):
            if name in line:
                return f"java {name}"
        return "java other"
    if "gateway serve" in line or line.endswith("tidegate serve"):
        return "gateway serve"
    if "-m gateway " in line or "/tidegate " in line:
        sub = line.split("-m gateway ", 1)[-1] if "-m gateway " in line else line
        return f"tidegate {sub.split()[0] if sub.split() else ''}".strip()
    for name in ("redis-server", "postgres", "chrom", "moto", "helm", "duckdb", "git"):
        if name in line:
            return name
    if "execnet" in line or "sys.stdin.readline" in line:
        return "pytest worker"
    if "pytest" in line:
        return "pytest main"
    if "python" in exe:
        return "python " + " ".join(cmd[1:3])[:60]
    return exe or "?"


def _read(pid: str) -> tuple[float, list[str]] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    return (int(stat[11]) + int(stat[12])) / _TICK, cmd


def _test_of(pid: str) -> str:
    """The test (file and name, without its phase) running when ``pid`` was spawned by a
    test process, or "" for a process no test started."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return ""
    for item in env:
        if item.startswith(b"PYTEST_CURRENT_TEST="):
            return item.split(b"=", 1)[1].decode(errors="replace").rsplit(" (", 1)[0]
    return ""


def _scan(tests: dict[str, str]) -> dict[str, tuple[float, str]]:
    """Every process now: a key (its pid and command, as a reused pid has another) to its
    CPU seconds so far and its kind; the test that started each new one goes in ``tests``."""
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            got = _read(pid)
            if got is not None and got[1]:
                key = f"{pid}:{got[1][0]}:{len(got[1])}"
                found[key] = (got[0], kind_of(got[1]))
                if key not in tests:
                    tests[key] = _test_of(pid)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite_cpu", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=float, default=0.25)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    seen: dict[str, tuple[float, str]] = {}
    tests: dict[str, str] = {}
    # Processes already running count from here on only (the machine's own services).
    before = {k: used for k, (used, _) in _scan(tests).items()}
    start = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        for key, (used, kind) in _scan(tests).items():
            seen[key] = (used - before.get(key, 0.0), kind)
        time.sleep(ns.every)
    wall = time.monotonic() - start
    cpu: dict[str, float] = {}
    count: Counter[str] = Counter()
    for used, kind in seen.values():
        cpu[kind] = cpu.get(kind, 0.0) + used
        count[kind] += 1
    ranked = sorted(cpu.items(), key=lambda kv: -kv[1])
    rows = [{"kind": k, "processes": count[k], "cpu_s": round(v, 1)} for k, v in ranked]
    by_test: dict[str, float] = {}
    gateways: Counter[str] = Counter()
    for key, (used, kind) in seen.items():
        test = tests.get(key, "")
        if test and kind not in ("pytest worker", "pytest main"):
            by_test[test] = by_test.get(test, 0.0) + used
            gateways[test] += kind == "gateway serve"
    started = [
        {"test": t, "cpu_s": round(v, 1), "gateways": gateways[t]}
        for t, v in sorted(by_test.items(), key=lambda kv: -kv[1])[:60]
    ]
    report = {
        "wall_s": round(wall, 1),
        "rc": proc.returncode,
        "kinds": rows,
        "started_by_test": started,
    }
    ns.out.write_text(json.dumps(report, indent=1))
    for r in rows[:25]:
        print(f"{r['cpu_s']:9.1f} s {r['processes']:5d}  {r['kind']}", file=sys.stderr)
    print(f"wall {wall:.1f} s, total {sum(cpu.values()):.1f} s of CPU", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
