"""The history checker for primary-key tables (issue 42; docs/decisions/primary-keys.md,
"The fault suite's key tables").

Per key table and partition, the changelog read back from offset 0 is walked in offset
order beside a mirror of the live rows. Each batch that was applied made a run of
consecutive changes naming it (every batch holds an upsert; an upsert's ``v`` is
``wid/index``): at each offset the batch is the one the next ``+I``/``+U`` names, and the
changes there must be exactly what resolving that batch's rows on the mirror makes
(``+I`` of a key not live, ``-U`` of the mirror's row then ``+U`` of a live one, ``-D``
of the mirror's row for a delete of a live key, nothing for one of a key not live), else
``misapplied``. So the changelog replays to the model of the batches applied, each once:

- **once**: a batch applied a second time (a retried sequence resolved again) is
  ``duplicated``; an acknowledged batch answered with two ranges is ``duplicated`` too;
- **acknowledged**: every acknowledged batch is applied, at the base and with the count
  of changes its answer named (``lost``, ``moved``), unless its range is one the
  changelog table records as lost (an emptied Redis: counted as lost by design, and its
  re-send may then be stored once more);
- **after a lost range** the changes of a key that a batch in the range may have touched
  are resolved on a state the read cannot see (the lost batch was live when the later one
  came): until such a key's next change, its before-image (or a delete's absence, an
  insert where the mirror has a row) is taken from the changelog; its after-image must
  still be the batch's row;
- **unknown** batches (the answer never came) are applied once or not at all, and the
  mirror follows whichever the changelog shows; **refused** ones never (``refused_stored``);
  a change naming no batch sent is ``phantom``; the offsets are dense (``not_dense``);
- **current state**: the scan, ``get`` of every key, and the state table read by
  pyiceberg (up to the offsets its snapshot has applied, ``tidegate.applied``) equal the
  mirror, each row with the ``_partition``/``_offset`` of its key's last change
  (``state_differs``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.faults.checker import Violation
from tests.faults.history import Event, History
from tests.faults.keyworkload import KeyState

INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = 0, 1, 2, 3
#: A live row in the mirror: (v, n, partition, offset of the change that made it).
Row = tuple[str, int, int, int]


@dataclass
class KeyVerdict:
    violations: list[Violation] = field(default_factory=list)
    changes: int = 0
    acknowledged: int = 0
    unknown: int = 0
    resent: int = 0
    lost_recorded: int = 0
    #: Rows compared per current-state path (scan, get, state).
    per_path: Counter[str] = field(default_factory=Counter)


@dataclass
class _Batch:
    wid: str
    partition: int
    rows: list[list[Any]]
    events: list[Event]
    applied: list[int] = field(default_factory=list)
    #: How many changes its (first) application made.
    made: int = 0

    def ranges(self) -> set[tuple[int, int]]:
        return {(e["at"][1], e["at"][2]) for e in self.events if e["outcome"] == "ok"}

    @property
    def outcome(self) -> str:
        outcomes = {e["outcome"] for e in self.events}
        return "ok" if "ok" in outcomes else "unknown" if "unknown" in outcomes else "refused"


def check_keys(
    history: History, final: Mapping[str, KeyState], *, allow_lost: bool = False
) -> KeyVerdict:
    """The verdict on the key tables' batches in ``history`` and the tables read back;
    ``allow_lost`` as for :func:`tests.faults.checker.check`."""
    verdict = KeyVerdict()
    events = history.of("keyed")
    for table, state in final.items():
        if state.lost and not allow_lost:
            message = f"the changelog records lost offsets {state.lost} in a run that lost no data"
            verdict.violations.append(Violation("unexpected_lost_range", table, message))
        batches: dict[str, _Batch] = {}
        for e in events:
            if e["table"] == table:
                b = batches.setdefault(e["wid"], _Batch(e["wid"], e["partition"], e["rows"], []))
                b.events.append(e)
        ctx = _Table(table, state, batches, verdict)
        for p in range(state.partitions):
            ctx.walk(p)
        ctx.finish()
    return verdict


class _Table:
    def __init__(
        self, table: str, state: KeyState, batches: dict[str, _Batch], verdict: KeyVerdict
    ) -> None:
        self.table, self.state, self.batches, self.verdict = table, state, batches, verdict
        #: The live rows of the partition being walked (keys route to one partition).
        self.mirror: dict[int, Row] = {}
        #: Keys of the partition being walked whose last change may be in a lost range.
        self.doubtful: set[int] = set()
        #: Each partition's rows once its whole changelog was replayed, and once its
        #: changes below the state table's applied offset were.
        self.replayed: dict[int, dict[int, Row]] = {}
        self.at_applied: dict[int, dict[int, Row]] = {}

    def flag(
        self, kind: str, message: str, where: set[tuple[int, int]], wid: str | None = None
    ) -> None:
        wids = {wid} if wid else set()
        self.verdict.violations.append(Violation(kind, self.table, message, wids, where))

    def lost(self, p: int, lo: int, hi: int) -> bool:
        return any(a <= lo and hi <= b for a, b in self.state.lost.get(p, ()))

    def walk(self, p: int) -> None:
        self.mirror, self.doubtful = {}, set()
        try:
            self._walk(p)
        finally:
            self.replayed[p] = self.mirror
            self.at_applied.setdefault(p, dict(self.mirror))

    def _walk(self, p: int) -> None:
        changes = [c for c in self.state.changes if c["_partition"] == p]
        changes.sort(key=lambda c: c["_offset"])
        self.verdict.changes += len(changes)
        offsets = [c["_offset"] for c in changes]
        top = offsets[-1] + 1 if offsets else 0
        want = [o for o in range(top) if not self.lost(p, o, o + 1)]
        if offsets != want:
            gap = sorted(set(offsets) ^ set(want))[:5]
            where = {(p, o) for o in gap}
            self.flag("not_dense", f"changelog partition {p}: first differences {gap}", where)
        applied = self.state.applied.get(p, 0)
        lost = sorted(self.state.lost.get(p, ()))
        i = 0
        while i < len(changes):
            while lost and lost[0][0] <= changes[i]["_offset"]:
                self.doubtful |= self._touched(p, *lost.pop(0))
            if changes[i]["_offset"] >= applied and p not in self.at_applied:
                self.at_applied[p] = dict(self.mirror)
            made = self._batch_at(changes, i)
            if made is None:
                return  # flagged; the rest of the partition cannot be attributed
            batch, expected = made
            o = changes[i]["_offset"]
            got = [_change(c) for c in changes[i : i + len(expected)]]
            if got != expected:
                self.flag(
                    "misapplied",
                    f"batch {batch.wid} at {p}/{o}: changes {got[:6]}, resolving its rows "
                    f"{batch.rows} on the replayed state makes {expected[:6]}",
                    {(p, o)},
                    batch.wid,
                )
                return
            if batch.applied:
                self.flag(
                    "duplicated",
                    f"batch {batch.wid} applied at {p}/{batch.applied[0]} and again at {p}/{o}",
                    {(p, batch.applied[0]), (p, o)},
                    batch.wid,
                )
            batch.applied.append(o)
            self.doubtful -= {row[0] for row in batch.rows}
            batch.made = batch.made or len(expected)
            for c in changes[i : i + len(expected)]:
                if c["_offset"] == applied and p not in self.at_applied:
                    self.at_applied[p] = dict(self.mirror)
                _apply(self.mirror, c)
            i += len(expected)

    def _batch_at(
        self, changes: list[dict[str, Any]], i: int
    ) -> tuple[_Batch, list[tuple[Any, ...]]] | None:
        """The batch whose changes start at ``changes[i]`` and the changes it must make."""
        p, o = changes[i]["_partition"], changes[i]["_offset"]
        named = next((c for c in changes[i:] if c["_change"] in (INSERT, UPDATE_AFTER)), None)
        if named is None or not isinstance(named["v"], str) or "/" not in named["v"]:
            self.flag("phantom", f"the changes from {p}/{o} name no batch", {(p, o)})
            return None
        batch = self.batches.get(named["v"].rsplit("/", 1)[0])
        if batch is None or batch.partition != p:
            self.flag("phantom", f"{named['v']} at {p}/{o} was never sent to {p}", {(p, o)})
            return None
        got = [_change(c) for c in changes[i : i + 2 * len(batch.rows)]]
        return batch, _resolve(batch.rows, self.mirror, self.doubtful, got)

    def _touched(self, p: int, lo: int, hi: int) -> set[int]:
        """The keys a batch in the lost range ``[lo, hi)`` of ``p`` may have changed: those of
        the batches acknowledged there, and of every unknown one not applied yet."""
        keys: set[int] = set()
        for b in self.batches.values():
            if b.partition != p or b.applied:
                continue
            inside = any(base < hi and lo < base + n for base, n in b.ranges())
            if inside or b.outcome == "unknown":
                keys |= {row[0] for row in b.rows}
        return keys

    def finish(self) -> None:
        v = self.verdict
        for b in self.batches.values():
            v.resent += sum(1 for e in b.events if e.get("resend"))
            ranges = b.ranges()
            if b.outcome == "unknown":
                v.unknown += 1
            elif b.outcome == "refused" and b.applied:
                self.flag("refused_stored", f"refused batch {b.wid} was applied", set(), b.wid)
            if b.outcome != "ok":
                continue
            v.acknowledged += 1
            # A range recorded lost went with the hot tier's producer state: the batch's
            # re-send may then be stored again, once, elsewhere (as for append tables).
            if len([r for r in ranges if not self.lost(b.partition, r[0], sum(r))]) > 1:
                self.flag(
                    "duplicated",
                    f"batch {b.wid} acknowledged with ranges {sorted(ranges)} (a retry "
                    "applied again)",
                    {(b.partition, base) for base, _ in ranges},
                    b.wid,
                )
            for base, count in ranges:
                if self.lost(b.partition, base, base + count):
                    v.lost_recorded += not b.applied
                elif not b.applied:
                    self.flag(
                        "lost",
                        f"acknowledged batch {b.wid} at {b.partition}/{base} is not in the "
                        "changelog",
                        {(b.partition, base)},
                        b.wid,
                    )
                elif base not in b.applied:
                    self.flag(
                        "moved",
                        f"batch {b.wid} acknowledged at {b.partition}/{base}, applied at "
                        f"{b.applied}",
                        {(b.partition, base)},
                        b.wid,
                    )
                elif count != b.made:
                    self.flag(
                        "moved",
                        f"batch {b.wid} acknowledged with {count} changes at "
                        f"{b.partition}/{base}, made {b.made}",
                        {(b.partition, base)},
                        b.wid,
                    )
        self._current_state()

    def _current_state(self) -> None:
        want = {k: r for m in self.replayed.values() for k, r in m.items()}
        self._same("scan", self.state.scan, want)
        self._same("get", self.state.got, want)
        if self.state.state is not None:
            applied = {k: r for m in self.at_applied.values() for k, r in m.items()}
            self._same("state", self.state.state, applied)

    def _same(self, path: str, rows: list[dict[str, Any]], want: dict[int, Row]) -> None:
        got: dict[int, Row] = {}
        for r in rows:
            if r["k"] in got:
                self.flag("state_differs", f"{path} holds key {r['k']} twice", set())
            got[r["k"]] = (r["v"], r["n"], r["_partition"], r["_offset"])
        self.verdict.per_path[path] += len(rows)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            shown = [(k, got.get(k), want.get(k)) for k in diff[:3]]
            self.flag(
                "state_differs",
                f"{path} differs from the replayed changelog at {len(diff)} keys; "
                f"(key, {path}, replay): {shown}",
                {(w[2], w[3]) for _, _, w in shown if w},
            )


def _change(c: dict[str, Any]) -> tuple[Any, ...]:
    return (c["_change"], c["k"], c["v"], c["n"])


def _resolve(
    rows: list[list[Any]],
    mirror: Mapping[int, Row],
    doubtful: set[int] | frozenset[int] = frozenset(),
    got: list[tuple[Any, ...]] | None = None,
) -> list[tuple[Any, ...]]:
    """The changes ``rows`` (upserts and deletes, in order) make on ``mirror`` under the
    last-row engine (gateway.wire.changes.changelog). A key in ``doubtful`` has its state
    before its first row taken from ``got`` (the changes read), as :class:`_Table` says."""
    live = {k: (r[0], r[1]) for k, r in mirror.items()}
    doubt, got = set(doubtful), got or []
    out: list[tuple[Any, ...]] = []
    for k, v, n in rows:
        old = live.get(k)
        if k in doubt:
            doubt.discard(k)
            seen = got[len(out)] if len(out) < len(got) else None
            kind = seen[0] if seen and seen[1] == k else None
            old = tuple(seen[2:]) if kind in (UPDATE_BEFORE, DELETE) else None
        if v is None:
            if old is not None:
                out.append((DELETE, k, *old))
                live.pop(k, None)
        elif old is None:
            out.append((INSERT, k, v, n))
            live[k] = (v, n)
        else:
            out += [(UPDATE_BEFORE, k, *old), (UPDATE_AFTER, k, v, n)]
            live[k] = (v, n)
    return out


def _apply(mirror: dict[int, Row], c: dict[str, Any]) -> None:
    if c["_change"] in (INSERT, UPDATE_AFTER):
        mirror[c["k"]] = (c["v"], c["n"], c["_partition"], c["_offset"])
    elif c["_change"] == DELETE:
        mirror.pop(c["k"], None)


def batches_by_outcome(history: History) -> dict[str, int]:
    """How many key-table batches ended each way (for the run's summary)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for e in history.of("keyed"):
        seen[e["wid"]].add(e["outcome"])
    return dict(
        Counter(
            "ok" if "ok" in s else "unknown" if "unknown" in s else "refused" for s in seen.values()
        )
    )
