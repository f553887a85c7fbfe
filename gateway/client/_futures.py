"""A :class:`concurrent.futures.Future` that makes its lock only when something waits on it.

``Future.__init__`` builds a ``threading.Condition`` (an ``RLock``, its bound methods and a
waiter deque) for every future. A sync producer returns one future per ``send``, and most
are never waited on (the application waits on the last one, or calls ``flush``): profiled,
building that Condition was half of the caller's time in a send of one dict.
:class:`SendFuture` makes it at first use (``result``, ``exception``, ``done``, ``cancel``, a
callback, ``concurrent.futures.wait`` and ``as_completed`` all ask for it), and its
``set_result`` / ``set_exception`` store the outcome of a future that nothing asked about
under one module lock, with nothing to notify. Behaviour is the standard future's: the
state machine, the errors and the callbacks are those of ``Future``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, TypeVar

__all__ = ["SendFuture"]

T = TypeVar("T")

#: Held while a future's Condition is made, and while an outcome is stored without one: a
#: waiter that makes the Condition after the outcome was stored finds the state finished.
_MAKING = threading.Lock()
_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class SendFuture(Future[T]):
    def __init__(self) -> None:  # Future.__init__ but the Condition (made by _condition)
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        made: threading.Condition | None = self.__dict__.get("_made")
        if made is None:
            with _MAKING:
                made = self.__dict__.get("_made")
                if made is None:
                    made = self.__dict__["_made"] = threading.Condition()
        return made

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
