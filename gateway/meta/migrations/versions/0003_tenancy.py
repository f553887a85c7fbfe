"""Tenancy: API keys, quotas and per-minute usage.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 06:00:00

Written in parallel with "0002" (consumer-group offsets) and re-chained onto it when both
landed, so the history stays linear; the two touch different tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = (
    "append_bytes",
    "append_records",
    "read_bytes",
    "read_records",
    "requests",
    "throttled",
    "hot_bytes",
    "cold_bytes",
)
_QUOTAS = (
    "append_bytes_per_s",
    "read_bytes_per_s",
    "requests_per_s",
    "max_tables",
    "max_partitions",
    "max_hot_bytes",
)


def upgrade() -> None:
    op.create_table(
        "tg_api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tg_tenants.id"],
            name="fk_tg_api_keys_tenant_id_tg_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tg_api_keys"),
    )
    op.create_table(
        "tg_quotas",
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        *[sa.Column(q, sa.BigInteger(), nullable=True) for q in _QUOTAS],
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tg_tenants.id"],
            name="fk_tg_quotas_tenant_id_tg_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tg_quotas"),
    )
    op.create_table(
        "tg_usage",
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        *[
            sa.Column(c, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
            for c in _COUNTERS
        ],
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tg_tenants.id"],
            name="fk_tg_usage_tenant_id_tg_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "minute", name="pk_tg_usage"),
    )


def downgrade() -> None:
    op.drop_table("tg_usage")
    op.drop_table("tg_quotas")
    op.drop_table("tg_api_keys")
