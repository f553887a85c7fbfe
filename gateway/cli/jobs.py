"""``tidegate serve``, ``tidegate tier`` and ``tidegate migrate``: the gateway process, the
lake jobs and the schema migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from gateway.cli._common import app, fail
from gateway.hot.disk.log import HotTierBusy
from gateway.plugins import BackendError
from gateway.wire.errors import TidegateError

LogLevelOption = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None,
    typer.Option(
        help="Level of Tidegate's own logs (default: log.level, INFO).",
        case_sensitive=False,
        show_default=False,
    ),
]
LogFormatOption = Annotated[
    Literal["text", "json"] | None,
    typer.Option(
        help="'text', or 'json': one JSON object per line (default: log.format, text).",
        show_default=False,
    ),
]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address of both servers.")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0 disables).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0 disables).")] = None,
    flight_port: Annotated[
        int | None, typer.Option(help="Arrow Flight port for bulk reads (0 disables).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Run a gateway: gRPC and HTTP on embedded defaults unless configured otherwise."""
    import asyncio

    from gateway.config import Settings
    from gateway.logs import configure as configure_logging
    from gateway.server.app import serve as serve_async

    settings = Settings()
    configure_logging(settings.log, level=log_level, fmt=log_format)
    server = settings.server.model_copy(
        update={
            k: v
            for k, v in {
                "host": host,
                "grpc_port": grpc_port,
                "http_port": http_port,
                "flight_port": flight_port,
            }.items()
            if v is not None
        }
    )
    settings = settings.model_copy(update={"server": server})
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    try:
        asyncio.run(serve_async(settings))
    except (TidegateError, BackendError) as err:
        fail(err)


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
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Move every table's hot records into its Iceberg table (then trim the hot tier
    below what has been tiered for tiering.hot_retention_s)."""
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.lake.runners import make_runner
    from gateway.lake.scheduler import run_forever, run_once
    from gateway.logs import configure as configure_logging

    if runner not in ("local", "spark"):
        raise typer.BadParameter("--runner must be 'local' or 'spark'")
    kind: Any = runner
    settings = Settings()
    configure_logging(settings.log, level=log_level, fmt=log_format)
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    try:
        if every:
            run_forever(settings, every_s=every, kind=kind, master=master)
            return
        with Components.open(settings) as c:
            report = run_once(c, make_runner(c, kind, master))
    except HotTierBusy as err:
        typer.echo(
            f"error: {err.reason}: {err.message}. A gateway that owns the disk hot tier tiers "
            "it on its own schedule (tiering.enabled, tiering.interval_s): there is nothing "
            "to run here while it is up.",
            err=True,
        )
        raise typer.Exit(2) from None
    except (TidegateError, BackendError) as err:
        fail(err)
    for name, failure in report.failures.items():
        typer.echo(f"failed: {name}: {failure}", err=True)
    typer.echo(f"tiered {report.records} records in {len(report.tables)} tables")
    if not report.tables:
        typer.echo(
            f"warning: no tables found (data folder {settings.data_dir.resolve()}, metadata "
            f"{settings.metadata_url.split('@')[-1]}): run tier where the gateway keeps its "
            "data (--data-dir) or with its TIDEGATE_METADATA__URL",
            err=True,
        )
    if report.failures:
        raise typer.Exit(1)


def _first_line(err: Exception) -> str:
    """The driver's own message of a SQLAlchemy error, first line only."""
    return str(getattr(err, "orig", None) or err).splitlines()[0]


@app.command()
def migrate(
    log_level: LogLevelOption = "WARNING",
    log_format: LogFormatOption = None,
) -> None:
    """Bring the metadata store to the newest schema and create the Iceberg SQL catalog's
    tables when they are missing; nothing to do when both are current. Gateways and jobs
    do the same when they open them: this runs it once, before they start (Helm runs it
    as a pre-install and pre-upgrade hook)."""
    from pydantic import ValidationError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from gateway.cold import load_cold_store
    from gateway.config import Settings
    from gateway.logs import configure as configure_logging
    from gateway.meta import MetadataStore

    try:
        settings = Settings()
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        fail(ValueError(f"setting {where} (TIDEGATE_* or TIDEGATE_CONFIG): {first['msg']}"))
    configure_logging(settings.log, level=log_level, fmt=log_format)
    url = settings.metadata_url
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        fail(
            ValueError(
                f"TIDEGATE_METADATA__URL {url!r} is not a SQLAlchemy URL "
                "(e.g. postgresql+psycopg://user:password@host:5432/tidegate)"
            )
        )
    try:
        with MetadataStore(url, echo=settings.metadata.echo) as meta:
            revision = meta.revision()
    except SQLAlchemyError as err:
        fail(ValueError(f"cannot migrate the metadata store at {shown}: {_first_line(err)}"))
    try:
        cold = load_cold_store(settings)
    except SQLAlchemyError as err:
        fail(ValueError(f"cannot prepare the Iceberg catalog: {_first_line(err)}"))
    except (TidegateError, BackendError) as err:
        fail(err)
    if cold is not None:
        cold.close()
    typer.echo(f"metadata store {shown} at revision {revision}")
    if cold is not None:
        typer.echo(f"Iceberg catalog {settings.cold.catalog.type!r} ready")
