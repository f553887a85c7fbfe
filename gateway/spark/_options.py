"""The connector's options: read once on the driver, each refusal one sentence naming the
option, the value and what would be accepted."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.client import Client, TableInfo, TableRef
from gateway.wire.errors import InvalidRequest, TidegateError
from gateway.wire.retry import Retry

__all__ = ["Connection", "Options", "SparkOptionError"]

#: Options every use takes.
COMMON = ("endpoint", "api_key", "table", "path")
#: Options of batch reads.
BATCH_READ = (
    "warehouse",
    "as_of",
    "partitions",
    "columns",
    "split_bytes",
    "min_partitions",
    "hot_split_records",
)
#: Options of streaming reads.
STREAM_READ = (
    "warehouse",
    "partitions",
    "columns",
    "startingoffsets",
    "maxrecordspertrigger",
    "reconnecttimeout",
)
#: Options of writes.
WRITE = ("write_id", "batch_rows", "batch_bytes", "test_fail_after_batches")
#: Spark's own options, which it hands to sources and sinks too.
SPARKS = ("checkpointlocation",)
ACCEPTED = frozenset(COMMON + BATCH_READ + STREAM_READ + WRITE + SPARKS)


#: This process's clients, by (process id, endpoint, api key): see :meth:`Connection.shared`.
_SHARED: dict[tuple[int, str, str | None, bool], Client] = {}
_SHARED_LOCK = threading.Lock()


#: gRPC addresses of gateways given by their HTTP URL, by URL (see :func:`grpc_endpoint`).
_GRPC_OF: dict[str, str] = {}


def grpc_endpoint(endpoint: str) -> str:
    """The gRPC address of the gateway ``endpoint`` names: itself when it is one
    (``host:port``), else, for the gateway's HTTP URL (``http://host:8080``, what the JVM
    connector takes), the address its ``/v1/endpoints`` route tells, asked once per
    process. So one set of options works with either implementation."""
    if not endpoint.lower().startswith(("http://", "https://")):
        return endpoint
    url = endpoint.rstrip("/")
    found = _GRPC_OF.get(url)
    if found is not None:
        return found
    try:
        with urllib.request.urlopen(f"{url}/v1/endpoints", timeout=30) as response:
            grpc = json.loads(response.read()).get("grpc")
    except (OSError, ValueError) as exc:
        raise SparkOptionError(
            f"tidegate: option 'endpoint' is {endpoint!r}, which does not answer as a "
            f"Tidegate gateway's HTTP address ({exc})"
        ) from None
    if not isinstance(grpc, str) or not grpc:
        raise SparkOptionError(
            f"tidegate: the gateway at {endpoint!r} serves no gRPC edge, which the Python "
            "source needs; put the connector's jar on the session (gateway.spark.jar_path())"
        )
    _GRPC_OF[url] = grpc
    return grpc


class SparkOptionError(InvalidRequest):
    """An option of ``spark.read/readStream/write.format("tidegate")`` that cannot be used."""

    reason = "INVALID_SPARK_OPTION"


@dataclass(frozen=True)
class Connection:
    """Where the table lives and who asks: everything a task needs to reach the gateway."""

    endpoint: str
    api_key: str | None
    table: TableRef
    #: The gateway's local warehouse folder as the executors see it (the ``warehouse``
    #: option): a plan's files are read there, not through the gateway's links.
    warehouse: str | None = None

    def client(self, *, unretried: bool = False) -> Client:
        """A client of its own, which the caller closes; ``unretried``: one whose calls
        fail at once, for a caller that rides outages itself (a streaming query)."""
        if unretried:
            return Client(self.endpoint, api_key=self.api_key, retry=Retry.none())
        return Client(self.endpoint, api_key=self.api_key)

    def shared(self, *, unretried: bool = False) -> Client:
        """This process's client of the gateway for this key, opened at first use and
        kept open (never close it).

        Spark reuses a Python worker for the tasks and plannings that follow
        (``spark.python.worker.reuse``, on by default), so every planning and hot-range
        read after the first skips setting up a channel, connecting and asking for the
        Flight edge. The process id is part of the key: a forked child opens its own, as
        gRPC channels do not survive a fork.
        """
        key = (os.getpid(), self.endpoint, self.api_key, unretried)
        with _SHARED_LOCK:
            client = _SHARED.get(key)
            if client is None:
                client = _SHARED[key] = self.client(unretried=unretried)
        return client

    def table_info(self, *, unretried: bool = False) -> TableInfo:
        """The table as the gateway describes it, or a clear error naming table and cause."""
        try:
            return self.shared(unretried=unretried).table_info(self.table)
        except TidegateError as err:
            raise described(err, f"table {self.table} at {self.endpoint}") from None


def described(err: TidegateError, what: str, more: str = "") -> TidegateError:
    """``err`` (same class, same details) with a message that says what was being done
    (and ``more`` after the error's own words)."""
    message = f"tidegate: {what}: {err.message}{more}"
    try:
        return type(err)(message, **err.details)
    except TypeError:  # a class whose details are not all keyword arguments
        return TidegateError(message, reason=err.reason, **err.details)


class Options:
    """Case-insensitive view of the options Spark hands to the data source."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.values = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(set(self.values) - ACCEPTED)
        if unknown:
            accepted = sorted(ACCEPTED - {"path", *SPARKS})
            raise SparkOptionError(f"tidegate: unknown option(s) {unknown}; accepted: {accepted}")

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name.lower())
        return default if value is None or value == "" else value

    def integer(self, name: str, default: int, *, minimum: int = 1) -> int:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise SparkOptionError(
                f"tidegate: option {name!r} is {text!r}; give an integer >= {minimum}"
            )
        return value

    def reconnect_timeout(self) -> float | None:
        """``reconnectTimeout``: seconds a streaming query keeps reconnecting to a gateway
        that went away (a restart, a rolling deploy) before it fails; unset: for ever, as
        a Kafka consumer does."""
        text = self.get("reconnectTimeout")
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise SparkOptionError(
                f"tidegate: option 'reconnectTimeout' is {text!r}; give a number of seconds "
                "> 0, or leave it out to reconnect for ever"
            )
        return value

    def names(self, name: str) -> list[str]:
        """A comma-separated list option (empty when not given)."""
        text = self.get(name)
        return [] if text is None else [n.strip() for n in text.split(",") if n.strip()]

    def connection(self) -> Connection:
        endpoint = self.get("endpoint")
        if endpoint is None:
            raise SparkOptionError(
                "tidegate: option 'endpoint' is missing; give the gateway's HTTP address, "
                "e.g. .option('endpoint', 'http://gateway:8080')"
            )
        endpoint = grpc_endpoint(endpoint)
        table = self.get("table") or self.get("path")
        if table is None:
            raise SparkOptionError(
                "tidegate: no table given; name it as .load('namespace.table') "
                "or .option('table', 'namespace.table')"
            )
        try:
            ref = TableRef.parse(table)
        except ValueError:
            raise SparkOptionError(
                f"tidegate: table {table!r} is not of the form 'namespace.table'"
            ) from None
        api_key = self.get("api_key") or os.environ.get("TIDEGATE_API_KEY") or None
        return Connection(endpoint, api_key, ref, self.get("warehouse"))

    def partitions(self, count: int) -> list[int] | None:
        """The ``partitions`` option checked against the table's ``count`` partitions."""
        chosen = self.names("partitions")
        if not chosen:
            return None
        out = []
        for text in chosen:
            p = int(text) if text.lstrip("-").isdigit() else -1
            if not 0 <= p < count:
                raise SparkOptionError(
                    f"tidegate: option 'partitions' names partition {text!r}; the table has "
                    f"partitions 0..{count - 1}"
                )
            out.append(p)
        return sorted(set(out))

    def columns(self, available: Sequence[str]) -> list[str]:
        """The ``columns`` option checked against the table's columns (all when absent)."""
        chosen = self.names("columns")
        unknown = [c for c in chosen if c not in available]
        if unknown:
            raise SparkOptionError(
                f"tidegate: option 'columns' names unknown column(s) {unknown}; "
                f"the table has {list(available)}"
            )
        return chosen or list(available)

    def starting_offsets(self, partitions: Sequence[int]) -> dict[int, int | str]:
        """``startingOffsets``: per partition an offset, ``earliest`` or ``latest``.

        Accepts ``earliest`` (default), ``latest`` or JSON ``{"0": 42, "1": -2}`` where -2
        means earliest and -1 latest (Kafka's convention); partitions not named start at
        the earliest offset.
        """
        text = (self.get("startingOffsets") or "earliest").strip()
        if text.lower() in ("earliest", "latest"):
            return dict.fromkeys(partitions, text.lower())
        accepted = "'earliest', 'latest' or JSON such as {\"0\": 42, \"1\": -2}"
        try:
            raw: Any = json.loads(text)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            raise SparkOptionError(
                f"tidegate: option 'startingOffsets' is {text!r}; give {accepted}"
            )
        out: dict[int, int | str] = dict.fromkeys(partitions, "earliest")
        for key, value in raw.items():
            p = int(key) if str(key).isdigit() else -1
            if p not in out:
                raise SparkOptionError(
                    f"tidegate: option 'startingOffsets' names partition {key!r}; the read "
                    f"covers partitions {list(partitions)}"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < -2:
                raise SparkOptionError(
                    f"tidegate: option 'startingOffsets' gives partition {key} the offset "
                    f"{value!r}; give an offset >= 0, -2 (earliest) or -1 (latest)"
                )
            out[p] = {-2: "earliest", -1: "latest"}.get(value, value)
        return out
