"""Schema evolution: a version per table schema, raised by every change.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tg_tables") as batch:
        batch.add_column(
            sa.Column("schema_version", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("tg_tables") as batch:
        batch.drop_column("schema_version")
