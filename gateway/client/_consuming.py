"""The consumer's I/O-free core, shared by the sync and asyncio consumers.

- :class:`Positions`: where a consumer is in each partition it holds (the next offset to
  fetch, the offset after the last record handed out, the last commit);
- :class:`Membership`: a member's side of the group protocol (KIP-848 in small, see
  :mod:`gateway.core.coordinator` for the gateway's): its id and generation, the
  partitions it holds and those it was told to hold, and the rebalance it must apply;
- :class:`Outage`: riding through a gateway outage: backoff between attempts, one log
  line per outage, a clear error when the consumer's reconnect timeout runs out;
- :class:`ConsumerBase`: what the two consumers share apart from I/O.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from gateway.client._lake_scan import check_mode
from gateway.client._reading import mark_consumed, start_positions
from gateway.client._requests import (
    commit_offsets_request,
    fetch_offsets_request,
    offsets_for_times_request,
)
from gateway.client._types import StartAt, TableInfo, TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import TidegateError, Unavailable, UnknownMember
from gateway.wire.retry import ExponentialBackoff, Retry

__all__ = [
    "NO_RETRY",
    "Callback",
    "ConsumerBase",
    "Membership",
    "Outage",
    "Positions",
    "Rebalance",
]

log = logging.getLogger("tidegate.client")

#: What a consumer passes to the client's calls: it retries (and logs) them itself.
NO_RETRY = Retry.none()


class Positions:
    """Per partition the consumer holds: ``positions`` (the next offset to fetch),
    ``consumed`` (the offset after the last record handed out: what a commit stores) and
    ``committed`` (the group's offset as last committed or fetched)."""

    def __init__(self, start: StartAt) -> None:
        self.start = start
        #: Where a position below the earliest offset goes (auto.offset.reset).
        self.reset: StartAt = "latest" if start == "latest" else "earliest"
        self.positions: dict[int, int] = {}
        self.consumed: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self._next = 0

    @property
    def partitions(self) -> list[int]:
        return sorted(self.positions)

    def add(
        self,
        table: TableInfo,
        partitions: Sequence[int],
        committed: Mapping[int, int],
        by_time: Mapping[int, int] | None,
    ) -> None:
        """Start ``partitions``: at the group's committed offset, else at ``start``."""
        got = start_positions(table, partitions, committed, self.start, by_time)
        self.positions.update(got)
        self.consumed.update(got)
        self.committed.update({p: o for p, o in committed.items() if p in got})

    def remove(self, partitions: Collection[int]) -> None:
        for p in partitions:
            self.positions.pop(p, None)
            self.consumed.pop(p, None)
            self.committed.pop(p, None)

    def order(self) -> list[int]:
        """The partitions in this round's order (round-robin, so none starves)."""
        parts = self.partitions
        if not parts:
            return []
        k = self._next % len(parts)
        self._next = (self._next + 1) % len(parts)
        return parts[k:] + parts[:k]

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset
        self.consumed[partition] = offset

    def hand_out(self, batches: Sequence[pa.RecordBatch]) -> None:
        """``batches`` were handed to the caller: they count as consumed."""
        for batch in batches:
            if batch.column("_partition")[0].as_py() in self.positions:
                mark_consumed(self.consumed, batch)

    def to_commit(
        self, offsets: Mapping[int, int] | None, only: Collection[int] | None = None
    ) -> dict[int, int]:
        """What a commit must store: ``offsets`` (default: past every record handed out,
        of ``only`` those partitions when given), less what is committed already."""
        wanted = dict(self.consumed if offsets is None else offsets)
        if only is not None:
            wanted = {p: o for p, o in wanted.items() if p in only}
        return {p: o for p, o in wanted.items() if self.committed.get(p) != o}

    def committed_ok(self, offsets: Mapping[int, int]) -> None:
        self.committed.update({p: o for p, o in offsets.items() if p in self.positions})


@dataclass(frozen=True)
class Rebalance:
    """What a consumer must do before its next fetch: drop ``lost`` partitions without
    committing (it was fenced), commit and give up ``revoked`` ones, and start ``added``
    ones."""

    lost: frozenset[int] = frozenset()
    revoked: frozenset[int] = frozenset()
    added: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.lost or self.revoked or self.added)


