"""Issue 31's acceptance for outages: following consumers (the SDK in both flavours, and
``tidegate read --follow``), each a real process, keep their positions through two
restarts of every gateway and a rolling restart of two replicas (Redis tier, two gateway
processes sharing Redis and the metadata store, reached through one multi-address
target as a balancer would spread them); every record is read once, and each outage is
one line on stderr, never a traceback or gRPC's transport text."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.client import ExponentialBackoff, Retry
from tests.integration.conftest import gateway_env
from tests.integration.test_groups import wait_for
from tests.services import REPO_ROOT, GatewayProcess, RedisServer, connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FOLLOWER = """
import asyncio, sys
from tests.services import connect, connect_async

target, table, out_path, api_key, flavour = sys.argv[1:6]
OPTIONS = dict(poll_interval=0.02, max_records=200)

def write(out, batch):
    for n in batch.column("n").to_pylist():
        out.write(f"{n}\\n")
    out.flush()

def run_sync(out):
    with connect(target, api_key=api_key) as client:
        with client.consumer(table, **OPTIONS) as consumer:
            for batch in consumer.batches():
                write(out, batch)

async def run_aio(out):
    async with connect_async(target, api_key=api_key) as client:
        async with client.consumer(table, **OPTIONS) as consumer:
            async for batch in consumer.batches():
                write(out, batch)

with open(out_path, "w") as out:
    run_sync(out) if flavour == "sync" else asyncio.run(run_aio(out))
"""

#: What a restart must never print: a traceback, or the transport's own words.
RAW = ("Traceback", "failed to connect to all addresses", "StatusCode", "UNKNOWN:")


class Pair:
    """Two gateway replicas on one Redis, one metadata store and one Iceberg catalog."""

    def __init__(self, root: Path, redis: RedisServer) -> None:
        env = {
            **gateway_env("redis", redis),
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_METADATA__URL": f"sqlite:///{root / 'shared-metadata.db'}",
            "TIDEGATE_COLD__CATALOG__TYPE": "sql",
            "TIDEGATE_COLD__CATALOG__URI": f"sqlite:///{root / 'shared-catalog.db'}",
            "TIDEGATE_COLD__WAREHOUSE": str(root / "shared-warehouse"),
            "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_pair_{secrets.token_hex(16)}",
        }
        self.first = GatewayProcess(root / "gw1", env).start()
        self.second = GatewayProcess(
            root / "gw2", env, tenant=self.first.tenant, api_key=self.first.api_key
        ).start()
        self.gateways = (self.first, self.second)
        self.api_key = str(self.first.api_key)
        # Both replicas behind one name: gRPC tries the next address when one is down.
        self.target = "ipv4:" + ",".join(g.grpc_target for g in self.gateways)

    def restart_all(self, while_down: Callable[[], None] | None = None) -> None:
        """Every replica SIGKILLed at once, then started again on its ports (after
        ``while_down()`` returns, if given)."""
        for g in self.gateways:
            g.kill()
        if while_down is not None:
            while_down()
        for g in self.gateways:
            g.start()

    def rolling_restart(self) -> None:
        """One replica after the other, each drained with SIGTERM, as a deploy does."""
        for g in self.gateways:
            g.stop()
            g.start()

    def stop(self) -> None:
        for g in self.gateways:
            g.stop()


@pytest.fixture
def pair(tmp_path: Path, redis_server: RedisServer) -> Iterator[Pair]:
    p = Pair(tmp_path, redis_server)
    try:
        yield p
    finally:
        p.stop()


def _spawn(
    argv: list[str], env: dict[str, str], stderr: Path, stdout: Path | None = None
) -> subprocess.Popen[bytes]:
    """A follower process writing its stderr (and stdout) to files of its own."""
    with stderr.open("wb") as err, (stdout or Path(os.devnull)).open("wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stderr=err, stdout=out if stdout else None
        )


def _ids(path: Path, cli: bool) -> list[int]:
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if cli:
        return [json.loads(line)["n"] for line in lines if line.endswith("}")]
    return [int(line) for line in lines]


def _outages(stderr: Path) -> int:
    """The follower's lines saying it lost the gateway (one per outage)."""
    if not stderr.exists():
        return 0
    return sum("reconnecting with backoff" in line for line in stderr.read_text().splitlines())


