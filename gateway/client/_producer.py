"""The producer's state machine, free of I/O: sequencing, in-flight windows and retries
per partition over one append stream (Kafka's idempotent producer rules)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from gateway.client._batching import Accumulator, Delivery, Finished, ProducerBatch, ProducerConfig
from gateway.client._types import TableInfo
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import (
    RetryableError,
    SchemaMismatch,
    TidegateError,
    Unavailable,
    UnknownProducer,
)
from gateway.wire.status import error_from_pb

__all__ = ["PartitionQueue", "ProducerCore", "RetryLog", "new_producer_id"]

log = logging.getLogger("tidegate.client")


class RetryLog:
    """What the producer says while it resends: a warning at the first retry of an episode
    and then at most one every ``every`` seconds (a quota can cost thousands of retries a
    minute), and a line once requests are acknowledged again. Through the logger
    ``tidegate.client``: Python shows warnings on stderr even where logging was never
    configured, like Kafka's producer logging its retries."""

    def __init__(self, table: str, every: float = 10.0) -> None:
        self.table = table
        self.every = every
        self.count = 0  # retries of the episode so far
        self.since: float | None = None  # when the episode began
        self.logged_at: float | None = None
        self.logged_count = 0

    def retrying(self, err: BaseException, delay: float, partition: int | None) -> None:
        now = time.monotonic()
        self.count += 1
        if self.since is None:
            self.since = now
        if self.logged_at is not None and now - self.logged_at < self.every:
            return
        where = "" if partition is None else f" partition {partition}:"
        reason = getattr(err, "reason", type(err).__name__)
        message = getattr(err, "message", str(err))
        if self.logged_at is None:
            log.warning(
                "tidegate producer for %s:%s %s: %s; resending in %.1f s (it keeps trying "
                "for its retry policy's time; producer.retries counts the resends)",
                self.table, where, reason, message, delay,
            )  # fmt: skip
        else:
            log.warning(
                "tidegate producer for %s:%s still resending, %d retries in the last %.0f s "
                "(%d since %.0f s ago); last: %s: %s",
                self.table, where, self.count - self.logged_count, now - self.logged_at,
                self.count, now - self.since, reason, message,
            )  # fmt: skip
        self.logged_at, self.logged_count = now, self.count

    def delivered(self) -> None:
        """A request was acknowledged: an episode of retries, if any, is over."""
        if self.since is None:
            return
        log.info(
            "tidegate producer for %s: acknowledged again after %d retries over %.1f s",
            self.table,
            self.count,
            time.monotonic() - self.since,
        )
        self.count, self.since, self.logged_at, self.logged_count = 0, None, None, 0


class PartitionQueue:
    """Sequencing and in-flight bookkeeping of one partition (Kafka's rules).

    Batches get consecutive sequences when first sent. At most ``max_in_flight`` are
    unanswered at once, and only one until the partition's first acknowledgement (a second
    in-flight batch must never overtake a refused first). After a retryable failure every
    unanswered batch is resent in order, keeping its sequence: the gateway answers those it
    already stored with their original offsets. After a final failure the batches behind it
    are renumbered, as none of them can have been stored. When the gateway no longer knows
    the producer (``UNKNOWN_PRODUCER_ID``: its hot tier lost the state) the partition goes
    on under a new epoch: see :meth:`ProducerCore._unknown_producer`.
    """

    def __init__(self, partition: int, max_in_flight: int) -> None:
        self.partition = partition
        self.max_in_flight = max_in_flight
        self.waiting: list[ProducerBatch] = []
        self.in_flight: list[ProducerBatch] = []
        self.next_sequence = 0
        self.acked_once = False
        #: Bumped when batches of unknown fate are given up; part of the producer identity.
        self.epoch = 0
        #: Set after a retryable failure: time before which nothing is (re)sent.
        self.paused_until = 0.0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.in_flight)

    def can_send(self, now: float, probing: bool = False) -> bool:
        """Whether another batch may go now; ``probing``: the stream has not answered yet."""
        limit = self.max_in_flight if self.acked_once and not probing else 1
        return bool(self.waiting) and len(self.in_flight) < limit and now >= self.paused_until

    def take(self, idempotent: bool) -> ProducerBatch:
        batch = self.waiting.pop(0)
        if idempotent and batch.sequence is None:
            batch.sequence = self.next_sequence
            self.next_sequence += 1
        if not batch.attempts:
            batch.first_attempt = time.monotonic()
        batch.attempts += 1
        self.in_flight.append(batch)
        return batch

    def rewind(self) -> None:
        """Put every unanswered batch back in front, in order, to be resent."""
        self.waiting[:0] = self.in_flight
        self.in_flight = []

    def renumber(self, freed: int) -> None:
        """After a final failure of the batch with sequence ``freed``: none of the batches
        behind it can have been stored (each would have been a gap), so they are resent
        with new sequences from ``freed`` on."""
        self.rewind()
        for b in self.waiting:
            b.sequence = None
        self.next_sequence = freed


