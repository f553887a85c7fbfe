"""Real local services for the tests: processes started on free ports, never mocks."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.forkserver import can_fork, fork_server

if TYPE_CHECKING:
    import grpc
    import httpx

    from gateway.client import AdminClient, AsyncClient, Client

REPO_ROOT = Path(__file__).resolve().parent.parent


class _PortBlocks:
    """Ports for the tests' servers, each handed out once per process, none shared by two
    processes that run at the same time.

    Asking the kernel for a free port (bind to port 0, close, hand the number on) races:
    between the close and the server's own bind, another pytest-xdist worker asking the
    same may get the same number, and any outgoing connection of any process may take it
    as its ephemeral port. So the ports come from below the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``), where it never picks one by itself, in blocks of
    :attr:`BLOCK`: a process owns a block while it holds an ``flock`` on that block's file in
    the system's temporary folder (the kernel lets go when the process ends, however it
    ends), so workers of one run, other runs and other checkouts on the machine never
    hand out the same port. A port something already listens on, or that is still held
    by a closed connection, is passed over.
    """

    BLOCK = 100
    #: The lowest port handed out (below it: well-known and registered services).
    LOW = 10_000

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._held: list[int] = []  # descriptors of the block files this process holds
        self._next = self._end = 0

    @staticmethod
    def _high() -> int:
        """One past the highest port the kernel never hands out by itself."""
        try:
            low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            low = 32768  # Linux's default
        return max(low, _PortBlocks.LOW + 10 * _PortBlocks.BLOCK)

    def _claim_block(self) -> None:
        import fcntl
        import tempfile

        folder = Path(tempfile.gettempdir()) / "tidegate-test-ports"
        folder.mkdir(exist_ok=True)
        with contextlib.suppress(PermissionError):
            folder.chmod(0o1777)  # any user's test run may claim blocks here
        blocks = (self._high() - self.LOW) // self.BLOCK
        first = os.getpid() % blocks  # spread processes out before they contend
        for i in range(blocks):
            block = (first + i) % blocks
            fd = os.open(folder / f"{block}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._held.append(fd)  # kept open (and locked) until the process ends
            self._next = self.LOW + block * self.BLOCK
            self._end = self._next + self.BLOCK
            return
        raise RuntimeError(f"every block of test ports under {folder} is held by a process")

    def take(self) -> int:
        with self._lock:
            while True:
                if self._next >= self._end:
                    self._claim_block()
                port, self._next = self._next, self._next + 1
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    try:
                        s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: TIME_WAIT counts as used
                    except OSError:
                        continue
                return port


_PORTS = _PortBlocks()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on, that no other test process (of this run
    or another) is given: see :class:`_PortBlocks`."""
    return _PORTS.take()


