"""Issue 40: pyiceberg through Tidegate's Iceberg catalog, planning on the server (the plan
names the hot tail as files) against planning on the client (the committed files only).

- **freshness**: an append, then pyiceberg scans through the catalog until the row is in
  the answer: how long that takes, planning on the server and on the client (a gateway
  with its embedded tiering at its default interval);
- **scan throughput**: records/s of ``scan().to_arrow()`` on the same table (all of it
  tiered, so both read the same files), planning on the server and on the client;
- **hot-tail cost**: the bytes a plan writes as the tail grows, and what a second plan of
  the same tail writes (nothing: it names the files again).

``python -m benchmarks.catalog_plans [--out FOLDER] [--rows N]``; the results are printed
and written as ``results.json``. It starts its own gateway on a free port (disk hot tier,
embedded tiering as shipped) and needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.services import GatewayProcess

SCHEMA = {"id": "int64", "name": "string", "v": "float64"}


def _rows(first: int, count: int) -> list[dict[str, Any]]:
    ids = range(first, first + count)
    return [{"id": i, "name": f"name-{i % 1000}", "v": i * 0.5} for i in ids]


def _catalog(gw: GatewayProcess, mode: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog(
        "tidegate", uri=f"{gw.http_url}/iceberg", token=gw.api_key, **{"scan-planning-mode": mode}
    )


def _append(gw: GatewayProcess, table: str, first: int, count: int) -> None:
    with gw.client() as c:
        for start in range(first, first + count, 20_000):
            c.append(table, _rows(start, min(20_000, first + count - start)))


def _wait_tiered(gw: GatewayProcess, table: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    with gw.client() as c:
        while time.monotonic() < deadline:
            parts = c.describe_table(table).partition_info
            if all(p.tiered_watermark == p.high_watermark for p in parts):
                return
            time.sleep(0.2)
    raise RuntimeError(f"{table} was not tiered within {timeout} s")


def freshness(gw: GatewayProcess, samples: int) -> dict[str, Any]:
    """Seconds from an append's acknowledgement to the row in a pyiceberg scan."""
    with gw.client() as c:
        c.create_table("bench.fresh", SCHEMA, partitions=2)
    out: dict[str, Any] = {}
    next_id = 0
    for mode in ("server", "client"):
        catalog = _catalog(gw, mode)
        seen = []
        for _ in range(samples):
            _append(gw, "bench.fresh", next_id, 1)
            acked = time.monotonic()
            while True:
                ids = catalog.load_table("bench.fresh").scan(selected_fields=("id",)).to_arrow()
                if next_id in set(ids["id"].to_pylist()):
                    break
                time.sleep(0.05)
            seen.append(time.monotonic() - acked)
            next_id += 1
        out[mode] = {
            "samples": len(seen),
            "p50_s": round(statistics.median(seen), 3),
            "max_s": round(max(seen), 3),
        }
    return out


def throughput(gw: GatewayProcess, rows: int, repeats: int) -> dict[str, Any]:
    """Records/s of a whole-table pyiceberg scan, the table all tiered (same files)."""
    with gw.client() as c:
        c.create_table("bench.scan", SCHEMA, partitions=4)
    _append(gw, "bench.scan", 0, rows)
    _wait_tiered(gw, "bench.scan")
    out: dict[str, Any] = {"rows": rows}
    for mode in ("server", "client"):
        catalog = _catalog(gw, mode)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            got = catalog.load_table("bench.scan").scan().to_arrow()
            times.append(time.perf_counter() - start)
            assert got.num_rows == rows, (mode, got.num_rows)
        best = min(times)
        out[mode] = {"best_s": round(best, 3), "records_per_s": round(rows / best)}
    out["server_over_client"] = round(out["client"]["best_s"] / out["server"]["best_s"], 2)
    return out


