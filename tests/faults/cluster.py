"""The processes a fault run works against, per hot tier, built from tests/services.

- ``redis``: two redis-servers (``appendfsync always``), the hot tier's shards ``default``
  and ``s1``, each behind a :class:`ChaosProxy`, two gateways sharing them, one metadata
  store, one Iceberg catalog and warehouse;
- ``disk``: one gateway (the disk tier is single node) whose hot folder is a small ext4
  filesystem of its own on a loop device, so that the disk can fill up and lose power
  (:meth:`Cluster.power_cut`), with the seed's fsync policy.

Every gateway's gRPC, HTTP and Arrow Flight ports sit behind a proxy too: clients reach the
gateways only through them. The gateways run the embedded tiering schedule every second and load the
clock shim (``clockshim/sitecustomize.py``) so the suite can jump their wall clock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gateway.wire.errors import AlreadyExists, Unavailable
from tests.faults.proxy import ChaosProxy
from tests.forkserver import can_fork, fork_server
from tests.services import REPO_ROOT, GatewayProcess, RedisServer

T = TypeVar("T")
#: The Redis shards of a ``redis`` cluster: new partitions spread over both, and the
#: ``shard_move`` fault moves them between the two.
SHARDS = ("default", "s1")
CLOCK_SHIM = Path(__file__).resolve().parent / "clockshim"
HOT_DISK_BYTES = 64 * 1024 * 1024


@dataclass
class Front:
    """The proxies clients reach one gateway through."""

    grpc: ChaosProxy
    http: ChaosProxy
    #: In front of the gateway's Arrow Flight edge, when it has one.
    flight: ChaosProxy | None = None

    @property
    def flight_location(self) -> str | bool:
        """The SDK's ``flight`` argument: this proxy, or no Flight at all."""
        return f"grpc+tcp://127.0.0.1:{self.flight.port}" if self.flight else False

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}"


