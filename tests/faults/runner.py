"""One seed of the fault suite: start a cluster, run the workload under the nemesis, heal,
read everything back through every path, check the history. ``python -m tests.faults``
runs seeds from the command line (``make faults``)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.cold.helpers import duckdb_rows, pyiceberg_rows
from tests.faults.checker import TableState, Verdict, check, records_of, report
from tests.faults.cluster import Cluster
from tests.faults.faults import LOSES_DATA, Nemesis
from tests.faults.history import History
from tests.faults.keychecker import KeyVerdict, check_keys
from tests.faults.keyworkload import KEY_MIX, create_key_tables, read_back_keys
from tests.faults.workload import (
    DEFAULT_MIX,
    SCHEMA,
    SPARK_MIX,
    TABLES,
    Context,
    start_operations,
)

TIERS = ("disk", "redis")


@dataclass
class RunResult:
    seed: int
    tier: str
    fsync: str
    verdict: Verdict
    faults: Counter[str]
    history_path: Path
    problems: list[str] = field(default_factory=list)
    #: ERROR lines in the gateways' logs, by their first words (faults cause many: they
    #: are counted, not failed on).
    log_errors: Counter[str] = field(default_factory=Counter)
    #: The first of each kind of ERROR line, with its traceback.
    log_samples: dict[str, str] = field(default_factory=dict)
    #: Seconds spent per phase: start, faults, heal, check, stop.
    phases: dict[str, float] = field(default_factory=dict)
    text: str = ""
    #: The key tables' verdict (its violations are in ``verdict``'s too).
    keys: KeyVerdict = field(default_factory=KeyVerdict)

    @property
    def ok(self) -> bool:
        return not self.verdict.violations and not self.problems

    def summary(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "seed": self.seed,
            "tier": self.tier,
            "fsync": self.fsync if self.tier == "disk" else None,
            "ok": self.ok,
            "faults": dict(self.faults),
            "records_checked": v.records_checked,
            "acknowledged": v.acknowledged,
            "unknown_appends": v.unknown,
            "refused_appends": v.refused,
            "reads_checked": v.reads_checked,
            "per_path": v.per_path,
            "lost": v.lost,
            "duplicated": v.duplicated,
            "lost_recorded": v.lost_recorded,
            "lost_offsets": v.lost_offsets,
            "violations": len(v.violations),
            "key_tables": {
                "changes": self.keys.changes,
                "batches_acknowledged": self.keys.acknowledged,
                "batches_unknown": self.keys.unknown,
                "batches_resent": self.keys.resent,
                "lost_recorded": self.keys.lost_recorded,
                "per_path": dict(self.keys.per_path),
            },
            "problems": self.problems,
            "log_errors": dict(self.log_errors),
            "phases_s": self.phases,
        }


def tier_of(seed: int) -> str:
    """Seeds alternate between the hot tiers: even seeds disk, odd seeds Redis."""
    return TIERS[seed % 2]


def fsync_of(seed: int) -> str:
    """The disk tier's fsync policy of a seed: every policy in turn over the disk seeds. A
    process kill must lose nothing acknowledged under any of them (the page cache outlives
    the process); what they differ in, a machine crash, the suite injects where it is
    promised to lose nothing: ``power_cut`` on ``batch`` seeds."""
    return ("batch", "interval", "never")[(seed // 2 - 1) % 3]


def rerun_command(seed: int) -> str:
    return f"make faults SEED={seed}"


def run_seed(
    seed: int,
    root: Path,
    *,
    tier: str | None = None,
    duration: float = 15.0,
    mix: list[tuple[str, int]] | None = None,
    kinds: list[str] | None = None,
    hot_env: dict[str, str] | None = None,
    spark: Any = None,
    faults_after_acks: int = 0,
) -> RunResult:
    """Run one seed in ``root`` (its processes' folders and the history): ``duration``
    seconds of ``mix`` under the nemesis (``kinds`` of faults, all that apply by default),
    then read back and check (through ``spark``, a SparkSession, too when given). With
    ``faults_after_acks``, the nemesis starts once that many appends were acknowledged
    (within a minute), so a slow machine's first fault does not come before any traffic."""
    tier = tier or tier_of(seed)
    root.mkdir(parents=True, exist_ok=True)
    # The clock shim only where the clock may jump (it makes every gateway start exec'd).
    clock_shim = kinds is None or "clock_jump" in kinds
    cluster = Cluster(tier, root, fsync=fsync_of(seed), spark=spark, clock_shim=clock_shim)
    history = History()
    problems: list[str] = []
    nemesis: Nemesis | None = None
    verdict = Verdict([], 0, 0, 0, 0, 0)
    keys = KeyVerdict()
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 1)
        mark = now

    try:
        cluster.start(hot_env)
        cluster.create_tables(TABLES, SCHEMA)
        create_key_tables(cluster)
        phase("start")
        ctx = Context(cluster, history, seed)
        mix = mix or DEFAULT_MIX + KEY_MIX + (SPARK_MIX if spark else [])
        ops = start_operations(ctx, mix)
        _wait_for_acks(history, faults_after_acks, within=60.0)
        nemesis = Nemesis(cluster, seed, history, kinds).start()
        time.sleep(duration)
        nemesis.join()
        phase("faults")
        cluster.heal()
        ctx.stop.set()
        for op in ops:
            op.finish(150)
        phase("heal")
        problems += [f"operation did not finish: {op.name}" for op in ops if op.thread.is_alive()]
        problems += ctx.errors + [f"fault failed: {e}" for e in nemesis.errors]
        final = read_back(cluster, history, spark)
        allow_lost = bool(LOSES_DATA & set(nemesis.counts))
        verdict = check(history, final, allow_lost=allow_lost)
        keys_final = read_back_keys(cluster)
        # Kept with a failing seed's folder: `python -m tests.faults.recheck keys` reads it.
        keys_json = {t: s.to_json() for t, s in keys_final.items()}
        (root / "keys-final.json").write_text(json.dumps(keys_json, default=str))
        keys = check_keys(history, keys_final, allow_lost=allow_lost)
        verdict.violations += keys.violations
        phase("check")
    finally:
        cluster.stop()
        phase("stop")
    samples: dict[str, str] = {}
    logs = log_errors(root, samples)
    history_path = root / "history.jsonl"
    history.dump(history_path)
    counts = nemesis.counts if nemesis is not None else Counter()
    result = RunResult(
        seed, tier, cluster.fsync, verdict, counts, history_path, problems, logs, samples, phases
    )
    result.keys = keys
    if not result.ok:
        text = (
            report(seed, tier, verdict, history, rerun_command(seed)) if verdict.violations else ""
        )
        result.text = "\n".join(
            [f"seed {seed} ({tier}) rerun: {rerun_command(seed)}", *problems, text]
        )
        result.text += f"\nfull history: {history_path}"
    return result


