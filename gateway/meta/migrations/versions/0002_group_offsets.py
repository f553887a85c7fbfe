"""Consumer-group committed offsets.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_group_offsets",
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("group_id", sa.String(length=255), nullable=False),
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tg_tenants.id"], name="fk_tg_group_offsets_tenant_id_tg_tenants"
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_group_offsets_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "group_id", "table_id", "partition", name="pk_tg_group_offsets"
        ),
    )


def downgrade() -> None:
    op.drop_table("tg_group_offsets")
