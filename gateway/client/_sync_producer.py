"""The sync producer: batching, linger, compression, idempotence and retries over one
append stream, gRPC's ``AppendStream`` or Flight's ``DoPut`` (its logic is
:class:`gateway.client._producer.ProducerCore`)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pyarrow.flight as fl

from gateway.client._batching import ProducerConfig
from gateway.client._flight import FlightReads, error_from_flight
from gateway.client._futures import SendFuture
from gateway.client._producer import ProducerCore
from gateway.client._types import (
    RecordMetadata,
    TableRef,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import InvalidRequest, Throttled, TidegateError, Unavailable
from gateway.wire.status import error_from_rpc

if TYPE_CHECKING:
    from gateway.client._hosts import SyncHost

__all__ = ["Producer"]


class Producer:
    """Batches, routes, compresses and sends rows; retries without duplicates.

    ``send`` routes rows to partitions exactly as the gateway would (key hash, or sticky
    round-robin without keys), buffers them per partition and returns a future resolving to
    :class:`RecordMetadata` ``(partition, offset)`` for a dict, or a list of them (one per
    row, in row order) for a table, batch, frame or list. A background thread sends a
    partition's batch once it holds ``batch_records`` rows or ``batch_bytes`` bytes, or
    after ``linger`` seconds, over one pipelined ``AppendStream``.

    Args:
        batch_records / batch_bytes: cut a batch at this many rows / bytes (uncompressed).
        linger: seconds a non-full batch waits for more rows.
        compression: Arrow IPC compression on the wire: ``zstd``, ``lz4`` or ``none``.
        idempotent: give each batch ``(producer_id, sequence)`` per partition so retries are
            stored once (default on). Without it a retry may store a batch twice.
        max_in_flight: unanswered batches per partition (1 to 15); order is kept anyway.
        buffer_records: ``send`` blocks while this many rows are unacknowledged...
        max_block: ...for at most this many seconds, then raises :class:`Throttled`.
        retry: a :class:`Retry`; waits at least the gateway's retry-after hint.
        producer_id: a stable id (default: a random one per producer).
        transport: ``grpc`` (``AppendStream``, the default), ``flight`` (the gateway's
            Flight edge, ``DoPut``: Arrow's C++ sends the batches, compressed there), or
            ``auto``: Flight when the gateway offers Flight appends (the faster of the
            two: less of this process's time per record), else gRPC.
    """

    def __init__(
        self,
        client: SyncHost,
        table: str | TableRef,
        *,
        max_block: float = 60.0,
        transport: str = "grpc",
        **config: Any,
    ) -> None:
        self.client = client
        self.config = ProducerConfig(**config)
        self.table = client.table_info(table)
        self.max_block = max_block
        self._flight = _flight_of(client, transport)
        self._core = ProducerCore(self.table, self.config, encode=self._flight is None, bound=True)
        #: Guards the core; ``send`` takes the lock itself (Condition's ``with`` is a
        #: Python frame more per record), waits and wakes go through ``_cond``.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        #: Why sends and flushes are refused besides a close (set in a forked child).
        self._why: str | None = None
        self._stop = False
        self._flushing = 0
        self._requests: queue.SimpleQueue[Any] | None = None
        self._call: Any = None
        #: The threads of the open stream (its answers, and Flight's writes): ``close``
        #: waits for them, so that no call is still open when the process exits (an
        #: interpreter exiting under a live call of gRPC's or Arrow's C++ can hang).
        self._stream_threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="tidegate-producer", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @property
    def retries(self) -> int:
        """Batches resent so far after retryable failures."""
        return self._core.retries

    @property
    def producer_id(self) -> str | None:
        return self._core.producer_id

    @property
    def transport(self) -> str:
        """What the producer appends over: ``grpc`` or ``flight``."""
        return "grpc" if self._flight is None else "flight"

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Public ----------------------------------------------------------------------------
    def send(
        self, data: Any, *, partition: int | None = None
    ) -> Future[RecordMetadata | list[RecordMetadata]]:
        """Buffer rows for sending; the future resolves once the gateway stored them.

        Raises (at once, nothing buffered):
            SchemaMismatch: the rows do not fit the table. InvalidPartition.
            Throttled: the buffer stayed full for ``max_block`` seconds.
        """
        future: Future[RecordMetadata | list[RecordMetadata]] = SendFuture()
        with self._lock:
            if self._closed:
                raise RuntimeError(self._why or "the producer is closed")
            core = self._core
            if core.unfinished >= self.config.buffer_records:
                self._wait_for_room(core)
            delivery = core.add(data, partition, future)
            if delivery is not None:
                delivery.future = future
                if delivery.done:
                    future.set_result(delivery.result())
                self._cond.notify_all()
            elif core.acc.kick:  # a batch opened or filled: the sender has something new
                core.acc.kick = False
                self._cond.notify_all()
            else:
                return future
        # Hand the GIL over now: the sender (and the threads answering the stream) would
        # else wait for the interpreter's switch interval (5 ms) while a caller that sends
        # back to back keeps it, once per batch and per answer.
        time.sleep(0)
        return future

    def _wait_for_room(self, core: ProducerCore) -> None:
        """Back-pressure (the lock held): wait while ``buffer_records`` records are
        unacknowledged, for ``max_block`` seconds at most."""
        deadline = time.monotonic() + self.max_block
        while core.unfinished >= self.config.buffer_records:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Throttled(
                    f"the producer buffer stayed full ({self.config.buffer_records} "
                    f"records) for {self.max_block}s",
                    retry_after_ms=100,
                )
            self._cond.wait(left)
            if self._closed:
                raise RuntimeError(self._why or "the producer is closed")

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait until it is acknowledged (or failed)."""
        if self._why is not None:
            raise RuntimeError(self._why)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while not self._core.idle():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("flush timed out")
                    self._cond.wait(min(left, 0.5) if left is not None else 0.5)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender. Sends after close raise."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._stop = True
                finished = self._core.fail_all(RuntimeError("the producer was closed"))
                self._cond.notify_all()
            finished.resolve()
            self._thread.join(10)
            self._close_stream()
            deadline = time.monotonic() + _STREAM_END_S
            for t in self._stream_threads:
                t.join(max(0.0, deadline - time.monotonic()))

    def _forked(self) -> None:
        """In a child made by ``os.fork``: no thread of the parent's is here to send (and
        one may have held the lock), so the producer refuses sends and flushes instead of
        buffering what nothing would ever send; what the parent buffered is the parent's."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._closed = True
        self._why = (
            f"this producer of {self.table.ref} was made before os.fork(), in process "
            f"{os.getppid()}: make a new one in this process"
        )

    # Sender ----------------------------------------------------------------------------
    def _close_stream(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
            self._requests = None
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _open_stream(self) -> None:
        self._close_stream()
        if self._flight is not None:
            self._open_put(self._flight)
            return
        requests: queue.SimpleQueue[pb.AppendStreamRequest | None] = queue.SimpleQueue()
        gen = self._core.stream_opened()
        call = self.client.stub.AppendStream(
            iter(requests.get, None), metadata=self.client.metadata
        )
        self._requests, self._call = requests, call
        self._start_threads(
            threading.Thread(
                target=self._read_responses, args=(call, gen), name="tidegate-producer-rx",
                daemon=True,
            )
        )  # fmt: skip

    def _start_threads(self, *threads: threading.Thread) -> None:
        self._stream_threads = [t for t in self._stream_threads if t.is_alive()]
        for t in threads:
            t.start()
            self._stream_threads.append(t)

    def _open_put(self, flight: FlightReads) -> None:
        """Open a Flight ``DoPut``: a thread writes the batches with their requests as app
        metadata, another reads the answers (each the ``AppendStreamResponse``)."""
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        gen = self._core.stream_opened()
        try:
            writer, reader = flight.do_put(
                self.table.ref, self.table.schema, self.config.compression
            )
        except TidegateError as err:
            # Flight connects when the call opens (gRPC's stream does so lazily): a gateway
            # away now is the stream failing, retried as any stream failure.
            self._core.on_stream_error(gen, err).resolve()
            return
        self._requests, self._call = requests, _PutCall(writer, requests)
        self._start_threads(
            threading.Thread(
                target=_write_put, args=(writer, requests), name="tidegate-producer-tx",
                daemon=True,
            ),
            threading.Thread(
                target=self._read_put, args=(reader, writer, gen), name="tidegate-producer-rx",
                daemon=True,
            ),
        )  # fmt: skip

    def _read_put(self, reader: Any, writer: Any, gen: int) -> None:
        err: BaseException
        try:
            while (answer := reader.read()) is not None:
                resp = pb.AppendStreamResponse.FromString(answer.to_pybytes())
                with self._cond:
                    done = self._core.on_response(gen, resp)
                    self._cond.notify_all()
                done.resolve()
            err = Unavailable("the append stream ended")
        except fl.FlightError as exc:
            err = _put_error(exc)
        except (pa.ArrowException, OSError) as exc:
            err = Unavailable(f"the Flight append stream failed: {exc}", transport=True)
        finally:
            with contextlib.suppress(Exception):
                writer.close()
        with self._cond:
            done = self._core.on_stream_error(gen, err)
            self._cond.notify_all()
        done.resolve()

    def _read_responses(self, call: Any, gen: int) -> None:
        err: BaseException
        try:
            for resp in call:
                with self._cond:
                    done = self._core.on_response(gen, resp)
                    self._cond.notify_all()
                done.resolve()
            # The stream ended without an error status: the gateway went away cleanly.
            err = Unavailable("the append stream ended")
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
        with self._cond:
            done = self._core.on_stream_error(gen, err)
            self._cond.notify_all()
        done.resolve()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                now = time.monotonic()
                force = self._flushing > 0 or self._closed
                if self._core.needs_stream(now, force):
                    try:
                        self._open_stream()
                    except Exception as exc:  # pragma: no cover - channel closed under us
                        self._core.fail_all(exc).resolve()
                        continue
                requests = self._core.outgoing(now, force)
                rejected = self._core.take_rejected()
                if rejected:
                    rejected.resolve()
                    self._cond.notify_all()
                if requests and self._requests is not None:
                    for r in requests:
                        if self._flight is not None:  # the batch goes with its request
                            self._requests.put((r, self._core.pending[r.request_id][1].arrow))
                        else:
                            self._requests.put(r)
                    continue
                wake = self._core.next_wakeup(now)
                self._core.acc.kick = False
                self._cond.wait(None if wake is None else max(0.0, wake - now) + 0.0005)


#: Seconds ``close`` waits for the stream's threads to end once the stream is closed (a
#: gRPC call ends at its cancel, a Flight DoPut when the gateway answers its end).
_STREAM_END_S = 5.0

#: The sync producers of this process, told by :func:`_after_fork` that they were forked.
_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork() -> None:
    for producer in list(_LIVE):
        producer._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _flight_of(client: SyncHost, transport: str) -> FlightReads | None:
    """The Flight edge a producer appends over (None: gRPC).

    Raises:
        InvalidRequest: an unknown ``transport``, or ``flight`` where the gateway offers
            no Flight appends.
    """
    if transport not in ("auto", "grpc", "flight"):
        raise InvalidRequest(
            f"unknown producer transport {transport!r}: use 'auto', 'grpc' or 'flight'"
        )
    if transport == "grpc":
        return None
    flight = client._flight()
    if flight is not None and flight.appends:
        return flight
    if transport == "flight":
        raise InvalidRequest(
            "transport='flight': this gateway's Flight edge takes no appends (it has none, "
            "or predates Flight appends); use transport='grpc' or 'auto'"
        )
    return None


class _PutCall:
    """The producer's handle on a DoPut call: cancelling it ends the batches it writes."""

    def __init__(self, writer: Any, requests: queue.SimpleQueue[Any]) -> None:
        self.writer = writer
        self.requests = requests

    def cancel(self) -> None:
        self.requests.put(None)


def _write_put(writer: Any, requests: queue.SimpleQueue[Any]) -> None:
    """Write a DoPut's batches, each with its request as app metadata, until told to end
    (a failure here ends the call: its reader reports it)."""
    try:
        while (item := requests.get()) is not None:
            request, batch = item
            request.append.ClearField("table")  # the call's descriptor names the table
            writer.write_with_metadata(batch, pa.py_buffer(request.SerializeToString()))
        writer.done_writing()
    except (fl.FlightError, pa.ArrowException, OSError, TidegateError):
        with contextlib.suppress(Exception):
            writer.close()


def _put_error(exc: fl.FlightError) -> TidegateError:
    """What a DoPut's failure means to the producer: the gateway's own error when it sent
    one, else the call broke below the API (a reset, a gateway gone): retryable, since
    the producer's batches are idempotent."""
    err = error_from_flight(exc)
    if type(err) is TidegateError:
        return Unavailable(f"the Flight append stream broke: {err.message}", transport=True)
    return err
