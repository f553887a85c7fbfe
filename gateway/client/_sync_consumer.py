"""The sync consumer: reads partitions from start positions or a group's commits, as a
member of a consumer group or with partitions of its own; rides through gateway outages."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.client._consuming import NO_RETRY, Callback, ConsumerBase
from gateway.client._lake_scan import ScanMode
from gateway.client._reading import skip_removed
from gateway.client._requests import offsets_of
from gateway.client._types import StartAt, TableRef
from gateway.wire.errors import MemberFenced, OffsetOutOfRange, TidegateError, UnknownMember
from gateway.wire.retry import Retry

if TYPE_CHECKING:
    from gateway.client._hosts import SyncHost

__all__ = ["Consumer"]

log = logging.getLogger("tidegate.client")


class Consumer(ConsumerBase):
    """Reads a table's partitions in offset order, alone or as a member of a group.

    Iterate records (dicts with the system columns), :meth:`batches` (Arrow record
    batches) or call :meth:`poll` (a list of Arrow record batches). Whatever was handed
    out counts as consumed: :meth:`commit` stores the offset after it, and so do
    auto-commit (every ``auto_commit_interval``, at the next fetch) and :meth:`close`.

    With ``group`` and no ``partitions`` the consumer is a **member** of the group: the
    gateway shares the table's partitions among the group's live members (sticky,
    cooperative rebalancing when members join, leave or stop heartbeating), a background
    thread heartbeats, and the consumer applies each rebalance before its next fetch
    (``on_revoke`` after committing what it gives up, ``on_assign`` once new partitions
    have their start positions, ``on_lost`` when it was fenced and must not commit).
    With ``partitions`` it reads those (manual assignment, no membership); its commits
    are refused while the group has live members.

    Each partition starts at the group's committed offset when there is one, else at
    ``start``: ``"earliest"``, ``"latest"``, an offset, or a datetime.

    A gateway outage (a restart, a rolling deploy) is ridden out: reads, heartbeats and
    commits are tried again with backoff, the outage is logged in one line, and the
    consumer resumes at its positions, for ``reconnect_timeout`` seconds at most.

    Args:
        group: the consumer group (committed offsets, and membership).
        partitions: read these partitions, without membership (default: all, or the
            group's share with ``group``).
        start: where partitions without a committed offset begin.
        follow: keep waiting for new records (default); without it iteration ends once
            every partition it holds is caught up (and, in a group, its share settled).
        auto_commit_interval: with a group, commit what was handed out every this many
            seconds (at the next fetch, so at-least-once), on revocation and on close;
            None to commit only by :meth:`commit`.
        max_records: records per fetch and partition.
        poll_interval: wait between polls while every partition is caught up.
        with_tier: add a ``_tier`` column ("iceberg" or "hot": the tier that served it).
        mode: who reads records below the tiered watermark, as for ``Client.read``
            (default ``"server"``: the gateway; ``"auto"``/``"client"``: this client reads
            the Iceberg files itself, which a catch-up through history gains from).
        on_assign, on_revoke, on_lost: rebalance callbacks (``on_lost`` defaults to
            ``on_revoke``), called with the sorted partitions in the consuming thread.
        session_timeout: a member without a heartbeat for this long is removed and its
            partitions reassigned.
        heartbeat_interval: seconds between heartbeats (shorter while rebalancing).
        max_poll_interval: a member that does not fetch for this long leaves the group
            (its partitions go to others) and rejoins at its next fetch.
        reconnect_timeout: seconds to keep reconnecting during an outage before raising
            :class:`~gateway.wire.errors.Unavailable`; None: for ever when ``follow``,
            else the client's retry timeout.
        client_id: who this member is in ``describe`` (default ``host/pid``).
    """

    def __init__(
        self,
        client: SyncHost,
        table: str | TableRef,
        *,
        group: str | None = None,
        partitions: Sequence[int] | None = None,
        start: StartAt = "earliest",
        follow: bool = True,
        auto_commit_interval: float | None = 5.0,
        max_records: int = 10_000,
        poll_interval: float = 0.1,
        with_tier: bool = False,
        mode: ScanMode = "server",
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
        session_timeout: float = 10.0,
        heartbeat_interval: float = 1.0,
        max_poll_interval: float = 300.0,
        reconnect_timeout: float | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(
            client.reach.target,
            client.retry.timeout,
            group=group,
            partitions=partitions,
            start=start,
            follow=follow,
            auto_commit_interval=auto_commit_interval,
            max_records=max_records,
            poll_interval=poll_interval,
            with_tier=with_tier,
            mode=mode,
            on_assign=on_assign,
            on_revoke=on_revoke,
            on_lost=on_lost,
            session_timeout=session_timeout,
            heartbeat_interval=heartbeat_interval,
            max_poll_interval=max_poll_interval,
            reconnect_timeout=reconnect_timeout,
            client_id=client_id,
        )
        self.client = client
        self._beats: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._beat_error: TidegateError | None = None
        parts = self._configure(client.table_info(table))
        if parts is not None:
            self._start_partitions(parts)
            return
        self._heartbeat()  # join now, and start what the answer gives
        self._rebalance()
        self._beats = threading.Thread(
            target=self._heartbeats, name=f"tidegate-heartbeat-{group}", daemon=True
        )
        self._beats.start()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Commit what was handed out (with a group and auto-commit), then leave the
        group, so its partitions go to the other members at once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.group and self.auto_commit_interval is not None:
                self._commit_quietly()
        finally:
            if self.member is not None:
                self._stop.set()
                self._wake.set()
                if self._beats is not None:
                    self._beats.join(10)
                self._leave()

    # Commits ---------------------------------------------------------------------------
    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Commit ``offsets`` (default: past every record handed out) for the group.

        Raises:
            IllegalGeneration, UnknownMember: this member no longer holds a partition it
                commits (its partitions were reassigned); nothing was stored.
            GroupNotEmpty: a consumer with partitions of its own, while the group has
                live members.
        """
        self._commit(offsets, retry=self.client.retry)

    def _commit(
        self,
        offsets: Mapping[int, int] | None,
        only: Collection[int] | None = None,
        retry: Retry = NO_RETRY,
    ) -> None:
        request = self._commit_request(offsets, only)
        if request is not None:
            try:
                self.client._call("CommitOffsets", request, idempotent=True, retry=retry)
            except TidegateError as err:
                self._fenced_commit(err)
                raise
        self._committed(request)

    def _commit_quietly(self, only: Collection[int] | None = None) -> None:
        """An automatic commit: a refusal or an outage is logged, not raised (the next
        one, or the member that gets the partitions, carries on)."""
        try:
            self._commit(None, only)
        except MemberFenced as err:
            log.warning("%s: %s", self.outage.what, err.message)
        except TidegateError as err:
            if not err.retryable:
                raise
            log.info("%s: auto-commit failed: %s", self.outage.what, err.message)

    def _maybe_auto_commit(self) -> None:
        if self._auto_commit_due():
            self._commit_quietly()

    # Membership ------------------------------------------------------------------------
    def _beat(self, leave: bool = False) -> Any:
        assert self.member is not None
        asked = self.member.request(leave=leave)
        timeout = min(self.client.timeout, self.member.session_timeout)
        return asked, self.client._call("GroupHeartbeat", asked, retry=NO_RETRY, timeout=timeout)

    def _leave(self) -> None:
        """Tell the group this member leaves (its session times out if this fails)."""
        try:
            self._beat(leave=True)
        except TidegateError as err:
            log.info("%s: could not leave the group: %s", self.outage.what, err.message)

    def _heartbeat(self) -> None:
        assert self.member is not None
        try:
            asked, answer = self._beat()
        except UnknownMember as err:
            log.warning("%s: %s", self.outage.what, err.message)
            self.member.fenced()
        except TidegateError as err:
            if not err.retryable:
                self._beat_error = err
            # An outage: the reads log it; the next heartbeat tries again.
        else:
            self.member.answer(answer, asked)

    def _heartbeats(self) -> None:
        member = self.member
        assert member is not None
        while not self._stop.is_set():
            self._wake.wait(member.interval())
            self._wake.clear()
            if self._stop.is_set():
                return
            if member.parked:
                continue
            if self._parked_too_long():
                log.warning(
                    "%s: no fetch for %g s (max_poll_interval): leaving the group, to rejoin "
                    "at the next fetch",
                    self.outage.what,
                    self.max_poll_interval,
                )
                member.parked = True
                self._leave()
                member.fenced()
                continue
            self._heartbeat()

    def _raise_beat_error(self) -> None:
        err, self._beat_error = self._beat_error, None
        if err is not None:
            raise err

    def _start_partitions(self, parts: Sequence[int]) -> None:
        asked, when = self._start_requests(parts)
        committed = offsets_of(self._retried("FetchOffsets", asked)) if asked and parts else {}
        by_time = offsets_of(self._retried("OffsetsForTimes", when)) if when and parts else None
        self._pos.add(self.table, parts, committed, by_time)

    def _rebalance(self) -> None:
        """Apply what the last heartbeat answered, before the next fetch."""
        member = self.member
        if member is None:
            return
        self._raise_beat_error()
        if member.parked:
            member.parked = False
            self._wake.set()
        plan = member.rebalance()
        if plan.lost:
            self._pos.remove(plan.lost)
            if self.on_lost:
                self.on_lost(sorted(plan.lost))
        if plan.revoked:
            if self.auto_commit_interval is not None:
                self._commit_quietly(plan.revoked)
            if self.on_revoke:
                self.on_revoke(sorted(plan.revoked))
            self._pos.remove(plan.revoked)
            member.released(plan.revoked)
        if plan.added:
            self._start_partitions(sorted(plan.added))
            member.took(plan.added)
            if self.on_assign:
                self.on_assign(sorted(plan.added))
        if plan:
            self._wake.set()  # say so now, so the partitions move on

    # Fetching --------------------------------------------------------------------------
    def _retried(self, method: str, request: Any) -> Any:
        """An idempotent call, tried again through an outage (see :class:`Outage`)."""
        while True:
            try:
                got = self.client._call(method, request, idempotent=True, retry=NO_RETRY)
                self.outage.ok()
                return got
            except TidegateError as err:
                time.sleep(self.outage.failed(err))

    def _fetch_round(self) -> list[pa.RecordBatch]:
        self._last_fetch = time.monotonic()
        self._rebalance()
        out: list[pa.RecordBatch] = []
        for p in self._pos.order():
            while True:
                try:
                    batches, nxt = self.client.fetch(
                        self.ref,
                        p,
                        self._pos.positions[p],
                        self.max_records,
                        self.with_tier,
                        retry=NO_RETRY,
                        mode=self.mode,
                    )
                    self.outage.ok()
                    break
                except OffsetOutOfRange as err:
                    # Retention removed records this consumer had not read: go on as
                    # Kafka's auto.offset.reset would.
                    skip_removed(err, p, self._pos.positions, self._pos.consumed, self._pos.reset)
                except TidegateError as err:
                    time.sleep(self.outage.failed(err))
            out.extend(batches)
            self._pos.positions[p] = nxt
        return out

    def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        """Arrow record batches (each of one partition, in offset order per partition)
        from the partitions that have records; an empty list after ``timeout`` seconds.
        What it returns counts as consumed (see :meth:`commit`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._maybe_auto_commit()
            out = self._fetch_round()
            self._pos.hand_out(out)
            left = None if deadline is None else deadline - time.monotonic()
            if out or (left is not None and left <= 0):
                return out
            time.sleep(self.poll_interval if left is None else min(left, self.poll_interval))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Arrow record batches in offset order per partition."""
        while True:
            self._maybe_auto_commit()
            got = self._fetch_round()
            if not got:
                if self._caught_up():
                    return
                time.sleep(self.poll_interval)
                continue
            for batch in got:
                self._pos.hand_out([batch])
                yield batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                if p in self._pos.consumed:
                    self._pos.consumed[p] = row["_offset"] + 1
                yield row
