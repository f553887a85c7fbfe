"""What every part of the metadata store shares: the engine, its migration when the store
opens, and the short sessions every call runs in.

Synchronous and thread-safe: every call checks a connection out of the engine's pool and
runs in its own short transaction. Several processes (gateway replicas, Spark drivers) may
open the same database at once; opening runs the migrations to ``head`` under a lock
(a PostgreSQL advisory lock, or SQLite's write lock), so concurrent opens are safe.
"""

from __future__ import annotations

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
    def _session(self, *, write: bool) -> Iterator[Session]:
        factory = self._write if write else self._read
        with factory() as session, session.begin():
            yield session