def _wait_for_acks(history: History, count: int, within: float) -> None:
    deadline = time.monotonic() + within
    while count and time.monotonic() < deadline:
        acked = [e for e in history.of("append") if e.get("outcome") == "ok"]
        if len(acked) >= count:
            return
        time.sleep(0.05)


def read_back(cluster: Cluster, history: History, spark: Any = None) -> dict[str, TableState]:
    """Every table through every path, after the cluster healed and tiering caught up:
    the stream, a scan, DuckDB and pyiceberg on the Iceberg table, and the Spark connector
    (``spark.read.format("tidegate")``, a read plan's files plus the hot ranges) when a
    SparkSession is given."""
    gw = cluster.gateways[0]
    final: dict[str, TableState] = {}
    for (table, partitions), (tenant, key) in zip(TABLES, cluster.tenants, strict=True):
        state = TableState(partitions)
        with gw.client(api_key=key, timeout=60) as c:
            wait_tiered(c, table)
            stream = []
            for p in range(partitions):
                offset = 0
                while True:
                    t = c.read(table, partition=p, offset=offset, max_records=50_000)
                    if t.num_rows == 0:
                        break
                    stream += records_of(t.select(["_partition", "_offset", "rid"]).to_pylist())
                    offset = stream[-1][1] + 1
            state.paths["stream"] = stream
            scan = c.scan(table, columns=["rid", "_partition", "_offset"])
            state.paths["scan"] = records_of(scan.to_pylist())
            if spark is not None:
                state.paths["spark"] = spark_records(spark, gw.http_url, key, table)
            for group, _ in c.list_groups(table):
                offsets = c.fetch_offsets(group, table)
                history.record(
                    "fetch_offsets",
                    "checker",
                    table=table,
                    group=group,
                    offsets={str(k): v for k, v in offsets.items()},
                )
        store, iceberg = cold_table(cluster, tenant, table)
        marks = watermarks(iceberg)
        handle = SimpleNamespace(metadata_location=iceberg.metadata_location)
        state.paths["duckdb"] = records_of(duckdb_rows(store, handle)) if marks else []
        state.paths["pyiceberg"] = records_of(pyiceberg_rows(store, handle)) if marks else []
        state.prefix = {"duckdb": marks, "pyiceberg": marks}
        state.lost = lost_ranges(iceberg)
        final[table] = state
    return final


