"""The sync producer's :class:`concurrent.futures.Future`: nothing per record that nobody
asks for.

``Future.__init__`` builds a ``threading.Condition`` (an ``RLock``, its bound methods and a
waiter deque) for every future, and ``set_result`` takes it, notifies and runs callbacks.
A sync producer returns one future per ``send``; most are never looked at (the
application waits on the last one, or calls ``flush``), and each was made by the caller's
thread and resolved, then freed, by the producer's: profiled, the futures were the sync
producer's main cost (docs/decisions/client.md, "The sync producer's speed").

:class:`SendFuture` makes its Condition (and its waiter and callback lists) at first use:
``result``, ``exception``, ``done``, ``cancel``, a callback, ``concurrent.futures.wait``
and ``as_completed`` all ask for it first. A future bound to its batch with :meth:`bind`
(a one-dict send) is never touched by the producer's thread at all: the batch publishes
its answer once (:func:`publish`), and the future reads its outcome from it when first
asked; only futures something already waits on (a callback, a waiter) are resolved one by
one (:func:`resolve_watched`). An unbound future stores an outcome nothing asked about
under one module lock, with nothing to notify. Behaviour is the standard future's: the
state machine, the errors and the callbacks are those of ``Future``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, Protocol, TypeVar

from gateway.client._types import RecordMetadata

__all__ = ["Outcome", "SendFuture", "publish", "resolve_watched"]

T = TypeVar("T")

#: Held while a future's Condition is made, while an outcome is stored without one, and
#: while a batch publishes its answer: a waiter that makes the Condition after the
#: outcome was stored or published finds the state finished.
_MAKING = threading.Lock()
_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})
_new_tuple = tuple.__new__


class Outcome(Protocol):
    """What a bound future reads its outcome from (a producer's batch): ``published``
    once answered, then ``error`` or the row's offset from ``base_offset``; ``watchers``
    are the bound futures something waited on before the answer came."""

    partition: int
    base_offset: int
    error: BaseException | None
    published: bool
    watchers: list[Any]


class SendFuture(Future[T]):
    # Future.__init__'s attributes, as class defaults until first use (see _condition):
    # an empty tuple iterates as the empty list would, and nothing appends to either
    # before the Condition, which makes the lists, exists.
    _state = PENDING
    _result: Any = None
    _exception: BaseException | None = None
    _waiters: Any = ()
    _done_callbacks: Any = ()
    #: The batch whose answer is this future's (None: resolved by set_result or
    #: set_exception), and the future's row in it.
    _batch: Outcome | None = None
    _index = 0

    #: Future.__init__ makes the Condition and the lists: nothing to do here (C's).
    __init__ = object.__init__

    def bind(self, batch: Outcome, index: int) -> None:
        """Let ``batch``'s answer (row ``index`` of it) be this future's outcome."""
        self._batch = batch
        self._index = index

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        made: threading.Condition | None = self.__dict__.get("_made")
        if made is None:
            with _MAKING:
                made = self.__dict__.get("_made")
                if made is None:
                    self._waiters = []
                    self._done_callbacks = []
                    batch = self._batch
                    if batch is not None and self._state is PENDING:
                        if batch.published:
                            self._take(batch)
                        else:
                            batch.watchers.append(self)
                    made = self.__dict__["_made"] = threading.Condition()
        return made

    def _take(self, batch: Outcome) -> None:
        """Store the published outcome of ``batch`` as this future's."""
        if batch.error is not None:
            self._exception = batch.error
        else:
            self._result = _new_tuple(
                RecordMetadata, (batch.partition, batch.base_offset + self._index)
            )
        self._state = FINISHED

    def _settle_quietly(self, result: Any, exception: BaseException | None) -> bool:
        """Store the outcome if nothing asked for the Condition yet (True), else False."""
        with _MAKING:
            if "_made" in self.__dict__:
                return False
            if self._state in _DONE:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._exception = exception
            self._state = FINISHED
        return True

    def set_result(self, result: T) -> None:
        if self._settle_quietly(result, None):
            self._invoke_callbacks()  # type: ignore[attr-defined]
        else:
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if self._settle_quietly(None, exception):
            self._invoke_callbacks()  # type: ignore[attr-defined]
        else:
            super().set_exception(exception)


def publish(batch: Outcome) -> None:
    """Make ``batch``'s answer (its ``base_offset`` or ``error``, set before) the outcome
    of every future bound to it; those waited on are left in ``watchers`` for
    :func:`resolve_watched`."""
    with _MAKING:
        batch.published = True


def resolve_watched(batch: Outcome) -> None:
    """Resolve the bound futures of ``batch`` that something waits on (outside any lock of
    the producer's: a callback runs at once), as ``set_result`` would."""
    watchers, batch.watchers = batch.watchers, []
    err = batch.error
    for f in watchers:
        try:
            if err is not None:
                Future.set_exception(f, err)
            else:
                result = _new_tuple(RecordMetadata, (batch.partition, batch.base_offset + f._index))
                Future.set_result(f, result)
        except InvalidStateError:
            pass  # cancelled by its caller before the answer came
