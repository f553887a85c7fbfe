"""The metadata store, on SQLite (a file) and on PostgreSQL (a scratch database per test)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, make_url, text
from sqlalchemy.pool import NullPool

from gateway.config import Settings
from gateway.meta import (
    GroupMember,
    GroupState,
    MetadataStore,
    PartitionState,
    TableDef,
    TableLimits,
)
from gateway.meta.engine import HEAD_REVISION, alembic_config
from gateway.meta.models import VERSION_TABLE, Base
from gateway.meta.work import Mark
from gateway.wire.errors import (
    InvalidRequest,
    QuotaExceeded,
    TableAlreadyExists,
    TableNotFound,
    TenantNotFound,
)
from tests.services import scratch_database

T = TypeVar("T")

FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "payload", "type": "string"},
]
STORE_TABLES = {
    "tg_tenants",
    "tg_tables",
    "tg_partitions",
    "tg_api_keys",
    "tg_quotas",
    "tg_usage",
    "tg_group_offsets",
    "tg_groups",
    VERSION_TABLE,
}


# Fixtures -----------------------------------------------------------------------------
@pytest.fixture
def scratch_postgres(postgres_url: str) -> Iterator[str]:
    """A database of our own on the test PostgreSQL server, dropped afterwards."""
    with scratch_database(postgres_url, "tidegate_test") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta' / 'metadata.db'}"
    return str(request.getfixturevalue("scratch_postgres"))


@pytest.fixture
def open_store(db_url: str) -> Iterator[Callable[[], MetadataStore]]:
    """Opens stores (each with its own engine) on the test database; closes them all."""
    stores: list[MetadataStore] = []

    def _open() -> MetadataStore:
        stores.append(MetadataStore(db_url))
        return stores[-1]

    try:
        yield _open
    finally:
        for s in stores:
            s.close()


@pytest.fixture
def store(open_store: Callable[[], MetadataStore]) -> MetadataStore:
    s = open_store()
    s.ensure_tenant("acme")
    s.ensure_tenant("globex")
    return s


def _current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE}
    ).get_current_revision()


def _in_threads(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run ``fn(0..n-1)`` in ``n`` threads released together; re-raises the first error."""
    barrier = threading.Barrier(n)

    def run(i: int) -> T:
        barrier.wait(timeout=30)
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


# Migrations ---------------------------------------------------------------------------
def test_open_migrates_an_empty_database(db_url: str) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        if db_url.startswith("sqlite"):
            Path(make_url(db_url).database or "").parent.mkdir(parents=True, exist_ok=True)
        assert not STORE_TABLES & set(inspect(engine).get_table_names())
        with MetadataStore(db_url):
            pass
        assert set(inspect(engine).get_table_names()) >= STORE_TABLES
    finally:
        engine.dispose()


def test_reopen_is_idempotent_and_keeps_data(open_store: Callable[[], MetadataStore]) -> None:
    first = open_store()
    first.ensure_tenant("acme")
    created = first.create_table("acme", "ns", "events", FIELDS, 2, ["id"])
    with first.engine.connect() as conn:
        revision = _current_revision(conn)
    first.close()

    again = open_store()
    with again.engine.connect() as conn:
        assert _current_revision(conn) == revision
    assert again.get_table("acme", "ns", "events") == created
    assert open_store().list_tables("acme") == [created]


def test_current_revision_is_the_single_head(store: MetadataStore) -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1
    with store.engine.connect() as conn:
        assert _current_revision(conn) == heads[0]
    # The fast path that skips alembic for a current database knows the same head: a new
    # migration that forgot it would leave every existing database unmigrated.
    assert heads == [HEAD_REVISION]


def _structure(conn: Connection) -> dict[str, Any]:
    """Every table's columns (name, type, nullability, server default), primary key,
    foreign keys, indexes and unique constraints, as the database reports them."""
    db = inspect(conn)
    out: dict[str, Any] = {}
    for t in sorted(db.get_table_names()):
        out[t] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in db.get_columns(t)
            ],
            "pk": db.get_pk_constraint(t)["constrained_columns"],
            "fks": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                for f in db.get_foreign_keys(t)
            ),
            "indexes": sorted(
                (tuple(i["column_names"]), bool(i["unique"])) for i in db.get_indexes(t)
            ),
            "unique": sorted(tuple(u["column_names"]) for u in db.get_unique_constraints(t)),
        }
    return out


