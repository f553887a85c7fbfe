"""The ``tidegate`` command line: the app, its groups and what every command shares."""

from __future__ import annotations

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
)
table_app = typer.Typer(help="Create, list, describe and drop tables.", no_args_is_help=True)
app.add_typer(table_app, name="table")

tenant_app = typer.Typer(
    help="Tenants, API keys, quotas and usage (needs the operator key).", no_args_is_help=True
)
key_app = typer.Typer(help="Issue, list and revoke a tenant's API keys.", no_args_is_help=True)
quota_app = typer.Typer(help="Set and show a tenant's quotas.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")
tenant_app.add_typer(key_app, name="key")
tenant_app.add_typer(quota_app, name="quota")

Target = Annotated[
    str,
    typer.Option("--target", "-t", envvar="TIDEGATE_TARGET", help="Gateway gRPC address."),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="TIDEGATE_API_KEY", help="The tenant's API key.", show_default=False
    ),
]
OperatorKey = Annotated[
    str,
    typer.Option(
        "--operator-key",
        envvar="TIDEGATE_OPERATOR_KEY",
        help="The operator key (printed at first start, in <data_dir>/operator.key).",
        show_default=False,
    ),
]

# The target of every data command, and the key its client sends (set by the callback).
_API_KEY: dict[str, str | None] = {"key": None}


@app.callback()
def _main(api_key: ApiKey = None) -> None:
    """Tidegate: a hot log and Iceberg tables served as one stream-table."""
    _API_KEY["key"] = api_key


def client_for(target: str) -> Any:
    from gateway.client import Client

    return Client(target, api_key=_API_KEY["key"])


def admin_for(target: str, operator_key: str) -> Any:
    from gateway.client import AdminClient

    return AdminClient(target, operator_key=operator_key)


def fail(err: TidegateError | ValueError) -> NoReturn:
    """Print one line for the error and exit 2 (no traceback)."""
    if isinstance(err, TidegateError):
        typer.echo(f"error: {err.reason}: {err.message}", err=True)
    else:
        typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)
