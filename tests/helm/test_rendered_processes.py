"""The rendered manifests start real processes.

The chart is rendered for ``examples/redis-postgres-s3.yaml`` plus an overlay that points it
at services this test starts, as an operator's own values would: the Redis URL's host and
port (the example's password stays, and the test's redis-server requires it), the S3
endpoint (moto's server; the example's bucket and keys stay) and the metadata URL (a
scratch database of the test's PostgreSQL: its user, password and database name cannot be
the example's). Then the containers' commands run as they are rendered, with the
environment Kubernetes would build from the ConfigMap, the Secret and the env entries,
rewritten only where a pod differs from this machine: the bind address (127.0.0.1, not
0.0.0.0), the listening ports (free ones, and the probes follow them) and the mount paths
(temporary folders, ConfigMap volumes written as files).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.client import AdminClient, Client
from tests.helm.chart import Rendered, example, merge, pod_spec
from tests.services import MotoServer, RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent


class Pod:
    """One container of a rendered workload, as this machine runs it."""

    def __init__(self, rendered: Rendered, workload: Mapping[str, Any], root: Path) -> None:
        spec = pod_spec(workload)
        self.container: dict[str, Any] = spec["containers"][0]
        self.root = root
        self.mounts: dict[str, Path] = {}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            self.mounts[mount["mountPath"]] = root / mount["name"]
            self.mounts[mount["mountPath"]].mkdir(parents=True, exist_ok=True)
        for mount in self.container.get("volumeMounts", []):
            source = volumes.get(mount["name"], {})
            if "configMap" in source:  # its keys as files, their mount paths made local
                data = rendered.one_named("ConfigMap", source["configMap"]["name"])["data"]
                for key, text in data.items():
                    for mount_path, local in self.mounts.items():
                        text = text.replace(f" {mount_path}/", f" {local}/")
                    (self.mounts[mount["mountPath"]] / key).write_text(text)
        #: container port -> local port, and the port names.
        self.ports = {p["containerPort"]: free_port() for p in self.container.get("ports", [])}
        self.port_names = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        env = rendered.container_env(self.container)
        self.env = {name: self.localise(value) for name, value in env.items()}
        self.env["TIDEGATE_SERVER__HOST"] = "127.0.0.1"
        listening = [f"TIDEGATE_SERVER__{n}" for n in ("GRPC_PORT", "HTTP_PORT", "METRICS_PORT")]
        # The Flight and Kafka ports too: two rendered gateways of the suite at once (or a
        # gateway of another test on Kafka's 9092) must not meet on a fixed port.
        listening += ["TIDEGATE_SERVER__FLIGHT_PORT", "TIDEGATE_KAFKA__PORT"]
        for key in listening:
            if key in self.env and int(self.env[key]):
                # A job binds nothing, but keep it off the ports a pod would use too.
                self.env[key] = str(self.ports.setdefault(int(self.env[key]), free_port()))
        if "TIDEGATE_KAFKA__ADVERTISED_PORT" in self.env and "TIDEGATE_KAFKA__PORT" in self.env:
            self.env["TIDEGATE_KAFKA__ADVERTISED_PORT"] = self.env["TIDEGATE_KAFKA__PORT"]

    def localise(self, value: str) -> str:
        for mount_path, local in self.mounts.items():
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path) :]
        return value

    def port(self, probe_port: int | str) -> int:
        if isinstance(probe_port, str):
            probe_port = self.port_names[probe_port]
        return self.ports[probe_port]

    def argv(self) -> list[str]:
        return [*self.container["command"], *self.container.get("args", [])]

    def process_env(self) -> dict[str, str]:
        # What the image brings: its PATH (the venv, where `tidegate` is) and a locale.
        base = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "LANG": "C.UTF-8"}
        return {**base, **self.env}

    def cwd(self) -> str:
        working_dir = self.container.get("workingDir")
        return self.localise(working_dir) if working_dir else str(self.root)

    def run(self, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(),
            env=self.process_env(),
            cwd=self.cwd(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                self.argv(),
                env=self.process_env(),
                cwd=self.cwd(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )


def http_probe(pod: Pod, probe: Mapping[str, Any]) -> int:
    get = probe["httpGet"]
    url = f"http://127.0.0.1:{pod.port(get['port'])}{get['path']}"
    return httpx.get(url, timeout=probe.get("timeoutSeconds", 1)).status_code


def grpc_probe(pod: Pod, probe: Mapping[str, Any]) -> int:
    """The kubelet's gRPC probe: grpc.health.v1.Health/Check on the probe's port."""
    spec = probe["grpc"]
    with grpc.insecure_channel(f"127.0.0.1:{pod.port(spec['port'])}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=spec.get("service", "")),
            timeout=probe.get("timeoutSeconds", 1),
        )
    return int(answer.status)


def wait_started(pod: Pod, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Probe as the kubelet does: the startup probe until it passes, within its budget."""
    probe = pod.container["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if http_probe(pod, probe) == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"startup probe never passed in {budget}s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[tuple[RedisServer, str]]:
    """A redis-server of this test's own that requires the example's password."""
    password = example("redis-postgres-s3")["hot"]["redis"]["password"]
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis(port=server.port)
        client.config_set("requirepass", password)
        client.close()
        yield server, password
    finally:
        server.stop()


def test_rendered_gateway_and_tiering_job_run(
    tmp_path: Path,
    redis_with_password: tuple[RedisServer, str],
    moto_server: MotoServer,
    helm_database: str,
) -> None:
    redis_server, _ = redis_with_password
    values = example("redis-postgres-s3")
    bucket = values["cold"]["warehouse"].removeprefix("s3://").split("/")[0]
    moto_server.create_bucket(bucket)
    overlay = {
        "hot": {"redis": {"url": f"redis://127.0.0.1:{redis_server.port}/0"}},
        "metadata": {"url": helm_database},
        "cold": {"s3": {"endpoint": moto_server.endpoint}},
    }
    rendered = Rendered(merge(values, overlay))

    # 1. The pre-install hook: the migrations.
    migration = Pod(rendered, rendered.one("Job", "-migration"), tmp_path / "migration")
    migrated = migration.run(timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    assert "at revision" in migrated.stdout

    # 2. The gateway, probed as its probes say; 3. a tenant, a table, a record.
    with serving_gateway(rendered, tmp_path) as client:
        assert tiered_watermark(client) == 0

        # 4. The tiering CronJob's command (Spark in local mode, as rendered).
        job = Pod(rendered, rendered.one("CronJob", "-tiering"), tmp_path / "tiering")
        assert job.argv()[:4] == ["tidegate", "tier", "--runner", "spark"]
        tiered = job.run(timeout=150)
        assert tiered.returncode == 0, tiered.stderr[-3000:]
        assert "tiered 1 record in 1 table" in tiered.stdout
        # Spark read the rendered spark-defaults.conf (SPARK_CONF_DIR): its local dir.
        assert (job.mounts["/tmp"] / "spark").is_dir()
        assert tiered_watermark(client) == 1
        cold = client.read("shop.orders", partition=0, offset=0)  # now from Iceberg
        assert cold.select(["item", "n"]) == pa.table({"item": ["kite"], "n": [3]})


def test_default_values_run_a_gateway_on_its_volume(tmp_path: Path) -> None:
    """The bare install: the disk hot tier, SQLite and the warehouse on the data volume."""
    rendered = Rendered()
    assert not rendered.all("Job")  # the gateway migrates SQLite itself
    with serving_gateway(rendered, tmp_path) as client:
        assert client.describe_table("shop.orders").partition_info[0].high_watermark == 1
    volume = tmp_path / "gateway" / "data"  # where the claim is mounted
    assert (volume / "metadata.db").exists()
    assert (volume / "hot" / ".lock").exists()


@contextlib.contextmanager
def serving_gateway(rendered: Rendered, tmp_path: Path) -> Iterator[Client]:
    """The rendered gateway's command, started, probed as its probes say, its metrics
    checked, then a tenant made with the operator key from the Secret and one record
    appended to shop.orders through its client. Stopped with SIGTERM, as a pod is."""
    gateway = Pod(rendered, rendered.gateway(), tmp_path / "gateway")
    assert gateway.argv() == ["tidegate", "serve"]
    log = tmp_path / "gateway.log"
    proc = gateway.start(log)
    try:
        wait_started(gateway, proc, log)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert grpc_probe(gateway, gateway.container["readinessProbe"]) == serving
        assert grpc_probe(gateway, gateway.container["livenessProbe"]) == serving
        check_metrics_are_private(gateway)
        grpc_target = f"127.0.0.1:{gateway.port(gateway.port_names['grpc'])}"
        operator_key = gateway.env["TIDEGATE_AUTH__OPERATOR_KEY"]
        tenant = f"t{secrets.token_hex(4)}"
        with AdminClient(grpc_target, operator_key=operator_key) as admin:
            admin.create_tenant(tenant)
            api_key = admin.issue_key(tenant)[1]
        with Client(grpc_target, api_key=api_key) as client:
            client.create_table("shop.orders", {"item": "string", "n": "int64"}, partitions=1)
            client.append("shop.orders", [{"item": "kite", "n": 3}])
            rows = client.read("shop.orders", partition=0, offset=0).select(["item", "n"])
            assert rows.to_pylist() == [{"item": "kite", "n": 3}]
            yield client
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, log.read_text()[-3000:]


def tiered_watermark(client: Client) -> int:
    info = client.describe_table("shop.orders")
    return int(info.partition_info[0].tiered_watermark)


def check_metrics_are_private(gateway: Pod) -> None:
    """/metrics is on the metrics port only, behind the token from the Secret."""
    http_port = gateway.port(gateway.port_names["http"])
    metrics_port = gateway.port(gateway.port_names["metrics"])
    assert httpx.get(f"http://127.0.0.1:{http_port}/metrics").status_code == 404
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"authorization": "Bearer wrong-token-123456"}).status_code == 401
    token = gateway.env["TIDEGATE_SERVER__METRICS_TOKEN"]
    answer = httpx.get(url, headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    assert "tidegate_" in answer.text
