"""The primary-key tables of a fault run (issue 42): their writer and how they are read back.

One small key table per tenant (:data:`KEY_TABLES`, key ``k``). A ``keys`` operation
writes batches of upserts and deletes of a few distinct keys of one partition (always at
least one upsert, so every batch that is applied makes at least one change and its
changes name it) with an explicit idempotence key ``(producer, partition, sequence)``,
retried as the append tables' writers retry, and now and then sends an acknowledged batch
again under the same sequence, as a client whose answer was lost would: it must be
answered with the same range, its changes not made twice. Every attempt is recorded as a
``keyed`` event: ``wid`` (the batch's id, in every upsert's ``v`` as ``wid/index``),
``partition``, ``rows`` (``[k, v, n]``; ``v`` null for a delete), ``outcome`` and, when
acknowledged, ``at`` ``[partition, base, count]``, the changes' range.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.wire.routing import partition_for_key
from tests.cold.helpers import pyiceberg_rows
from tests.faults.cluster import Cluster, settle
from tests.faults.workload import Operation, operation, outcome_of

KEY_SCHEMA = {"k": "int64", "v": "string", "n": "int64"}
PRIMARY_KEY = ["k"]
#: Per tenant of the cluster: (table, partitions).
KEY_TABLES = [("fa.kv", 2), ("fb.kv", 2)]
#: The keys written: few, so that updates and deletes of live keys are common.
KEYS = 48
#: What a run adds to its mix: one key writer per tenant.
KEY_MIX: list[tuple[str, int]] = [("keys", 2)]


def keys_of(partition: int, partitions: int) -> list[int]:
    """The keys of :data:`KEYS` that route to ``partition``."""
    return [k for k in range(KEYS) if partition_for_key([k], partitions) == partition]


def create_key_tables(cluster: Cluster) -> None:
    for (table, partitions), (_, key) in zip(KEY_TABLES, cluster.tenants, strict=True):
        with cluster.gateways[0].client(api_key=key) as c:
            settle(
                lambda c=c, t=table, n=partitions: c.create_table(
                    t, KEY_SCHEMA, partitions=n, primary_key=PRIMARY_KEY
                )
            )


@operation
class KeyWriter(Operation):
    """Upserts and deletes of a key table over gRPC, idempotent, retried (see the module)."""

    kind = "keys"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.table, self.partitions = KEY_TABLES[self.tenant_index]
        self.keys = [keys_of(p, self.partitions) for p in range(self.partitions)]

    def record(self, type: str, **fields: Any) -> None:
        self.ctx.history.record(type, self.name, table=self.table, **fields)

    def run(self) -> None:
        with self.client() as self.grpc:
            pid, seqs = f"{self.name}-{uuid.uuid4().hex[:6]}", [0] * self.partitions
            resent = ""
            while not self.ctx.stop.is_set():
                p = self.rng.randrange(self.partitions)
                wid = f"{self.name}.{next(self.ctx.ids)}"
                picked = self.rng.sample(self.keys[p], self.rng.randint(1, 4))
                rows = [
                    [k, None, None] if i and self.rng.random() < 0.35 else [k, f"{wid}/{i}", i]
                    for i, k in enumerate(picked)
                ]
                self.rng.shuffle(rows)
                for attempt in range(4):
                    outcome = self._attempt(wid, rows, p, pid, seqs[p])
                    if outcome == "ok":
                        # The answer "lost": the same again (the first batch always, so
                        # that every run does it).
                        if not resent or self.rng.random() < 0.1:
                            resent = self._attempt(wid, rows, p, pid, seqs[p], resend=True)
                        seqs[p] += 1
                        break
                    if outcome == "refused" or self.ctx.stop.is_set() or attempt == 3:
                        pid, seqs = f"{self.name}-{uuid.uuid4().hex[:6]}", [0] * self.partitions
                        break
                    time.sleep(0.2 * (attempt + 1))
                time.sleep(self.rng.uniform(0.01, 0.05) + self.ctx.pace)

    def _attempt(
        self, wid: str, rows: list[list[Any]], p: int, pid: str, seq: int, resend: bool = False
    ) -> str:
        sent = [
            {"k": k, "_change": 3} if v is None else {"k": k, "v": v, "n": n} for k, v, n in rows
        ]
        fields: dict[str, Any] = {"key": f"{pid}/{p}/{seq}", "wid": wid, "partition": p}
        fields["rows"] = rows
        if resend:
            fields["resend"] = True
        try:
            ranges = self.grpc.append(self.table, sent, partition=p, producer_id=pid, sequence=seq)
        except Exception as err:
            outcome = outcome_of(err)
            self.record("keyed", outcome=outcome, error=repr(err)[:200], **fields)
            return outcome
        r = ranges[0]
        at = [r.partition, r.base_offset, r.count]
        self.record("keyed", outcome="ok", at=at, duplicate=bool(r.duplicate), **fields)
        return "ok"


@dataclass
class KeyState:
    """One key table read back at the end: its changelog per partition (read from offset
    0, stitched from Iceberg and the hot tier), the current-state scan, ``get`` of every
    key, the state table read by pyiceberg with the offsets it has applied, and the lost
    ranges the changelog table records."""

    partitions: int
    changes: list[dict[str, Any]] = field(default_factory=list)
    scan: list[dict[str, Any]] = field(default_factory=list)
    got: list[dict[str, Any]] = field(default_factory=list)
    state: list[dict[str, Any]] | None = None
    applied: dict[int, int] = field(default_factory=dict)
    lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyState:
        """What :meth:`to_json` wrote (JSON names partitions as strings)."""
        applied = {int(p): o for p, o in d["applied"].items()}
        lost = {int(p): [(a, b) for a, b in r] for p, r in d["lost"].items()}
        return cls(**{**d, "applied": applied, "lost": lost})


def read_back_keys(cluster: Cluster) -> dict[str, KeyState]:
    """Every key table through every path, after the heal (tiering given time to catch up)."""
    from tests.faults.runner import cold_table, lost_ranges, wait_tiered

    gw = cluster.gateways[0]
    final: dict[str, KeyState] = {}
    for (table, partitions), (tenant, key) in zip(KEY_TABLES, cluster.tenants, strict=True):
        out = KeyState(partitions)
        with gw.client(api_key=key, timeout=60) as c:
            wait_tiered(c, table)
            for p in range(partitions):
                offset = 0
                while True:
                    t = c.read(table, partition=p, offset=offset, max_records=50_000)
                    if t.num_rows == 0:
                        break
                    out.changes += t.select(
                        ["k", "v", "n", "_change", "_partition", "_offset"]
                    ).to_pylist()
                    offset = out.changes[-1]["_offset"] + 1
            out.scan = c.scan(table, columns=["k", "v", "n", "_partition", "_offset"]).to_pylist()
            out.got = c.get(table, [{"k": k} for k in range(KEYS)]).to_pylist()
        store, changelog = cold_table(cluster, tenant, table)
        out.lost = lost_ranges(changelog)
        ns, name = table.split(".")
        try:
            state = store.catalog.load_table((tenant, ns, f"{name}$state"))
        except Exception:  # never made: nothing was tiered
            state = None
        snap = None if state is None else state.current_snapshot()
        if snap is not None:
            raw = snap.summary.additional_properties.get("tidegate.applied") or "{}"
            out.applied = {int(p): int(o) for p, o in json.loads(raw).items()}
            out.state = pyiceberg_rows(store, state)
        final[table] = out
    return final
