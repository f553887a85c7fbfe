"""Flight scans and cold stream reads of two checkouts side by side, calls interleaved.

``python -m benchmarks.flight_ab --before CHECKOUT [--after CHECKOUT] [--rounds 30]``
starts one gateway from each checkout (Redis hot tier, one Redis), fills each with the
same table (one partition, 200,000 records of about 100 bytes), tiers it all with
``tidegate tier`` and then times, round after round and in a rotating order, a whole-table
Flight scan of each gateway beside pyiceberg's ``scan().to_arrow()`` of the same table,
and a 10,000-record Flight stream read of each beside pyarrow reading those rows from the
files. On a machine shared with other work, interleaving makes both sides and the
baselines see the same load; the medians of each and their ratios are printed and written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.flight as fl

from tests.services import REPO_ROOT, GatewayProcess, RedisServer

RECORDS, BATCH, READ = 200_000, 1000, 10_000


def _start(root: Path, folder: Path, redis: RedisServer) -> GatewayProcess:
    os.environ["PYTHONPATH"] = str(root)
    return GatewayProcess(
        folder,
        {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis.url,
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_COMPACTION__ENABLED": "false",
            "TIDEGATE_EXPIRY__ENABLED": "false",
        },
    ).start()


def _fill_and_tier(gw: GatewayProcess, root: Path) -> None:
    with gw.client() as c:
        c.create_table("ab.t", {"id": "int64", "payload": "string"}, partitions=1)
        for start in range(0, RECORDS, BATCH):
            ids = list(range(start, start + BATCH))
            c.append(
                "ab.t",
                pa.record_batch({"id": ids, "payload": [f"{i:080d}" for i in ids]}),
                partition=0,
            )
    env = {**gw.env(), "PYTHONPATH": str(root)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    out = subprocess.run(
        ["tidegate", "tier"], env=env, cwd=str(REPO_ROOT), capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)


def _iceberg(gw: GatewayProcess) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from gateway.config import Settings

    s = Settings.explicit(data_dir=gw.data_dir, hot={"type": "disk"})
    catalog = SqlCatalog(s.cold.catalog.name, uri=s.cold_catalog_uri, warehouse=s.cold_warehouse)
    return catalog.load_table((gw.tenant, "ab", "t"))


def _flight(gw: GatewayProcess) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
    client = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
    auth = [(b"authorization", f"Bearer {gw.api_key}".encode())]
    return client, fl.FlightCallOptions(headers=auth, timeout=60)


def _get(flight: tuple[fl.FlightClient, fl.FlightCallOptions], body: dict[str, Any]) -> int:
    client, opts = flight
    return int(client.do_get(fl.Ticket(json.dumps(body).encode()), opts).read_all().num_rows)


def run(before: Path, after: Path, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tidegate-ab-") as tmp:
        redis = RedisServer(Path(tmp) / "redis").start()
        gws = {}
        try:
            for label, root in (("before", before), ("after", after)):
                gws[label] = _start(root, Path(tmp) / label, redis)
                _fill_and_tier(gws[label], root)
            table = _iceberg(gws["before"])
            files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
            flights = {label: _flight(gw) for label, gw in gws.items()}
            where = {"namespace": "ab", "name": "t"}

            def scan(label: str) -> Callable[[int], int]:
                return lambda r: _get(flights[label], {"scan": where})

            def read(label: str) -> Callable[[int], int]:
                return lambda r: _get(
                    flights[label],
                    {"read": {**where, "partition": 0, "offset": r * READ % RECORDS,
                              "max_records": READ}},
                )  # fmt: skip

            def pyarrow_rows(r: int) -> int:
                lo = r * READ % RECORDS
                data = ds.dataset(files).to_table(
                    filter=(ds.field("_offset") >= lo) & (ds.field("_offset") < lo + READ)
                )
                return int(data.num_rows)

            cases: dict[str, dict[str, Callable[[int], int]]] = {
                "scan": {
                    "before": scan("before"),
                    "after": scan("after"),
                    "pyiceberg scan().to_arrow()": lambda r: table.scan().to_arrow().num_rows,
                },
                "cold stream read": {
                    "before": read("before"),
                    "after": read("after"),
                    "pyarrow on the files": pyarrow_rows,
                },
            }
            times: dict[str, dict[str, list[float]]] = {
                c: {k: [] for k in v} for c, v in cases.items()
            }
            for case, fns in cases.items():
                names = list(fns)
                for name in names:
                    fns[name](0)  # warm up
                for r in range(rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        started = time.perf_counter()
                        rows = fns[name](r)
                        times[case][name].append(time.perf_counter() - started)
                        assert rows in (RECORDS, READ), (case, name, rows)
        finally:
            for gw in gws.values():
                gw.stop()
            redis.stop()
    out: dict[str, Any] = {"rounds": rounds, "load_average_end": os.getloadavg()}
    for case, by in times.items():
        med = {k: statistics.median(v) for k, v in by.items()}
        base = next(k for k in med if k not in ("before", "after"))
        out[case] = {
            "median_ms": {k: round(v * 1000, 2) for k, v in med.items()},
            "ratio_to_baseline": {
                side: round(med[base] / med[side], 3) for side in ("before", "after")
            },
            "after_speedup": round(med["before"] / med["after"], 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flight_ab", description=__doc__)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=REPO_ROOT)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    ns = parser.parse_args()
    result = run(ns.before, ns.after, ns.rounds)
    print(json.dumps(result, indent=2))
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
