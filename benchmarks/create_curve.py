"""What creating a table costs as tables accumulate, with nothing else running (issue 30.3).

    python -m benchmarks.create_curve [--tables 2000] [--step 250] [--eager]

The service in process (disk hot tier, SQLite metadata and catalog, local warehouse, no
lake jobs, no edges), one tenant per 100 tables as the scale benchmark makes them: each
table is created and appended one record to, one after another, and the median ms of a
create + append is printed per ``step`` tables. ``--eager`` also makes the Iceberg table
at create, as the gateway did before it made it at first use, so both curves come from the
same run conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from gateway.config import Settings
from gateway.server.app import build_service
from gateway.wire.schema import parse_fields

FIELDS = [{"name": "k", "type": "string"}, {"name": "n", "type": "int64"}]


async def curve(root: Path, tables: int, step: int, eager: bool) -> list[tuple[int, float]]:
    settings = Settings.explicit(data_dir=root, hot={"type": "disk"})
    svc = build_service(settings)
    out: list[tuple[int, float]] = []
    took: list[float] = []
    made: list[float] = []
    try:
        for i in range(tables):
            tenant, name = f"c{i // 100:04d}", f"t{i}"
            started = time.perf_counter()
            view = await svc.create_table(tenant, "ns", name, FIELDS, 4)
            if eager and svc.cold is not None:
                svc.cold.create_table(view.definition, parse_fields(FIELDS))
            made.append((time.perf_counter() - started) * 1000)
            await svc.append(tenant, "ns", name, [pa.record_batch({"k": ["x"], "n": [i]})])
            took.append((time.perf_counter() - started) * 1000)
            if (i + 1) % step == 0:
                out.append((i + 1, statistics.median(took)))
                print(
                    f"{i + 1} tables: create + append {out[-1][1]:.1f} ms, "
                    f"create alone {statistics.median(made):.1f} ms (medians)",
                    flush=True,
                )
                took.clear()
                made.clear()
    finally:
        svc.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.create_curve", description=__doc__)
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--step", type=int, default=250)
    parser.add_argument("--eager", action="store_true", help="make the Iceberg table at create")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tidegate-curve-") as root:
        asyncio.run(curve(Path(root), ns.tables, ns.step, ns.eager))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