def test_a_new_database_is_created_as_the_migrations_make_it(
    db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A new database is made from the models at once (MetadataStore skips replaying the
    migrations): it must be the database every migration in turn makes, to the column
    defaults, so that later migrations apply to both alike."""
    created = MetadataStore(db_url)
    try:
        with created.engine.connect() as conn:
            made = _structure(conn)
            assert _current_revision(conn) == HEAD_REVISION
    finally:
        created.close()
    with contextlib.ExitStack() as stack:
        if db_url.startswith("sqlite"):
            migrated_url = f"sqlite:///{tmp_path / 'migrated.db'}"
        else:
            postgres = request.getfixturevalue("postgres_url")
            migrated_url = stack.enter_context(scratch_database(postgres, "tidegate_mig"))
        engine = create_engine(migrated_url, poolclass=NullPool)
        stack.callback(engine.dispose)
        with engine.connect() as conn, conn.begin():
            command.upgrade(alembic_config(connection=conn), "head")
        with engine.connect() as conn:
            assert _structure(conn) == made
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": VERSION_TABLE,
                    "compare_type": True,
                    "target_metadata": Base.metadata,
                },
            )
            assert compare_metadata(context, Base.metadata) == []


def test_downgrade_to_base_and_upgrade_again(store: MetadataStore) -> None:
    with store.engine.connect() as conn, conn.begin():
        command.downgrade(alembic_config(connection=conn), "base")
    assert not (STORE_TABLES - {VERSION_TABLE}) & set(inspect(store.engine).get_table_names())
    with store.engine.connect() as conn, conn.begin():
        command.upgrade(alembic_config(connection=conn), "head")
    store.ensure_tenant("acme")
    assert store.create_table("acme", "ns", "t", FIELDS, 1).partitions == 1


def test_concurrent_opens_of_an_empty_database(db_url: str) -> None:
    stores = _in_threads(4, lambda _: MetadataStore(db_url))
    try:
        for i, s in enumerate(stores):
            s.ensure_tenant("acme")
            s.create_table("acme", "ns", f"t{i}", FIELDS, 1)
        assert [t.name for t in stores[0].list_tables("acme")] == ["t0", "t1", "t2", "t3"]
    finally:
        for s in stores:
            s.close()


# Tables -------------------------------------------------------------------------------
def test_a_create_makes_its_tenant_in_the_same_transaction_when_asked(
    open_store: Callable[[], MetadataStore],
) -> None:
    store = open_store()
    with pytest.raises(TenantNotFound):
        store.create_table("fresh", "ns", "t", FIELDS, 1)
    # Four stores (four gateways) making the same new tenant's first tables at once.
    stores = [open_store() for _ in range(4)]
    made = _in_threads(
        4, lambda i: stores[i].create_table("fresh", "ns", f"t{i}", FIELDS, 1, create_tenant=True)
    )
    assert sorted(d.name for d in made) == ["t0", "t1", "t2", "t3"]
    assert [t.name for t in store.list_tables("fresh")] == ["t0", "t1", "t2", "t3"]


def test_creates_racing_at_a_quotas_edge_pass_it_by_none(
    open_store: Callable[[], MetadataStore],
) -> None:
    stores = [open_store() for _ in range(6)]
    stores[0].ensure_tenant("acme")
    stores[0].create_table("acme", "ns", "first", FIELDS, 2)
    limits = TableLimits(max_tables=4, max_partitions=None)

    def create(i: int) -> str:
        try:
            stores[i].create_table("acme", "ns", f"t{i}", FIELDS, 1, limits=limits)
            return "made"
        except QuotaExceeded as exc:
            assert exc.message == "the tenant has 4 tables; its quota is 4"
            return "refused"

    assert sorted(_in_threads(6, create)) == ["made"] * 3 + ["refused"] * 3
    assert len(stores[0].list_tables("acme")) == 4
    with pytest.raises(QuotaExceeded, match="the tenant has 5 partitions; 3 more would pass"):
        stores[0].create_table(
            "acme", "ns", "wide", FIELDS, 3, limits=TableLimits(None, max_partitions=6)
        )


def test_a_tables_storage_mark_moves_with_every_change_of_its_bytes(
    store: MetadataStore,
) -> None:
    """``storage_marks``: one mark per table of the tenant, the same while nothing that
    changes the table's bytes happens, a new one after each such change."""
    a = store.create_table("acme", "ns", "a", FIELDS, 2)
    b = store.create_table("acme", "ns", "b", FIELDS, 2)
    other = store.create_table("globex", "ns", "a", FIELDS, 1)
    marks = store.storage_marks("acme")
    assert set(marks) == {a.table_id, b.table_id}
    assert not marks[a.table_id].written and marks[a.table_id].partitions == 2
    assert store.storage_marks("acme") == marks
    seen = [marks[a.table_id]]

    def moved() -> None:
        now = store.storage_marks("acme")
        assert now[a.table_id] not in seen, "the change did not move the mark"
        assert now[b.table_id] == marks[b.table_id], "an unchanged table's mark moved"
        seen.append(now[a.table_id])

    store.record_appends({a.table_id: {0: (5, datetime.now(UTC))}})
    moved()
    assert store.storage_marks("acme")[a.table_id].written
    store.record_appends({other.table_id: {0: (3, datetime.now(UTC))}})  # another tenant
    assert store.storage_marks("acme")[a.table_id] == seen[-1]
    store.update_tiered_watermarks(a.table_id, {0: 5})  # tiering
    moved()
    now = datetime.now(UTC)  # what a tiering run asks for later; its tier mark goes
    store.mark_work(Mark(a.table_id, -1, job, since=now, due_at=now) for job in ("trim", "expire"))
    store.finish_tiering(a.table_id, {0: 5, 1: 0}, now)
    moved()
    store.finish_work(a.table_id, "trim", datetime.now(UTC) + timedelta(seconds=1), 0)
    moved()  # the trim done: hot bytes went
    store.raise_earliest_offsets(a.table_id, {0: 2})  # retention
    moved()
    store.record_run(a.table_id, "compact", "ok", "rewrote 2 files")
    moved()
    store.drop_table("acme", "ns", "a")
    assert set(store.storage_marks("acme")) == {b.table_id}


def test_tables_by_id_gives_the_tenants_tables_among_the_ids(store: MetadataStore) -> None:
    """``tables_by_id``: the definitions of those ids that are the tenant's tables, over
    as many queries as the ids take (1,203 here), nothing of another tenant's."""
    a = store.create_table("acme", "ns", "a", FIELDS, 2)
    b = store.create_table("acme", "ns", "b", FIELDS, 1)
    other = store.create_table("globex", "ns", "a", FIELDS, 1)
    ids = [f"missing-{i}" for i in range(1200)] + [b.table_id, a.table_id, other.table_id]
    got = store.tables_by_id("acme", ids)
    assert {t: (d.namespace, d.name, d.partitions) for t, d in got.items()} == {
        a.table_id: ("ns", "a", 2),
        b.table_id: ("ns", "b", 1),
    }
    assert store.tables_by_id("acme", []) == {}


def test_a_transaction_makes_the_calls_inside_it_one_commit(store: MetadataStore) -> None:
    """``transaction()``: the calls a thread makes inside take effect together or, when
    the block raises, not at all; a nested block joins the outer one; another thread's
    calls meanwhile are their own."""
    d = store.create_table("acme", "ns", "a", FIELDS, 2)

    def tiered() -> list[int]:
        return [p.tiered_watermark for p in store.partitions(d.table_id)]

    with pytest.raises(RuntimeError), store.transaction():
        store.update_tiered_watermarks(d.table_id, {0: 5})
        with store.transaction():
            store.record_run(d.table_id, "tier", "ok", "5 records")
        assert tiered() == [5, 0]  # the thread reads its own writes
        raise RuntimeError("the run fails after its bookkeeping")
    assert tiered() == [0, 0]
    assert store.last_runs(d.table_id) == {}
    with store.transaction():
        store.update_tiered_watermarks(d.table_id, {0: 5, 1: 2})
        with store.transaction():
            store.record_run(d.table_id, "tier", "ok", "7 records")
        assert _in_threads(1, lambda _: tiered()) == [[0, 0]]  # not committed yet
    assert tiered() == [5, 2]
    assert store.last_runs(d.table_id)["tier"].detail == "7 records"


def test_create_get_list_drop(store: MetadataStore) -> None:
    before = datetime.now(UTC)
    table = store.create_table("acme", "sales", "orders", FIELDS, 4, ["id"])
    assert isinstance(table, TableDef)
    assert (table.tenant, table.namespace, table.name) == ("acme", "sales", "orders")
    assert table.fields == FIELDS
    assert table.partitions == 4
    assert table.key_columns == ["id"]
    assert uuid.UUID(table.table_id)
    assert table.created_at.tzinfo is not None
    assert before - timedelta(seconds=1) <= table.created_at <= datetime.now(UTC)

    assert store.get_table("acme", "sales", "orders") == table
    assert store.list_tables("acme") == [table]

    assert store.drop_table("acme", "sales", "orders") == table
    with pytest.raises(TableNotFound):
        store.get_table("acme", "sales", "orders")
    assert store.list_tables("acme") == []


def test_create_makes_partition_rows(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 3)
    assert table.key_columns == []
    assert store.partitions(table.table_id) == [
        PartitionState(p, high_watermark=0, tiered_watermark=0, shard="default", epoch=0)
        for p in range(3)
    ]


def test_drop_removes_partitions_and_recreate_gets_a_new_id(store: MetadataStore) -> None:
    old = store.create_table("acme", "ns", "t", FIELDS, 2)
    store.update_high_watermarks(old.table_id, {0: 10, 1: 20})
    store.drop_table("acme", "ns", "t")
    assert store.partitions(old.table_id) == []
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT count(*) FROM tg_partitions WHERE table_id = :t"), {"t": old.table_id}
        ).scalar_one()
    assert rows == 0

    new = store.create_table("acme", "ns", "t", FIELDS, 2)
    assert new.table_id != old.table_id
    assert [p.high_watermark for p in store.partitions(new.table_id)] == [0, 0]


