"""Alembic environment of the metadata store.

Normally run through :func:`gateway.meta.engine.upgrade`, which passes an open connection
(already inside the transaction that holds the migration lock) in
``config.attributes["connection"]``. ``config.attributes["engine"]`` or the
``sqlalchemy.url`` option work too, e.g. to autogenerate a new revision::

    from alembic import command
    from gateway.meta.engine import alembic_config

    command.revision(alembic_config(url="sqlite:///dev.db"), "add quotas", autogenerate=True)

SQLite runs in batch mode (``render_as_batch``), as it cannot ALTER most things in place.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine, create_engine, pool

from gateway.meta.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade --sql``)."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=bool(url and url.startswith("sqlite")),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        # The caller owns the connection and its transaction (and any lock it holds).
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return

    engine = config.attributes.get("engine")
    if not isinstance(engine, Engine):
        url = config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("no connection, engine or sqlalchemy.url given to alembic")
        engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
