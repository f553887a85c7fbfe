"""Run a gateway process: both edges on one event loop, one service behind them."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import metrics
from gateway.cold import load_cold_store
from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import load_hot_log
from gateway.lake.components import Components
from gateway.lake.scheduler import EmbeddedJobs
from gateway.lake.shards import shard_stats
from gateway.meta import MetadataStore
from gateway.server.calls import DataCalls
from gateway.tenancy import OPERATOR_KEY_FILE, Tenancy, load_operator_key
from gateway.wire.errors import TidegateError, hide_paths

if TYPE_CHECKING:
    import uvicorn

    from gateway.server.flight import FlightEdge
    from gateway.server.grpc.server import GrpcEdge
    from gateway.server.kafka import KafkaEdge

__all__ = ["build_service", "serve"]

log = logging.getLogger("tidegate")


def build_service(settings: Settings) -> StreamTables:
    """The service with its backends, from settings (creates the data folder if needed)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    meta = MetadataStore(settings.metadata_url, echo=settings.metadata.echo)
    try:
        hot = load_hot_log(settings)
    except Exception:
        meta.close()
        raise
    try:
        cold = load_cold_store(settings)
    except Exception:
        hot.close()
        meta.close()
        raise
    return StreamTables(settings, meta, hot, cold)


def _start_tiering(service: StreamTables, settings: Settings) -> EmbeddedJobs | None:
    """The embedded lake jobs' schedule (tiering, compaction), or None when they are all
    disabled (or without a cold tier)."""
    cold = service.cold
    components = Components(settings, service.meta, service.hot, cold) if cold is not None else None
    return EmbeddedJobs.start_for(components)


def _quiet_server_class() -> type[Any]:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn without its own signal handlers: this process owns SIGTERM/SIGINT."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


def _freeze_startup_objects() -> None:
    """Keep what startup built out of the cyclic garbage collector's full collections.

    Imports, settings, schemas and backends make ~200k long-lived tracked objects; every
    full collection walked them all, a pause of 50-200 ms of the event loop (every request
    waits) about every 15 s under load. Frozen after one last collection, they are skipped;
    they are still freed by reference counting when dropped.
    """
    gc.collect()
    gc.freeze()


def _return_freed_memory() -> None:
    """Have Arrow give freed memory back to the system at once.

    Arrow's default allocator keeps what reads free for reuse, per thread; with dozens of
    I/O threads and many streams that retained memory, not live data, made most of the
    gateway's growth. jemalloc with no decay returns it as soon as it is freed, so the
    process's size follows what it really holds (what the read budget bounds).
    ``set_memory_pool`` covers what pyarrow allocates; Arrow's C++ internals (compute
    kernels, Parquet and IPC readers) use the pool named by ``ARROW_DEFAULT_MEMORY_POOL``
    when pyarrow was imported, which the ``tidegate`` command sets (:mod:`gateway.cli`).
    """
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():  # pragma: no cover - other builds
        return
    pa.set_memory_pool(pa.jemalloc_memory_pool())
    pa.jemalloc_set_decay_ms(0)
    _fixed_mmap_threshold()


#: glibc's mallopt parameter number of M_MMAP_THRESHOLD.
_M_MMAP_THRESHOLD = -3


def _fixed_mmap_threshold(nbytes: int = 128 * 1024) -> None:
    """Have glibc serve every allocation of ``nbytes`` or more with its own mapping, given
    back to the system when freed.

    What is not Arrow's (gRPC's and protobuf's message buffers, zstd contexts) is on
    glibc's malloc. By default glibc raises its mmap threshold each time a large block is
    freed (up to 32 MiB), after which the multi-MiB answers of the read paths come from the
    per-thread arenas and their freed space stays in the process: the soak's gateway that
    served gRPC reads grew about 3.7 MiB a minute. Setting the threshold fixes it (and
    turns off that adjustment). No-op where the C library is not glibc, and where the
    operator set glibc's own ``MALLOC_MMAP_THRESHOLD_`` (glibc applied it at start): the
    fixed threshold costs the gRPC bulk paths throughput (each large buffer is a fresh
    mapping), which ``MALLOC_MMAP_THRESHOLD_=33554432`` trades back for memory.
    """
    import ctypes
    import ctypes.util
    import os

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return

    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - no C library to tune
        return
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, nbytes)


