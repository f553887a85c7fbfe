"""Consumer-group membership: one row per group and table with its generation and live
members, which every gateway replica reads and locks (issue 31).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_groups",
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("group_id", sa.String(length=255), nullable=False),
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("members_json", sa.Text(), nullable=False),
        sa.Column("rebalance_since_ms", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tg_tenants.id"], name="fk_tg_groups_tenant_id_tg_tenants"
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_groups_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "group_id", "table_id", name="pk_tg_groups"),
    )


def downgrade() -> None:
    op.drop_table("tg_groups")
