"""Tenants, tables and partitions.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tg_tenants",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column(
            "status", sa.String(length=16), server_default=sa.text("'active'"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('active', 'suspended')", name="ck_tg_tenants_status"),
        sa.PrimaryKeyConstraint("id", name="pk_tg_tenants"),
    )
    op.create_table(
        "tg_tables",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("schema_json", sa.Text(), nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("key_columns_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tg_tenants.id"], name="fk_tg_tables_tenant_id_tg_tenants"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tg_tables"),
        sa.UniqueConstraint(
            "tenant_id", "namespace", "name", name="uq_tg_tables_tenant_id_namespace_name"
        ),
    )
    op.create_table(
        "tg_partitions",
        sa.Column("table_id", sa.String(length=36), nullable=False),
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("high_watermark", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("tiered_watermark", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "shard", sa.String(length=255), server_default=sa.text("'default'"), nullable=False
        ),
        sa.Column("epoch", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tg_tables.id"],
            name="fk_tg_partitions_table_id_tg_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", "partition", name="pk_tg_partitions"),
    )


def downgrade() -> None:
    op.drop_table("tg_partitions")
    op.drop_table("tg_tables")
    op.drop_table("tg_tenants")
