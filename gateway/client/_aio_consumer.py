"""The asyncio consumer: the twin of :mod:`gateway.client._sync_consumer`, with a
heartbeat task instead of a heartbeat thread."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import suppress
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
    from gateway.client._hosts import AsyncHost

__all__ = ["AsyncConsumer"]

log = logging.getLogger("tidegate.client")


async def _call_back(callback: Callback | None, partitions: Collection[int]) -> None:
    if callback is not None:
        done = callback(sorted(partitions))
        if inspect.isawaitable(done):
            await done


class AsyncConsumer(ConsumerBase):
    """The asyncio twin of :class:`gateway.client.Consumer` (same options and
    behaviour): ``async for`` records, ``async for`` over :meth:`batches`, or ``await``
    :meth:`poll`. Rebalance callbacks may be coroutine functions. Get one with
    ``client.consumer(table, ...)``; it starts on ``async with`` or the first read.
    """

    def __init__(
        self,
        client: AsyncHost,
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
        self._table_name = table
        self._started = False
        self._beats: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._beat_error: TidegateError | None = None

    async def start(self) -> None:
        """Look the table up, then start the partitions, or join the group (idempotent)."""
        if self._started:
            return
        self._started = True
        parts = self._configure(await self.client.table_info(self._table_name))
        if parts is not None:
            await self._start_partitions(parts)
            return
        await self._heartbeat()  # join now, and start what the answer gives
        await self._rebalance()
        self._beats = asyncio.create_task(self._heartbeats())

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit what was handed out (with a group and auto-commit), then leave the
        group, so its partitions go to the other members at once."""
        if self._closed or not self._started:
            return
        self._closed = True
        try:
            if self.group and self.auto_commit_interval is not None:
                await self._commit_quietly()
        finally:
            if self._beats is not None:
                self._beats.cancel()
                with suppress(asyncio.CancelledError):
                    await self._beats
            if self.member is not None:
                await self._leave()

    # Commits ---------------------------------------------------------------------------
    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """See :meth:`gateway.client.Consumer.commit`."""
        await self.start()
        await self._commit(offsets, retry=self.client.retry)

    async def _commit(
        self,
        offsets: Mapping[int, int] | None,
        only: Collection[int] | None = None,
        retry: Retry = NO_RETRY,
    ) -> None:
        request = self._commit_request(offsets, only)
        if request is not None:
            try:
                await self.client._call("CommitOffsets", request, idempotent=True, retry=retry)
            except TidegateError as err:
                self._fenced_commit(err)
                raise
        self._committed(request)

    async def _commit_quietly(self, only: Collection[int] | None = None) -> None:
        try:
            await self._commit(None, only)
        except MemberFenced as err:
            log.warning("%s: %s", self.outage.what, err.message)
        except TidegateError as err:
            if not err.retryable:
                raise
            log.info("%s: auto-commit failed: %s", self.outage.what, err.message)

    async def _maybe_auto_commit(self) -> None:
        if self._auto_commit_due():
            await self._commit_quietly()

    # Membership ------------------------------------------------------------------------
    async def _beat(self, leave: bool = False) -> Any:
        assert self.member is not None
        asked = self.member.request(leave=leave)
        timeout = min(self.client.timeout, self.member.session_timeout)
        answer = await self.client._call("GroupHeartbeat", asked, retry=NO_RETRY, timeout=timeout)
        return asked, answer

    async def _leave(self) -> None:
        try:
            await self._beat(leave=True)
        except TidegateError as err:
            log.info("%s: could not leave the group: %s", self.outage.what, err.message)

    async def _heartbeat(self) -> None:
        assert self.member is not None
        try:
            asked, answer = await self._beat()
        except UnknownMember as err:
            log.warning("%s: %s", self.outage.what, err.message)
            self.member.fenced()
        except TidegateError as err:
            if not err.retryable:
                self._beat_error = err
        else:
            self.member.answer(answer, asked)

    async def _heartbeats(self) -> None:
        member = self.member
        assert member is not None
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), member.interval())
            self._wake.clear()
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
                await self._leave()
                member.fenced()
                continue
            await self._heartbeat()

    def _raise_beat_error(self) -> None:
        err, self._beat_error = self._beat_error, None
        if err is not None:
            raise err

    async def _start_partitions(self, parts: Sequence[int]) -> None:
        asked, when = self._start_requests(parts)
        committed = (
            offsets_of(await self._retried("FetchOffsets", asked)) if asked and parts else {}
        )
        by_time = (
            offsets_of(await self._retried("OffsetsForTimes", when)) if when and parts else None
        )
        self._pos.add(self.table, parts, committed, by_time)

    async def _rebalance(self) -> None:
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
            await _call_back(self.on_lost, plan.lost)
        if plan.revoked:
            if self.auto_commit_interval is not None:
                await self._commit_quietly(plan.revoked)
            await _call_back(self.on_revoke, plan.revoked)
            self._pos.remove(plan.revoked)
            member.released(plan.revoked)
        if plan.added:
            await self._start_partitions(sorted(plan.added))
            member.took(plan.added)
            await _call_back(self.on_assign, plan.added)
        if plan:
            self._wake.set()

    # Fetching --------------------------------------------------------------------------
    async def _retried(self, method: str, request: Any) -> Any:
        while True:
            try:
                got = await self.client._call(method, request, idempotent=True, retry=NO_RETRY)
                self.outage.ok()
                return got
            except TidegateError as err:
                await asyncio.sleep(self.outage.failed(err))

    async def _fetch_round(self) -> list[pa.RecordBatch]:
        self._last_fetch = time.monotonic()
        await self._rebalance()
        out: list[pa.RecordBatch] = []
        for p in self._pos.order():
            while True:
                try:
                    batches, nxt = await self.client.fetch(
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
                    await asyncio.sleep(self.outage.failed(err))
            out.extend(batches)
            self._pos.positions[p] = nxt
        return out

    async def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        """See :meth:`gateway.client.Consumer.poll`."""
        await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            await self._maybe_auto_commit()
            out = await self._fetch_round()
            self._pos.hand_out(out)
            left = None if deadline is None else deadline - time.monotonic()
            if out or (left is not None and left <= 0):
                return out
            await asyncio.sleep(
                self.poll_interval if left is None else min(left, self.poll_interval)
            )

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        await self.start()
        while True:
            await self._maybe_auto_commit()
            got = await self._fetch_round()
            if not got:
                if self._caught_up():
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            for batch in got:
                self._pos.hand_out([batch])
                yield batch

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                if p in self._pos.consumed:
                    self._pos.consumed[p] = row["_offset"] + 1
                yield row
