"""The chart renders, lints and validates, for the defaults and every example values file;
its schema and templates refuse what cannot work; what it renders wires settings,
credentials, ports and jobs as documented."""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import kubernetes_validate
import pytest

from gateway.config import RedisHotConfig, Settings
from tests.helm.chart import (
    CHART,
    EXAMPLES,
    NAMESPACE,
    Rendered,
    example,
    iter_containers,
    merge,
)

#: The values sets every structural test runs on: the defaults and each example file.
VALUE_SETS = ["defaults", *sorted(p.stem for p in EXAMPLES.glob("*.yaml"))]

#: The Kubernetes version manifests are validated against: the newest the package knows.
KUBE_VERSION = kubernetes_validate.latest_version()
#: And the oldest the chart supports (Chart.yaml's kubeVersion: gRPC probes are GA in 1.27).
KUBE_FLOOR = re.findall(r'kubeVersion: ">=(\d+\.\d+)', (CHART / "Chart.yaml").read_text())[0]

#: Secret keys and the TIDEGATE_* variables that read them.
CREDENTIALS = {
    "TIDEGATE_AUTH__OPERATOR_KEY",
    "TIDEGATE_SERVER__METRICS_TOKEN",
    "TIDEGATE_METADATA__URL",
    "TIDEGATE_COLD__CATALOG__URI",
    "TIDEGATE_COLD__CATALOG__CREDENTIAL",
    "TIDEGATE_HOT__URL",
    "TIDEGATE_HOT__SHARDS",
    "TIDEGATE_COLD__S3__ACCESS_KEY_ID",
    "TIDEGATE_COLD__S3__SECRET_ACCESS_KEY",
}


def values_of(name: str) -> dict[str, Any]:
    return {} if name == "defaults" else example(name)


