"""The ``tidegate`` command line: the app, its groups and what every command shares."""

from __future__ import annotations

import time
from typing import Annotated, Any, NoReturn

try:
    import typer
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit(
        f"the tidegate command needs the server extra: pip install 'tidegate[server]' ({exc})"
    ) from exc


from gateway.wire.errors import TidegateError

app = typer.Typer(
    name="tidegate",
    help="Tidegate: a hot log and Iceberg tables served as one stream-table.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # errors as one plain line, never a box that wraps the words
)
table_app = typer.Typer(
    help="Create, list, describe and drop tables.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(table_app, name="table")

tenant_app = typer.Typer(
    help="Tenants, API keys, quotas, usage and reserved shards (needs the operator key).",
    no_args_is_help=True,
)
key_app = typer.Typer(
    help="Issue, list and revoke a tenant's API keys.", no_args_is_help=True, rich_markup_mode=None
)
quota_app = typer.Typer(
    help="Set (set) and show (get) a tenant's quotas.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(tenant_app, name="tenant")
group_app = typer.Typer(
    help="Consumer groups: committed offsets and lag, and moving them.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(group_app, name="group")
tenant_app.add_typer(key_app, name="key")
tenant_app.add_typer(quota_app, name="quota")

TableArg = Annotated[str, typer.Argument(help="The table, as namespace.name.", show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
PageSizeOption = Annotated[
    int, typer.Option(min=0, help="Print one page of this many (the gateway serves 1,000 at most).")
]
PageTokenOption = Annotated[
    str, typer.Option(help="The page to print: the token the previous page ended with.")
]
ContainsOption = Annotated[str, typer.Option(help="Only names holding this text (any case).")]


def next_page(token: str) -> None:
    """Say, on stderr, how to ask for the page after the one printed (if any)."""
    if token:
        typer.echo(f"more: --page-token {token}", err=True)


def plural(n: int, word: str) -> str:
    """``1 record``, ``2 records``, ``0 records``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def duration(ms: int) -> str:
    """Milliseconds in the largest unit that holds them exactly: ``7 days``, ``90
    minutes``, ``1500 ms``."""
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if ms >= size and ms % size == 0:
            return plural(ms // size, unit)
    if ms >= 1000 and ms % 1000 == 0:
        return plural(ms // 1000, "second")
    return f"{ms} ms"


def size(n: int) -> str:
    """Bytes for a reader: ``812 bytes``, ``2.1 KiB``, ``95.0 MiB``."""
    if n < 1024:
        return plural(n, "byte")
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def columns(rows: list[list[str]]) -> list[str]:
    """``rows`` as lines of left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


#: Options that every command takes, before or after the command's name.
GLOBAL_OPTIONS = {"--target", "-t", "--api-key", "--operator-key", "--connect-timeout"}
DEFAULT_TARGET = "127.0.0.1:50051"


class Globals:
    """What the global options said (set by the app's callback)."""

    target: str = DEFAULT_TARGET
    api_key: str | None = None
    operator_key: str | None = None
    connect_timeout: float = 5.0
    #: Whose key the command's client sends: "tenant" (client_for) or "operator".
    speaks_as: str = ""


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"tidegate {version('tidegate')}")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree
            typer.echo("tidegate (not installed)")
        raise typer.Exit()


@app.callback(context_settings={"help_option_names": ["-h", "--help"]})
def _main(
    target: Annotated[
        str,
        typer.Option(
            "--target", "-t", envvar="TIDEGATE_TARGET", help="The gateway's gRPC address."
        ),
    ] = DEFAULT_TARGET,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="TIDEGATE_API_KEY", help="The tenant's API key.", show_default=False
        ),
    ] = None,
    operator_key: Annotated[
        str | None,
        typer.Option(
            "--operator-key",
            envvar="TIDEGATE_OPERATOR_KEY",
            help="The operator key, for 'tenant', 'shard moves' and 'rebalance' (printed at "
            "first start, kept in <data_dir>/operator.key).",
            show_default=False,
        ),
    ] = None,
    connect_timeout: Annotated[
        float,
        typer.Option(
            envvar="TIDEGATE_CONNECT_TIMEOUT",
            help="Seconds to try reaching the gateway before giving up.",
        ),
    ] = 5.0,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Tidegate: a hot log and Iceberg tables served as one stream-table.

    --target, --api-key and --operator-key may come anywhere on the line."""
    Globals.target = target
    Globals.api_key = api_key
    Globals.operator_key = operator_key
    Globals.connect_timeout = connect_timeout


def hoist_global_options(argv: list[str]) -> list[str]:
    """``argv`` with the global options moved before the first command, wherever they were
    written (``tidegate read t --target x`` as ``tidegate --target x read t``)."""
    hoisted: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS and i > 0:
            if "=" in arg or i + 1 >= len(argv):
                hoisted.append(arg)
                i += 1
            else:
                hoisted.extend(argv[i : i + 2])
                i += 2
            continue
        rest.append(arg)
        i += 1
    return hoisted + rest


#: Seconds of trying to reach the gateway that a command always has, however long its
#: start took: a live gateway on a busy machine must not be reported unreachable.
MIN_CONNECT_S = 3.0


def connect_budget(now: float | None = None) -> float:
    """What is left of ``--connect-timeout`` once this process has started (Python and
    its imports take a second or more on a busy machine), so that a gateway that cannot
    be reached is reported within the time the option says for the whole command; but
    never less than :data:`MIN_CONNECT_S` of trying."""
    from gateway.cli import STARTED

    spent = (time.monotonic() if now is None else now) - STARTED
    return max(min(MIN_CONNECT_S, Globals.connect_timeout), Globals.connect_timeout - spent)


def client_for(warehouse: str | None = None) -> Any:
    """The tenant's client; ``warehouse``: the gateway's local warehouse folder as this
    host sees it, where client-side scans read the data files."""
    from gateway.client import Client

    Globals.speaks_as = "tenant"
    return Client(
        Globals.target,
        api_key=Globals.api_key,
        connect_timeout=connect_budget(),
        warehouse=warehouse,
    )


def admin_for() -> Any:
    from gateway.client import AdminClient

    if not Globals.operator_key:
        raise typer.BadParameter(
            "this command needs the operator key: pass --operator-key or set "
            "TIDEGATE_OPERATOR_KEY (the gateway prints it at first start and keeps it in "
            "<data_dir>/operator.key)",
            param_hint="--operator-key",
        )
    Globals.speaks_as = "operator"
    return AdminClient(
        Globals.target,
        operator_key=Globals.operator_key,
        connect_timeout=connect_budget(),
    )


def error_line(err: TidegateError) -> str:
    """The one line the command line prints for ``err``: the gateway's words, except where
    they speak HTTP to a command-line user (a request without a key)."""
    no_key = not (Globals.api_key or "").strip()
    if err.reason == "UNAUTHENTICATED" and Globals.speaks_as == "tenant" and no_key:
        return (
            "error: UNAUTHENTICATED: no API key was given: set TIDEGATE_API_KEY or pass "
            "--api-key (with the operator key, 'tidegate tenant key issue TENANT' makes one)"
        )
    return f"error: {err.reason}: {err.message}"


def fail(err: TidegateError | ValueError) -> NoReturn:
    """Print one line for the error and exit 2 (no traceback)."""
    if isinstance(err, TidegateError):
        typer.echo(error_line(err), err=True)
    else:
        typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def settings_error_line(err: Any) -> str | None:
    """The one line for a pydantic ``ValidationError`` of the settings (a ``TIDEGATE_*``
    variable or the ``TIDEGATE_CONFIG`` file out of range), naming the setting and its
    variable; ``None`` for any other model's. The value is not repeated (it may be a key)."""
    if getattr(err, "title", None) != "Settings":
        return None
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    env = "TIDEGATE_" + "__".join(str(part) for part in first["loc"]).upper()
    return f"error: setting {where} ({env} or TIDEGATE_CONFIG): {first['msg']}"


def run(argv: list[str]) -> int:
    """Run the command line on ``argv`` (without the program name); the exit code.

    Every error Tidegate raises on purpose is one line on stderr and exit code 2."""
    try:
        # Click handles its own errors (usage, bad parameters, --help) and exits.
        app(args=hoist_global_options(argv), prog_name="tidegate")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except KeyboardInterrupt:
        typer.echo("aborted", err=True)
        return 130
    except TidegateError as err:
        typer.echo(error_line(err), err=True)
        return 2
    except BrokenPipeError:  # `tidegate read ... | head`
        return 0
    except Exception as exc:  # a bug of ours: still one line, the traceback on request
        import os

        line = settings_error_line(exc)
        if line is not None:
            typer.echo(line, err=True)
            return 2
        if os.environ.get("TIDEGATE_DEBUG"):
            raise
        typer.echo(
            f"error: unexpected {type(exc).__name__}: {exc} (set TIDEGATE_DEBUG=1 to see where; "
            "please report it)",
            err=True,
        )
        return 3
    return 0
