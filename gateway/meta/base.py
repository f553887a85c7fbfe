"""What every part of the metadata store shares: the engine, its migration when the store
opens, and the short sessions every call runs in.

Synchronous and thread-safe: every call checks a connection out of the engine's pool and
runs in its own short transaction. Several processes (gateway replicas, Spark drivers) may
open the same database at once; opening runs the migrations to ``head`` under a lock
(a PostgreSQL advisory lock, or SQLite's write lock), so concurrent opens are safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gateway.meta.engine import SQLITE_BEGIN, make_engine, upgrade
from gateway.meta.models import VERSION_TABLE

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = ["MetaBase"]


class MetaBase:
    """The state the operation groups (:mod:`~gateway.meta.tables`,
    :mod:`~gateway.meta.partitions`, :mod:`~gateway.meta.groups`,
    :mod:`~gateway.meta.maintenance`,
    :mod:`~gateway.meta.placement`) share: the engine, migrated when opened, and
    :meth:`_session`, the one way they reach the database."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self._engine = make_engine(url, echo=echo)
        try:
            upgrade(self._engine)
        except BaseException:
            self._engine.dispose()
            raise
        self._read = sessionmaker(self._engine, expire_on_commit=False)
        self._write = sessionmaker(
            self._engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"}),
            expire_on_commit=False,
        )
        #: This thread's session of :meth:`transaction`, when one is open.
        self._held = threading.local()

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.metadata_url, echo=settings.metadata.echo)

    @property
    def engine(self) -> Engine:
        return self._engine

    def revision(self) -> str | None:
        """The migration revision the database is at (``None`` for an empty database)."""
        from alembic.runtime.migration import MigrationContext

        with self._engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the calls this thread makes inside one write transaction: all of them
        take effect, or (an exception leaves the block) none. One commit instead of one
        per call: a tiering run's bookkeeping after its Iceberg commit is four calls.
        Nested blocks join the outer one."""
        if getattr(self._held, "session", None) is not None:
            yield
            return
        with self._write() as session, session.begin():
            self._held.session = session
            try:
                yield
            finally:
                self._held.session = None

    @contextmanager
    def _session(self, *, write: bool) -> Iterator[Session]:
        held = getattr(self._held, "session", None)
        if held is not None:  # inside transaction(): part of it
            yield held
            return
        factory = self._write if write else self._read
        with factory() as session, session.begin():
            yield session