def spark_records(spark: Any, endpoint: str, key: str, table: str) -> list[Any]:
    import gateway.spark

    gateway.spark.register(spark)
    frame = (
        spark.read.format("tidegate")
        .option("endpoint", endpoint)
        .option("api_key", key)
        .load(table)
        .select("_partition", "_offset", "rid")
    )
    return records_of(r.asDict() for r in frame.collect())


def wait_tiered(client: Any, table: str, timeout: float = 20.0) -> None:
    """Until tiering has caught up with every partition (or ``timeout``: the checker then
    checks what was tiered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.describe_table(table)
        if all(p.tiered_watermark == p.high_watermark for p in info.partition_info):
            return
        time.sleep(0.5)


def error_kind(line: str) -> str:
    """An ERROR line's logger and message, with tenant and table names taken out."""
    head = line.split(" ERROR ", 1)[1]
    return re.sub(r"\bt[0-9a-f]{12}b?(/\S+)?", "<table>", head)[:80]


def log_errors(root: Path, samples: dict[str, str] | None = None) -> Counter[str]:
    """ERROR lines of every gateway log under ``root``, by kind (:func:`error_kind`).
    ``samples`` gets each kind's first occurrence with the end of the traceback that
    follows it (where the cause is)."""
    found: Counter[str] = Counter()
    for log in sorted(root.glob("gw*/gateway.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if " ERROR " in line:
                kind = error_kind(line)
                found[kind] += 1
                if samples is not None and kind not in samples:
                    block = [line]
                    for more in lines[i + 1 : i + 150]:  # its traceback, to the next entry
                        if re.match(r"\d{4}-\d\d-\d\d ", more):
                            break
                        block.append(more)
                    samples[kind] = block[0] + "\n...\n" + "\n".join(block[1:])[-2500:]
    return found


def cold_table(cluster: Cluster, tenant: str, table: str) -> tuple[Any, Any]:
    from gateway.cold.iceberg import IcebergColdStore
    from gateway.config import Settings

    env = cluster.settings_env()
    settings = Settings.explicit(
        data_dir=cluster.root / "checker",
        cold={
            "warehouse": env["TIDEGATE_COLD__WAREHOUSE"],
            "catalog": {"type": "sql", "uri": env["TIDEGATE_COLD__CATALOG__URI"]},
        },
    )
    store = IcebergColdStore.from_settings(settings)
    ns, name = table.split(".")
    return store, store.catalog.load_table((tenant, ns, name))


def lost_ranges(iceberg: Any) -> dict[int, list[tuple[int, int]]]:
    """The offsets the table's current snapshot records as lost (``tidegate.lost``)."""
    snap = iceberg.current_snapshot()
    raw = None if snap is None else snap.summary.additional_properties.get("tidegate.lost")
    if not raw:
        return {}
    return {int(p): [(int(lo), int(hi)) for lo, hi in r] for p, r in json.loads(raw).items()}


def watermarks(iceberg: Any) -> dict[int, int]:
    snap = iceberg.current_snapshot()
    if snap is None or "tidegate.watermarks" not in snap.summary.additional_properties:
        return {}
    raw = json.loads(snap.summary.additional_properties["tidegate.watermarks"])
    return {int(k): int(v) for k, v in raw.items()}
