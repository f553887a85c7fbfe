"""The groups an edge's own protocol coordinates (issue 41): each Kafka consumer group, on
each table it reads, as the replica coordinating it published it, so that `tidegate group
describe` and the console show its members from any replica.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_edge_groups",
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("group_id", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("coordinator", sa.String(length=255), nullable=False),
        sa.Column("protocol", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("members_json", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "group_id", "namespace", "name", name="pk_tg_edge_groups"
        ),
    )
    op.create_index("ix_tg_edge_groups_coordinator", "tg_edge_groups", ["coordinator"])


def downgrade() -> None:
    op.drop_index("ix_tg_edge_groups_coordinator", table_name="tg_edge_groups")
    op.drop_table("tg_edge_groups")
