"""``tidegate tenant ...``: tenants, keys, quotas and usage (the operator's commands)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gateway.cli._common import (
    OperatorKey,
    Target,
    admin_for,
    fail,
    key_app,
    quota_app,
    tenant_app,
)
from gateway.wire.errors import TidegateError


@tenant_app.command("create")
def tenant_create(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    issue_key: Annotated[
        bool, typer.Option("--issue-key", help="Also issue an API key and print it alone.")
    ] = False,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Create a tenant (with --issue-key: print only its first API key)."""
    with admin_for(target, operator_key) as a:
        try:
            info = a.create_tenant(name)
            if issue_key:
                typer.echo(a.issue_key(name)[1])
                return
        except TidegateError as err:
            fail(err)
        typer.echo(json.dumps(info))


@tenant_app.command("list")
def tenant_list(operator_key: OperatorKey, target: Target = "127.0.0.1:50051") -> None:
    """List tenants and their status."""
    with admin_for(target, operator_key) as a:
        try:
            for t in a.list_tenants():
                typer.echo(f"{t['name']}\t{t['status']}")
        except TidegateError as err:
            fail(err)


def _tenant_action(action: str, name: str, operator_key: str, target: str) -> None:
    with admin_for(target, operator_key) as a:
        try:
            getattr(a, f"{action}_tenant")(name)
        except TidegateError as err:
            fail(err)
    typer.echo(f"{action}{'d' if action.endswith('e') else 'ed'} {name}")


@tenant_app.command("suspend")
def tenant_suspend(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Refuse every request of the tenant, on every gateway, at once."""
    _tenant_action("suspend", name, operator_key, target)


@tenant_app.command("resume")
def tenant_resume(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Serve a suspended tenant again."""
    _tenant_action("resume", name, operator_key, target)


@tenant_app.command("delete")
def tenant_delete(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Delete the tenant with its tables (every tier), keys, quotas and usage."""
    _tenant_action("delete", name, operator_key, target)


@key_app.command("issue")
def key_issue(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Issue an API key and print it (alone: it is never shown again)."""
    with admin_for(target, operator_key) as a:
        try:
            typer.echo(a.issue_key(tenant)[1])
        except TidegateError as err:
            fail(err)


@key_app.command("revoke")
def key_revoke(
    key_id: Annotated[str, typer.Argument(help="Key id (the part after 'tg_').")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Revoke a key: it authenticates nothing from now on."""
    with admin_for(target, operator_key) as a:
        try:
            a.revoke_key(key_id)
        except TidegateError as err:
            fail(err)
    typer.echo(f"revoked {key_id}")


@key_app.command("list")
def key_list(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """The tenant's key ids (never the keys)."""
    with admin_for(target, operator_key) as a:
        try:
            for k in a.list_keys(tenant):
                typer.echo(f"{k['key_id']}\t{'revoked' if k['revoked'] else 'active'}")
        except TidegateError as err:
            fail(err)


@quota_app.command("set")
def quota_set(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    append_bytes_per_s: Annotated[int | None, typer.Option(help="Append bytes/s.")] = None,
    read_bytes_per_s: Annotated[int | None, typer.Option(help="Read bytes/s.")] = None,
    requests_per_s: Annotated[int | None, typer.Option(help="Requests/s.")] = None,
    max_tables: Annotated[int | None, typer.Option(help="Tables.")] = None,
    max_partitions: Annotated[int | None, typer.Option(help="Partitions, all tables.")] = None,
    max_hot_bytes: Annotated[int | None, typer.Option(help="Hot-tier bytes.")] = None,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Set quotas (a negative value means unlimited); prints the tenant's quotas."""
    values = {
        k: v
        for k, v in {
            "append_bytes_per_s": append_bytes_per_s,
            "read_bytes_per_s": read_bytes_per_s,
            "requests_per_s": requests_per_s,
            "max_tables": max_tables,
            "max_partitions": max_partitions,
            "max_hot_bytes": max_hot_bytes,
        }.items()
        if v is not None
    }
    with admin_for(target, operator_key) as a:
        try:
            typer.echo(json.dumps(a.set_quota(tenant, **values)))
        except TidegateError as err:
            fail(err)


@quota_app.command("get")
def quota_get(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """The tenant's own quotas (null: the gateway's default)."""
    with admin_for(target, operator_key) as a:
        try:
            typer.echo(json.dumps(a.get_quota(tenant)))
        except TidegateError as err:
            fail(err)


@tenant_app.command("usage")
def tenant_usage(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    operator_key: OperatorKey,
    target: Target = "127.0.0.1:50051",
) -> None:
    """Usage per minute as JSON lines, then the totals."""
    with admin_for(target, operator_key) as a:
        try:
            rows = a.usage(tenant)
        except TidegateError as err:
            fail(err)
    totals: dict[str, int] = {}
    for row in rows:
        typer.echo(json.dumps(row))
        for k, v in row.items():
            if k in ("hot_bytes", "cold_bytes"):
                totals[k] = max(totals.get(k, 0), v)
            elif k != "minute_ms":
                totals[k] = totals.get(k, 0) + v
    typer.echo(json.dumps({"total": totals}))
