"""Lake maintenance: snapshot leases of open scans and read plans, and the last run of
each maintenance job per table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_snapshot_leases",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_snapshot_leases_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tg_snapshot_leases"),
    )
    op.create_index(
        "ix_tg_snapshot_leases_table_id", "tg_snapshot_leases", ["table_id"], unique=False
    )
    op.create_table(
        "tg_maintenance_runs",
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("job", sa.String(length=16), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_maintenance_runs_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", "job", name="pk_tg_maintenance_runs"),
    )


def downgrade() -> None:
    op.drop_table("tg_maintenance_runs")
    op.drop_index("ix_tg_snapshot_leases_table_id", table_name="tg_snapshot_leases")
    op.drop_table("tg_snapshot_leases")
