"""Table retention: per-table ``retention_ms`` / ``retention_records`` and each
partition's ``earliest_offset`` (raised by the retention job, never lowered).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tg_tables") as batch:
        batch.add_column(sa.Column("retention_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("retention_records", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("retention_set_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("tg_partitions") as batch:
        batch.add_column(
            sa.Column(
                "earliest_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("tg_partitions") as batch:
        batch.drop_column("earliest_offset")
    with op.batch_alter_table("tg_tables") as batch:
        batch.drop_column("retention_set_at")
        batch.drop_column("retention_records")
        batch.drop_column("retention_ms")