def run_cli(
    argv: list[str] | tuple[str, ...],
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    *,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``tidegate *argv`` run to its end in ``env``, as ``subprocess.run`` with
    ``capture_output=True, text=True`` would: forked from this test process's fork server
    (tests/forkserver.py: the CLI's imports made once, a command 0.1-0.3 s of CPU instead
    of 0.6-2), or exec'd as ``python -m gateway`` where ``env`` holds what an interpreter
    reads at its start (:func:`~tests.forkserver.can_fork`)."""
    folder = str(cwd if cwd is not None else Path.cwd())
    if can_fork(env):
        return fork_server().run(list(argv), env, folder, stdin=stdin, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", "gateway", *argv],
        env=dict(env),
        cwd=folder,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_module(
    module: str,
    argv: list[str] | tuple[str, ...],
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    *,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m module *argv`` run to its end in ``env`` (a lake job's own entry point,
    ``tiering``), as :func:`run_cli` runs ``tidegate``: forked where the environment allows,
    else exec'd."""
    folder = str(cwd if cwd is not None else Path.cwd())
    if can_fork(env):
        return fork_server().run(list(argv), env, folder, timeout=timeout, module=module)
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        env=dict(env),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Seconds a service the tests start may take to listen and answer. Generous: a process that
#: dies is noticed at once (``wait_for_port`` watches it), so the budget is spent only by one
#: that is slow, as a loaded machine makes every process (four test workers on two cores,
#: and other builds beside them: at a load average of 40 a gateway once wrote nothing and
#: listened on nothing for 60 s, and every test of its module errored).
START_TIMEOUT_S = 120.0


def wait_for_port(
    port: int, timeout: float = START_TIMEOUT_S, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def require_binary(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is required by the tests and was not found on PATH: {hint}")
    return path


class RedisServer:
    """A redis-server process of our own, in its own folder, on a free port.

    ``appendfsync always`` so an acknowledged write survives kill -9 of Redis itself.
    """

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        #: More redis-server arguments (a cluster node's).
        self.extra_args: list[str] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = require_binary("redis-server", "apt-get install redis-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--logfile",
                str(self.workdir / "redis.log"),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, proc=self.proc)
        self._wait_loaded()
        return self

    def _wait_loaded(self) -> None:
        import redis

        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def kill(self) -> None:
        """kill -9: no shutdown hook, no final fsync."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc, 10)

    def restart(self) -> None:
        self.kill()
        self.start()


class RedisClusterServer:
    """A Redis Cluster of three masters (no replicas), each a :class:`RedisServer` process
    of our own, joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.nodes = [RedisServer(workdir / f"node{i}") for i in range(masters)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisClusterServer:
        cli = require_binary("redis-cli", "apt-get install redis-tools")
        for node in self.nodes:
            node.extra_args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(node.workdir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                # The bus port defaults to port + 10000, past 65535 for a high free port.
                "--cluster-port",
                str(free_port()),
            ]
            node.start()
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        import redis

        deadline = time.monotonic() + START_TIMEOUT_S
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            try:
                while client.cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise TimeoutError("the Redis Cluster never reached state ok")
                    time.sleep(0.1)
            finally:
                client.close()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def postgres_bindir() -> Path:
    """The folder of PostgreSQL's server binaries (``initdb``, ``postgres``)."""
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "postgres").exists():
            return folder
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, postgres) are required by the tests and were "
        "not found on PATH or under /usr/lib/postgresql: apt-get install postgresql"
    )


class PostgresServer:
    """A PostgreSQL server of our own: ``initdb`` in a temporary folder, a free port, trust
    authentication on 127.0.0.1 only, no fsync (the tests never crash PostgreSQL itself).

    PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
    unprivileged ``postgres`` (or ``nobody``) user, which owns only this folder. That user
    must be able to reach the folder: give one in a world-traversable place such as
    ``tempfile.mkdtemp()`` (not pytest's private temporary root, which every new pytest
    session closes again).
    """

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _user(self) -> dict[str, Any]:
        """Arguments of ``subprocess`` that drop root: that user, its group and no other."""
        if os.geteuid() != 0:
            return {}
        import pwd

        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        raise RuntimeError("the tests run as root and no unprivileged user exists for PostgreSQL")

    def start(self) -> PostgresServer:
        bindir = postgres_bindir()
        user = self._user()
        data = self.workdir / "data"
        self.workdir.mkdir(parents=True, exist_ok=True)
        if user:
            os.chown(self.workdir, user["user"], user["group"])
        log = self.workdir / "postgres.log"
        init = subprocess.run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            **user,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed in {data}: {init.stderr.decode(errors='replace')}")
        with log.open("wb") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.workdir}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=self.workdir,
                **user,
            )
        wait_for_port(self.port, proc=self.proc)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user="postgres", dbname="postgres"
                ):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc, 20)


@contextlib.contextmanager
def scratch_database(base_url: str, prefix: str) -> Iterator[str]:
    """A database of our own on the PostgreSQL server at ``base_url``, dropped afterwards:
    the URL to it. Never touches another database of that server."""
    import uuid

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    base = make_url(base_url)
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