class CannotStart(TidegateError):
    reason = "CANNOT_START"


#: Descriptors kept for everything but client connections (files, sockets to the
#: backends, the Flight edge's connections).
_RESERVED_DESCRIPTORS = 1024


def connection_cap(settings: Settings) -> int:
    """Connections each edge may hold: ``server.max_connections``, after raising the soft
    descriptor limit to the hard one, lowered when the edges' caps together would leave
    fewer than a reserve of descriptors for the rest of the process (logged)."""
    import resource

    wanted = settings.server.max_connections
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (ValueError, OSError):  # pragma: no cover - a platform without rlimits
        return wanted
    ports = (settings.server.http_port, settings.server.grpc_port, settings.kafka.port)
    edges = sum(1 for port in ports if port) or 1
    fits = max(16, (soft - _RESERVED_DESCRIPTORS) // edges)
    if fits < wanted:
        log.warning(
            "server.max_connections=%d per edge does not fit the descriptor limit (%d); "
            "each edge takes at most %d connections",
            wanted,
            soft,
            fits,
        )
        return fits
    return wanted


def _quiet_accept_failures(loop: asyncio.AbstractEventLoop) -> None:
    """Log a failed ``accept`` (descriptors or memory exhausted) in one line, at most every
    ten seconds, instead of asyncio's traceback for each: a flood of connections must not
    also flood the log. Every other loop error is handled as before."""
    from gateway.logs import LogLimiter

    limiter = LogLimiter(log)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            exc = context.get("exception")
            limiter.log(
                logging.ERROR,
                "accept",
                "cannot accept connections: %s (asyncio retries in a second)",
                getattr(exc, "strerror", None) or exc,
            )
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def private_folders(settings: Settings) -> dict[str, str]:
    """The folders whose absolute paths this gateway never shows a caller, by the name
    shown instead: its data folder, disk hot tier and local warehouse, and where Tidegate
    and Python are installed (see :func:`gateway.wire.errors.hide_paths`)."""
    import sys

    import gateway

    folders = {
        str(settings.data_dir.resolve()): "<data_dir>",
        str(settings.hot_path.resolve()): "<hot>",
        str(Path(gateway.__file__).resolve().parent.parent): "<tidegate>",
        str(Path(sys.prefix).resolve()): "<python>",
        str(Path(sys.base_prefix).resolve()): "<python>",
    }
    warehouse = settings.cold_warehouse
    if warehouse.startswith("file://"):
        folders[warehouse.removeprefix("file://")] = "<warehouse>"
    return folders


def check_can_start(settings: Settings) -> None:
    """Refuse to start, in one message naming every conflict at once, when a port this
    gateway needs is taken or its disk hot tier's folder is owned by another process (a
    second gateway started on the same defaults hits all three)."""
    import socket

    from gateway.config import DiskHotConfig
    from gateway.hot.disk.log import folder_holder

    host = settings.server.host
    conflicts = []
    for port, what, option in (
        (settings.server.grpc_port, "gRPC", "--grpc-port or TIDEGATE_SERVER__GRPC_PORT"),
        (settings.server.http_port, "HTTP", "--http-port or TIDEGATE_SERVER__HTTP_PORT"),
        (settings.server.metrics_port, "metrics", "TIDEGATE_SERVER__METRICS_PORT"),
        (settings.server.flight_port, "Flight", "--flight-port or TIDEGATE_SERVER__FLIGHT_PORT"),
        (settings.kafka.port, "Kafka", "--kafka-port or TIDEGATE_KAFKA__PORT"),
    ):
        if not port:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                conflicts.append(
                    f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc} "
                    f"(choose another port with {option})"
                )
    if isinstance(settings.hot, DiskHotConfig):
        holder = folder_holder(settings.hot_path)
        if holder is not None:
            conflicts.append(
                f"the disk hot tier at {settings.hot_path} is in use by {holder} (give this "
                "gateway another data folder with --data-dir or TIDEGATE_DATA_DIR, or share "
                "a hot tier between gateways with the Redis one, TIDEGATE_HOT__TYPE=redis)"
            )
    if conflicts:
        raise CannotStart(
            f"{len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}, another gateway "
            "may be running: " + "; ".join(conflicts)
        )