def test_deleting_a_table_row_cascades_to_partitions(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 2)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM tg_tables WHERE id = :t"), {"t": table.table_id})
    assert store.partitions(table.table_id) == []


def test_list_is_sorted_and_filters_by_namespace(store: MetadataStore) -> None:
    for namespace, name in [("b", "z"), ("a", "y"), ("b", "a"), ("a", "x")]:
        store.create_table("acme", namespace, name, FIELDS, 1)
    listed = [(t.namespace, t.name) for t in store.list_tables("acme")]
    assert listed == [("a", "x"), ("a", "y"), ("b", "a"), ("b", "z")]
    assert [t.name for t in store.list_tables("acme", "b")] == ["a", "z"]
    assert store.list_tables("acme", "missing") == []


def test_duplicate_create_raises_and_keeps_the_original(store: MetadataStore) -> None:
    original = store.create_table("acme", "ns", "t", FIELDS, 2, ["id"])
    with pytest.raises(TableAlreadyExists, match=r"ns\.t"):
        store.create_table("acme", "ns", "t", [{"name": "other", "type": "string"}], 5)
    assert store.get_table("acme", "ns", "t") == original
    assert len(store.partitions(original.table_id)) == 2


def test_racing_creates_of_one_name_have_one_winner(
    open_store: Callable[[], MetadataStore],
) -> None:
    stores = [open_store() for _ in range(4)]
    stores[0].ensure_tenant("acme")

    def create(i: int) -> str:
        try:
            stores[i].create_table("acme", "ns", "t", FIELDS, 2)
        except TableAlreadyExists:
            return "exists"
        return "created"

    assert sorted(_in_threads(4, create)) == ["created", "exists", "exists", "exists"]
    assert len(stores[0].list_tables("acme")) == 1


