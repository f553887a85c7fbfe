"""``tidegate serve`` and ``tidegate tier``: the gateway process and the lake jobs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli._common import (
    app,
)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address of both servers.")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0 disables).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0 disables).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "INFO",
) -> None:
    """Run a gateway: gRPC and HTTP on embedded defaults unless configured otherwise."""
    import asyncio

    from gateway.config import Settings
    from gateway.server.app import serve as serve_async

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = Settings()
    server = settings.server.model_copy(
        update={
            k: v
            for k, v in {"host": host, "grpc_port": grpc_port, "http_port": http_port}.items()
            if v is not None
        }
    )
    settings = settings.model_copy(update={"server": server})
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    asyncio.run(serve_async(settings))


@app.command()
def tier(
    every: Annotated[
        float | None, typer.Option(help="Repeat every N seconds (default: run once).")
    ] = None,
    runner: Annotated[
        str, typer.Option(help="'local' (threads in this process) or 'spark'.")
    ] = "local",
    master: Annotated[
        str | None, typer.Option(help="Spark master (default: tiering.master).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "INFO",
) -> None:
    """Move every table's hot records into its Iceberg table (then trim the hot tier
    below what has been tiered for tiering.hot_retention_s)."""
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.lake.runners import make_runner
    from gateway.lake.scheduler import run_forever, run_once

    if runner not in ("local", "spark"):
        raise typer.BadParameter("--runner must be 'local' or 'spark'")
    kind: Any = runner
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = Settings()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    if every:
        run_forever(settings, every_s=every, kind=kind, master=master)
        return
    with Components.open(settings) as c:
        report = run_once(c, make_runner(c, kind, master))
    for name, err in report.failures.items():
        typer.echo(f"failed: {name}: {err}", err=True)
    typer.echo(f"tiered {report.records} records in {len(report.tables)} tables")
    if report.failures:
        raise typer.Exit(1)