class MotoServer:
    """moto's S3 server as a real process on a free port, reached over HTTP."""

    ACCESS_KEY = "testing"
    SECRET_KEY = "testing"
    REGION = "us-east-1"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "moto.log", "ab")  # noqa: SIM115 - owned by the child
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        wait_for_port(self.port, proc=self.proc)
        return self

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.ACCESS_KEY,
            aws_secret_access_key=self.SECRET_KEY,
            region_name=self.REGION,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def cold_s3_settings(self) -> dict[str, Any]:
        """The ``cold.s3`` config section for this server."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.ACCESS_KEY,
            "secret_access_key": self.SECRET_KEY,
            "region": self.REGION,
            "path_style": True,
        }

    def gateway_env(self, warehouse: str, presign_expiry_s: int = 600) -> dict[str, str]:
        """A gateway's environment for an ``s3://`` warehouse on this server."""
        return {
            "TIDEGATE_COLD__WAREHOUSE": warehouse,
            "TIDEGATE_COLD__S3__ENDPOINT": self.endpoint,
            "TIDEGATE_COLD__S3__ACCESS_KEY_ID": self.ACCESS_KEY,
            "TIDEGATE_COLD__S3__SECRET_ACCESS_KEY": self.SECRET_KEY,
            "TIDEGATE_COLD__S3__REGION": self.REGION,
            "TIDEGATE_COLD__S3__PATH_STYLE": "true",
            "TIDEGATE_COLD__PRESIGN_EXPIRY_S": str(presign_expiry_s),
        }

    def stop(self) -> None:
        stop_process(self.proc, 10)

    # IAM enforcement ------------------------------------------------------------------
    ACCOUNT = "123456789012"

    def iam(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        import boto3

        return boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key or self.ACCESS_KEY,
            aws_secret_access_key=secret_key or self.SECRET_KEY,
            region_name=self.REGION,
        )

    def user_with_policy(self, name: str, statements: list[dict[str, Any]]) -> tuple[str, str]:
        """An IAM user with an inline policy of ``statements``: its (access key, secret)."""
        import json

        iam = self.iam(*self.admin_keys) if self.enforcing else self.iam()
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": statements}
        iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
        made = iam.create_access_key(UserName=name)["AccessKey"]
        return made["AccessKeyId"], made["SecretAccessKey"]

    def role_with_policy(self, name: str, statements: list[dict[str, Any]]) -> str:
        """An IAM role any principal of the account may assume, with an inline policy of
        ``statements``: its ARN."""
        import json

        iam = self.iam(*self.admin_keys) if self.enforcing else self.iam()
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}
            ],
        }
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
        policy = {"Version": "2012-10-17", "Statement": statements}
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
        return str(arn["Role"]["Arn"])

    enforcing = False
    admin_keys: tuple[str, str] = ("", "")

    def enforce_iam(self) -> None:
        """From now on every request must be signed by an IAM user's (or an assumed role's)
        keys and be allowed by its policies (moto's IAM enforcement). An administrator
        user (every action allowed) is made first: :attr:`admin_keys`."""
        import httpx

        self.admin_keys = self.user_with_policy(
            "tests-admin", [{"Effect": "Allow", "Action": "*", "Resource": "*"}]
        )
        httpx.post(f"{self.endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()
        self.enforcing = True


def connect(target: str, **kwargs: Any) -> Client:
    """A gRPC client of the gateway at ``target``: the one place tests (and the child
    processes they start) build clients, so credentials are added here."""
    from gateway.client import Client

    return Client(target, **kwargs)


def connect_async(target: str, **kwargs: Any) -> AsyncClient:
    """The asyncio twin of :func:`connect`; call it inside the loop that will use it."""
    from gateway.client import AsyncClient

    return AsyncClient(target, **kwargs)


#: Seconds a client the harness builds keeps trying a gateway it started before giving up
#: (see :meth:`GatewayProcess.client`).
FIRST_CONTACT_S = 30.0


class GatewayProcess:
    """``python -m gateway serve`` as a real process, configured only by the env we give it.

    It runs with an operator key of its own (``TIDEGATE_AUTH__OPERATOR_KEY``, unless the
    env given sets one) and, at first start, creates a tenant and an API key for it, so
    :meth:`client` and :meth:`http_client` authenticate as that tenant.
    """

    def __init__(
        self,
        data_dir: Path,
        env: Mapping[str, str] | None = None,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.extra_env = dict(env or {})
        # The Flight edge is on unless the env says otherwise, so every SDK scan of the
        # suite goes through it (tests that want gRPC scans pass ``flight=False``).
        self.flight_port = int(
            self.extra_env.setdefault("TIDEGATE_SERVER__FLIGHT_PORT", str(free_port()))
        )
        # The Kafka listener is off unless a test gives it a port (tests/kafka do): on in
        # `tidegate serve`, but each listener costs a gateway its Kafka imports (kio's
        # message types, ~0.3 s), and the suite starts some 500 gateways.
        self.kafka_port = int(self.extra_env.setdefault("TIDEGATE_KAFKA__PORT", "0"))
        self.operator_key = self.extra_env.setdefault(
            "TIDEGATE_AUTH__OPERATOR_KEY", f"tgop_test_{secrets.token_hex(16)}"
        )
        #: The bootstrap tenant and its key; pass both to share them with another gateway
        #: on the same metadata store.
        self.tenant = tenant or f"t{secrets.token_hex(6)}"
        self.api_key = api_key
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "gateway.log"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
        env.update(
            {
                "TIDEGATE_DATA_DIR": str(self.data_dir),
                "TIDEGATE_SERVER__GRPC_PORT": str(self.grpc_port),
                "TIDEGATE_SERVER__HTTP_PORT": str(self.http_port),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def start(
        self, timeout: float = START_TIMEOUT_S, *, imports: Path | None = None
    ) -> GatewayProcess:
        """Start the gateway and wait until it is ready. ``imports``: a forked gateway writes
        there, when it exits, the modules it imported after the fork (tests/forkserver.py)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = self.env()
        if can_fork(env):
            # `tidegate serve` forked from a process that made its imports once
            # (tests/forkserver.py): the same command, a second less of CPU per start.
            self.proc = fork_server().start(
                ["serve"],
                env,
                str(REPO_ROOT),
                str(self.log_path),
                imports=str(imports) if imports else None,
            )
        else:
            log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve"],
                env=env,
                cwd=str(REPO_ROOT),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
        try:
            wait_for_port(self.grpc_port, timeout, self.proc)
            wait_for_port(self.http_port, timeout, self.proc)
            self._wait_ready(timeout)
            if self.api_key is None:
                with self.admin() as admin:
                    admin.create_tenant(self.tenant)
                    self.api_key = admin.issue_key(self.tenant)[1]
        except Exception as exc:
            raise RuntimeError(f"gateway did not start: {exc}\n{self.log()}") from exc
        return self

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.http_url}/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError("gateway /readyz never answered 200")

    def client(self, **kwargs: Any) -> Client:
        """A gRPC client for this gateway. Tests build clients only through here (and
        :meth:`http_client`), so credentials are added in one place: the bootstrap
        tenant's key unless ``api_key`` is given (``api_key=None``: no credential).

        The first contact may take :data:`FIRST_CONTACT_S` (not the SDK's 5 s): this gateway
        answered ``/readyz`` when it started, so a slow first answer is a loaded machine
        (several test workers on two cores), not a wrong address."""
        kwargs.setdefault("api_key", self.api_key)
        kwargs.setdefault("connect_timeout", FIRST_CONTACT_S)
        return connect(self.grpc_target, **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        """An asyncio gRPC client (see :meth:`client`); call it inside the loop that uses it."""
        kwargs.setdefault("api_key", self.api_key)
        kwargs.setdefault("connect_timeout", FIRST_CONTACT_S)
        return connect_async(self.grpc_target, **kwargs)

    def http_client(self, *, api_key: str | bool | None = True, **kwargs: Any) -> httpx.Client:
        """An HTTP client for this gateway (see :meth:`client`); ``api_key=None`` sends no
        credential, a string sends that key."""
        import httpx

        kwargs.setdefault("timeout", 30)
        key = self.api_key if api_key is True else api_key
        headers = dict(kwargs.pop("headers", {}) or {})
        if key:
            headers.setdefault("authorization", f"Bearer {key}")
        return httpx.Client(base_url=self.http_url, headers=headers, **kwargs)

    def admin(self) -> AdminClient:
        """A gRPC admin client holding this gateway's operator key."""
        from gateway.client import AdminClient

        return AdminClient(
            self.grpc_target, operator_key=self.operator_key, connect_timeout=FIRST_CONTACT_S
        )

    def channel(self, api_key: str | bool | None = True, **kwargs: Any) -> grpc.Channel:
        """A raw gRPC channel sending the bootstrap tenant's key (or ``api_key``)."""
        import grpc

        from gateway.client._auth import authorized_channel

        key = self.api_key if api_key is True else api_key
        return authorized_channel(grpc.insecure_channel(self.grpc_target, **kwargs), key or None)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, timeout: float = START_TIMEOUT_S) -> GatewayProcess:
        """SIGKILL, then start again on the same data folder and the same ports, so
        clients connected to it reconnect by themselves."""
        self.kill()
        return self.start(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def running(service: RedisServer | GatewayProcess | MotoServer) -> Iterator[None]:
    try:
        yield
    finally:
        service.stop()


def java_home() -> str:
    """The folder of the Java runtime on PATH (or ``JAVA_HOME``); a clear error when absent."""
    configured = os.environ.get("JAVA_HOME")
    if configured and Path(configured, "bin", "java").exists():
        return configured
    java = require_binary(
        "java", "Spark needs a Java 17+ runtime: apt-get install openjdk-17-jre-headless"
    )
    return str(Path(java).resolve().parent.parent)


class SparkCluster:
    """A standalone Spark cluster of our own: one master and ``workers`` workers, each a JVM
    started with the pyspark wheel's own ``bin/spark-class``, on free ports, in a folder of
    its own.

    The daemons start with a clean environment (a short ``PATH``, ``JAVA_HOME``,
    ``SPARK_HOME`` and Spark's own variables; nothing of the test process, so no
    ``TIDEGATE_*``, ``AWS_*``, ``PYTHONPATH`` or ``VIRTUAL_ENV``), and the executors a worker
    starts inherit the worker's: whatever an application's executors need must come through
    its Spark configuration (``spark.pyspark.python``, ``spark.executorEnv.*``), as on a
    cluster of other machines. Each daemon leads a process group of its own (its executors
    and their Python workers are in it), and :meth:`stop` ends every group, so no JVM
    outlives the cluster.
    """

    #: Cores and memory of each worker (and so of each application's executors).
    CORES = 1
    MEMORY = "512m"
    #: Heap of the master's and the workers' own JVMs.
    DAEMON_MEMORY = "256m"
    #: Options of every JVM of the cluster and its applications: short-lived JVMs on two
    #: busy cores start faster with the client compiler alone and one GC thread, and
    #: without verifying the bytecode of the classes they load from Spark's own jars and
    #: ours (a tenth of a Spark JVM's start; the JDK's own classes are never verified).
    JVM_OPTS = (
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
    )

    def __init__(self, workdir: Path, workers: int = 2) -> None:
        import pyspark

        self.workdir = workdir
        self.spark_home = Path(pyspark.__file__).resolve().parent
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_ports = [(free_port(), free_port()) for _ in range(workers)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def daemon_env(self) -> dict[str, str]:
        """The whole environment of the master and the workers (see the class docstring)."""
        conf = self.workdir / "conf"  # empty: no spark-defaults.conf or spark-env.sh
        conf.mkdir(parents=True, exist_ok=True)
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
            "JAVA_HOME": java_home(),
            "SPARK_HOME": str(self.spark_home),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_DAEMON_MEMORY": self.DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": self.JVM_OPTS,
            # No REST submission server: it would listen on the fixed port 6066.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [str(self.spark_home / "bin" / "spark-class"), *args],
            env=self.daemon_env(),
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, executors included
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> SparkCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            master = self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ],
            )
            wait_for_port(self.port, proc=master)
            wait_for_port(self.webui_port, proc=master)
            for i, (port, webui) in enumerate(self.worker_ports):
                work = self.workdir / f"worker{i}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    f"worker{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--webui-port",
                        str(webui),
                        "--cores",
                        str(self.CORES),
                        "--memory",
                        self.MEMORY,
                        "--work-dir",
                        str(work),
                        self.master_url,
                    ],
                )
            self._wait_workers()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"the Spark cluster did not start: {exc}\n{self.log()}") from exc
            raise
        return self

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster (its ``/json/``: workers, applications)."""
        import httpx

        answer = httpx.get(f"{self.webui_url}/json/", timeout=5)
        answer.raise_for_status()
        state: dict[str, Any] = answer.json()
        return state

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def _wait_workers(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[1]} exited with {proc.returncode}")
            # ValueError: a master still starting may answer with a page that is not JSON.
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if len(self.alive_workers()) == len(self.worker_ports):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {len(self.worker_ports)} workers registered")
            time.sleep(0.2)

    def submit_conf(self) -> dict[str, str]:
        """The Spark configuration an application on this cluster needs: where the master
        is, a driver reachable on 127.0.0.1, executors that fit the workers (one core and
        :attr:`MEMORY` each, one per worker) and this virtualenv's Python on the executors
        (where tidegate is installed, as on a cluster's machines)."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": self.MEMORY,
            "spark.executor.cores": str(self.CORES),
            "spark.executor.memory": self.MEMORY,
            "spark.driver.extraJavaOptions": self.JVM_OPTS,
            "spark.executor.extraJavaOptions": self.JVM_OPTS,
            "spark.cores.max": str(self.CORES * len(self.worker_ports)),
            # A job waits for an executor on every worker before its first task (else the
            # first executor to register may run them all).
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(START_TIMEOUT_S)}s",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
        }

    def submit_args(self, conf: Mapping[str, str] | None = None) -> list[str]:
        """``spark-submit`` of the wheel with :meth:`submit_conf` and ``conf`` as ``--conf``
        flags; the application (a ``.py`` file and its arguments) follows."""
        merged = {**self.submit_conf(), **(conf or {})}
        args = [str(self.spark_home / "bin" / "spark-submit")]
        for key, value in merged.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def defaults_conf(self, folder: Path, conf: Mapping[str, str] | None = None) -> Path:
        """A ``SPARK_CONF_DIR`` holding a ``spark-defaults.conf`` of :meth:`submit_conf` and
        ``conf``: the Spark configuration of a program that starts its own SparkSession
        (``tidegate tier --runner spark``) rather than being submitted."""
        folder.mkdir(parents=True, exist_ok=True)
        merged = {**self.submit_conf(), **(conf or {})}
        lines = [f"{key} {value}" for key, value in merged.items()]
        (folder / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
        return folder

    def executors_by_app(self) -> dict[str, set[str]]:
        """Which workers ran executors of each application (by application id), from the
        workers' own ``/json/``."""
        import httpx

        out: dict[str, set[str]] = {}
        for i, (_, webui) in enumerate(self.worker_ports):
            answer = httpx.get(f"http://127.0.0.1:{webui}/json/", timeout=5)
            answer.raise_for_status()
            state = answer.json()
            for executor in state.get("executors", []) + state.get("finishedexecutors", []):
                out.setdefault(str(executor["appid"]), set()).add(f"worker{i}")
        return out

    def log(self) -> str:
        out = []
        for path in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def process_groups(self) -> list[int]:
        """The process groups of the daemons still running (or of their children)."""
        alive = []
        for proc in self.procs:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                continue
            alive.append(proc.pid)
        return alive

    def stop(self) -> None:
        """SIGTERM to every daemon's process group (workers end their executors), then
        SIGKILL to whatever of a group is left; waits until every group is empty."""
        for proc in reversed(self.procs):  # workers first, then the master
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while self.process_groups() and time.monotonic() < deadline:
            for proc in self.procs:
                proc.poll()  # reap the leaders
            time.sleep(0.1)
        for pgid in self.process_groups():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        deadline = time.monotonic() + 10
        while self.process_groups() and time.monotonic() < deadline:
            time.sleep(0.1)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 and its key, written in
    ``folder`` by openssl: (certificate, key) paths."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            require_binary("openssl", "apt-get install openssl"),
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