def test_unknown_table_raises_table_not_found(store: MetadataStore) -> None:
    with pytest.raises(TableNotFound, match=r"ns\.missing") as info:
        store.get_table("acme", "ns", "missing")
    assert info.value.reason == "TABLE_NOT_FOUND"
    assert info.value.details == {"namespace": "ns", "name": "missing"}
    with pytest.raises(TableNotFound, match=r"ns\.missing"):
        store.drop_table("acme", "ns", "missing")
    assert store.partitions(str(uuid.uuid4())) == []


def test_create_needs_an_existing_tenant(store: MetadataStore) -> None:
    with pytest.raises(TenantNotFound) as info:
        store.create_table("nobody", "ns", "t", FIELDS, 1)
    assert info.value.reason == "TENANT_NOT_FOUND"
    assert store.list_tables("nobody") == []


def test_ensure_tenant_is_idempotent(store: MetadataStore) -> None:
    store.ensure_tenant("acme")
    store.ensure_tenant("acme")
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status FROM tg_tenants ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("acme", "active"), ("globex", "active")]


def test_create_needs_at_least_one_partition(store: MetadataStore) -> None:
    with pytest.raises(InvalidRequest):
        store.create_table("acme", "ns", "t", FIELDS, 0)
    assert store.list_tables("acme") == []


# Tenancy ------------------------------------------------------------------------------
def test_tenants_are_isolated(store: MetadataStore) -> None:
    mine = store.create_table("acme", "ns", "secret", FIELDS, 2)

    with pytest.raises(TableNotFound):
        store.get_table("globex", "ns", "secret")
    assert store.list_tables("globex") == []
    assert store.list_tables("globex", "ns") == []
    with pytest.raises(TableNotFound):
        store.drop_table("globex", "ns", "secret")
    assert store.get_table("acme", "ns", "secret") == mine

    # The same name in both tenants: two independent tables.
    theirs = store.create_table("globex", "ns", "secret", FIELDS, 3)
    assert theirs.table_id != mine.table_id
    assert store.get_table("globex", "ns", "secret") == theirs
    assert store.get_table("acme", "ns", "secret") == mine
    assert store.list_tables("acme") == [mine]
    assert store.list_tables("globex") == [theirs]

    assert store.drop_table("globex", "ns", "secret") == theirs
    assert store.get_table("acme", "ns", "secret") == mine
    assert len(store.partitions(mine.table_id)) == 2


# Watermarks ---------------------------------------------------------------------------
def test_cached_high_watermarks_never_move_backwards(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 3)
    tid = table.table_id

    def hws() -> list[int]:
        return [p.high_watermark for p in store.partitions(tid)]

    store.update_high_watermarks(tid, {0: 10, 1: 5})
    assert hws() == [10, 5, 0]
    store.update_high_watermarks(tid, {0: 3, 1: 7, 2: 1})
    assert hws() == [10, 7, 1]
    store.update_high_watermarks(tid, {0: 10})
    store.update_high_watermarks(tid, {})
    store.update_high_watermarks(tid, {99: 50})  # unknown partition: ignored
    assert hws() == [10, 7, 1]
    assert [p.tiered_watermark for p in store.partitions(tid)] == [0, 0, 0]


def test_concurrent_watermark_updates_keep_the_maximum(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 2)
    values = [[(i * 37) % 101 + j for j in range(20)] for i in range(8)]

    def push(i: int) -> None:
        for v in values[i]:
            store.update_high_watermarks(table.table_id, {0: v, 1: 1000 - v})

    _in_threads(8, push)
    flat = [v for vs in values for v in vs]
    hws = [p.high_watermark for p in store.partitions(table.table_id)]
    assert hws == [max(flat), 1000 - min(flat)]


