"""The live gateway replicas (issue 41): each replica's Kafka node id and advertised
address under a lease it renews, so the replicas sharing a metadata store answer Kafka
clients as one cluster of brokers.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_replicas",
        sa.Column("replica_id", sa.String(length=255), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("replica_id", name="pk_tg_replicas"),
        sa.UniqueConstraint("node_id", name="uq_tg_replicas_node_id"),
    )


def downgrade() -> None:
    op.drop_table("tg_replicas")
