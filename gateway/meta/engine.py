"""The metadata store's engine and migrations.

How a store connects (:func:`make_engine`: SQLite's pragmas, WAL and transaction modes, or
a pooled PostgreSQL engine) and how it migrates (:func:`upgrade` under a lock, with the
alembic scripts in :data:`MIGRATIONS_DIR` configured by :func:`alembic_config`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, func, make_url, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from gateway.meta.models import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "MIGRATIONS_DIR",
    "SQLITE_BEGIN",
    "alembic_config",
    "make_engine",
    "upgrade",
]

#: The alembic script directory shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: The newest migration's revision (``versions/``); a test holds it equal to alembic's head.
HEAD_REVISION = "0012"

#: Key of the PostgreSQL advisory lock held while migrating (any fixed bigint).
_MIGRATION_LOCK_KEY = 0x7469_6465_6761_7465 & 0x7FFF_FFFF_FFFF_FFFF  # "tidegate"

#: Execution option naming the SQLite BEGIN mode (DEFERRED or IMMEDIATE) of a transaction.
SQLITE_BEGIN = "tidegate_sqlite_begin"

_SQLITE_BUSY_TIMEOUT_MS = 30_000


def alembic_config(
    *, connection: Connection | None = None, engine: Engine | None = None, url: str | None = None
) -> Config:
    """An alembic ``Config`` for the packaged migrations, without any ini file.

    Args:
        connection: Run on this connection (inside its current transaction, if any).
        engine: Otherwise connect with this engine.
        url: Otherwise connect to this SQLAlchemy URL.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    if engine is not None:
        config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision``; a no-op when already there.

    Safe when several processes do it at once: the whole upgrade runs in one transaction
    that first takes a PostgreSQL advisory lock (released at commit), or on SQLite
    ``BEGIN IMMEDIATE`` (the database write lock). Whoever comes second waits, then finds
    the schema current.

    A database already at :data:`HEAD_REVISION` is left alone without loading alembic and
    its scripts (a third of a process's start: every gateway, CLI job and test opens one).
    """
    if revision == "head" and _at_head(engine):
        return
    if revision == "head" and _create_new(engine):
        return
    from alembic import command

    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch migrations recreate tables; with foreign keys on, dropping the old copy
            # would cascade. The pragma is a no-op inside a transaction: set it before.
            _sqlite_pragma(conn, "foreign_keys=OFF")
        try:
            with conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"}).begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
                command.upgrade(alembic_config(connection=conn), revision)
                if sqlite and conn.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise RuntimeError("metadata migration left dangling foreign keys")
        finally:
            if sqlite:
                _sqlite_pragma(conn, "foreign_keys=ON")


def _create_new(engine: Engine) -> bool:
    """Create the newest schema at once in a database that holds no table at all (the
    models are the migrations' result: tests/meta holds them equal), and record it at
    :data:`HEAD_REVISION`; False, and nothing done, when the database holds a table.

    Replaying every migration on a new database cost each new gateway, job and CLI
    command a third of a second of CPU (alembic and its scripts, SQLite's batch table
    copies). Under the same lock as a migration: whoever comes second finds the tables.
    """
    from sqlalchemy import inspect

    from gateway.meta.models import Base

    with engine.connect() as conn, conn.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"}).begin():
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
        if inspect(conn).get_table_names():
            return False
        Base.metadata.create_all(conn)
        # The version table as alembic makes it (its primary key named <table>_pkc).
        conn.execute(
            text(
                f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
                f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
            )
        )
        conn.execute(
            text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:v)"), {"v": HEAD_REVISION}
        )
    return True


def _at_head(engine: Engine) -> bool:
    """Whether the database's one recorded revision is :data:`HEAD_REVISION`."""
    try:
        with engine.connect() as conn:
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    except SQLAlchemyError:  # no such table yet: a new database
        return False
    return [tuple(r) for r in found] == [(HEAD_REVISION,)]


def _sqlite_pragma(conn: Connection, pragma: str) -> None:
    """Run a PRAGMA outside any transaction (SQLAlchemy would autobegin one)."""
    conn.connection.driver_connection.execute(f"PRAGMA {pragma}")  # type: ignore[union-attr]


def _enable_wal(dbapi_connection: Any) -> None:
    """Switch a SQLite database to WAL. The switch needs the database to itself and SQLite
    may answer "database is locked" at once, without its busy handler, while another
    process or thread opens the same new database (a gateway and a tiering job starting
    together): retry for up to the busy timeout."""
    import sqlite3

    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def make_engine(url: str, *, echo: bool) -> Engine:
    """An engine for ``url``; on SQLite one that enables WAL (on a file), foreign keys and
    a busy timeout on every connection, and begins transactions in the mode asked by the
    :data:`SQLITE_BEGIN` execution option."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, echo=echo, pool_pre_ping=True)

    database = sa_url.database or ""
    in_memory = database in ("", ":memory:") or "mode=memory" in database
    kwargs: dict[str, Any] = {}
    if in_memory:
        # One shared connection, or every pooled connection would see its own empty DB.
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    elif not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(sa_url, echo=echo, pool_pre_ping=True, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin, so that
        # DDL is transactional and SELECTs are repeatable (SQLAlchemy's documented recipe).
        dbapi_connection.isolation_level = None
        dbapi_connection.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
        if not in_memory:
            _enable_wal(dbapi_connection)
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that reads and then
        # writes can fail with SQLITE_BUSY in WAL mode without waiting for the busy timeout.
        mode = conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine
