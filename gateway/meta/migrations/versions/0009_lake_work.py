"""Lake work driven by change (issue 30): a row per partition with records not yet
tiered and per table for the maintenance a change asks for later, so the lake jobs visit
only tables that need them; and an index on tables with a retention.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 23:55:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_lake_work",
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job", sa.String(length=16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("marked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("high", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.CheckConstraint(
            "job IN ('tier', 'trim', 'compact', 'expire', 'orphans')",
            name="ck_tg_lake_work_job",
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_lake_work_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", "partition", "job", name="pk_tg_lake_work"),
    )
    op.create_index("ix_tg_lake_work_job_due_at", "tg_lake_work", ["job", "due_at"])
    # Every table already there may hold records not yet tiered: the first runs after
    # the upgrade visit each once (then only what changes).
    op.execute(
        "INSERT INTO tg_lake_work (table_id, partition, job, since, marked_at, due_at, high) "
        "SELECT id, -1, 'tier', created_at, created_at, created_at, 0 FROM tg_tables"
    )


def downgrade() -> None:
    op.drop_index("ix_tg_lake_work_job_due_at", table_name="tg_lake_work")
    op.drop_table("tg_lake_work")