# Several stores -----------------------------------------------------------------------
def test_two_stores_see_each_others_writes(open_store: Callable[[], MetadataStore]) -> None:
    a, b = open_store(), open_store()
    a.ensure_tenant("acme")
    created = a.create_table("acme", "ns", "t", FIELDS, 2)
    assert b.get_table("acme", "ns", "t") == created

    b.update_high_watermarks(created.table_id, {1: 42})
    assert [p.high_watermark for p in a.partitions(created.table_id)] == [0, 42]

    b.create_table("acme", "ns", "u", FIELDS, 1)
    assert [t.name for t in a.list_tables("acme")] == ["t", "u"]

    a.drop_table("acme", "ns", "t")
    with pytest.raises(TableNotFound):
        b.get_table("acme", "ns", "t")
    with pytest.raises(TableNotFound):
        b.drop_table("acme", "ns", "t")


def test_from_settings(db_url: str, tmp_path: Path) -> None:
    settings = Settings.explicit(data_dir=tmp_path, metadata={"url": db_url})
    with MetadataStore.from_settings(settings) as s:
        s.ensure_tenant("acme")
        s.create_table("acme", "ns", "t", FIELDS, 1)
    with MetadataStore(db_url) as s:
        assert [t.name for t in s.list_tables("acme")] == ["t"]


def test_default_settings_use_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings.explicit(data_dir=tmp_path / "data")
    with MetadataStore.from_settings(settings) as s:
        assert s.engine.dialect.name == "sqlite"
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() > 0
    assert (tmp_path / "data" / "metadata.db").is_file()


def test_group_offsets_commit_fetch_and_isolation(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 3)
    assert store.fetch_offsets("acme", "g1", table.table_id) == {}
    store.commit_offsets("acme", "g1", table.table_id, {0: 5, 2: 7})
    store.commit_offsets("acme", "g1", table.table_id, {0: 9})
    store.commit_offsets("acme", "g2", table.table_id, {1: 1})
    assert store.fetch_offsets("acme", "g1", table.table_id) == {0: 9, 2: 7}
    assert store.fetch_offsets("acme", "g2", table.table_id) == {1: 1}
    assert store.fetch_offsets("globex", "g1", table.table_id) == {}
    # Rewinding on purpose is allowed: the last commit wins.
    store.commit_offsets("acme", "g1", table.table_id, {0: 3})
    assert store.fetch_offsets("acme", "g1", table.table_id)[0] == 3


def test_dropping_a_table_forgets_its_group_offsets(store: MetadataStore) -> None:
    old = store.create_table("acme", "ns", "t", FIELDS, 1)
    store.commit_offsets("acme", "g", old.table_id, {0: 4})
    store.update_group("acme", "g", old.table_id, lambda s: _join(s, "m1"))
    store.drop_table("acme", "ns", "t")
    assert store.fetch_offsets("acme", "g", old.table_id) == {}
    assert store.read_group("acme", "g", old.table_id) == GroupState()
    assert store.list_groups("acme") == []
    new = store.create_table("acme", "ns", "t", FIELDS, 1)
    assert store.fetch_offsets("acme", "g", new.table_id) == {}


def test_concurrent_group_commits_keep_one_row(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 1)
    _in_threads(6, lambda i: store.commit_offsets("acme", "g", table.table_id, {0: i}))
    assert store.fetch_offsets("acme", "g", table.table_id)[0] in range(6)


# Group membership ---------------------------------------------------------------------
def _join(state: GroupState, member: str) -> int:
    """A stand-in for the coordinator: add a member, raise the generation."""
    state.generation += 1
    state.members[member] = GroupMember(
        member, f"host/{member}", state.generation, {0: state.generation}, {}, [0], 1000, 1, 2
    )
    return state.generation