@dataclass
class Cluster:
    tier: str
    root: Path
    #: The disk tier's fsync policy (``batch``, ``interval``, ``never``).
    fsync: str = "batch"
    gateways: list[GatewayProcess] = field(default_factory=list)
    fronts: list[Front] = field(default_factory=list)
    #: The first Redis shard (``default``) and the proxy the gateways reach it through.
    redis: RedisServer | None = None
    redis_proxy: ChaosProxy | None = None
    #: Every Redis shard by name, with its proxy (``default`` is ``redis`` above).
    shards: dict[str, tuple[RedisServer, ChaosProxy]] = field(default_factory=dict)
    hot_mount: Path | None = None
    clock_file: Path | None = None
    #: (tenant, api key) per tenant of the run.
    tenants: list[tuple[str, str]] = field(default_factory=list)
    jobs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: More settings of every process (the soak runs the lake maintenance jobs so).
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The run's SparkSession when it has one: the Spark writer appends through it.
    spark: Any = None
    #: Whether the gateways run under the clock shim (its ``clock_jump`` fault needs it).
    #: Without it nothing acts before their first line, so they are forked from the test
    #: process's fork server (tests/forkserver.py) like every other gateway of the suite,
    #: and a run that only kills them restarts each in 0.3 s of CPU, not 2.
    clock_shim: bool = True

    @property
    def proxies(self) -> list[ChaosProxy]:
        found = [p for f in self.fronts for p in (f.grpc, f.http, f.flight) if p is not None]
        return found + [proxy for _, proxy in self.shards.values()]

    def settings_env(self) -> dict[str, str]:
        """What every process of the cluster (gateways, tiering jobs) is configured with."""
        shared = self.root / "shared"
        env = {
            "TIDEGATE_METADATA__URL": f"sqlite:///{shared / 'metadata.db'}",
            "TIDEGATE_COLD__WAREHOUSE": str(shared / "warehouse"),
            "TIDEGATE_COLD__CATALOG__TYPE": "sql",
            "TIDEGATE_COLD__CATALOG__URI": f"sqlite:///{shared / 'catalog.db'}",
            "TIDEGATE_TIERING__INTERVAL_S": "1",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "2",
            "TIDEGATE_SERVER__MAX_REQUEST_BYTES": str(1024 * 1024),
            **self.extra_env,
        }
        if self.tier == "redis":
            shards = [
                {"name": name, "url": f"redis://127.0.0.1:{proxy.port}/0"}
                for name, (_, proxy) in self.shards.items()
            ]
            env.update(
                {
                    "TIDEGATE_HOT__TYPE": "redis",
                    "TIDEGATE_HOT__SHARDS": json.dumps(shards),
                    "TIDEGATE_HOT__SOCKET_TIMEOUT_S": "2",
                }
            )
        else:
            assert self.hot_mount is not None
            env.update(
                {
                    "TIDEGATE_HOT__TYPE": "disk",
                    "TIDEGATE_HOT__FSYNC": self.fsync,
                    "TIDEGATE_HOT__PATH": str(self.hot_mount / "hot"),
                    # The single disk gateway holds its hot folder, so no job can run
                    # beside it: it compacts on its own schedule, often, under the faults.
                    "TIDEGATE_COMPACTION__INTERVAL_S": "4",
                    **self.extra_env,
                }
            )
        return env

    def gateway_env(self) -> dict[str, str]:
        assert self.clock_file is not None
        shim = {
            "PYTHONPATH": f"{CLOCK_SHIM}{os.pathsep}{REPO_ROOT}",
            "TIDEGATE_FAULTS_CLOCK_FILE": str(self.clock_file),
        }
        return {
            **self.settings_env(),
            **(shim if self.clock_shim else {}),
            "TIDEGATE_LOG__LEVEL": "WARNING",
            "TIDEGATE_SERVER__SHUTDOWN_GRACE_S": "1",
        }

    def start(self, hot_env: dict[str, str] | None = None) -> Cluster:
        """Start everything; ``hot_env`` overrides the hot tier settings (a test's own,
        deliberately broken backend)."""
        (self.root / "shared").mkdir(parents=True, exist_ok=True)
        self.clock_file = self.root / "clock-offset"
        self.clock_file.write_text("0")
        if self.tier == "redis":
            for name in SHARDS:
                server = RedisServer(self.root / f"redis-{name}").start()
                self.shards[name] = (server, ChaosProxy(server.port).start())
            self.redis, self.redis_proxy = self.shards[SHARDS[0]]
        else:
            self.hot_mount = mount_loop_disk(self.root / "hotdisk", HOT_DISK_BYTES)
        env = self.gateway_env()
        if hot_env:
            env = {k: v for k, v in env.items() if not k.startswith("TIDEGATE_HOT__")}
        env = {
            **env,
            "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_faults_{secrets.token_hex(16)}",
            **(hot_env or {}),
        }
        # The tenants are made here rather than by GatewayProcess, so that a slow answer
        # is retried (see settle) instead of failing the start.
        tenant = f"t{secrets.token_hex(6)}"
        for i in range(2 if self.tier == "redis" else 1):
            gw = GatewayProcess(self.root / f"gw{i}", env, tenant=tenant, api_key="pending")
            self.gateways.append(gw.start())
        for gw in self.gateways:
            flight = ChaosProxy(gw.flight_port).start() if gw.flight_port else None
            self.fronts.append(
                Front(ChaosProxy(gw.grpc_port).start(), ChaosProxy(gw.http_port).start(), flight)
            )
        with self.gateways[0].admin() as admin:
            for name in (tenant, f"{tenant}b"):
                settle(lambda n=name: admin.create_tenant(n))
                key = settle(lambda n=name: admin.issue_key(n))
                assert key is not None
                self.tenants.append((name, key[1]))
        for gw in self.gateways:
            gw.api_key = self.tenants[0][1]
        return self

    def create_tables(self, tables: list[tuple[str, int]], schema: dict[str, str]) -> None:
        """One table per tenant, in order."""
        for (table, partitions), (_, key) in zip(tables, self.tenants, strict=True):
            with self.gateways[0].client(api_key=key) as c:
                settle(lambda c=c, t=table, n=partitions: c.create_table(t, schema, partitions=n))

    def heal(self) -> None:
        """Undo every fault still in force: proxies forward, stopped processes continue,
        dead ones start again, the disk has room."""
        for proxy in self.proxies:
            proxy.set("pass")
        procs: list[Any] = [gw.proc for gw in self.gateways]
        procs += [server.proc for server, _ in self.shards.values()]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        for server, _ in self.shards.values():
            if server.proc is None or server.proc.poll() is not None:
                server.start()
        for gw in self.gateways:
            if gw.proc is None or gw.proc.poll() is not None:
                gw.start()
        if self.hot_mount is not None:
            for balloon in self.hot_mount.glob("balloon*"):
                balloon.unlink()
        for job in self.jobs:
            if job.poll() is None:
                job.kill()
            job.wait(10)
        interrupted = [j for j in self.jobs if "move" in j.args and j.returncode != 0]
        self.jobs.clear()
        if interrupted:
            # A shard mover killed before its seal leaves its intent: the operator's
            # recovery (what every drain runs first) finishes it.
            self.job("shard", "recover").wait(120)

    def power_cut(self, down_s: float) -> None:
        """The disk tier's machine loses power: its filesystem stops at once, keeping
        only what had reached the device (ext4's shutdown without flushing its journal,
        as xfstests' ``godown`` does: unsynced writes are dropped), and the gateway dies
        with it. ``down_s`` later the disk is mounted again (the journal replays) and the
        gateway starts on what it finds."""
        assert self.hot_mount is not None
        # The machine stops as one: no gateway thread may run once the disk is gone. A
        # gateway that ran on after the filesystem's shutdown could acknowledge a batch
        # whose fsync straddled it: ext4 can return 0 from such an fsync although the
        # journal commit that held the data's blocks was aborted (python -m
        # tests.faults.powercut_check: 10 trials in 100 lost an fsynced block). So the
        # gateways are stopped, every thread of theirs seen stopped, before the filesystem
        # shuts down.
        pids = [
            gw.proc.pid for gw in self.gateways if gw.proc is not None and gw.proc.poll() is None
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            wait_stopped(pid)
        shutdown_filesystem(self.hot_mount)
        for gw in self.gateways:
            gw.kill()
        time.sleep(down_s)
        remount_loop_disk(self.hot_mount)
        for gw in self.gateways:
            gw.start()

    def job_clock(self, ahead_s: float) -> dict[str, str]:
        """The settings of a job whose host's wall clock runs ``ahead_s`` seconds ahead of
        the gateways' (the clock shim, on a file of its own)."""
        clock = self.root / f"job-clock-{secrets.token_hex(4)}"
        clock.write_text(str(ahead_s))
        return {
            "PYTHONPATH": f"{CLOCK_SHIM}{os.pathsep}{REPO_ROOT}",
            "TIDEGATE_FAULTS_CLOCK_FILE": str(clock),
        }

    def shard_of(self, tenant: str, table: str, partition: int) -> str:
        """The shard taking the appends of a partition now, from the metadata store."""
        from gateway.meta import MetadataStore

        namespace, name = table.split(".")
        meta = MetadataStore(self.settings_env()["TIDEGATE_METADATA__URL"])
        try:
            for p in meta.placements(tenant=tenant):
                if (p.namespace, p.name, p.partition) == (namespace, name, partition):
                    return p.shard
        finally:
            meta.close()
        raise LookupError(f"no placement for {tenant} {table}/{partition}")

    def tier_job(self) -> subprocess.Popen[bytes]:
        """``tidegate tier`` beside the gateways (the Spark-free runner), as the CronJob runs it."""
        return self.job("tier")

    def job(self, *command: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``tidegate <command>`` beside the gateways on their configuration (and ``env``),
        as a CronJob or an operator runs it."""
        full = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
        full.update(self.settings_env())
        full["TIDEGATE_DATA_DIR"] = str(self.root / f"{command[0]}job")
        full.update(env or {})
        # Every job's output, one file per command, for a seed's post-mortem.
        path = self.root / f"{command[0]}-jobs.log"
        with path.open("ab") as log:
            log.write(f"--- tidegate {' '.join(command)}\n".encode())
            log.flush()
            if can_fork(full):  # as the gateways (tests/forkserver.py); not under the clock shim
                job: subprocess.Popen[bytes] = fork_server().start(
                    command, full, str(REPO_ROOT), str(path)
                )
            else:
                job = subprocess.Popen(
                    [sys.executable, "-m", "gateway", *command],
                    env=full,
                    cwd=str(REPO_ROOT),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        self.jobs.append(job)
        return job

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        for gw in self.gateways:  # SIGTERM to all first: they drain at the same time
            if gw.proc is not None and gw.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(gw.proc.pid, signal.SIGCONT)
                    gw.proc.terminate()
        for gw in self.gateways:
            gw.stop()
        for job in self.jobs:
            if job.poll() is None:
                job.kill()
        for server, _ in self.shards.values():
            if server.proc is not None and server.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.proc.pid, signal.SIGCONT)
            server.stop()
        if self.hot_mount is not None:
            unmount(self.hot_mount)


def settle(call: Callable[[], T], attempts: int = 10) -> T | None:
    """``call()`` during setup, retried while the gateway is slow to answer (a loaded
    machine); an "already exists" means an earlier try went through."""
    for attempt in range(attempts):
        try:
            return call()
        except AlreadyExists:
            return None
        except Unavailable:
            if attempt == attempts - 1:
                raise
            time.sleep(1 + attempt)
    return None


#: ext4's ``EXT4_IOC_SHUTDOWN`` (``_IOR('X', 125, __u32)``) and its flag that drops what
#: the journal has not committed (``EXT4_GOING_FLAGS_NOLOGFLUSH``).
EXT4_IOC_SHUTDOWN = (2 << 30) | (4 << 16) | (ord("X") << 8) | 125
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def _image_of(path: Path) -> Path:
    return path.with_name(path.name + ".img")


def mount_loop_disk(path: Path, size: int) -> Path:
    """A fresh ext4 filesystem of ``size`` bytes on a loop device at ``path`` (the machine
    must let us mount: root, or a container with CAP_SYS_ADMIN). The fault suite fills it
    to run the disk out of space and shuts it down to cut its power."""
    path.mkdir(parents=True, exist_ok=True)
    image = _image_of(path)
    with image.open("wb") as f:
        f.truncate(size)
    steps = [
        ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
        ["mount", "-o", "loop", str(image), str(path)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"the fault suite needs a small filesystem of its own for the disk hot tier "
                f"and could not make an ext4 one on a loop device at {path} (`{' '.join(step)}`"
                f" failed; run as root or with CAP_SYS_ADMIN): {done.stderr.strip()}"
            )
    return path


def wait_stopped(pid: int, timeout_s: float = 10.0) -> None:
    """Return once every thread of process ``pid`` is stopped (or the process is gone):
    ``kill(SIGSTOP)`` only queues the signal, and a thread running on the other core
    could still send an answer meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            with contextlib.suppress(OSError):
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        if all(state in "tTZX" for state in states):
            return
        time.sleep(0.0005)
    raise RuntimeError(f"process {pid} did not stop within {timeout_s} s")


def shutdown_filesystem(path: Path) -> None:
    """Stop the filesystem mounted at ``path`` as a power cut would: every later I/O on it
    fails, and what was not on the device yet is gone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


def remount_loop_disk(path: Path) -> None:
    """Unmount the (shut down) filesystem at ``path`` and mount its image again."""
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if done.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot unmount {path}: {done.stderr.strip()}")
        time.sleep(0.2)
    subprocess.run(["mount", "-o", "loop", str(_image_of(path)), str(path)], check=True)


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
    _image_of(path).unlink(missing_ok=True)
