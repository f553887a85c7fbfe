"""Fault kinds, and the nemesis that injects them on a schedule drawn from the seed.

A fault kind is a function registered with :func:`fault`: it gets the cluster and the
nemesis's random generator, injects its fault, holds it, undoes it (or leaves the cluster
to :meth:`Cluster.heal`) and returns what it did, which goes into the history. New
subsystems add their kinds here (compaction killed mid-rewrite, a shard move cut at its
seal, the Spark writer killed between tasks and commit): one function each, with
``applies`` saying on which clusters it makes sense.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.faults.cluster import Cluster
from tests.faults.history import History

Inject = Callable[[Cluster, random.Random], dict[str, Any]]


@dataclass(frozen=True)
class FaultKind:
    name: str
    inject: Inject
    applies: Callable[[Cluster], bool]
    weight: float


FAULTS: dict[str, FaultKind] = {}


def fault(
    name: str, *, weight: float = 1.0, applies: Callable[[Cluster], bool] = lambda c: True
) -> Callable[[Inject], Inject]:
    def register(fn: Inject) -> Inject:
        FAULTS[name] = FaultKind(name, fn, applies, weight)
        return fn

    return register


def _redis(c: Cluster) -> bool:
    return c.tier == "redis"


def _disk(c: Cluster) -> bool:
    return c.tier == "disk"


@fault("gateway_kill", weight=1.5)
def gateway_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """SIGKILL one of the gateways mid-traffic, then start it again on its ports."""
    i = rng.randrange(len(c.gateways))
    down = rng.uniform(0.0, 1.0)
    c.gateways[i].kill()
    time.sleep(down)
    c.gateways[i].start()
    return {"target": f"gateway{i}", "down_s": round(down, 2)}


def _shard(c: Cluster, rng: random.Random) -> tuple[str, Any]:
    """A Redis shard of the cluster: its name and server."""
    names = sorted(c.shards)
    name = names[rng.randrange(len(names))]
    return f"redis-{name}", c.shards[name][0]


@fault("redis_kill", applies=_redis)
def redis_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """SIGKILL one shard's redis-server (AOF ``always``) and start it on the same folder
    and port."""
    name, server = _shard(c, rng)
    down = rng.uniform(0.0, 1.0)
    server.kill()
    time.sleep(down)
    server.start()
    return {"target": name, "down_s": round(down, 2)}


@fault("pause", weight=1.5)
def pause(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """SIGSTOP a gateway or a redis-server for a while, then SIGCONT (a long GC, a VM stall)."""
    targets: list[tuple[str, Any]] = [(f"gateway{i}", g.proc) for i, g in enumerate(c.gateways)]
    targets += [(f"redis-{n}", server.proc) for n, (server, _) in sorted(c.shards.items())]
    name, proc = targets[rng.randrange(len(targets))]
    held = rng.uniform(0.3, 3.0)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(held)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    return {"target": name, "held_s": round(held, 2)}


def _proxy(c: Cluster, rng: random.Random) -> tuple[str, Any]:
    named = [(f"client->gateway{i}.grpc", f.grpc) for i, f in enumerate(c.fronts)]
    named += [(f"client->gateway{i}.http", f.http) for i, f in enumerate(c.fronts)]
    named += [(f"client->gateway{i}.flight", f.flight) for i, f in enumerate(c.fronts) if f.flight]
    for shard, (_, proxy) in sorted(c.shards.items()):
        named += [(f"gateways->redis-{shard}", proxy)]
    return named[rng.randrange(len(named))]


@fault("net_cut", weight=1.5)
def net_cut(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Reset every connection through one proxy (clients or gateways must reconnect)."""
    name, proxy = _proxy(c, rng)
    return {"target": name, "connections": proxy.cut()}


