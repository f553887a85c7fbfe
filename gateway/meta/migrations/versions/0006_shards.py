"""Hot-tier shards: partition segments (the virtual log), move intents and shard pins.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 01:00:00

A partition without segment rows keeps its single implicit segment on its ``shard`` column
(``default``), so data written before this revision stays readable where it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tg_partitions") as batch:
        batch.add_column(sa.Column("move_target", sa.String(length=255), nullable=True))
    op.create_table(
        "tg_segments",
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("shard", sa.String(length=255), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("table_id", "partition", "seq", name="pk_tg_segments"),
    )
    op.create_table(
        "tg_shard_pins",
        sa.Column("shard", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tg_tenants.id"],
            name="fk_tg_shard_pins_tenant_id_tg_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("shard", name="pk_tg_shard_pins"),
    )


def downgrade() -> None:
    op.drop_table("tg_shard_pins")
    op.drop_table("tg_segments")
    with op.batch_alter_table("tg_partitions") as batch:
        batch.drop_column("move_target")