def refusal(values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught, helm.Chart.load(CHART) as chart:
        chart.render(values, name="tg", namespace=NAMESPACE)
    return str(caught.value)


# Lint and API validation -------------------------------------------------------------------
def test_every_values_set_is_tested() -> None:
    assert len(VALUE_SETS) >= 5, VALUE_SETS  # the defaults and at least four files


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_strict_passes(name: str) -> None:
    report = helm.lint(CHART, values_of(name), strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def check_service_monitor(monitor: dict[str, Any]) -> None:
    """The Prometheus Operator's CRD is not among Kubernetes' own schemas: check the fields
    the chart writes against the monitoring.coreos.com/v1 API reference, by hand."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    spec = monitor["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    assert set(spec["namespaceSelector"]) == {"matchNames"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {
            "port",
            "path",
            "scheme",
            "interval",
            "scrapeTimeout",
            "authorization",
        }
        if "authorization" in endpoint:
            assert endpoint["authorization"]["type"] == "Bearer"
            assert set(endpoint["authorization"]["credentials"]) == {"name", "key"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_validates_against_kubernetes(name: str) -> None:
    rendered = Rendered(values_of(name))
    assert rendered.manifests
    for manifest in rendered.manifests:
        if manifest["kind"] == "ServiceMonitor":
            check_service_monitor(manifest)
            continue
        for version in (KUBE_FLOOR, KUBE_VERSION):
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                path = ".".join(str(p) for p in err.path)
                name = f"{manifest['kind']} {manifest['metadata']['name']}"
                pytest.fail(f"{name} on Kubernetes {version}: {path}: {err.message}")


@pytest.mark.parametrize("name", VALUE_SETS)
def test_labels_and_security_of_every_workload(name: str) -> None:
    rendered = Rendered(values_of(name))
    for manifest in rendered.manifests:
        labels = manifest["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (manifest["kind"], key)
    containers = list(iter_containers(rendered.manifests))
    assert_gateway_rendered(name, containers)
    for where, container in containers:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, where
        assert security["allowPrivilegeEscalation"] is False, where
        assert container["resources"]["requests"], where
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, where  # the only writable places: /tmp and the data folder


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_setting_the_chart_writes_exists(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every TIDEGATE_* variable of every container names a field of gateway.config, and
    the settings load: a misspelt top-level variable would be silently ignored."""
    rendered = Rendered(values_of(name))
    secrets = {"tidegate-credentials": _production_secret()}
    containers = list(iter_containers(rendered.manifests))
    assert_gateway_rendered(name, containers)
    checked = 0
    for where, container in containers:
        env = rendered.container_env(container, secrets)
        for key in list(os.environ):
            if key.startswith("TIDEGATE_"):
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        for key in env:
            if not key.startswith("TIDEGATE_"):
                continue
            node: Any = settings
            for part in key.removeprefix("TIDEGATE_").lower().split("__"):
                assert hasattr(node, part), f"{where}: {key} is not a setting"
                node = getattr(node, part)
            checked += 1
    assert checked, f"{name}: no container sets a TIDEGATE_* variable: nothing was checked"


def assert_gateway_rendered(name: str, containers: list[tuple[str, Any]]) -> None:
    """The loops over rendered containers check something: the gateway's is among them."""
    names = [container["name"] for _, container in containers]
    assert "gateway" in names, f"{name}: no gateway container rendered (containers: {names})"


def _production_secret() -> dict[str, str]:
    """What the operator's own Secret of examples/production.yaml holds."""
    return {
        "operator-key": "op-" + "k" * 30,
        "metrics-token": "m" * 32,
        "metadata-url": "postgresql+psycopg://tg:pw@pg:5432/tg",
        "redis-url": "rediss://:pw@redis:6380/0?ssl_ca_certs=/etc/tidegate/redis-tls/ca.crt",
    }


# What the schema and the templates refuse ----------------------------------------------------
def test_schema_refuses_a_negative_replica_count() -> None:
    message = refusal({"replicaCount": -1})
    assert "/replicaCount" in message
    assert "minimum" in message


def test_schema_refuses_the_disk_tier_with_two_replicas() -> None:
    message = refusal({"hot": {"type": "disk"}, "replicaCount": 2})
    assert "/replicaCount" in message
    assert "maximum: got 2, want 1" in message


def test_schema_refuses_an_unknown_hot_tier_type() -> None:
    message = refusal({"hot": {"type": "memcached"}})
    assert "/hot/type" in message
    assert "'disk', 'redis'" in message


def test_schema_refuses_autoscaling_and_cronjobs_with_the_disk_tier() -> None:
    assert "/autoscaling/enabled" in refusal({"autoscaling": {"enabled": True}})
    assert "/jobs/tiering/enabled" in refusal({"jobs": {"tiering": {"enabled": True}}})


def test_rebalance_cronjob_moves_through_the_gateway_service_as_the_operator() -> None:
    values = merge(
        example("redis-postgres-s3"),
        {"jobs": {"rebalance": {"enabled": True}}, "networkPolicy": {"enabled": True}},
    )
    rendered = Rendered(values)
    cron = rendered.one("CronJob", "-rebalance")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "tidegate", "rebalance", "--runner", "local", "--band", "1.25", "--parallel", "2",
    ]  # fmt: skip
    env = rendered.container_env(container)
    service = rendered.one("Service")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert env["TIDEGATE_TARGET"] == f"{service['metadata']['name']}.tidegate.svc:{port}"
    assert env["TIDEGATE_OPERATOR_KEY"] == env["TIDEGATE_AUTH__OPERATOR_KEY"]
    assert len(env["TIDEGATE_OPERATOR_KEY"]) >= 16
    # Where the gateway admits only some clients, the job is one of them.
    (policy,) = rendered.all("NetworkPolicy")
    selectors = [
        peer.get("podSelector", {}).get("matchLabels", {})
        for rule in policy["spec"]["ingress"]
        for peer in rule.get("from", [])
    ]
    pod_labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert any(s and s.items() <= pod_labels.items() for s in selectors)


@pytest.mark.parametrize("job", ["compaction", "expiry", "orphans", "retention", "rebalance"])
def test_schema_refuses_maintenance_cronjobs_with_the_disk_tier(job: str) -> None:
    assert f"/jobs/{job}/enabled" in refusal({"jobs": {job: {"enabled": True}}})


def test_maintenance_cronjobs_run_their_commands_and_turn_the_embedded_ones_off() -> None:
    base = example("redis-postgres-s3")
    jobs = ("compaction", "expiry", "orphans", "retention")
    on = {"jobs": {j: {"enabled": True} for j in jobs}}
    rendered = Rendered(merge(base, on))
    data = rendered.one("ConfigMap")["data"]
    assert data["TIDEGATE_COMPACTION__ENABLED"] == "false"
    assert data["TIDEGATE_EXPIRY__ENABLED"] == "false"
    assert data["TIDEGATE_RETENTION__ENABLED"] == "false"
    commands = {}
    for name in ("tiering", *jobs):
        cron = rendered.one("CronJob", f"-{name}")
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        commands[name] = pod["containers"][0]["command"]
    assert commands == {
        "tiering": ["tidegate", "tier", "--runner", "spark", "--master", "local[2]"],
        "compaction": ["tidegate", "compact", "--runner", "spark", "--master", "local[2]"],
        "expiry": ["tidegate", "expire"],
        "orphans": ["tidegate", "clean-orphans"],
        "retention": ["tidegate", "retention"],
    }
    # Off by default: the gateway compacts and expires on its own schedule.
    default = Rendered(base).one("ConfigMap")["data"]
    assert default["TIDEGATE_COMPACTION__ENABLED"] == "true"
    assert default["TIDEGATE_EXPIRY__ENABLED"] == "true"
    assert default["TIDEGATE_RETENTION__ENABLED"] == "true"


def test_schema_refuses_unknown_keys_and_short_keys() -> None:
    assert "replicas" in refusal({"replicas": 3})  # a typo is not silently ignored
    assert "/auth/operatorKey" in refusal({"auth": {"operatorKey": "short"}})


def test_redis_replicas_must_share_metadata_and_warehouse() -> None:
    redis = {"hot": {"type": "redis", "redis": {"url": "redis://r:6379/0"}}}
    assert "set metadata.url" in refusal(redis)
    shared_meta = {**redis, "metadata": {"url": "postgresql+psycopg://u:p@pg/tg"}}
    assert "cold.warehouse" in refusal(shared_meta)
    assert "hot.redis.url is required" in refusal({"hot": {"type": "redis"}})


def test_settings_cannot_override_the_chart_or_carry_credentials() -> None:
    assert "settings.TIDEGATE_HOT__TYPE is set by the chart" in refusal(
        {"settings": {"TIDEGATE_HOT__TYPE": "redis"}}
    )
    assert "settings.TIDEGATE_AUTH__OPERATOR_KEY is a credential" in refusal(
        {"settings": {"TIDEGATE_AUTH__OPERATOR_KEY": "x" * 20}}
    )


# What the templates wire ------------------------------------------------------------------------
def test_defaults_are_one_stateful_gateway_that_tiers_itself() -> None:
    rendered = Rendered()
    gateway = rendered.gateway()
    assert gateway["kind"] == "StatefulSet"
    assert gateway["spec"]["replicas"] == 1
    claim = gateway["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not rendered.all("HorizontalPodAutoscaler")
    assert not rendered.all("CronJob")
    assert not rendered.all("Job")  # SQLite on the volume: the gateway migrates it
    assert rendered.one("ConfigMap")["data"]["TIDEGATE_TIERING__ENABLED"] == "true"


def test_the_iceberg_catalog_is_served_by_default_and_vends_with_the_role_given() -> None:
    data = Rendered().one("ConfigMap")["data"]
    assert data["TIDEGATE_COLD__REST_CATALOG__ENABLED"] == "true"
    assert "TIDEGATE_COLD__REST_CATALOG__ROLE_ARN" not in data
    s3 = Rendered(example("redis-postgres-s3")).one("ConfigMap")["data"]
    assert s3["TIDEGATE_COLD__REST_CATALOG__ROLE_ARN"].endswith(":role/tidegate-{tenant}")
    assert s3["TIDEGATE_COLD__REST_CATALOG__STS_ENDPOINT"].startswith("http://minio")
    off = Rendered({"cold": {"restCatalog": {"enabled": False}}}).one("ConfigMap")["data"]
    assert off["TIDEGATE_COLD__REST_CATALOG__ENABLED"] == "false"


def test_tiering_cronjob_turns_the_embedded_schedule_off() -> None:
    rendered = Rendered(example("redis-postgres-s3"))
    assert rendered.one("ConfigMap")["data"]["TIDEGATE_TIERING__ENABLED"] == "false"
    cron = rendered.one("CronJob", "-tiering")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["tidegate", "tier", "--runner", "spark", "--master", "local[2]"]
    off = Rendered(example("autoscaling-off"))
    assert off.one("ConfigMap")["data"]["TIDEGATE_TIERING__ENABLED"] == "true"
    assert not off.all("CronJob")
    assert off.gateway()["spec"]["replicas"] == 3


def test_external_spark_master_runs_the_driver_in_client_mode() -> None:
    rendered = Rendered(example("spark-on-kubernetes"))
    cron = rendered.one("CronJob", "-tiering")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[-2:] == ["--master", "k8s://https://kubernetes.default.svc:443"]
    assert pod["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "spark.driver.host=$(POD_IP)" in env["PYSPARK_SUBMIT_ARGS"]["value"]
    conf = rendered.one("ConfigMap", "-spark")["data"]["spark-defaults.conf"].splitlines()
    assert "spark.kubernetes.container.image registry.example.com/tidegate:0.1.0" not in conf
    assert "spark.kubernetes.container.image tidegate:0.1.0" in conf
    assert "spark.executor.instances 4" in conf
    assert f"spark.kubernetes.namespace {NAMESPACE}" in conf
    role = rendered.one("Role", "-spark")
    assert "pods" in role["rules"][0]["resources"]


def test_credentials_live_in_the_secret_never_in_the_configmap() -> None:
    values = example("redis-postgres-s3")
    rendered = Rendered(values)
    config = rendered.one("ConfigMap")["data"]
    assert not set(config) & CREDENTIALS
    text = repr(config)
    for secret in ("p@ss", "change-me", values["cold"]["s3"]["secretAccessKey"]):
        assert secret not in text
    data = rendered.secret_data("tg-tidegate")
    # The password goes into the URL percent-encoded, so any character is safe.
    assert data["redis-url"] == (
        "redis://:change%20me%3A%20p%40ss%2Fword@redis-master.data.svc.cluster.local:6379/0"
    )
    assert urlsplit(data["redis-url"]).hostname == "redis-master.data.svc.cluster.local"
    assert data["catalog-uri"] == data["metadata-url"] == values["metadata"]["url"]
    assert len(data["operator-key"]) >= 16 and len(data["metrics-token"]) >= 16


def test_redis_shards_are_a_list_in_the_secret_that_the_gateway_reads() -> None:
    values = example("redis-postgres-s3")
    shards = [
        {"name": "default", "url": "redis://:pw@redis-a:6379/0"},
        {"name": "b", "url": "redis://redis-b:6379/0"},
        {"name": "rc", "url": "redis://redis-cluster:6379", "cluster": True},
    ]
    values["hot"]["redis"] = {"shards": shards}
    rendered = Rendered(values)
    assert "pw@" not in repr(rendered.one("ConfigMap")["data"])
    data = rendered.secret_data("tg-tidegate")
    assert "redis-url" not in data
    hot = Settings.explicit(hot={"type": "redis", "shards": json.loads(data["redis-shards"])}).hot
    assert isinstance(hot, RedisHotConfig)
    assert [(s.name, s.url, s.cluster) for s in hot.shard_list()] == [
        ("default", "redis://:pw@redis-a:6379/0", False),
        ("b", "redis://redis-b:6379/0", False),
        ("rc", "redis://redis-cluster:6379", True),
    ]
    # One URL keeps working as before: no shards item at all.
    assert "redis-shards" not in Rendered(example("redis-postgres-s3")).secret_data("tg-tidegate")
    bad = {**values, "hot": {"type": "redis", "redis": {"shards": [{"name": "x y", "url": "r"}]}}}
    assert "shards" in refusal(bad)


def test_existing_secret_is_referenced_and_no_secret_is_made() -> None:
    rendered = Rendered(example("production"))
    assert not rendered.all("Secret")
    container = rendered.gateway()["spec"]["template"]["spec"]["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert {name: ref["key"] for name, ref in refs.items()} == {
        "TIDEGATE_AUTH__OPERATOR_KEY": "operator-key",
        "TIDEGATE_SERVER__METRICS_TOKEN": "metrics-token",
        "TIDEGATE_METADATA__URL": "metadata-url",
        "TIDEGATE_COLD__CATALOG__URI": "metadata-url",
        "TIDEGATE_HOT__URL": "redis-url",
    }
    assert {ref["name"] for ref in refs.values()} == {"tidegate-credentials"}
    job = rendered.one("Job", "-migration")
    job_env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    job_refs = {e["name"] for e in job_env if "valueFrom" in e}
    assert job_refs == {"TIDEGATE_METADATA__URL", "TIDEGATE_COLD__CATALOG__URI"}
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    monitor = rendered.one("ServiceMonitor")
    credentials = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]
    assert credentials == {"name": "tidegate-credentials", "key": "metrics-token"}


def test_metrics_have_their_own_port_service_and_network_rule() -> None:
    rendered = Rendered(example("redis-postgres-s3"))
    public = rendered.one("Service")
    assert {p["name"] for p in public["spec"]["ports"]} == {"grpc", "http", "kafka"}
    metrics = rendered.one("Service", "-metrics")
    assert [p["targetPort"] for p in metrics["spec"]["ports"]] == ["metrics"]
    assert metrics["spec"]["type"] == "ClusterIP"
    assert rendered.one("ConfigMap")["data"]["TIDEGATE_SERVER__METRICS_PORT"] == "9090"
    policy = rendered.one("NetworkPolicy")["spec"]["ingress"]
    by_port = {rule["ports"][0]["port"]: rule for rule in policy}
    assert "from" not in by_port["grpc"]  # clients: anyone by default
    assert by_port["metrics"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    monitor = rendered.one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {
        **{
            k: v
            for k, v in metrics["spec"]["selector"].items()
            if k != "app.kubernetes.io/component"
        },
        "app.kubernetes.io/component": "metrics",
    }
    assert metrics["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"


def test_every_default_value_is_described_by_the_schema() -> None:
    """values.yaml and values.schema.json name the same knobs, each with a description."""
    with helm.Chart.load(CHART) as chart:
        defaults, schema = chart.values, chart.schema
    assert schema is not None

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        properties = node.get("properties")
        if properties is None:
            return  # a free-form map (labels, resources, security contexts...)
        assert set(values) <= set(properties), f"{path}: {set(values) - set(properties)}"
        for key, value in values.items():
            child = properties[key]
            assert child.get("description"), f"{path}{key} has no description"
            if isinstance(value, dict):
                walk(value, child, f"{path}{key}.")

    walk(defaults, schema, "")


def test_grafana_dashboard_is_off_by_default_and_ships_the_file_when_on() -> None:
    default = Rendered().all("ConfigMap")
    assert not [m for m in default if m["metadata"]["name"].endswith("-dashboard")]
    rendered = Rendered({"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    dashboard = rendered.one("ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["tidegate.json"])
    assert shipped == json.loads((CHART / "dashboards" / "tidegate.json").read_text())
    assert shipped["uid"] == "tidegate-gateway" and len(shipped["panels"]) > 10


def test_the_kafka_listener_has_its_port_and_each_pod_is_a_broker_at_its_ip() -> None:
    rendered = Rendered(example("redis-postgres-s3"))
    public = rendered.one("Service")
    kafka = next(p for p in public["spec"]["ports"] if p["name"] == "kafka")
    assert (kafka["port"], kafka["targetPort"]) == (9092, "kafka")
    container = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "kafka", "containerPort": 9092, "protocol": "TCP"} in container["ports"]
    data = rendered.one("ConfigMap")["data"]
    assert data["TIDEGATE_KAFKA__PORT"] == "9092"
    # Clients bootstrap at the Service; Metadata names each replica at its pod's IP and
    # port, by a node id from the pod's name (docs/kafka.md).
    assert "TIDEGATE_KAFKA__ADVERTISED_HOST" not in data
    assert "TIDEGATE_KAFKA__CLUSTER" not in data
    assert data["TIDEGATE_KAFKA__ADVERTISED_PORT"] == "9092"
    env = {e["name"]: e for e in container["env"]}
    assert env["TIDEGATE_KAFKA__ADVERTISED_HOST"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }
    assert env["TIDEGATE_KAFKA__REPLICA_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    policy = rendered.one("NetworkPolicy")["spec"]["ingress"]
    assert {"port": "kafka", "protocol": "TCP"} in policy[0]["ports"]
    # One address for all (a load balancer): every replica answers as the one broker there.
    told = Rendered(
        {**example("redis-postgres-s3"), "kafka": {"advertisedHost": "kafka.example.com"}}
    )
    told_data = told.one("ConfigMap")["data"]
    assert told_data["TIDEGATE_KAFKA__ADVERTISED_HOST"] == "kafka.example.com"
    assert told_data["TIDEGATE_KAFKA__CLUSTER"] == "off"
    told_env = told.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not {"TIDEGATE_KAFKA__ADVERTISED_HOST", "TIDEGATE_KAFKA__REPLICA_ID"} & {
        e["name"] for e in told_env
    }
