"""Rebalancing hot-tier shards: per-partition heat, a plan of few moves, its execution.

**Heat** of a partition over a window: bytes/s and records/s appended (from the hot log's
own batches, whose append timestamps the metering would only give per tenant), and the hot
bytes it holds. Its **load** on a shard is ``bytes/s + RECORD_COST * records/s``.

**Plan**: shards nobody reserved form the shared pool; while the hottest pool shard holds
more than ``band`` times the pool's mean load, move off it the partition whose load best
fills the excess, to the coolest pool shard, if that lowers the maximum. Partitions of the
tenant hottest on that shard are tried first, so a hot tenant's own partitions move before
its neighbours'. A tenant's reserved shards are balanced the same way among themselves and
never receive anyone else's partitions. Every partition moves at most once per plan.

**Execution** runs the moves a few at a time through a mover (the job calls the gateways'
admin API), each tenant's moves in their own lane, so one tenant's slow or failing move
does not hold up another's.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.hot import HotLog, PartitionId
from gateway.plugins import load_class
from gateway.wire.errors import TidegateError

if TYPE_CHECKING:
    from gateway.lake.components import Components
    from gateway.meta import Placement

__all__ = [
    "RECORD_COST",
    "Heat",
    "HeatMeter",
    "LocalHeat",
    "Move",
    "Outcome",
    "Plan",
    "make_heat_meter",
    "measure_heat",
    "partition_heat",
    "plan_moves",
    "run_plan",
]

log = logging.getLogger(__name__)

#: Bytes of load one record stands for, beside its payload bytes.
RECORD_COST = 64


@dataclass(frozen=True, slots=True)
class Heat:
    tenant: str
    table_id: str
    table: str
    partition: int
    shard: str
    bytes_per_s: float
    records_per_s: float
    hot_bytes: int

    @property
    def load(self) -> float:
        return self.bytes_per_s + RECORD_COST * self.records_per_s


@dataclass(frozen=True, slots=True)
class Move:
    tenant: str
    table: str
    partition: int
    source: str
    target: str
    load: float


@dataclass
class Plan:
    band: float
    #: Load per shard before and (as planned) after the moves.
    before: dict[str, float]
    after: dict[str, float]
    moves: list[Move] = field(default_factory=list)

    @staticmethod
    def ratio(loads: dict[str, float], shards: Iterable[str]) -> float:
        """max/mean of the loads of ``shards`` (1.0 when idle)."""
        values = [loads.get(s, 0.0) for s in shards]
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "band": self.band,
            "before": self.before,
            "after": self.after,
            "moves": [asdict(m) for m in self.moves],
        }


def partition_heat(hot: HotLog, p: Placement, window_s: float, now_us: int) -> Heat:
    """The heat of one partition over the last ``window_s`` seconds, from its batches'
    append timestamps (read backwards from the high watermark, headers only)."""
    part = PartitionId(p.tenant, p.table_id, p.partition)
    offsets = hot.offsets(part)
    since = now_us - int(window_s * 1_000_000)
    nbytes = records = 0
    # The first offset appended inside the window (append times grow along the log).
    lo, hi = offsets.low, offsets.high
    while lo < hi:
        batch = hot.read(part, (lo + hi) // 2, 1, 1)[0]
        if batch.timestamp_us >= since:
            hi = max(batch.base_offset, lo)
        else:
            lo = batch.next_offset
    offset = lo
    while offset < offsets.high:
        batches = hot.read(part, offset, 10_000, 64 << 20)
        if not batches:
            break
        for b in batches:
            if b.next_offset <= offset or b.timestamp_us < since:
                continue
            records += b.next_offset - max(b.base_offset, offset)
            nbytes += len(b.payload)
        offset = batches[-1].next_offset
    return Heat(
        p.tenant,
        p.table_id,
        f"{p.namespace}.{p.name}",
        p.partition,
        p.shard,
        nbytes / window_s,
        records / window_s,
        offsets.size_bytes,
    )


class HeatMeter(ABC):
    """Measures every partition's heat; chosen by name (``local``, ``spark``) through
    :func:`make_heat_meter`, like the tiering runners."""

    @classmethod
    @abstractmethod
    def create(cls, c: Components, master: str | None = None) -> HeatMeter:
        """Build the meter for the components of a job."""

    @abstractmethod
    def measure(
        self, c: Components, placements: Sequence[Placement], window_s: float, now_us: int
    ) -> list[Heat]:
        """The heat of each placement's partition over the window ending at ``now_us``."""


class LocalHeat(HeatMeter):
    """Measures heat in this process, one partition after another."""

    @classmethod
    def create(cls, c: Components, master: str | None = None) -> LocalHeat:
        return cls()

    def measure(
        self, c: Components, placements: Sequence[Placement], window_s: float, now_us: int
    ) -> list[Heat]:
        return [partition_heat(c.hot, p, window_s, now_us) for p in placements]