def hot_cost(gw: GatewayProcess, steps: list[int]) -> list[dict[str, Any]]:
    """Bytes written by a plan as the tail grows by ``steps`` records (one partition), and
    by a second plan of the same tail. Tiering is kept off this table's tail by planning
    right after each append (the embedded schedule may still move it: then the next plan
    writes from the new watermark, which the rows show)."""
    with gw.client() as c:
        c.create_table("bench.tail", SCHEMA, partitions=1)
    known: dict[str, int] = {}
    out = []
    total = 0
    with httpx.Client(
        base_url=gw.http_url, headers={"authorization": f"Bearer {gw.api_key}"}, timeout=300
    ) as h:

        def plan() -> tuple[int, int, float]:
            start = time.perf_counter()
            r = h.post("/iceberg/v1/namespaces/bench/tables/tail/plan", json={})
            took = time.perf_counter() - start
            r.raise_for_status()
            written, named = 0, 0
            for task in r.json()["file-scan-tasks"]:
                f = task["data-file"]
                if "/tidegate-plans/" not in f["file-path"]:
                    continue
                named += f["file-size-in-bytes"]
                if f["file-path"] not in known:
                    known[f["file-path"]] = f["file-size-in-bytes"]
                    written += f["file-size-in-bytes"]
            return written, named, took

        for step in steps:
            _append(gw, "bench.tail", total, step)
            total += step
            written, named, took = plan()
            again, _, took_again = plan()
            out.append(
                {
                    "tail_added": step,
                    "records_appended": total,
                    "bytes_written": written,
                    "hot_file_bytes_named": named,
                    "plan_s": round(took, 3),
                    "second_plan_bytes_written": again,
                    "second_plan_s": round(took_again, 3),
                }
            )
    return out


def submitted(folder: Path, tails: list[int], bound: int = 10_000) -> list[dict[str, Any]]:
    """A plan of a fresh hot tail of ``tails`` records (two partitions, tiering off),
    completed within its request (``plan_submit_records`` 0) against submitted
    (``plan_submit_records`` ``bound``): how long the planTableScan answer takes, and
    until fetchPlanningResult (polled every 20 ms) answers ``completed``."""
    out: dict[int, dict[str, Any]] = {tail: {"tail_records": tail} for tail in tails}
    for mode, records in (("in_request", 0), ("submitted", bound)):
        env = {
            "TIDEGATE_HOT__TYPE": "disk",
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_COLD__REST_CATALOG__PLAN_SUBMIT_RECORDS": str(records),
        }
        gw = GatewayProcess(folder / mode, env).start()
        try:
            with httpx.Client(
                base_url=gw.http_url, headers={"authorization": f"Bearer {gw.api_key}"},
                timeout=600,
            ) as h:  # fmt: skip
                with gw.client() as c:  # a first plan loads what every plan needs
                    c.create_table("bench.warm", SCHEMA, partitions=2)
                _append(gw, "bench.warm", 0, 10)
                h.post("/iceberg/v1/namespaces/bench/tables/warm/plan", json={})
                for tail in tails:
                    name = f"sub{tail}"
                    with gw.client() as c:
                        c.create_table(f"bench.{name}", SCHEMA, partitions=2)
                    _append(gw, f"bench.{name}", 0, tail)
                    path = f"/iceberg/v1/namespaces/bench/tables/{name}/plan"
                    start = time.perf_counter()
                    answer = h.post(path, json={}).raise_for_status().json()
                    answered = time.perf_counter() - start
                    plan_id = answer["plan-id"]
                    while answer["status"] == "submitted":
                        time.sleep(0.02)
                        answer = h.get(f"{path}/{plan_id}").raise_for_status().json()
                    completed = time.perf_counter() - start
                    assert answer["status"] == "completed", answer
                    out[tail][mode] = {
                        "answer_s": round(answered, 3),
                        "completed_s": round(completed, 3),
                    }
        finally:
            gw.stop()
    return list(out.values())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.catalog_plans")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--rows", type=int, default=400_000, help="rows of the scanned table")
    parser.add_argument("--samples", type=int, default=3, help="freshness samples per mode")
    parser.add_argument(
        "--parts",
        default="hot_cost,freshness,throughput",
        help="comma-separated: hot_cost, freshness, throughput, submitted",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-plans-") as folder:
        gw = GatewayProcess(Path(folder), {"TIDEGATE_HOT__TYPE": "disk"}).start()
        try:
            result: dict[str, Any] = {
                "commit": subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
                ).stdout.strip(),
                "machine": f"{platform.processor() or platform.machine()}, "
                f"{platform.python_implementation()} {platform.python_version()}",
            }
            if "hot_cost" in parts:
                result["hot_cost"] = hot_cost(gw, [1_000, 10_000, 100_000])
            if "freshness" in parts:
                result["freshness"] = freshness(gw, args.samples)
            if "throughput" in parts:
                result["throughput"] = throughput(gw, args.rows, 3)
        finally:
            gw.stop()
        if "submitted" in parts:
            result["submitted"] = submitted(Path(folder), [50_000, 200_000, 800_000])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
