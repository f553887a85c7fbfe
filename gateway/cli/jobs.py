"""``tidegate serve``, ``tidegate tier``, ``tidegate compact``, ``tidegate retention`` and
``tidegate migrate``: the
gateway process, the lake jobs and the schema migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from gateway.cli._common import app, fail, plural
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
    kafka_port: Annotated[
        int | None, typer.Option(help="Kafka listener port (0 disables; default 9092).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")] = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Run a gateway: gRPC and HTTP on embedded defaults unless configured otherwise."""
    import asyncio

    from gateway.config import Settings
    from gateway.logs import configure as configure_logging
    from gateway.plugins import BackendError
    from gateway.server.app import serve as serve_async

    settings = Settings()
    configure_logging(settings.log, level=log_level, fmt=log_format)
    if log_format is not None:  # what serve prints follows the format it was given
        settings = settings.model_copy(
            update={"log": settings.log.model_copy(update={"format": log_format})}
        )
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
    if kafka_port is not None:
        kafka = settings.kafka.model_copy(update={"port": kafka_port})
        settings = settings.model_copy(update={"kafka": kafka})
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    try:
        asyncio.run(serve_async(settings))
    except (TidegateError, BackendError) as err:
        fail(err)


RunnerOption = Annotated[
    str,
    typer.Option(
        help="'local' (threads in this process), 'spark', or the dotted path of a Runner "
        "of your own ('mypkg.mymod:MyRunner')."
    ),
]
EveryOption = Annotated[
    float | None, typer.Option(help="Repeat every N seconds (default: run once).")
]
MasterOption = Annotated[str | None, typer.Option(help="Spark master (default: tiering.master).")]
DataDirOption = Annotated[Path | None, typer.Option(help="Embedded-mode data folder.")]
AllOption = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Visit every table (a sweep); default: only the tables marked as needing it.",
    ),
]


@app.command()
def tier(
    every: EveryOption = None,
    every_table: AllOption = False,
    runner: RunnerOption = "local",
    master: MasterOption = None,
    data_dir: DataDirOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Move every table's hot records into its Iceberg table (then trim the hot tier
    below what has been tiered for tiering.hot_retention_s)."""
    _run_job("tier", every, runner, master, data_dir, log_level, log_format, every_table)


@app.command()
def compact(
    every: EveryOption = None,
    every_table: AllOption = False,
    runner: RunnerOption = "local",
    master: MasterOption = None,
    data_dir: DataDirOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Rewrite each table's runs of small data files into files near
    compaction.target_file_bytes, sorted by (_partition, _offset), in one commit per table
    that leaves concurrent tiering intact."""
    _run_job("compact", every, runner, master, data_dir, log_level, log_format, every_table)


@app.command()
def expire(
    every: EveryOption = None,
    every_table: AllOption = False,
    data_dir: DataDirOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Expire each table's snapshots replaced more than expiry.retention_s ago (keeping the
    expiry.keep_last newest and those open scans and read plans hold), then delete the
    files only they referenced."""
    _run_job("expire", every, "local", None, data_dir, log_level, log_format, every_table)


@app.command("clean-orphans")
def clean_orphans(
    every: EveryOption = None,
    every_table: AllOption = False,
    data_dir: DataDirOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Delete the files under each table's folder that no snapshot references and that
    are older than expiry.orphan_age_s (3 days): leftovers of jobs that died."""
    _run_job("orphans", every, "local", None, data_dir, log_level, log_format, every_table)


@app.command()
def retention(
    every: EveryOption = None,
    every_table: AllOption = False,
    data_dir: DataDirOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Apply each table's retention (retention_ms, retention_records): record the earliest
    offset kept per partition, then remove the records below it from the Iceberg table
    and the hot tier."""
    _run_job("retention", every, "local", None, data_dir, log_level, log_format, every_table)


_COMMAND = {"orphans": "clean-orphans"}
_DONE = {
    "tier": "tiered",
    "compact": "compacted",
    "expire": "expired",
    "orphans": "cleaned",
    "retention": "removed",
}


def _run_job(
    job: str,
    every: float | None,
    runner: str,
    master: str | None,
    data_dir: Path | None,
    log_level: Any,
    log_format: Any,
    every_table: bool = False,
) -> None:
    from gateway.config import Settings
    from gateway.hot.disk.log import HotTierBusy
    from gateway.lake.components import Components
    from gateway.lake.runners import make_runner
    from gateway.lake.scheduler import run_forever, run_once
    from gateway.logs import configure as configure_logging
    from gateway.plugins import BackendError, check_name

    try:
        check_name("tiering runner", runner)
    except BackendError as err:
        raise typer.BadParameter(str(err)) from None
    settings = Settings()
    configure_logging(settings.log, level=log_level, fmt=log_format)
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    try:
        if every:
            run_forever(
                settings,
                every_s=every,
                kind=runner,
                master=master,
                job=job,
                changed=not every_table,
            )
            return
        with Components.open(settings) as c:
            report = run_once(c, make_runner(c, runner, master), job, changed=not every_table)
            no_tables = not report.tables and not report.failures and not c.meta.has_tables()
    except HotTierBusy as err:
        typer.echo(
            f"error: {err.reason}: {err.message}. A gateway that owns the disk hot tier runs "
            "the lake jobs on its own schedule (tiering.enabled, tiering.interval_s, "
            "compaction.enabled, compaction.interval_s): there is nothing to run here while "
            "it is up.",
            err=True,
        )
        raise typer.Exit(2) from None
    except (TidegateError, BackendError) as err:
        fail(err)
    for name, failure in report.failures.items():
        typer.echo(f"failed: {name}: {failure}", err=True)
    if job in ("tier", "compact", "retention"):
        typer.echo(
            f"{_DONE[job]} {plural(report.records, 'record')} in "
            f"{plural(len(report.tables), 'table')}"
        )
    else:
        typer.echo(f"{_DONE[job]} {plural(len(report.tables), 'table')}")
    if no_tables:
        typer.echo(
            f"warning: no tables found (data folder {settings.data_dir.resolve()}, metadata "
            f"{settings.metadata_url.split('@')[-1]}): run {_COMMAND.get(job, job)} where the "
            "gateway keeps its data (--data-dir) or with its TIDEGATE_METADATA__URL",
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
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from gateway.cold import load_cold_store
    from gateway.config import Settings
    from gateway.logs import configure as configure_logging
    from gateway.meta import MetadataStore
    from gateway.plugins import BackendError

    settings = Settings()  # out-of-range settings: one line (gateway.cli._common.run)
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