def default_client_id() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


class Membership:
    """A member's side of the group protocol, I/O-free and thread-safe (the sync
    consumer heartbeats from a thread of its own).

    The member draws its id, joins with generation 0, and from then on every heartbeat
    says what it holds (``owned``); the answers say what it may hold (``assigned``) at
    which ``generation``. The consumer applies the difference (:meth:`rebalance`) before
    its next fetch, then says so (:meth:`took`, :meth:`released`).
    """

    def __init__(
        self,
        group: str,
        table: TableRef,
        *,
        session_timeout: float,
        heartbeat_interval: float,
        client_id: str | None = None,
    ) -> None:
        if not 0 < heartbeat_interval < session_timeout:
            raise ValueError(
                f"heartbeat_interval ({heartbeat_interval} s) must be positive and shorter "
                f"than session_timeout ({session_timeout} s)"
            )
        self.group = group
        self.table = table
        self.session_timeout = session_timeout
        self.heartbeat_interval = heartbeat_interval
        self.client_id = client_id or default_client_id()
        self.member_id = uuid.uuid4().hex
        self.generation = 0
        self.owned: set[int] = set()
        self.assigned: set[int] = set()
        self.pending = 0
        self.settling = False
        #: The gateway answered since the member (re)joined.
        self.answered = False
        #: Fenced (or left for not polling): drop what it holds, then rejoin.
        self._lost = False
        #: Out of the group until the consumer polls again (max_poll_interval).
        self.parked = False
        self.lock = threading.Lock()

    def request(self, *, leave: bool = False) -> pb.GroupHeartbeatRequest:
        with self.lock:
            return pb.GroupHeartbeatRequest(
                group=self.group,
                table=self.table.pb(),
                member_id=self.member_id,
                generation=self.generation,
                owned=sorted(self.owned),
                session_timeout_ms=int(self.session_timeout * 1000),
                leave=leave,
                client_id=self.client_id,
            )

    def answer(self, response: pb.GroupHeartbeatResponse, asked: pb.GroupHeartbeatRequest) -> None:
        """Take a heartbeat's answer (ignored when the member was fenced meanwhile)."""
        with self.lock:
            if self._lost or asked.generation != self.generation:
                return  # fenced since it was asked: the member rejoins instead
            self.generation = int(response.generation)
            self.assigned = set(response.assigned)
            self.pending = int(response.pending)
            self.settling = bool(response.settling)
            self.answered = True

    def fenced(self) -> None:
        """The gateway no longer knows the member: it rejoins, and what it holds is lost."""
        with self.lock:
            self._lost = True
            self.generation = 0
            self.assigned = set()
            self.pending = 0
            self.answered = False

    def rebalance(self) -> Rebalance:
        with self.lock:
            if self._lost:
                self._lost = False
                lost, self.owned = frozenset(self.owned), set()
                return Rebalance(lost=lost)
            return Rebalance(
                revoked=frozenset(self.owned - self.assigned),
                added=frozenset(self.assigned - self.owned),
            )

    def took(self, partitions: Collection[int]) -> None:
        """The consumer holds ``partitions`` now (all of them: one taken back by an
        answer that came meanwhile is still held, and given up at the next rebalance)."""
        with self.lock:
            self.owned |= set(partitions)

    def released(self, partitions: Collection[int]) -> None:
        with self.lock:
            self.owned -= set(partitions)

    def interval(self) -> float:
        """Seconds until the next heartbeat: at once-ish while the group settles or this
        member has a change to report, else every ``heartbeat_interval``."""
        with self.lock:
            busy = self.settling or self.pending or self.owned != self.assigned
        return min(self.heartbeat_interval, 0.05) if busy else self.heartbeat_interval

    def settled(self) -> bool:
        """Everything this member is meant to hold, it holds (nothing pending either way)."""
        with self.lock:
            return (
                self.answered
                and not self._lost
                and not self.pending
                and self.owned == self.assigned
            )


