"""The Kafka listener over TLS from certificate files (kafka.tls_cert_file, tls_key_file):
a SASL_SSL client produces and consumes; a plaintext one is not served."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.clients import ConfluentKafka, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka
from tests.services import GatewayProcess, free_port, self_signed

pytestmark = pytest.mark.integration


class TlsConfluent(ConfluentKafka):
    """confluent-kafka over SASL_SSL, trusting the test's certificate."""

    def __init__(self, ca: Path) -> None:
        self.ca = ca

    def settings(self, target: KafkaTarget) -> dict[str, Any]:
        return {
            **librdkafka_settings(target),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.ca),
        }


def test_a_tls_listener_serves_sasl_ssl_clients_only(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    env = {
        "TIDEGATE_KAFKA__TLS_CERT_FILE": str(cert),
        "TIDEGATE_KAFKA__TLS_KEY_FILE": str(key),
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_SERVER__HEADER_TIMEOUT_S": "2",
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gw = GatewayProcess(tmp_path / "gw", env)
    try:
        gw.start()
        assert gw.api_key is not None
        target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
        with gw.client() as c:
            c.create_table("tls.t", {"n": "int64"}, partitions=1)
        client = TlsConfluent(cert)
        values = [(0, json.dumps({"n": i}).encode()) for i in range(5)]
        assert client.produce(target, "tls.t", values) == list(range(5))
        got = client.consume(target, "tls.t", [0], 5)
        assert [json.loads(m.value or b"")["n"] for m in got] == list(range(5))
        # Plaintext Kafka on the TLS port: the handshake never completes and the
        # connection is closed within the header timeout.
        with RawKafka(target) as raw:
            raw.send_bytes(b"\0\0\0\x0a\0\x12\0\x03\0\0\0\x01\xff\xff")
            assert raw.closed()
    finally:
        gw.stop()


@pytest.mark.parametrize("which", ["cert-only", "not-pem"])
def test_unusable_tls_files_stop_the_gateway_in_one_line(tmp_path: Path, which: str) -> None:
    cert, key = self_signed(tmp_path)
    if which == "not-pem":
        key.write_text("not a key\n")
    # free ports, a folder of the test's own
    env = GatewayProcess(tmp_path / "gw", {"TIDEGATE_KAFKA__PORT": str(free_port())}).env()
    env["TIDEGATE_KAFKA__TLS_CERT_FILE"] = str(cert)
    if which == "not-pem":
        env["TIDEGATE_KAFKA__TLS_KEY_FILE"] = str(key)
    ran = subprocess.run(
        [sys.executable, "-m", "gateway", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    assert ("go together" if which == "cert-only" else "cannot be used") in ran.stderr
