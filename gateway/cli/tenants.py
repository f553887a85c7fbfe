"""``tidegate tenant ...``: tenants, keys, quotas and usage (the operator's commands)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gateway.cli._common import (
    ContainsOption,
    PageSizeOption,
    PageTokenOption,
    admin_for,
    key_app,
    next_page,
    quota_app,
    tenant_app,
)


@tenant_app.command("create")
def tenant_create(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    issue_key: Annotated[
        bool, typer.Option("--issue-key", help="Also issue an API key and print it alone.")
    ] = False,
) -> None:
    """Create a tenant (with --issue-key: print only its first API key)."""
    with admin_for() as a:
        info = a.create_tenant(name)
        if issue_key:
            typer.echo(a.issue_key(name)[1])
            return
        typer.echo(json.dumps(info))


@tenant_app.command("list")
def tenant_list(
    page_size: PageSizeOption = 0,
    page_token: PageTokenOption = "",
    contains: ContainsOption = "",
) -> None:
    """List tenants by name and their status: all of them, or one page with --page-size."""
    with admin_for() as a:
        if page_size or page_token:
            tenants, token = a.list_tenants_page(
                page_size=page_size, page_token=page_token, name_contains=contains
            )
        else:
            tenants, token = a.list_tenants(name_contains=contains), ""
        for t in tenants:
            typer.echo(f"{t['name']}\t{t['status']}")
    next_page(token)


def _tenant_action(action: str, name: str) -> None:
    with admin_for() as a:
        getattr(a, f"{action}_tenant")(name)
    typer.echo(f"{action}{'d' if action.endswith('e') else 'ed'} {name}")


@tenant_app.command("suspend")
def tenant_suspend(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """Refuse every request of the tenant, on every gateway, at once."""
    _tenant_action("suspend", name)


@tenant_app.command("resume")
def tenant_resume(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """Serve a suspended tenant again."""
    _tenant_action("resume", name)


@tenant_app.command("delete")
def tenant_delete(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """Delete the tenant with its tables (every tier), keys, quotas and usage."""
    _tenant_action("delete", name)


@key_app.command("issue")
def key_issue(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """Issue an API key and print it (alone: it is never shown again)."""
    with admin_for() as a:
        typer.echo(a.issue_key(tenant)[1])


@key_app.command("revoke")
def key_revoke(
    key_id: Annotated[str, typer.Argument(help="Key id (the part after 'tg_').")],
) -> None:
    """Revoke a key: it authenticates nothing from now on."""
    with admin_for() as a:
        a.revoke_key(key_id)
    typer.echo(f"revoked {key_id}")


@key_app.command("list")
def key_list(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """The tenant's key ids (never the keys)."""
    with admin_for() as a:
        for k in a.list_keys(tenant):
            typer.echo(f"{k['key_id']}\t{'revoked' if k['revoked'] else 'active'}")


@quota_app.command("set")
def quota_set(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    append_bytes_per_s: Annotated[int | None, typer.Option(help="Append bytes/s.")] = None,
    read_bytes_per_s: Annotated[int | None, typer.Option(help="Read bytes/s.")] = None,
    requests_per_s: Annotated[int | None, typer.Option(help="Requests/s.")] = None,
    max_tables: Annotated[int | None, typer.Option(help="Tables.")] = None,
    max_partitions: Annotated[int | None, typer.Option(help="Partitions, all tables.")] = None,
    max_hot_bytes: Annotated[int | None, typer.Option(help="Hot-tier bytes.")] = None,
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
    with admin_for() as a:
        typer.echo(json.dumps(a.set_quota(tenant, **values)))


@quota_app.command("get")
def quota_get(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """The tenant's own quotas (null: the gateway's default)."""
    with admin_for() as a:
        typer.echo(json.dumps(a.get_quota(tenant)))


@tenant_app.command("usage")
def tenant_usage(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
) -> None:
    """Usage per minute as JSON lines, then the totals."""
    with admin_for() as a:
        rows = a.usage(tenant)
    totals: dict[str, int] = {}
    for row in rows:
        typer.echo(json.dumps(row))
        for k, v in row.items():
            if k in ("hot_bytes", "cold_bytes"):
                totals[k] = max(totals.get(k, 0), v)
            elif k != "minute_ms":
                totals[k] = totals.get(k, 0) + v
    typer.echo(json.dumps({"total": totals}))


@tenant_app.command("pin")
def tenant_pin(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    shards: Annotated[list[str], typer.Argument(help="Hot-tier shards to reserve.")],
) -> None:
    """Reserve hot-tier shards for the tenant: its new partitions go only there, nobody
    else's do (move its existing partitions with 'tidegate rebalance' or 'shard move')."""
    with admin_for() as a:
        pins = a.pin_shards(tenant, shards)["pins"]
    typer.echo(f"{tenant} reserves {', '.join(sorted(s for s, t in pins.items() if t == tenant))}")


@tenant_app.command("unpin")
def tenant_unpin(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    shards: Annotated[
        list[str] | None, typer.Argument(help="Shards to release (default: every one).")
    ] = None,
) -> None:
    """Release the tenant's reserved shards; its partitions stay where they are."""
    with admin_for() as a:
        pins = a.unpin_shards(tenant, shards or [])["pins"]
    left = sorted(s for s, t in pins.items() if t == tenant)
    typer.echo(f"{tenant} reserves {', '.join(left) if left else 'no shard'}")