def _went_away(err: TidegateError) -> bool:
    """A call the gateway cancelled: it was shutting down (a drain that outlasted its
    grace). The consumer never cancels its own calls, so it is safe to send again."""
    return err.details.get("grpc_code") == "CANCELLED"


class Outage:
    """Rides a consumer through a gateway outage (a restart, a rolling deploy): every
    retryable failure waits a backoff and is tried again, for ``timeout`` seconds at most
    (None: for ever), and the outage is logged once, in one line, when it begins (and at
    INFO when it ends). A failure that is not retryable is raised at once; a timeout
    raises :class:`~gateway.wire.errors.Unavailable` in one sentence."""

    def __init__(self, target: str, what: str, timeout: float | None) -> None:
        self.target = target
        self.what = what
        self.timeout = timeout
        self.retry = Retry(ExponentialBackoff(base=0.1, cap=2.0), timeout=None)
        self.since: float | None = None
        self.failures = 0
        self.outages = 0

    def failed(self, err: TidegateError) -> float:
        """Seconds to wait before trying again; raises when the consumer must give up."""
        if not (self.retry.retryable(err) or _went_away(err)) or err.details.get(
            "files_unreachable"
        ):
            # A host that cannot reach the data files it was told to read itself
            # (mode="client") is no outage: the gateway answers, and waiting changes nothing.
            raise err
        now = time.monotonic()
        if self.since is None:
            self.since, self.failures = now, 0
            self.outages += 1
            log.warning(
                "%s: %s; reconnecting with backoff (%s)",
                self.what,
                self.describe(err),
                "until it answers" if self.timeout is None else f"for up to {self.timeout:g} s",
            )
        self.failures += 1
        if self.timeout is not None and now - self.since >= self.timeout:
            raise Unavailable(
                f"{self.what}: {self.describe(err)} for {now - self.since:.0f} s, longer than "
                f"its reconnect timeout of {self.timeout:g} s",
                target=self.target,
            ) from None
        return self.retry.delay(err, self.failures)

    def ok(self) -> None:
        if self.since is not None:
            log.info(
                "%s: the gateway at %s answers again after %.1f s; resuming where it was",
                self.what,
                self.target,
                time.monotonic() - self.since,
            )
            self.since = None

    def describe(self, err: TidegateError) -> str:
        """The failure in plain words (never gRPC's transport text)."""
        if _went_away(err):
            return f"the gateway at {self.target} went away mid-call (shutting down)"
        if err.details.get("transport") or err.details.get("grpc_code") == "DEADLINE_EXCEEDED":
            text = err.message.lower()
            why = (
                "connection refused"
                if "refused" in text
                else "no answer in time"
                if "deadline" in text
                else "connection lost"
            )
            return f"cannot reach the gateway at {self.target} ({why})"
        return f"the gateway at {self.target} is unavailable: {err.message}"


#: What ``on_assign``, ``on_revoke`` and ``on_lost`` are called with: the partitions (an
#: asyncio consumer awaits a callback that returns an awaitable).
Callback = Callable[[list[int]], Any]


