"""``python -m tests.faults.recheck SEED ROOT HISTORY``: check a failed seed's history
again against the Iceberg tables its kept folder holds, with the workload's current
outcome rules (an append answered ``INVALID_IDEMPOTENT_APPEND``, a sequence older than
the de-duplication window, is an unknown outcome, not a refusal). The tables are read
through pyiceberg: at the end of a seed tiering had caught up, so they hold every record.
Prints the verdict as one JSON line (``benchmarks/results/faults/`` quotes them).

``python -m tests.faults.recheck keys HISTORY KEYS``: check the key tables of a seed again,
from its history and the ``keys-final.json`` its kept folder holds (what the read-back
saw), with the key checker's current rules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.cold.helpers import pyiceberg_rows
from tests.faults.checker import TableState, check, records_of
from tests.faults.cluster import Cluster
from tests.faults.history import History
from tests.faults.runner import lost_ranges
from tests.faults.workload import TABLES, maybe_stored


def main(argv: list[str]) -> None:
    if argv[0] == "keys":
        recheck_keys(Path(argv[1]), Path(argv[2]))
        return
    from gateway.cold.iceberg import IcebergColdStore
    from gateway.config import Settings

    seed, root, path = int(argv[0]), Path(argv[1]), Path(argv[2])
    events, changed = [], 0
    for line in path.read_text().splitlines():
        e = json.loads(line)
        error = e.get("error", "")
        if e["type"] == "append" and e["outcome"] == "refused" and maybe_stored(error):
            e["outcome"] = "unknown"
            changed += 1
        events.append(e)
    env = Cluster("redis", root).settings_env()
    cold = {
        "warehouse": env["TIDEGATE_COLD__WAREHOUSE"],
        "catalog": {"type": "sql", "uri": env["TIDEGATE_COLD__CATALOG__URI"]},
    }
    store = IcebergColdStore.from_settings(Settings.explicit(data_dir=root / "recheck", cold=cold))
    tenants = sorted(ns[0] for ns in store.catalog.list_namespaces() if len(ns) == 1)
    final = {}
    for (table, partitions), tenant in zip(TABLES, tenants, strict=True):
        ns, name = table.split(".")
        ice = store.catalog.load_table((tenant, ns, name))
        handle = SimpleNamespace(metadata_location=ice.metadata_location)
        state = TableState(partitions, {"stream": records_of(pyiceberg_rows(store, handle))})
        state.lost = lost_ranges(ice)
        final[table] = state
    verdict = check(History.of_events(events), final, allow_lost=True)
    kinds: dict[str, int] = {}
    for v in verdict.violations:
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
    summary = {
        "seed": seed,
        "reclassified_appends": changed,
        "records": verdict.records_checked,
        "acknowledged": verdict.acknowledged,
        "lost": verdict.lost,
        "duplicated": verdict.duplicated,
        "lost_recorded": verdict.lost_recorded,
        "violations": kinds,
    }
    print(json.dumps(summary))


def recheck_keys(history: Path, keys: Path) -> None:
    from tests.faults.keychecker import check_keys
    from tests.faults.keyworkload import KeyState

    events = [json.loads(line) for line in history.read_text().splitlines()]
    final = {t: KeyState.from_json(d) for t, d in json.loads(keys.read_text()).items()}
    verdict = check_keys(History.of_events(events), final, allow_lost=True)
    for v in verdict.violations:
        print(f"{v.kind}: {v.table}: {v.message}")
    print(json.dumps({"changes": verdict.changes, "violations": len(verdict.violations)}))


if __name__ == "__main__":
    main(sys.argv[1:])
