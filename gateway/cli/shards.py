"""``tidegate shard ...`` and ``tidegate rebalance``: hot-tier placement (the operator's
jobs). Like ``tidegate tier`` they run beside the gateways on the same configuration
(``TIDEGATE_*``): the metadata store and the Redis shards. ``shard moves`` and the moves of
``rebalance`` go through a gateway's admin API (``--target``, ``--operator-key``); reserved
shards are ``tidegate tenant pin|unpin``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from gateway.cli._common import JsonFlag, admin_for, app, columns, fail, plural
from gateway.plugins import BackendError
from gateway.wire.errors import TidegateError

if TYPE_CHECKING:
    from gateway.lake.components import Components

T = TypeVar("T")

shard_app = typer.Typer(
    help="Hot-tier shards: placements, moves and their status, draining.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(shard_app, name="shard")

TenantArg = Annotated[str, typer.Argument(help="Tenant name.", show_default=False)]
ShardArg = Annotated[str, typer.Argument(help="Shard name.", show_default=False)]


@contextmanager
def components() -> Iterator[Components]:
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.logs import configure as configure_logging

    settings = Settings()
    configure_logging(settings.log, level="WARNING")
    try:
        with Components.open(settings) as c:
            yield c
    except (TidegateError, BackendError) as err:
        fail(err)


def _run(fn: Callable[[Components], T]) -> T:
    with components() as c:
        return fn(c)


@shard_app.command("list")
def shard_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's partitions.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Partitions with their segments (shard and offsets), epoch and move under way."""
    with components() as c:
        rows = c.meta.placements(tenant=tenant)
        pins = c.meta.shard_pins()
    if as_json:
        out = {"pins": pins, "placements": [p.to_dict() for p in rows]}
        typer.echo(json.dumps(out))
        return
    table = [["TENANT", "TABLE", "PART", "SHARD", "EPOCH", "SEGMENTS", "MOVING TO"]]
    for p in rows:
        segs = " ".join(f"{s}[{a},{'' if b is None else b})" for _, s, a, b in p.segments)
        table.append(
            [
                p.tenant,
                f"{p.namespace}.{p.name}",
                str(p.partition),
                p.shard,
                str(p.epoch),
                segs,
                p.move_target or "",
            ]
        )
    for line in columns(table):
        typer.echo(line)


@shard_app.command("move")
def shard_move(
    tenant: TenantArg,
    table: Annotated[str, typer.Argument(help="namespace.name", show_default=False)],
    partition: Annotated[int, typer.Argument(help="Partition number.", show_default=False)],
    target: ShardArg,
) -> None:
    """Move a partition's appends to another shard, without copying its data."""
    from gateway.lake.shards import move_partition

    r = _run(lambda c: move_partition(c, tenant, table, partition, target))
    typer.echo(
        f"moved {r.tenant} {r.table}/{r.partition} from {r.source} to {r.target} "
        f"at offset {r.start} in {r.seconds:.3f}s"
    )


@shard_app.command("recover")
def shard_recover() -> None:
    """Finish every move a crash left under way."""
    from gateway.lake.shards import recover_moves

    typer.echo(f"finished {_run(recover_moves)} moves")


@shard_app.command("drain")
def shard_drain(
    shard: ShardArg,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for tiering to empty its sealed segments.")
    ] = 0.0,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Copy the sealed segments' un-tiered ranges to other shards instead of "
            "waiting for tiering (a failing shard).",
        ),
    ] = False,
) -> None:
    """Move every partition off a shard; it can be removed once nothing is left on it."""
    from gateway.lake.shards import drain_shard

    moves, left = _run(lambda c: drain_shard(c, shard, wait_s=wait, force=force))
    typer.echo(f"moved {plural(len(moves), 'partition')} off {shard}")
    if left:
        typer.echo(f"{plural(len(left), 'partition')} still hold sealed segments on {shard}")
        raise typer.Exit(1)
    typer.echo(f"{shard} is empty: remove it from hot.shards")


@shard_app.command("moves")
def shard_moves(as_json: JsonFlag = False) -> None:
    """Moves under way and the gateway's recent moves with their outcome (admin API,
    needs the operator key)."""
    with admin_for() as a:
        rows = a.moves()
    if as_json:
        typer.echo(json.dumps({"moves": rows}))
        return
    table = [["STATE", "TENANT", "TABLE", "PART", "FROM", "TO", "AT", "SECONDS", "ERROR"]]
    for m in rows:
        table.append(
            [
                m["state"],
                m["tenant"],
                m["table"],
                str(m["partition"]),
                m["source"],
                m["target"],
                str(m["start"]) if m["state"] == "done" else "",
                f"{m['seconds']:.3f}" if m["state"] in ("done", "failed") else "",
                m["error"],
            ]
        )
    for line in columns(table):
        typer.echo(line)


@app.command()
def rebalance(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan, move nothing.")
    ] = False,
    band: Annotated[float, typer.Option(help="Target max/mean shard load.", min=1.0)] = 1.25,
    window: Annotated[float, typer.Option(help="Seconds of heat to measure.", min=1.0)] = 300.0,
    runner: Annotated[
        str, typer.Option(help="'spark' (heat measured by Spark tasks) or 'local'.")
    ] = "spark",
    master: Annotated[
        str | None, typer.Option(help="Spark master (default: tiering.master).")
    ] = None,
    parallel: Annotated[int, typer.Option(help="Tenants moved at once.", min=1)] = 2,
    as_json: JsonFlag = False,
) -> None:
    """Plan moves that bring every shard within the load band (max/mean), and run them
    through the gateway's admin API (--target, --operator-key): a few at a time, each
    tenant's in its own lane. The heat is measured here, on the same configuration as
    the gateways (TIDEGATE_*: metadata store and shards)."""
    from gateway.lake.rebalance import (
        Move,
        Outcome,
        Plan,
        make_heat_meter,
        measure_heat,
        plan_moves,
        run_plan,
    )

    admin = None if dry_run else admin_for()  # refuse a missing operator key before measuring
    try:
        with components() as c:
            heat = measure_heat(c, window, make_heat_meter(c, runner, master))
            pins = c.meta.shard_pins()
            plan = plan_moves(heat, c.hot.shard_names(), pins, band=band)
        outcomes: list[Outcome] = []
        if admin is not None:

            def move(m: Move) -> object:
                return admin.move_partition(m.tenant, m.table, m.partition, m.target)

            outcomes = run_plan(plan, move, parallel=parallel)
    finally:
        if admin is not None:
            admin.close()
    moved = sum(1 for o in outcomes if o.state == "done")
    if as_json:
        out = {**plan.to_dict(), "moved": moved, "dry_run": dry_run}
        if not dry_run:
            out["outcomes"] = [o.to_dict() for o in outcomes]
        typer.echo(json.dumps(out))
    else:
        shared = [s for s in plan.before if s not in pins] or list(plan.before)
        typer.echo(
            f"max/mean load {Plan.ratio(plan.before, shared):.2f} -> "
            f"{Plan.ratio(plan.after, shared):.2f} (band {band})"
        )
        for i, m in enumerate(plan.moves):
            o = outcomes[i] if outcomes else None
            tail = "" if o is None else f": {o.state}" + (f" ({o.error})" if o.error else "")
            typer.echo(f"move {m.tenant} {m.table}/{m.partition} {m.source} -> {m.target}{tail}")
        if not dry_run:
            typer.echo(f"moved {moved} of {plural(len(plan.moves), 'partition')}")
    if moved < len(outcomes):
        raise typer.Exit(1)