@fault("net_delay")
def net_delay(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Slow one link: every chunk through the proxy waits, for a few seconds."""
    name, proxy = _proxy(c, rng)
    delay, held = rng.uniform(0.02, 0.3), rng.uniform(0.5, 3.0)
    proxy.set("delay", delay)
    try:
        time.sleep(held)
    finally:
        proxy.set("pass")
    return {"target": name, "delay_s": round(delay, 3), "held_s": round(held, 2)}


@fault("net_blackhole")
def net_blackhole(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Swallow everything through one link for a while (packets dropped, no reset), then
    reset what hung on it."""
    name, proxy = _proxy(c, rng)
    held = rng.uniform(0.5, 4.0)
    proxy.set("blackhole")
    try:
        time.sleep(held)
    finally:
        proxy.set("pass")
        proxy.cut()
    return {"target": name, "held_s": round(held, 2)}


@fault("tier_job_kill", applies=_redis)
def tier_job_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Start ``tidegate tier`` beside the gateways and SIGKILL it at a random point (before
    it reads, while it writes Parquet, around its commit, or after it finished)."""
    job = c.tier_job()
    after = rng.uniform(0.2, 5.0)
    try:
        job.wait(after)
        return {"target": "tier-job", "after_s": round(after, 2), "finished": job.returncode}
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait(10)
        return {"target": "tier-job", "after_s": round(after, 2), "killed": True}


def _run_and_kill(
    c: Cluster,
    rng: random.Random,
    target: str,
    command: list[str],
    points: list[str],
    env: str,
    env_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start ``tidegate <command>`` beside the gateways and have it die: at one of its
    crash points (``env`` names it; it SIGKILLs itself there) half the time, else SIGKILLed
    after a random while (which may find it before, in or after its work, or done). The
    nemesis goes on meanwhile: the job runs under the faults that follow (the heal kills
    what is left)."""
    extra = dict(env_extra or {})
    point = rng.choice(points) if rng.random() < 0.5 else None
    if point is not None:
        extra[env] = point
        job = c.job(*command, env=extra)
        return {"target": target, "crash_point": point}
    job = c.job(*command, env=extra)
    after = rng.uniform(0.5, 8.0)
    _kill_later(job, after)
    return {"target": target, "kill_after_s": round(after, 2)}


def _kill_later(job: subprocess.Popen[bytes], after: float) -> None:
    """SIGKILL ``job`` in ``after`` seconds unless it has finished."""

    def kill() -> None:
        if job.poll() is None:
            job.kill()

    timer = threading.Timer(after, kill)
    timer.daemon = True
    timer.start()


@fault("compact_job_kill", weight=0.5, applies=_redis)
def compact_job_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """``tidegate compact`` (rewriting the small files tiering leaves, beside tiering's
    commits) killed after planning, after writing, after committing, or at a random time."""
    points = ["after_plan", "after_write", "after_commit"]
    return _run_and_kill(
        c, rng, "compact-job", ["compact"], points, "TIDEGATE_COMPACTION_CRASH_POINT"
    )


@fault("expire_job_kill", weight=0.5, applies=_redis)
def expire_job_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """``tidegate expire`` (snapshots replaced over a minute ago, keeping the two newest,
    and the files only they referenced) killed between its expiring commit and its
    deletes, or at a random time, while scans and followers read. Its host's clock runs
    30-55 s ahead of the gateways' (the clock shim), so that a seed's few seconds of
    snapshots are old enough to go: the skew eats into the one-minute floor of
    ``expiry.retention_s``, and what is left (5-30 s) must still keep every read whole."""
    ahead = rng.uniform(30.0, 55.0)
    out = _run_and_kill(
        c,
        rng,
        "expire-job",
        ["expire"],
        ["after_expire"],
        "TIDEGATE_EXPIRY_CRASH_POINT",
        {"TIDEGATE_EXPIRY__KEEP_LAST": "2", **c.job_clock(ahead)},
    )
    return {**out, "clock_ahead_s": round(ahead, 1)}


@fault("shard_move", weight=0.5, applies=lambda c: len(c.shards) > 1)
def shard_move(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """``tidegate shard move`` of a random partition to the other Redis shard, under
    traffic (appends racing the seal); a third of the movers are SIGKILLed part way, and
    the heal finishes their moves with ``tidegate shard recover``. The nemesis goes on
    while the mover runs."""
    from tests.faults.keyworkload import KEY_TABLES
    from tests.faults.workload import TABLES

    # An append table or a key table (whose hot key index moves with its partition).
    i = rng.randrange(len(TABLES) + len(KEY_TABLES))
    table, partitions = (TABLES + KEY_TABLES)[i]
    tenant = c.tenants[i % len(TABLES)][0]
    partition = rng.randrange(partitions)
    current = c.shard_of(tenant, table, partition)
    target = next(name for name in sorted(c.shards) if name != current)
    job = c.job("shard", "move", tenant, table, str(partition), target)
    out: dict[str, Any] = {"target": f"{table}/{partition}", "from": current, "to": target}
    if rng.random() < 1 / 3:
        after = rng.uniform(0.5, 5.0)
        _kill_later(job, after)
        out["kill_after_s"] = round(after, 2)
    return out


@fault("disk_full", applies=_disk)
def disk_full(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Fill the disk hot tier's filesystem to the last byte for a while, then free it."""
    assert c.hot_mount is not None
    held = rng.uniform(0.5, 3.0)
    balloon = c.hot_mount / "balloon"
    written = 0
    with balloon.open("wb", buffering=0) as f:
        chunk = b"\0" * (1024 * 1024)
        while len(chunk) >= 512:
            try:
                written += f.write(chunk) or 0
            except OSError:  # ENOSPC: halve the chunk until not even 512 bytes fit
                chunk = chunk[: len(chunk) // 2]
    try:
        time.sleep(held)
    finally:
        balloon.unlink()
    return {"target": "hot-disk", "filled_bytes": written, "held_s": round(held, 2)}


@fault("power_cut", weight=0.7, applies=lambda c: _disk(c) and c.fsync == "batch")
def power_cut(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """The disk tier's machine loses power (:meth:`Cluster.power_cut`): unsynced writes
    are dropped and the gateway dies. Only where ``fsync=batch`` promises that nothing
    acknowledged survives a machine failure less (``interval`` and ``never`` promise
    less: docs/durability.md)."""
    down = rng.uniform(0.0, 1.0)
    c.power_cut(down)
    return {"target": "hot-disk", "down_s": round(down, 2)}


def _redis_client(server: Any) -> Any:
    import redis

    return redis.Redis(port=server.port, socket_timeout=10)


@fault("redis_flushall", weight=0.5, applies=_redis)
def redis_flushall(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """``FLUSHALL`` on one shard (an operator's mistake, an eviction of everything):
    every partition on it loses its hot state. What was acknowledged and not yet tiered
    is lost by design and must show as a recorded lost range (``tidegate.lost``)."""
    name, server = _shard(c, rng)
    client = _redis_client(server)
    try:
        keys = client.dbsize()
        client.flushall()
    finally:
        client.close()
    return {"target": name, "keys": keys, "loses_data": True}


@fault("redis_restart_empty", weight=0.5, applies=_redis)
def redis_restart_empty(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """One shard's redis-server restarted with nothing on disk, as a Redis without
    persistence comes back after ``shutdown nosave`` or a crash: SIGKILL, its AOF and
    RDB files removed, started again empty on the same port."""
    name, server = _shard(c, rng)
    down = rng.uniform(0.0, 1.0)
    server.kill()
    for item in server.workdir.iterdir():
        if item.name != "redis.log":
            if item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
    time.sleep(down)
    server.start()
    return {"target": name, "down_s": round(down, 2), "loses_data": True}


#: Faults whose effect Tidegate records as lost offsets (``tidegate.lost``) by design.
LOSES_DATA = frozenset({"redis_flushall", "redis_restart_empty"})


@fault("fd_exhaustion")
def fd_exhaustion(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Run one gateway out of file descriptors for a while: its soft ``RLIMIT_NOFILE``
    lowered (``prlimit``) to what it has open plus 0-8, so accepting a connection, opening
    a segment or a Parquet file fails with EMFILE; then the limit is given back."""
    i = rng.randrange(len(c.gateways))
    proc = c.gateways[i].proc
    assert proc is not None
    held = rng.uniform(0.5, 3.0)
    spare = rng.randint(0, 8)
    try:
        soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        used = len(os.listdir(f"/proc/{proc.pid}/fd"))
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (used + spare, hard))
    except (ProcessLookupError, FileNotFoundError):
        return {"target": f"gateway{i}", "skipped": "not running"}
    try:
        time.sleep(held)
    finally:
        with contextlib.suppress(ProcessLookupError):
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
    return {
        "target": f"gateway{i}",
        "open": used,
        "limit": used + spare,
        "held_s": round(held, 2),
        "survived": proc.poll() is None,
    }


@fault("slow_clients")
def slow_clients(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Strangers with no key hold connections to one gateway's edges (HTTP, gRPC, Flight):
    some idle (connected, nothing sent), some slow (an HTTP request's headers or body, or
    an HTTP/2 preface, a few bytes a second), for a few seconds, then go away. The
    gateway must keep serving the workload, and close what it holds too long."""
    i = rng.randrange(len(c.gateways))
    gw = c.gateways[i]
    ports = [gw.http_port, gw.grpc_port] + ([gw.flight_port] if gw.flight_port else [])
    n = rng.randint(20, 150)
    held = rng.uniform(1.0, 5.0)
    payloads = [
        b"",  # idle
        b"POST /v1/tables/fa/events/records HTTP/1.1\r\nHost: x\r\nContent-Length: 100000",
        b'POST /v1/tables HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n{"rows": [',
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ]
    conns: list[tuple[socket.socket, bytes]] = []
    for _ in range(n):
        port = ports[rng.randrange(len(ports))]
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            continue
        sock.setblocking(False)
        conns.append((sock, payloads[rng.randrange(len(payloads))]))
    closed = 0
    deadline = time.monotonic() + held
    step = 0
    while time.monotonic() < deadline:
        for sock, payload in conns:
            if step < len(payload):
                with contextlib.suppress(OSError):
                    sock.send(payload[step : step + 1])
        step += 1
        time.sleep(0.2)
    for sock, _ in conns:
        try:  # the gateway hung up (EOF or reset) on the ones it would not wait for
            if sock.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        sock.close()
    return {
        "target": f"gateway{i}",
        "connections": len(conns),
        "closed_by_gateway": closed,
        "held_s": round(held, 2),
    }


def _spark_workers(c: Cluster) -> list[int]:
    """The Python worker processes of the run's SparkSession (what runs the Spark writer's
    tasks): the children of the ``pyspark.daemon`` its JVM started."""
    if c.spark is None:
        return []
    jvm = c.spark.sparkContext._gateway.proc.pid
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    daemons = {pid for pid, ppid in parents.items() if ppid == jvm}
    return [pid for pid, ppid in parents.items() if ppid in daemons]


@fault("spark_worker_kill", applies=lambda c: c.spark is not None)
def spark_worker_kill(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """SIGKILL the Python workers of the Spark writer's tasks mid-write (an executor
    lost): the write fails or its tasks are retried; the writer runs it again under the
    same write id, and every record must be stored once."""
    wait = rng.uniform(0.0, 2.0)
    time.sleep(wait)
    workers: list[int] = []
    deadline = time.monotonic() + 10  # until a write runs (each one starts workers)
    while not workers and time.monotonic() < deadline:
        workers = _spark_workers(c)
        time.sleep(0.1)
    killed = 0
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return {"target": "spark-workers", "killed": killed, "after_s": round(wait, 2)}


@fault("clock_jump", weight=0.7, applies=lambda c: c.clock_shim)
def clock_jump(c: Cluster, rng: random.Random) -> dict[str, Any]:
    """Step the gateways' wall clock forward (past the hot retention) or back (a few
    seconds), and leave it there, as an NTP step does."""
    assert c.clock_file is not None
    now = float(c.clock_file.read_text() or 0)
    step = rng.choice([rng.uniform(5, 600), -rng.uniform(0.5, 30)])
    c.clock_file.write_text(str(now + step))
    return {"target": "gateways", "step_s": round(step, 2), "offset_s": round(now + step, 2)}


class Nemesis:
    """Injects faults one at a time, with pauses between them, until stopped: every other
    one from a round of every kind, rarest first, the rest drawn by weight. The seed fixes
    the sequence of kinds, targets and durations."""

    def __init__(
        self, cluster: Cluster, seed: int, history: History, kinds: list[str] | None = None
    ) -> None:
        self.cluster = cluster
        self.rng = random.Random(f"nemesis-{seed}")
        self.history = history
        names = kinds if kinds is not None else list(FAULTS)
        self.kinds = [FAULTS[n] for n in names if FAULTS[n].applies(cluster)]
        self.counts: Counter[str] = Counter()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> Nemesis:
        self._thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        if not self.kinds:
            return
        weights = [k.weight for k in self.kinds]
        # Every other fault comes from one round of every kind, the rarest first (ties in
        # the seed's order), the others are drawn by weight: even a short seed injects
        # the kinds random draws would seldom reach, and still the common ones.
        first = sorted(self.kinds, key=lambda k: (k.weight, self.rng.random()))
        n = 0
        while not self.stop.wait(self.rng.uniform(0.3, 1.5)):
            if first and n % 2 == 0:
                kind = first.pop(0)
            else:
                kind = self.rng.choices(self.kinds, weights)[0]
            n += 1
            self.history.record("fault", "nemesis", kind=kind.name, phase="start")
            try:
                details = kind.inject(self.cluster, self.rng)
            except Exception as exc:  # the fault itself failed: say so, keep going
                self.errors.append(f"{kind.name}: {exc!r}")
                details = {"error": repr(exc)[:300]}
            self.counts[kind.name] += 1
            self.history.record("fault", "nemesis", kind=kind.name, phase="end", **details)