class ConsumerBase:
    """What both consumers share apart from I/O: their options, positions and membership
    state, and the answers to "what now" (see :class:`gateway.client.Consumer` for what
    the options mean)."""

    def __init__(
        self,
        target: str,
        retry_timeout: float | None,
        *,
        group: str | None,
        partitions: Sequence[int] | None,
        start: StartAt,
        follow: bool,
        auto_commit_interval: float | None,
        max_records: int,
        poll_interval: float,
        with_tier: bool,
        mode: str,
        on_assign: Callback | None,
        on_revoke: Callback | None,
        on_lost: Callback | None,
        session_timeout: float,
        heartbeat_interval: float,
        max_poll_interval: float,
        reconnect_timeout: float | None,
        client_id: str | None,
    ) -> None:
        self.group = group
        self._asked_partitions = partitions
        self.follow = follow
        self.auto_commit_interval = auto_commit_interval
        self.max_records = max_records
        self.poll_interval = poll_interval
        self.with_tier = with_tier
        check_mode(mode)
        #: Who reads records below the tiered watermark (``Client.read``'s ``mode``).
        self.mode = mode
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.on_lost = on_lost or on_revoke
        self.max_poll_interval = max_poll_interval
        self._session_timeout = session_timeout
        self._heartbeat_interval = heartbeat_interval
        self._client_id = client_id
        self._target = target
        self._reconnect_timeout = (
            reconnect_timeout if reconnect_timeout is not None or follow else retry_timeout
        )
        self._pos = Positions(start)
        self._start = start
        self._last_commit = time.monotonic()
        self._last_fetch = time.monotonic()
        self._closed = False
        self.member: Membership | None = None
        self.outage = Outage(target, "consumer", self._reconnect_timeout)

    def _configure(self, table: TableInfo) -> list[int] | None:
        """Take the table as described: the partitions to start now, or None for a
        member (its share comes with its first heartbeat's answer)."""
        self.table = table
        self.ref = table.ref
        self.outage.what = f"consumer of {self.ref}" + (
            f" (group {self.group})" if self.group else ""
        )
        if self.group and self._asked_partitions is None:
            self.member = Membership(
                self.group,
                self.ref,
                session_timeout=self._session_timeout,
                heartbeat_interval=self._heartbeat_interval,
                client_id=self._client_id,
            )
            return None
        if self._asked_partitions is None:
            return list(range(table.partitions))
        return list(self._asked_partitions)

    # What it holds ----------------------------------------------------------------------
    @property
    def positions(self) -> dict[int, int]:
        """The next offset to fetch, per partition held."""
        return self._pos.positions

    @property
    def consumed(self) -> dict[int, int]:
        """The offset after the last record handed out, per partition held."""
        return self._pos.consumed

    @property
    def partitions(self) -> list[int]:
        return self._pos.partitions

    def assignment(self) -> list[int]:
        """The partitions this consumer reads now."""
        return self._pos.partitions

    @property
    def member_id(self) -> str | None:
        return self.member.member_id if self.member else None

    @property
    def generation(self) -> int:
        """The member's generation (0 outside a group, or while it joins)."""
        return self.member.generation if self.member else 0

    def seek(self, partition: int, offset: int) -> None:
        self._pos.seek(partition, offset)

    # What now ---------------------------------------------------------------------------
    def _auto_commit_due(self) -> bool:
        return (
            self.group is not None
            and self.auto_commit_interval is not None
            and time.monotonic() - self._last_commit >= self.auto_commit_interval
        )

    def _commit_request(
        self, offsets: Mapping[int, int] | None, only: Collection[int] | None
    ) -> pb.CommitOffsetsRequest | None:
        """The commit to send (None: nothing changed), as the member when in a group."""
        if not self.group:
            raise ValueError("commit needs a consumer group")
        changed = self._pos.to_commit(offsets, only)
        if not changed:
            return None
        member = self.member
        return commit_offsets_request(
            self.group,
            self.ref,
            changed,
            member.member_id if member else None,
            member.generation if member else 0,
        )

    def _committed(self, request: pb.CommitOffsetsRequest | None) -> None:
        if request is not None:
            self._pos.committed_ok({o.partition: o.offset for o in request.offsets})
        self._last_commit = time.monotonic()

    def _fenced_commit(self, err: TidegateError) -> None:
        if isinstance(err, UnknownMember) and self.member is not None:
            self.member.fenced()

    def _start_requests(
        self, parts: Sequence[int]
    ) -> tuple[pb.FetchOffsetsRequest | None, pb.OffsetsForTimesRequest | None]:
        """The calls that tell where ``parts`` start: the group's commits, the offsets of
        a start time."""
        asked = fetch_offsets_request(self.group, self.ref, parts) if self.group else None
        when = (
            offsets_for_times_request(self.ref, self._start, parts)
            if isinstance(self._start, dt.datetime)
            else None
        )
        return asked, when

    def _parked_too_long(self) -> bool:
        return time.monotonic() - self._last_fetch > self.max_poll_interval

    def _caught_up(self) -> bool:
        """With nothing fetched: whether a consumer that does not follow is done (every
        partition held is at its end, and a member holds all it is meant to)."""
        return not self.follow and (self.member is None or self.member.settled())