def test_group_membership_round_trips_and_is_listed(store: MetadataStore) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 2)
    assert store.read_group("acme", "g", table.table_id) == GroupState()
    assert store.update_group("acme", "g", table.table_id, lambda s: _join(s, "m1")) == 1
    got = store.read_group("acme", "g", table.table_id)
    assert got.generation == 1 and list(got.members) == ["m1"]
    assert got.members["m1"].assigned == {0: 1} and got.members["m1"].client_id == "host/m1"
    # Listed although it never committed; other tenants see nothing of it.
    assert store.list_groups("acme") == [("g", table.table_id)]
    assert store.list_groups("globex") == []
    assert store.read_group("globex", "g", table.table_id) == GroupState()
    # A change that changes nothing writes nothing (and returns what it returned).
    assert store.update_group("acme", "g", table.table_id, lambda s: s.generation) == 1


def test_concurrent_group_changes_are_serialised(open_store: Callable[[], MetadataStore]) -> None:
    """Gateways (here: stores of their own) change one group at once: every change sees
    the one before it, as heartbeats from members on different replicas must."""
    stores = [open_store() for _ in range(4)]
    stores[0].ensure_tenant("acme")
    table = stores[0].create_table("acme", "ns", "t", FIELDS, 1)
    gens = _in_threads(
        8,
        lambda i: stores[i % 4].update_group(
            "acme", "g", table.table_id, lambda s: _join(s, f"m{i}")
        ),
    )
    assert sorted(gens) == list(range(1, 9))
    state = stores[1].read_group("acme", "g", table.table_id)
    assert state.generation == 8 and len(state.members) == 8


def test_a_refused_commit_stores_no_offset_but_keeps_the_checks_changes(
    store: MetadataStore,
) -> None:
    table = store.create_table("acme", "ns", "t", FIELDS, 2)
    store.commit_offsets("acme", "g", table.table_id, {0: 1})

    def refuse(state: GroupState) -> str:
        state.generation = 7  # e.g. members expired by the check
        return "refused"

    assert store.commit_offsets("acme", "g", table.table_id, {0: 5}, refuse) == "refused"
    assert store.fetch_offsets("acme", "g", table.table_id) == {0: 1}
    assert store.read_group("acme", "g", table.table_id).generation == 7
    assert store.commit_offsets("acme", "g", table.table_id, {0: 5}, lambda s: None) is None
    assert store.fetch_offsets("acme", "g", table.table_id) == {0: 5}


def test_shard_counts_and_segments_take_a_few_queries_whatever_the_partitions(
    store: MetadataStore,
) -> None:
    """What a /metrics scrape reads of the hot tier's shards (issue 30): the same as the
    placements say, in aggregate queries whose number does not grow with partitions."""
    from sqlalchemy import event

    shards = ["s1", "s2"]
    moved = store.create_table(
        "acme", "ns", "moved", [{"name": "a", "type": "int64"}], 3, (), shards
    )
    epoch, _, _ = store.chain(moved.table_id, 0)
    first = store.placements()[0].shard
    other = "s2" if first == "s1" else "s1"
    assert store.replace_chain(
        moved.table_id, 0, epoch, [(0, first, 0, 5), (1, other, 5, None)], finish_move=False
    )

    def expected() -> tuple[dict[str, tuple[int, int]], list[tuple[str, str, int, int, str]]]:
        counts: dict[str, list[int]] = {}
        segments = []
        for p in store.placements():
            counts.setdefault(p.shard, [0, 0])[0] += 1
            for seq, on, _, _ in p.segments:
                counts.setdefault(on, [0, 0])[1] += 1
                segments.append((p.tenant, p.table_id, p.partition, seq, on))
        return {s: (a, b) for s, (a, b) in counts.items()}, sorted(segments)

    statements: list[str] = []
    event.listen(store._engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def queries() -> int:
        want = expected()
        statements.clear()
        counts, segments = store.shard_counts(), sorted(store.all_segments())
        made = len([s for s in statements if s.lstrip().upper().startswith("SELECT")])
        assert (counts, segments) == want
        return made

    few = queries()
    for i in range(20):
        store.create_table("globex", "ns", f"t{i}", [{"name": "a", "type": "int64"}], 4, (), shards)
    assert queries() == few <= 5
