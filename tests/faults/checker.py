"""The checker: a recorded history and the table read back at the end, through every path.

It verifies, per table:

- **dense**: each path's offsets of a partition are 0..n-1 (the stream and a scan: up to
  the high watermark; an Iceberg reader: up to the snapshot's ``tidegate.watermarks``);
- **agree**: every path holds the same record at the same ``(partition, offset)``;
- **acknowledged**: every acknowledged record is present exactly once, at the offset its
  acknowledgement named (missing: ``lost``; elsewhere: ``moved``);
- **whole batches**: a batch sent in one request is stored wholly or not at all (``torn``);
- **at most once**: no record id is stored twice (``duplicated``), whatever its append's
  outcome (an ``unknown`` one may be absent, never doubled); a ``refused`` one is absent;
  nothing is stored that no client sent (``phantom``);
- **stable reads**: every record a read or scan returned during the run is still there,
  at the same offset, at the end (``vanished`` / ``moved``), and a read's records are
  consecutive from where it started, a scan's a dense prefix of each partition;
- **group offsets** never go backwards;
- **recorded losses only**: offsets the gateway recorded as lost (the Iceberg snapshot
  property ``tidegate.lost``: a hot tier that lost its state, an emptied Redis, before
  tiering moved them) are passed over by every path; an acknowledged record at such an
  offset is counted as lost by design (``lost_recorded``), not as lost, and so is a
  record a read returned there before the loss. Nothing else may be missing, and a run
  that injected no fault losing data (``allow_lost``) must have no lost range at all
  (``unexpected_lost_range``).

A failure names the seed and shows the smallest excerpt of the history that involves it:
the operations that mention its records or offsets and the faults around them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.faults.history import Event, History

Record = tuple[int, int, str]  # (partition, offset, rid)


@dataclass
class TableState:
    """One table read back at the end: records per path, and for prefix paths (the
    Iceberg readers) the tiered watermark per partition they must cover exactly."""

    partitions: int
    paths: dict[str, list[Record]] = field(default_factory=dict)
    prefix: dict[str, dict[int, int]] = field(default_factory=dict)
    #: The lost ranges ``[start, end)`` per partition the table's snapshot records.
    lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def is_lost(self, partition: int, offset: int) -> bool:
        return any(lo <= offset < hi for lo, hi in self.lost.get(partition, ()))


@dataclass
class Violation:
    kind: str
    table: str
    message: str
    rids: set[str] = field(default_factory=set)
    where: set[tuple[int, int]] = field(default_factory=set)


@dataclass
class Verdict:
    violations: list[Violation]
    records_checked: int
    acknowledged: int
    unknown: int
    refused: int
    reads_checked: int
    #: Records read back at the end per path (stream, scan, duckdb, pyiceberg...).
    per_path: dict[str, int] = field(default_factory=dict)
    #: Acknowledged records at offsets the gateway recorded as lost (by design: a hot
    #: tier that lost its state before tiering), and offsets so recorded.
    lost_recorded: int = 0
    lost_offsets: int = 0

    @property
    def lost(self) -> int:
        return sum(1 for v in self.violations if v.kind == "lost")

    @property
    def duplicated(self) -> int:
        return sum(1 for v in self.violations if v.kind == "duplicated")


def check(
    history: History, final: Mapping[str, TableState], *, allow_lost: bool = False
) -> Verdict:
    """The verdict on ``history`` and the tables read back; ``allow_lost``: the run
    injected a fault after which lost ranges are expected (an emptied Redis)."""
    out: list[Violation] = []
    lost_recorded = lost_offsets = 0
    appends = history.of("append")
    sent: dict[str, list[Event]] = defaultdict(list)
    for e in appends:
        for rid in e["rids"]:
            sent[rid].append(e)
    records = 0
    per_path: Counter[str] = Counter()
    for table, state in final.items():
        for name, recs in state.paths.items():
            per_path[name] += len(recs)
        for p, ranges in state.lost.items():
            size = sum(hi - lo for lo, hi in ranges)
            lost_offsets += size
            if size and not allow_lost:
                out.append(
                    Violation(
                        "unexpected_lost_range",
                        table,
                        f"partition {p} records lost offsets {ranges} in a run that injected "
                        "no fault losing the hot tier's data",
                        where={(p, lo) for lo, _ in ranges},
                    )
                )
        truth = _truth(table, state, out)
        records += len(truth)
        lost_recorded += _check_appends(
            table, truth, [e for e in appends if e["table"] == table], out, state
        )
        for rid, n in Counter(truth.values()).items():
            if n > 1:
                where = {k for k, v in truth.items() if v == rid}
                out.append(Violation("duplicated", table, f"{rid} stored {n} times", {rid}, where))
            if rid not in sent:
                where = {k for k, v in truth.items() if v == rid}
                out.append(Violation("phantom", table, f"{rid} was never sent", {rid}, where))
        _check_reads(table, truth, history, out, state)
    _check_groups(history, out)
    outcomes = Counter(e["outcome"] for e in appends)
    return Verdict(
        out,
        records,
        sum(len(e["rids"]) for e in appends if e["outcome"] == "ok"),
        outcomes["unknown"],
        outcomes["refused"],
        len(history.of("read", "scan")),
        dict(per_path),
        lost_recorded,
        lost_offsets,
    )


def _truth(table: str, state: TableState, out: list[Violation]) -> dict[tuple[int, int], str]:
    """The stream path's records as ``(partition, offset) -> rid``, after checking that
    every path is dense and that they all agree."""
    truth: dict[tuple[int, int], str] = {}
    for p, o, rid in state.paths["stream"]:
        truth[(p, o)] = rid
    for name, recs in state.paths.items():
        per: dict[int, list[int]] = defaultdict(list)
        for p, o, rid in recs:
            per[p].append(o)
            if (p, o) in truth and truth[(p, o)] != rid:
                out.append(
                    Violation(
                        "disagree",
                        table,
                        f"{name} holds {rid} at {p}/{o}, the stream {truth[(p, o)]}",
                        {rid, truth[(p, o)]},
                        {(p, o)},
                    )
                )
            elif (p, o) not in truth:
                out.append(
                    Violation(
                        "disagree",
                        table,
                        f"{name} holds {rid} at {p}/{o}, the stream none",
                        {rid},
                        {(p, o)},
                    )
                )
        for p in range(state.partitions):
            got = sorted(per.get(p, []))
            if name in state.prefix:
                top = state.prefix[name].get(p, 0)
            else:
                top = got[-1] + 1 if got else 0
            want = [o for o in range(top) if not state.is_lost(p, o)]
            if got != want:
                gap = sorted(set(want) ^ set(got))[:5] or got[:5]
                out.append(
                    Violation(
                        "not_dense",
                        table,
                        f"{name} partition {p}: {len(got)} offsets, expected {len(want)}; "
                        f"first differences {gap}",
                        where={(p, o) for o in gap},
                    )
                )
    return truth


def _check_appends(
    table: str,
    truth: Mapping[tuple[int, int], str],
    appends: Sequence[Event],
    out: list[Violation],
    state: TableState | None = None,
) -> int:
    """Check the appends to ``table``; the acknowledged records lost by design (at an
    offset ``state`` records as lost) are counted, not reported."""
    where_is: dict[str, tuple[int, int]] = {rid: k for k, rid in truth.items()}
    lost_by_design = 0
    for e in appends:
        if e["outcome"] == "ok" and e.get("at") is None:
            # A writer that acknowledges rows without their offsets (the Spark writer):
            # each must be there; where, the stream decides.
            for rid in e["rids"]:
                if rid not in where_is:
                    out.append(Violation("lost", table, f"acknowledged {rid} is gone", {rid}))
        elif e["outcome"] == "ok":
            for rid, at in zip(e["rids"], e["at"], strict=True):
                found = where_is.get(rid)
                if state is not None and state.is_lost(at[0], at[1]):
                    # Acknowledged, then lost with the hot tier's state before tiering:
                    # recorded by the gateway (at most re-sent and stored elsewhere once).
                    lost_by_design += found is None
                    continue
                if found is None:
                    out.append(
                        Violation(
                            "lost",
                            table,
                            f"acknowledged {rid} at {at[0]}/{at[1]} is gone",
                            {rid},
                            {(at[0], at[1])},
                        )
                    )
                elif found != (at[0], at[1]):
                    out.append(
                        Violation(
                            "moved",
                            table,
                            f"{rid} acknowledged at {at[0]}/{at[1]}, stored at "
                            f"{found[0]}/{found[1]}",
                            {rid},
                            {found, (at[0], at[1])},
                        )
                    )
        if e.get("atomic"):
            stored = [rid for rid in e["rids"] if rid in where_is]
            if stored and len(stored) < len(e["rids"]):
                missing = set(e["rids"]) - set(stored)
                out.append(
                    Violation(
                        "torn",
                        table,
                        f"append {e['i']} ({e['outcome']}) is stored in part: "
                        f"{sorted(missing)[:3]} missing",
                        set(e["rids"]),
                        {where_is[rid] for rid in stored},
                    )
                )
        if e["outcome"] == "refused":
            for rid in e["rids"]:
                if rid in where_is:
                    out.append(
                        Violation(
                            "refused_stored",
                            table,
                            f"refused {rid} was stored",
                            {rid},
                            {where_is[rid]},
                        )
                    )
    return lost_by_design


def _check_reads(
    table: str,
    truth: Mapping[tuple[int, int], str],
    history: History,
    out: list[Violation],
    state: TableState | None = None,
) -> None:
    lost = state.is_lost if state is not None else (lambda p, o: False)
    for e in history.of("read", "scan"):
        if e["table"] != table:
            continue
        if e["type"] == "read":
            recs = [(e["partition"], o, rid) for o, rid in e["records"]]
            # Offsets recorded lost since may or may not be in it (read before the loss
            # or after): the rest must be consecutive, passing over them.
            offsets = [o for _, o, _ in recs if not lost(e["partition"], o)]
            want: list[int] = []
            o = e["from"]
            while offsets and len(want) < len(offsets):
                if not lost(e["partition"], o):
                    want.append(o)
                o += 1
            if offsets and offsets != want:
                out.append(
                    Violation(
                        "read_gap",
                        table,
                        f"read {e['i']} from {e['from']} returned offsets {offsets[:8]}...",
                        where={(e["partition"], e["from"])},
                    )
                )
        else:
            recs = [tuple(r) for r in e["records"]]  # type: ignore[misc]
            per: dict[int, list[int]] = defaultdict(list)
            for p, o, _ in recs:
                if not lost(p, o):
                    per[p].append(o)
            for p, offs in per.items():
                top = max(offs) + 1
                if sorted(offs) != [o for o in range(top) if not lost(p, o)]:
                    out.append(
                        Violation(
                            "scan_gap",
                            table,
                            f"scan {e['i']} partition {p} is not a dense prefix",
                            where={(p, min(offs))},
                        )
                    )
        for p, o, rid in recs:
            now = truth.get((p, o))
            if now is None and lost(p, o):
                continue  # read before the hot tier lost it, recorded lost since
            if now != rid:
                out.append(
                    Violation(
                        "vanished" if now is None else "moved",
                        table,
                        f"{e['type']} {e['i']} returned {rid} at {p}/{o}; at the end: {now}",
                        {rid} | ({now} if now else set()),
                        {(p, o)},
                    )
                )


def _check_groups(history: History, out: list[Violation]) -> None:
    seen: dict[tuple[str, str, int], tuple[int, int]] = {}
    for e in history.of("fetch_offsets", "commit"):
        for p, o in e["offsets"].items():
            key = (e["table"], e["group"], int(p))
            before = seen.get(key)
            if before is not None and o < before[0] and e["type"] == "fetch_offsets":
                out.append(
                    Violation(
                        "group_backwards",
                        e["table"],
                        f"group {e['group']} partition {p}: {before[0]} (event "
                        f"{before[1]}) then {o} (event {e['i']})",
                        where={(int(p), o)},
                    )
                )
            if before is None or o >= before[0]:
                seen[key] = (o, e["i"])


def excerpt(history: History, violation: Violation, limit: int = 24) -> list[Event]:
    """The smallest part of the history that shows ``violation``: the operations that
    sent, acknowledged or returned its records or offsets, and the faults between the
    first and the last of them (and the one just before)."""
    involved = []
    for e in history:
        if e["type"] == "fault" or e.get("table") != violation.table:
            continue
        if _mentions(e, violation):
            involved.append(e)
    if not involved:
        return history.of("fault")[-limit:]
    lo, hi = involved[0]["i"], involved[-1]["i"]
    faults = [f for f in history.of("fault") if lo <= f["i"] <= hi]
    before = [f for f in history.of("fault") if f["i"] < lo][-2:]
    picked = sorted({e["i"]: e for e in before + involved + faults}.values(), key=lambda e: e["i"])
    if len(picked) > limit:
        picked = picked[: limit // 2] + picked[-limit // 2 :]
    return [_trim(e, violation) for e in picked]


def _mentions(e: Event, v: Violation) -> bool:
    if e["type"] == "append":
        return bool(v.rids & set(e["rids"])) or any(
            (a[0], a[1]) in v.where for a in e.get("at") or []
        )
    if e["type"] == "read":
        return any(rid in v.rids or (e["partition"], o) in v.where for o, rid in e["records"])
    if e["type"] == "scan":
        return any(rid in v.rids or (p, o) in v.where for p, o, rid in e["records"])
    if e["type"] in ("fetch_offsets", "commit"):
        return v.kind == "group_backwards"
    if e["type"] == "keyed":  # a key table's batch (tests/faults/keychecker.py)
        at = e.get("at")
        return e["wid"] in v.rids or (at is not None and (at[0], at[1]) in v.where)
    return False


def _trim(e: Event, v: Violation) -> Event:
    """``e`` with long record lists cut to the entries that matter."""
    e = dict(e)
    if e["type"] == "read":
        e["records"] = [
            r for r in e["records"] if r[1] in v.rids or (e["partition"], r[0]) in v.where
        ]
    elif e["type"] == "scan":
        e["records"] = [r for r in e["records"] if r[2] in v.rids or (r[0], r[1]) in v.where]
    return e


def report(seed: int, tier: str, verdict: Verdict, history: History, rerun: str) -> str:
    """What a failing seed prints: the seed, how to run it alone, each kind of violation
    with its first few cases and, for the first, the history excerpt."""
    lines = [f"seed {seed} ({tier}): {len(verdict.violations)} violations; rerun: {rerun}"]
    by_kind: dict[str, list[Violation]] = defaultdict(list)
    for v in verdict.violations:
        by_kind[v.kind].append(v)
    for kind, vs in by_kind.items():
        lines.append(f"  {kind}: {len(vs)}")
        lines.extend(f"    {v.table}: {v.message}" for v in vs[:3])
    first = verdict.violations[0]
    lines.append(f"history excerpt for: {first.kind} {first.message}")
    lines.extend("  " + json.dumps(e, separators=(",", ":")) for e in excerpt(history, first))
    return "\n".join(lines)


def records_of(rows: Iterable[Mapping[str, Any]]) -> list[Record]:
    return [(int(r["_partition"]), int(r["_offset"]), str(r["rid"])) for r in rows]