#: gRPC codes of a stream broken by the transport rather than refused by the gateway.
_TRANSPORT_CODES = frozenset({"INTERNAL", "UNKNOWN", "CANCELLED", "DEADLINE_EXCEEDED"})


class ProducerCore:
    """The producer's state machine, free of I/O: the sync and asyncio producers drive it.

    All requests go over one ``AppendStream`` (the gateway answers its requests in order);
    per partition :class:`PartitionQueue` keeps sequences and in-flight limits. A driver
    calls :meth:`add` for sends, :meth:`outgoing` to get requests to write,
    :meth:`on_response` / :meth:`on_stream_error` with what the stream said, and resolves
    the :class:`Finished` sends those return (outside its lock).
    """

    def __init__(
        self, table: TableInfo, config: ProducerConfig, *, encode: bool = True, bound: bool = False
    ) -> None:
        """``encode``: requests carry Arrow IPC (gRPC's ``AppendStream``); without it each
        request's batch is kept as Arrow (``ProducerBatch.arrow``, for Flight's DoPut).
        ``bound``: one-dict sends' futures are :class:`~gateway.client._futures.SendFuture`
        bound to their batch (the sync producer's; see ``ProducerBatch``)."""
        self.table = table
        self.config = config
        self.encode = encode
        self.producer_id = (config.producer_id or new_producer_id()) if config.idempotent else None
        self.acc = Accumulator(table, config, bound=bound)
        self.queues = [PartitionQueue(p, config.max_in_flight) for p in range(table.partitions)]
        self.pending: dict[int, tuple[PartitionQueue, ProducerBatch]] = {}
        #: Requests of the open stream rewound for resending before their answer came:
        #: a retry-after hint in that late answer must still hold their partition back.
        self.rewound: dict[int, PartitionQueue] = {}
        self.failures = [0] * table.partitions
        self._ids = 0
        self.stream_gen = 0
        self.stream_open = False
        self.stream_paused_until = 0.0
        self.stream_failures = 0
        #: Whether the current stream answered once. Until it has, one batch per partition
        #: goes: after an outage or a refusal the stream is probed before the window opens
        #: (and a refusal never races a burst of requests, which can cost its status).
        self.stream_answered = False
        #: Records sent but not yet acknowledged or failed (buffered, queued, in flight).
        self.unfinished = 0
        #: Batches put back to be resent after a retryable failure (a statistic).
        self.retries = 0
        #: Sends whose batch failed to seal, for :meth:`take_rejected`.
        self.rejected = Finished()
        self.retry_log = RetryLog(str(table.ref))

    # Sends ------------------------------------------------------------------------------
    def add(self, data: Any, partition: int | None, future: Any = None) -> Delivery | None:
        """Buffer a send; see :meth:`Accumulator.add` (None: ``future`` stands for it)."""
        if future is not None and type(data) is dict and self.acc.add_dict(data, partition, future):
            self.unfinished += 1
            return None
        delivery = self.acc.add(data, partition, future)
        self.unfinished += 1 if delivery is None else delivery.pending
        return delivery

    def idle(self) -> bool:
        return self.unfinished == 0

    def _stage(self, now: float, force: bool) -> None:
        for b in self.acc.drain(now, force):
            try:
                b.seal(self.table.schema, self.config.compression, self.encode)
            except SchemaMismatch as err:
                # Dict rows the check at send let through, refused by Arrow: fail this
                # batch alone (it never got a sequence, so nothing behind it is affected).
                self.unfinished -= b.records
                self.rejected.failed(b, err)
                continue
            self.queues[b.partition].waiting.append(b)

    def take_rejected(self) -> Finished:
        """Sends failed while sealing their batch; the driver resolves them."""
        out, self.rejected = self.rejected, Finished()
        return out

    def needs_stream(self, now: float, force: bool = False) -> bool:
        self._stage(now, force)
        return (
            not self.stream_open
            and now >= self.stream_paused_until
            and any(q.waiting for q in self.queues)
        )

    def stream_opened(self) -> int:
        """Call when a new stream is open; returns its generation."""
        self.stream_gen += 1
        self.stream_open = True
        self.stream_answered = False
        self.rewound.clear()
        return self.stream_gen

    def outgoing(self, now: float, force: bool = False) -> list[pb.AppendStreamRequest]:
        """Requests to write now (batches whose linger passed, or all with ``force``)."""
        self._stage(now, force)
        if not self.stream_open:
            return []
        out = []
        for q in self.queues:
            while q.can_send(now, probing=not self.stream_answered):
                batch = q.take(self.config.idempotent)
                self._ids += 1
                self.pending[self._ids] = (q, batch)
                out.append(
                    pb.AppendStreamRequest(
                        request_id=self._ids,
                        append=batch.request(self.table.ref, self.producer_id, q.epoch),
                    )
                )
        return out

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`outgoing` may next have something (None: only after an event)."""
        times = []
        deadline = self.acc.next_deadline()
        if deadline is not None:
            times.append(deadline)
        for q in self.queues:
            if q.waiting and q.paused_until > now:
                times.append(q.paused_until)
        if not self.stream_open and any(q.waiting for q in self.queues):
            times.append(self.stream_paused_until)
        return min(times) if times else None

    # Answers ----------------------------------------------------------------------------
    def on_response(self, gen: int, resp: pb.AppendStreamResponse) -> Finished:
        """A response of stream ``gen``; returns the sends it finished."""
        entry = self.pending.pop(resp.request_id, None)
        if entry is None or gen != self.stream_gen:
            # An answer to a batch already rewound for resending. If it was refused with a
            # retry-after (a pipelined batch throttled just after the one that paused the
            # partition), its resend must wait for that hint too.
            q = self.rewound.pop(resp.request_id, None) if gen == self.stream_gen else None
            if q is not None and resp.WhichOneof("result") == "error":
                hint = resp.error.retry_after_ms
                if hint > 0:
                    q.paused_until = max(q.paused_until, time.monotonic() + hint / 1000)
            return Finished()
        q, batch = entry
        self.stream_failures = 0
        self.stream_answered = True
        if resp.WhichOneof("result") == "ok":
            if self.retry_log.since is not None:
                self.retry_log.delivered()
            q.in_flight.remove(batch)
            q.acked_once = True
            self.failures[q.partition] = 0
            self.unfinished -= batch.records
            ranges = resp.ok.ranges
            done = Finished()
            done.acked(batch, ranges[0].base_offset if ranges else 0)
            return done
        return self._failed(q, batch, error_from_pb(resp.error))

    def _forget(self, q: PartitionQueue) -> None:
        for b in q.in_flight:
            for rid, (_, other) in list(self.pending.items()):
                if other is b:
                    del self.pending[rid]
                    self.rewound[rid] = q

    def _failed(self, q: PartitionQueue, batch: ProducerBatch, err: BaseException) -> Finished:
        if isinstance(err, UnknownProducer):
            return self._unknown_producer(q, err)
        self.failures[q.partition] += 1
        delay = self.config.retry.next_delay(err, self.failures[q.partition], batch.first_attempt)
        self._forget(q)
        if delay is not None:
            self.retries += len(q.in_flight)
            self.retry_log.retrying(err, delay, q.partition)
            q.rewind()
            q.paused_until = time.monotonic() + delay
            return Finished()
        q.in_flight.remove(batch)
        self.unfinished -= batch.records
        self.failures[q.partition] = 0
        if batch.sequence is not None:
            q.renumber(batch.sequence)
        else:
            q.rewind()
        done = Finished()
        done.failed(batch, err)
        return done

    def _unknown_producer(self, q: PartitionQueue, err: UnknownProducer) -> Finished:
        """The gateway holds no state of this producer in the partition (its hot tier lost
        it), so it cannot tell a resent batch from a new one: the partition goes on under a
        new epoch (a new producer id) from sequence 0. A batch sent only once was refused
        by that one send, so it is resent under the new identity; one sent before may have
        been stored by an earlier attempt, and resending it could store it twice: it fails
        (its fate is unknown) and is never resent."""
        self._forget(q)
        # Whether each batch may have been stored: one in flight by an earlier send than
        # this one, or by this one when a batch ahead of it may have been (its request may
        # have been served first); one waiting by any send so far.
        unsure_ahead = False
        unsure: list[bool] = []
        for b in q.in_flight:
            unsure_ahead = unsure_ahead or b.attempts > 1
            unsure.append(unsure_ahead)
        unsure += [b.attempts > 0 for b in q.waiting]
        q.rewind()
        done = Finished()
        kept, lost = [], 0
        failure = UnknownProducer(
            f"the gateway lost this producer's state for partition {q.partition} of "
            f"{self.table.ref} while a batch of it was being resent: an earlier attempt of "
            "the batch may have been stored, so it is not sent again (its records may be in "
            "the table once, or not at all)",
            **err.details,
        )
        for b, maybe_stored in zip(q.waiting, unsure, strict=True):
            if maybe_stored:
                self.unfinished -= b.records
                done.failed(b, failure)
                lost += 1
            else:
                b.sequence = None
                kept.append(b)
        q.waiting = kept
        q.epoch += 1
        q.next_sequence = 0
        q.acked_once = False
        self.failures[q.partition] = 0
        log.warning(
            "tidegate producer for %s: partition %d no longer knows this producer (%s); "
            "going on as %s.%d from sequence 0, %d batch(es) of unknown fate failed",
            self.table.ref, q.partition, err.message, self.producer_id, q.epoch,
            lost,
        )  # fmt: skip
        return done

    def on_stream_error(self, gen: int, err: BaseException) -> Finished:
        """Stream ``gen`` broke: resend what it carried, or fail it when not retryable."""
        if gen != self.stream_gen or not self.stream_open:
            return Finished()
        if (
            isinstance(err, TidegateError)
            and not isinstance(err, RetryableError)
            and err.details.get("grpc_code") in _TRANSPORT_CODES
        ):
            # The stream broke below the API (a reset, a lost connection): resending is
            # safe, the batches being idempotent.
            err = Unavailable(f"the append stream broke: {err.message}")
        self.stream_open = False
        self.pending.clear()
        self.stream_failures += 1
        retry = self.config.retry
        done = Finished()
        now = time.monotonic()
        if retry.retryable(err):
            delay = retry.delay(err, self.stream_failures)
            self.stream_paused_until = now + delay
            if any(q.in_flight or q.waiting for q in self.queues):
                self.retry_log.retrying(err, delay, None)
        for q in self.queues:
            self.retries += len(q.in_flight)
            q.rewind()
            if not q.waiting:
                continue
            head = q.waiting[0]
            if retry.next_delay(err, self.stream_failures, head.first_attempt or now) is None:
                # Give up on everything queued for the partition.
                for b in q.waiting:
                    self.unfinished -= b.records
                    done.failed(b, err)
                q.waiting = []
                # Whether the gateway stored the batches we gave up on is unknown: continue
                # under a new producer identity for this partition, so no later batch can be
                # mistaken for one of them.
                q.epoch += 1
                q.next_sequence = 0
                q.acked_once = False
        return done

    def fail_all(self, err: BaseException) -> Finished:
        """Fail everything not yet acknowledged (the producer is closing without flushing)."""
        self._stage(time.monotonic(), True)
        done = self.take_rejected()
        for q in self.queues:
            q.rewind()
            for b in q.waiting:
                done.failed(b, err)
            q.waiting = []
        self.pending.clear()
        self.unfinished = 0
        return done


def new_producer_id() -> str:
    return f"p-{uuid.uuid4().hex}"