def make_heat_meter(c: Components, name: str, master: str | None = None) -> HeatMeter:
    """The heat meter ``name``: built-in (:data:`gateway.plugins.BUILTINS`) or ``module:Class``.

    Raises:
        BackendError: an unknown name, a missing extra, or not a :class:`HeatMeter`.
    """
    cls: type[HeatMeter] = load_class("heat meter", name, HeatMeter)
    return cls.create(c, master)


def measure_heat(c: Components, window_s: float, meter: HeatMeter | None = None) -> list[Heat]:
    """Every partition's heat over the last ``window_s`` seconds."""
    now_us = int(time.time() * 1_000_000)
    return (meter or LocalHeat()).measure(c, c.meta.placements(), window_s, now_us)


def plan_moves(
    heat: Sequence[Heat],
    shards: Sequence[str],
    pins: dict[str, str],
    *,
    band: float = 1.25,
    max_moves: int = 100,
) -> Plan:
    """The moves that bring each group of shards (the shared pool; each tenant's reserved
    shards) within ``band`` (max/mean load), moving as few partitions as it can."""
    loads = dict.fromkeys(shards, 0.0)
    for h in heat:
        loads[h.shard] = loads.get(h.shard, 0.0) + h.load
    plan = Plan(band, dict(loads), dict(loads))
    groups: dict[str | None, list[str]] = {}
    for s in shards:
        groups.setdefault(pins.get(s), []).append(s)
    moved: set[tuple[str, int]] = set()
    for owner, group in groups.items():
        members = [h for h in heat if h.shard in group and (owner is None or h.tenant == owner)]
        where = {(h.table_id, h.partition): h.shard for h in members}
        while len(plan.moves) < max_moves and len(group) > 1:
            if Plan.ratio(plan.after, group) <= band:
                break
            hot_shard = max(group, key=lambda s: (plan.after[s], s))
            cool = min(group, key=lambda s: (plan.after[s], s))
            mean = sum(plan.after[s] for s in group) / len(group)
            excess = plan.after[hot_shard] - mean
            room = plan.after[hot_shard] - plan.after[cool]
            on_it = [
                h
                for h in members
                if where[(h.table_id, h.partition)] == hot_shard
                and (h.table_id, h.partition) not in moved
                and 0 < h.load < room
            ]
            if not on_it:
                break
            by_tenant: dict[str, float] = {}
            for h in on_it:
                by_tenant[h.tenant] = by_tenant.get(h.tenant, 0.0) + h.load
            hottest = max(by_tenant, key=lambda t: (by_tenant[t], t))
            own = [h for h in on_it if h.tenant == hottest]
            # The hot tenant's own partitions first, when one of them can close the gap.
            pool = own if any(h.load >= excess * 0.5 for h in own) else on_it
            pick = min(pool, key=lambda h: (abs(h.load - excess), h.table_id, h.partition))
            plan.after[hot_shard] -= pick.load
            plan.after[cool] += pick.load
            where[(pick.table_id, pick.partition)] = cool
            moved.add((pick.table_id, pick.partition))
            plan.moves.append(
                Move(pick.tenant, pick.table, pick.partition, hot_shard, cool, pick.load)
            )
    return plan


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one planned move: ``done``, ``failed`` (with the error) or
    ``skipped`` (an earlier move of the same tenant failed)."""

    move: Move
    state: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.move), "state": self.state, "error": self.error}


def run_plan(plan: Plan, mover: Callable[[Move], object], *, parallel: int = 2) -> list[Outcome]:
    """Execute the moves through ``mover`` (the admin API's move call, for the job):
    each tenant's in order in its own lane, ``parallel`` lanes at a time. A failed move
    ends its tenant's lane (the tenant's later moves are skipped: the plan assumed it) and
    does not stop other tenants' lanes. Returns the outcomes in the plan's order."""
    lanes: dict[str, list[tuple[int, Move]]] = {}
    for i, m in enumerate(plan.moves):
        lanes.setdefault(m.tenant, []).append((i, m))
    outcomes: dict[int, Outcome] = {}

    def lane(moves: list[tuple[int, Move]]) -> None:
        failed = ""
        for i, m in moves:
            if failed:
                outcomes[i] = Outcome(m, "skipped", f"an earlier move failed: {failed}")
                continue
            try:
                mover(m)
            except Exception as exc:
                failed = (
                    f"{exc.reason}: {exc.message}"
                    if isinstance(exc, TidegateError)
                    else f"{type(exc).__name__}: {exc}"
                )
                log.warning("moving %s %s/%d failed: %s", m.tenant, m.table, m.partition, failed)
                outcomes[i] = Outcome(m, "failed", failed)
            else:
                outcomes[i] = Outcome(m, "done")

    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="tg-rebalance") as pool:
        list(pool.map(lane, lanes.values()))
    return [outcomes[i] for i in range(len(plan.moves))]