def test_follow_consumers_keep_their_positions_through_restarts(pair: Pair, tmp_path: Path) -> None:
    table = "outage.events"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TIDEGATE_API_KEY": pair.api_key}
    followers: dict[str, subprocess.Popen[bytes]] = {}
    outputs: dict[str, Path] = {}
    with connect(pair.target, api_key=pair.api_key) as c:
        c.create_table(table, {"n": "int64"}, partitions=3)
        for flavour in ("sync", "aio"):
            outputs[flavour] = tmp_path / f"{flavour}.txt"
            followers[flavour] = _spawn(
                [
                    sys.executable,
                    "-c",
                    FOLLOWER,
                    pair.target,
                    table,
                    str(outputs[flavour]),
                    pair.api_key,
                    flavour,
                ],
                env,
                tmp_path / f"{flavour}.err",
            )
        outputs["cli"] = tmp_path / "cli.jsonl"
        followers["cli"] = _spawn(
            [sys.executable, "-m", "gateway", "read", table, "--follow", "--target", pair.target],
            env,
            tmp_path / "cli.err",
            stdout=outputs["cli"],
        )
        sent = 0
        try:
            with c.producer(
                table,
                linger=0.002,
                retry=Retry(ExponentialBackoff(base=0.05, cap=0.5), timeout=300),
            ) as producer:

                def produce(count: int) -> None:
                    nonlocal sent
                    for n in range(sent, sent + count):
                        producer.send({"n": n})
                    sent += count
                    producer.flush()

                def everyone_has_all() -> bool:
                    for name, proc in followers.items():
                        assert proc.poll() is None, f"the {name} follower exited"
                    return all(len(_ids(outputs[n], n == "cli")) >= sent for n in followers)

                produce(600)
                wait_for("the followers to catch up", everyone_has_all)

                def reported() -> dict[str, int]:
                    return {n: _outages(tmp_path / f"{n}.err") for n in followers}

                for _ in range(2):  # two restarts of every gateway
                    # Down until every follower said so: a gateway that starts again
                    # within a follower's first retry is no outage it could report.
                    seen = reported()
                    pair.restart_all(
                        lambda seen=seen: wait_for(
                            "every follower to report the outage",
                            lambda: all(n > seen[name] for name, n in reported().items()),
                        )
                    )
                    produce(600)
                    wait_for("the followers to catch up after a restart", everyone_has_all)
                # A rolling restart while records keep coming.
                stop = threading.Event()

                def keep_producing() -> None:
                    while not stop.is_set():
                        produce(50)

                background = threading.Thread(target=keep_producing)
                background.start()
                try:
                    pair.rolling_restart()
                finally:
                    stop.set()
                    background.join(120)
                produce(100)
                wait_for("the followers to catch up after the rolling restart", everyone_has_all)
        finally:
            for proc in followers.values():
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    for name in followers:
        got = _ids(outputs[name], name == "cli")
        assert sorted(got) == list(range(sent)), f"{name}: records lost or read twice"
        errors = (tmp_path / f"{name}.err").read_text()
        for raw in RAW:
            assert raw not in errors, f"{name} printed {raw!r}:\n{errors}"
        outages = [line for line in errors.splitlines() if "reconnecting with backoff" in line]
        # One line for each restart of every gateway; a rolling restart may cost one more
        # per replica when a read was on it as it went down.
        assert 2 <= len(outages) <= 4, errors
        assert all("the gateway at " in line for line in outages), errors