def next_steps(settings: Settings, *, from_file: bool) -> str:
    """What to do once the gateway serves: the console's address and how to make a tenant
    and its API key, as commands to paste in another shell where this one was started."""
    import shlex
    import shutil
    import sys

    server = settings.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    command = sys.argv[0] if sys.argv and sys.argv[0].endswith("tidegate") else "tidegate"
    found = shutil.which("tidegate")
    if found and os.path.realpath(found) == os.path.realpath(command):
        command = "tidegate"  # on PATH: the short name
    key_file = settings.data_dir / OPERATOR_KEY_FILE
    operator = (
        f"$(cat {shlex.quote(str(key_file))})" if from_file else "<TIDEGATE_AUTH__OPERATOR_KEY>"
    )
    lines = ["tidegate is ready. Next:"]
    if server.http_port:
        where = f"http://{host}:{server.http_port}/console"
        whose = f"the operator key, in {key_file}" if from_file else "the operator key"
        lines.append(f"  the console: {where} (sign in with {whose})")
    if server.grpc_port:
        lines.append("  a tenant and its API key, in another shell here:")
        lines.append(f"    export TIDEGATE_OPERATOR_KEY={operator}")
        if (host, server.grpc_port) != ("127.0.0.1", 50051):
            lines.append(f"    export TIDEGATE_TARGET={host}:{server.grpc_port}")
        lines.append(f"    {command} tenant create shop")
        lines.append(f"    export TIDEGATE_API_KEY=$({command} tenant key issue shop)")
    return "\n".join(lines)


async def serve(settings: Settings) -> None:
    """Serve gRPC and HTTP until SIGTERM or SIGINT, then drain and stop."""
    check_can_start(settings)
    hide_paths(private_folders(settings))

    _return_freed_memory()

    edges = Edges(settings, connection_cap(settings))
    service = build_service(settings)
    tenancy = _start_tenancy(settings, service)
    # One DataCalls (stateless) serves both edges that speak Arrow to SDK clients.
    calls = DataCalls(service, tenancy)
    _gauges_on_scrape(settings, service)
    ready = asyncio.Event()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    _quiet_accept_failures(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)

    tiering: EmbeddedJobs | None = None
    try:
        await edges.start(
            service, tenancy, calls, ready=lambda: ready.is_set() and not stopping.is_set()
        )
        _freeze_startup_objects()  # before the tiering thread starts allocating
        tiering = _start_tiering(service, settings)
        ready.set()
        _say_ready(settings)
        await stopping.wait()
        log.info("draining")
    finally:
        grace = settings.server.shutdown_grace_s
        if tiering is not None:
            await asyncio.to_thread(tiering.stop, grace + 30)
        await edges.stop(grace)
        await tenancy.close()
        service.close()
        log.info("stopped")


def _start_tenancy(settings: Settings, service: StreamTables) -> Tenancy:
    """Who may call and how much, started, with the operator key (generated and said once
    when there was none)."""
    operator_key, generated = load_operator_key(settings)
    if generated:
        print(
            f"tidegate: generated the operator key (stored in "
            f"{settings.data_dir / OPERATOR_KEY_FILE}): {operator_key}",
            flush=True,
        )
    tenancy = Tenancy(settings, service, operator_key)
    tenancy.start()
    return tenancy


def _gauges_on_scrape(settings: Settings, service: StreamTables) -> None:
    """The gauges read at each scrape: consumer groups' lags, and per-shard ones of a Redis
    hot tier."""
    if settings.hot.type == "redis":  # per-shard gauges, read from the shards at scrape
        bytes_read = [float("-inf")]

        def shard_gauges() -> None:
            now = time.monotonic()
            fresh = now - bytes_read[0] >= metrics.SHARD_BYTES_REFRESH_S
            metrics.set_shard_stats(shard_stats(service, with_bytes=fresh))
            if fresh:
                bytes_read[0] = now

        metrics.on_scrape(shard_gauges)
    most_groups = settings.groups.metrics_max_groups
    metrics.on_scrape(lambda: metrics.set_group_lags(*service.group_lags(), most_groups))


