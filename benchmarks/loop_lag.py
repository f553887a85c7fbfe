"""Event-loop lag of a gateway under 64 KiB keyed appends (issue 28, item 3).

``python -m benchmarks.loop_lag [--root CHECKOUT] [--seconds 10] [--out FILE]`` starts a
gateway (disk hot tier, from ``CHECKOUT``: another checkout's code gives the figures
before a change), creates a table keyed by a string column over 8 partitions, and has
two producers append 64 KiB batches of 655 keyed rows as fast as they are acknowledged
(each batch's rows route to every partition), while a probe asks ``GET /healthz`` every
10 ms. ``/healthz`` is answered on the gateway's event loop and does nothing else, so its
latency above the idle one is the time the loop was busy with other work: the loop's lag.
Prints and writes the probe's percentiles idle and under load, and the append rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from tests.services import GatewayProcess

ROWS, VALUE_BYTES = 655, 90


def _batch(seed: int) -> pa.RecordBatch:
    rng = random.Random(seed)
    keys = [f"user-{rng.randrange(1_000_000)}" for _ in range(ROWS)]
    values = ["".join(rng.choices(string.ascii_letters, k=VALUE_BYTES)) for _ in range(ROWS)]
    return pa.record_batch({"k": keys, "v": values})


def _percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    if not s:
        return {}

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(s[-1] * 1000, 3), "n": len(s)}


def _probe(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/healthz")
            out.append(time.perf_counter() - started)
            time.sleep(0.01)


def run(root: Path | None, seconds: float) -> dict[str, Any]:
    if root is not None:
        os.environ["PYTHONPATH"] = str(root)
    with tempfile.TemporaryDirectory(prefix="tidegate-loop-lag-") as tmp:
        gw = GatewayProcess(
            Path(tmp) / "gw",
            {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_TIERING__ENABLED": "false"},
        ).start()
        try:
            table = "lag.keyed"
            with gw.client() as c:
                c.create_table(
                    table, {"k": "string", "v": "string"}, partitions=8, key_columns=["k"]
                )
            idle: list[float] = []
            stop = threading.Event()
            probe = threading.Thread(target=_probe, args=(gw.http_url, stop, idle))
            probe.start()
            time.sleep(2)
            stop.set()
            probe.join()

            loaded: list[float] = []
            sent = [0, 0]
            stop = threading.Event()
            deadline = time.monotonic() + seconds

            def produce(i: int) -> None:
                batches = [_batch(i * 100 + j) for j in range(8)]
                with gw.client() as c:
                    n = 0
                    while time.monotonic() < deadline:
                        c.append(table, batches[n % len(batches)])
                        n += 1
                    sent[i] = n

            producers = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
            for t in producers:
                t.start()
            time.sleep(0.5)  # the appends under way
            probe = threading.Thread(target=_probe, args=(gw.http_url, stop, loaded))
            probe.start()
            for t in producers:
                t.join()
            stop.set()
            probe.join()
        finally:
            gw.stop()
    return {
        "idle": _percentiles(idle),
        "under_keyed_appends": _percentiles(loaded),
        "appends_per_s": round(sum(sent) / seconds, 1),
        "records_per_s": round(sum(sent) * ROWS / seconds),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_lag", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="checkout to run the gateway from")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None)
    ns = parser.parse_args()
    result = run(ns.root, ns.seconds)
    print(json.dumps(result, indent=2))
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
