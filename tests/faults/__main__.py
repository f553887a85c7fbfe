"""``python -m tests.faults``: run seeds of the fault suite (``make faults``).

    make faults                 # a few seeds (FIRST..FIRST+SEEDS-1, default 1..4)
    make faults SEEDS=200       # the long run
    make faults SEED=17         # one seed alone (a failing one, to replay it)
    make faults SEEDS=20 FAULTS_ARGS=--spark   # read back through the Spark connector too

Seeds alternate between the hot tiers (even: disk, odd: Redis). Each seed prints one line;
a failing seed prints its violations and the history excerpt that shows the first one.
A JSON summary of the run (faults per kind, records checked, lost, duplicated) is written
to ``--out`` (default ``faults-results/summary.json``), and the first of each kind of ERROR
line the gateways logged, with its traceback, to ``log-error-samples.json`` beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from tests.faults.runner import run_seed

TOTALS = (
    "records_checked",
    "acknowledged",
    "unknown_appends",
    "refused_appends",
    "reads_checked",
    "lost",
    "duplicated",
    "violations",
    "lost_recorded",
    "lost_offsets",
)


def summarise(per_seed: list[dict[str, Any]], failed: list[int], wall_s: float) -> dict[str, Any]:
    """The figures of a run (or of several runs' ``per_seed`` lists put together)."""
    totals: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    log_errors: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    for s in per_seed:
        keys.update({k: v for k, v in s.get("key_tables", {}).items() if isinstance(v, int)})
        faults.update(s["faults"])
        log_errors.update(s.get("log_errors", {}))
        totals.update({k: s.get(k, 0) for k in TOTALS})
        totals["seeds_redis" if s["tier"] == "redis" else f"seeds_disk_{s['fsync']}"] += 1
    per_kind: dict[str, Counter[str]] = {}
    for s in per_seed:
        for kind, n in s["faults"].items():
            row = per_kind.setdefault(kind, Counter())
            row.update(
                injected=n,
                seeds=1,
                acknowledged=s["acknowledged"],
                lost=s["lost"],
                duplicated=s["duplicated"],
                lost_recorded=s.get("lost_recorded", 0),
            )
    return {
        "seeds": len(per_seed),
        "failed_seeds": failed,
        "faults": dict(faults),
        # Per fault kind: how often it was injected, in how many seeds, and the figures of
        # those seeds (a seed injects several kinds: its records count under each).
        "per_fault_kind": {k: dict(v) for k, v in sorted(per_kind.items())},
        "faults_injected": sum(faults.values()),
        "gateway_log_errors": dict(log_errors),
        **totals,
        # The primary-key tables' batches and changes checked (tests/faults/keychecker.py).
        "key_tables": dict(keys),
        "wall_s": round(wall_s),
        "per_seed": per_seed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=4, help="how many seeds")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, default=None, help="run this seed alone")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of faults per seed")
    parser.add_argument("--out", type=Path, default=Path("faults-results"))
    parser.add_argument("--keep", action="store_true", help="keep every seed's folder")
    parser.add_argument(
        "--spark",
        action="store_true",
        help="read back through the Spark connector too, and run Spark writers under the faults",
    )
    parser.add_argument(
        "--kinds", default=None, help="only these fault kinds (comma-separated; default all)"
    )
    args = parser.parse_args(argv)
    spark = None
    if args.spark:
        from tiering.spark_runner import spark_session

        spark = spark_session("local[2]", "tidegate-faults")
        spark.sparkContext.setLogLevel("ERROR")
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    failed: list[int] = []
    per_seed: list[dict[str, Any]] = []
    started = time.monotonic()
    summary = summarise(per_seed, failed, 0)
    samples: dict[str, str] = {}
    for seed in seeds:
        root = Path(tempfile.mkdtemp(prefix=f"tidegate-faults-{seed}-"))
        try:
            kinds = args.kinds.split(",") if args.kinds else None
            result = run_seed(seed, root, duration=args.duration, spark=spark, kinds=kinds)
        except Exception:  # the cluster did not come up: a failed seed, not a failed run
            failed.append(seed)
            print(f"seed {seed:4d} could not run:\n{traceback.format_exc()}", flush=True)
            continue
        s = result.summary()
        per_seed.append(s)
        tier = result.tier if result.tier == "redis" else f"disk/{result.fsync}"
        print(
            f"seed {seed:4d} {tier:14s} {'ok' if result.ok else 'FAILED'}: "
            f"{s['records_checked']} records, {s['acknowledged']} acknowledged, "
            f"{s['unknown_appends']} unknown, {s['key_tables']['changes']} key-table changes, "
            f"faults {dict(result.faults)}",
            flush=True,
        )
        if not result.ok:
            failed.append(seed)
            kept = args.out / f"seed-{seed}-history.jsonl"
            shutil.copy(result.history_path, kept)
            print(result.text.replace(str(result.history_path), str(kept)), flush=True)
        if result.ok and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        for kind, text in result.log_samples.items():
            samples.setdefault(kind, f"seed {seed}:\n{text}")
        (args.out / "log-error-samples.json").write_text(json.dumps(samples, indent=1))
        # Written after every seed, so a run stopped early still leaves its figures.
        summary = summarise(per_seed, failed, time.monotonic() - started)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_seed"}))
    if failed:
        print("failing seeds: " + " ".join(f"make faults SEED={s}" for s in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