def _say_ready(settings: Settings) -> None:
    """The ready line in the log, and the next steps for the person who started us."""
    log.info(
        "tidegate ready: data_dir=%s hot=%s metadata=%s",
        settings.data_dir,
        settings.hot.type,
        settings.metadata_url.split("@")[-1],
    )
    steps = next_steps(settings, from_file=not settings.auth.operator_key)
    if settings.log.format == "json":  # every line of the output stays a JSON object
        log.info("%s", steps)
    else:
        print(steps, flush=True)


class Edges:
    """The network edges of one process (gRPC, Flight, Kafka, HTTP and metrics, each when
    its port is set), started in that order and stopped in that order."""

    def __init__(self, settings: Settings, max_connections: int) -> None:
        self.settings = settings
        self.max_connections = max_connections
        self.grpc: GrpcEdge | None = None
        self.flight: FlightEdge | None = None
        self.kafka: KafkaEdge | None = None
        self.http: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(
        self, service: StreamTables, tenancy: Tenancy, calls: DataCalls, ready: Callable[[], bool]
    ) -> None:
        """Start each edge whose port is set; ``ready`` answers the HTTP readiness probe."""
        from gateway.server.flight import FlightEdge
        from gateway.server.grpc.server import GrpcEdge
        from gateway.server.http import create_app
        from gateway.server.http.health import metrics_app
        from gateway.server.http.refusals import AppendRefusals

        settings = self.settings
        if settings.server.grpc_port:
            self.grpc = GrpcEdge(service, settings, tenancy, calls, self.max_connections)
            await self.grpc.start()
            log.info("gRPC listening on %s:%s", settings.server.host, self.grpc.port)
        if settings.server.flight_port:
            self.flight = FlightEdge(calls, settings)
            log.info("Flight listening on %s:%s", settings.server.host, self.flight.port)
        if settings.kafka.port:
            from gateway.server.kafka import KafkaEdge  # kio's message types: only when on

            self.kafka = KafkaEdge(calls, settings, self.max_connections)
            await self.kafka.start()
            log.info("Kafka listening on %s:%s", settings.server.host, self.kafka.port)
        if settings.server.http_port:
            app = create_app(service, settings, ready=ready, tenancy=tenancy)
            await self._start_http(AppendRefusals(app, tenancy), settings.server.http_port, "HTTP")
        if settings.server.metrics_port:
            await self._start_http(
                metrics_app(settings.server), settings.server.metrics_port, "metrics"
            )

    async def _start_http(self, app: Any, port: int, what: str) -> None:
        import uvicorn

        from gateway.server.http.connections import guarded_protocol

        settings = self.settings
        # log_config=None: uvicorn's records go through the process's one handler
        # (gateway/logs.py), so they share its format (text or JSON lines).
        # Connections capped, and timed out while they send nothing useful
        # (gateway/server/http/connections.py).
        config = uvicorn.Config(
            app,
            host=settings.server.host,
            port=port,
            log_level="warning",
            log_config=None,
            lifespan="off",
            http=guarded_protocol(settings.server, self.max_connections),
            timeout_keep_alive=settings.server.http_keep_alive_s,  # type: ignore[arg-type]
        )
        server = _quiet_server_class()(config)
        task = asyncio.create_task(server.serve())
        self.http.append((server, task))
        while not server.started:
            if task.done():
                await task
                raise RuntimeError(f"the {what} server stopped while starting")
            await asyncio.sleep(0.01)
        log.info("%s listening on %s:%s", what, settings.server.host, port)

    async def stop(self, grace: float) -> None:
        """Stop the edges that started, each given ``grace`` seconds to drain."""
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.flight is not None:
            await self.flight.stop()
        if self.kafka is not None:
            await self.kafka.stop()
        for server, task in self.http:
            server.should_exit = True
            with suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, grace + 1)
