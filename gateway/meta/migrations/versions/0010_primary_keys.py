"""Primary-key tables (issue 42): a table's primary key and merge engine, declared at
create and immutable (NULL: an append-only table).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 02:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tg_tables") as batch:
        batch.add_column(sa.Column("primary_key_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tg_tables") as batch:
        batch.drop_column("primary_key_json")
