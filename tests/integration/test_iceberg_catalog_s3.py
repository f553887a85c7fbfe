"""Issue 27 on an S3 warehouse (moto's server with its IAM enforcement on): engines given
only a tenant's key read that tenant's tiered rows with temporary credentials the catalog
vends (STS AssumeRole of the tenant's role, with a session policy for the table's folder);
those credentials cannot read another tenant's objects nor write, and the warehouse's own
keys appear in no answer.

moto evaluates the assumed role's own policies but not the session policy (moto 5.2:
``moto/iam/access_control.py`` collects only the role's), so here each tenant has a role
of its own that allows reading its prefix only, as ``cold.rest_catalog.role_arn`` with
``{tenant}`` sets up; what the session policy adds (one table, not the tenant's whole
prefix) is AWS's to enforce and is not asserted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.integration.iceberg_catalog import (
    SCHEMA,
    Tenant,
    duckdb_with_extensions,
    fill,
    new_tenant,
    pyiceberg_catalog,
    rows_of,
    tier,
    tiered_rows,
    watermarks,
)
from tests.services import GatewayProcess, MotoServer, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"
BUCKET = "tidegate-catalog"
PREFIX = "wh"


@dataclass
class S3Setup:
    moto: MotoServer
    gw: GatewayProcess
    #: The warehouse's own keys (the gateway's IAM user).
    keys: tuple[str, str]

    def tenant(self, prefix: str) -> Tenant:
        """A tenant with a role of its own that may read its prefix of the warehouse."""
        t = new_tenant(self.gw, prefix)
        self.moto.role_with_policy(
            f"tidegate-{t.name}",
            [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{BUCKET}/{PREFIX}/{t.name}/*"],
                }
            ],
        )
        return t

    def s3(self, config: dict[str, str] | None = None) -> Any:
        """An S3 client with ``config``'s credentials (vended ones), else the admin's."""
        if config is None:
            key, secret, token = *self.moto.admin_keys, None
        else:
            key = config["s3.access-key-id"]
            secret = config["s3.secret-access-key"]
            token = config["s3.session-token"]
        return boto3.client(
            "s3",
            endpoint_url=self.moto.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            aws_session_token=token,
            region_name=self.moto.REGION,
        )

    def objects(self, tenant: Tenant, suffix: str) -> list[str]:
        """Keys of the tenant's objects ending in ``suffix`` (listed as the admin)."""
        listed = self.s3().list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/{tenant.name}/")
        return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(suffix)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[S3Setup]:
    moto = MotoServer(tmp_path_factory.mktemp("moto-iam")).start()
    try:
        moto.create_bucket(BUCKET)
        keys = moto.user_with_policy(
            "tidegate-gateway",
            [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}],
        )
        moto.enforce_iam()
        env = {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis_server.url,
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
            "TIDEGATE_COLD__WAREHOUSE": f"s3://{BUCKET}/{PREFIX}",
            "TIDEGATE_COLD__S3__ENDPOINT": moto.endpoint,
            "TIDEGATE_COLD__S3__ACCESS_KEY_ID": keys[0],
            "TIDEGATE_COLD__S3__SECRET_ACCESS_KEY": keys[1],
            "TIDEGATE_COLD__S3__REGION": moto.REGION,
            "TIDEGATE_COLD__S3__PATH_STYLE": "true",
            "TIDEGATE_COLD__REST_CATALOG__ROLE_ARN": (
                f"arn:aws:iam::{moto.ACCOUNT}:role/tidegate-{{tenant}}"
            ),
            "TIDEGATE_COLD__REST_CATALOG__STS_ENDPOINT": moto.endpoint,
            "TIDEGATE_COLD__REST_CATALOG__CREDENTIALS_DURATION_S": "900",
        }
        gw = GatewayProcess(tmp_path_factory.mktemp("gw-s3-catalog"), env).start()
        try:
            yield S3Setup(moto, gw, keys)
        finally:
            gw.stop()
    finally:
        moto.stop()


@pytest.fixture(scope="module")
def two(s3: S3Setup) -> tuple[Tenant, Tenant]:
    """Tenants a and b, each with a table shop.orders: 10 rows tiered, 4 hot."""
    a, b = s3.tenant("a"), s3.tenant("b")
    for t in (a, b):
        with s3.gw.client(api_key=t.key) as c:
            c.create_table("shop.orders", SCHEMA, partitions=2)
        fill(s3.gw, t, "shop.orders", 0, 10)
    tier(s3.gw)
    for t in (a, b):
        fill(s3.gw, t, "shop.orders", 10, 4)
    return a, b


def test_load_table_vends_read_credentials_for_the_tables_folder(
    s3: S3Setup, two: tuple[Tenant, Tenant]
) -> None:
    a, _ = two
    with s3.gw.http_client(api_key=a.key) as h:
        answers = [
            h.get(f"{CATALOG}/config"),
            h.get(f"{CATALOG}/namespaces/shop/tables/orders"),
            h.get(f"{CATALOG}/namespaces/shop/tables/orders/credentials"),
            h.post(f"{CATALOG}/oauth/tokens", data={"grant_type": "client_credentials",
                                                   "client_secret": a.key}),
        ]  # fmt: skip
    for r in answers:
        assert r.status_code == 200, r.text
        # The warehouse's own keys are in no answer.
        assert s3.keys[0] not in r.text and s3.keys[1] not in r.text
    result = answers[1].json()
    location = result["metadata"]["location"]
    assert location.startswith(f"s3://{BUCKET}/{PREFIX}/{a.name}/shop/orders-")
    (cred,) = result["storage-credentials"]
    assert cred["prefix"] == location
    config = cred["config"]
    assert config["s3.access-key-id"] != s3.keys[0]
    assert config["s3.session-token"]
    assert config["s3.endpoint"] == s3.moto.endpoint
    assert int(config["s3.session-token-expires-at-ms"]) > 0
    (fresh,) = answers[2].json()["storage-credentials"]
    assert fresh["prefix"] == location and fresh["config"]["s3.session-token"]


def test_pyiceberg_reads_the_tiered_rows_with_vended_credentials(
    s3: S3Setup, two: tuple[Tenant, Tenant]
) -> None:
    a, _ = two
    # Planning on the client: the metadata's files (the server's plans are below).
    catalog = pyiceberg_catalog(s3.gw, token=a.key, **{"scan-planning-mode": "client"})
    assert catalog.list_namespaces() == [("shop",)]
    table = catalog.load_table("shop.orders")
    assert table.io.properties["s3.access-key-id"] != s3.keys[0]
    got = table.scan().to_arrow()
    with s3.gw.http_client(api_key=a.key) as h:
        marks = watermarks(h.get(f"{CATALOG}/namespaces/shop/tables/orders").json())
    expected = tiered_rows(s3.gw, a, "shop.orders", marks)
    assert expected.num_rows == 10
    assert rows_of(got) == rows_of(expected)


def test_pyiceberg_plans_on_the_server_and_reads_the_hot_tail_with_vended_credentials(
    s3: S3Setup, two: tuple[Tenant, Tenant]
) -> None:
    """Issue 40: the plan's hot-tail files are under the table's folder, so the vended
    credentials (narrowed to that folder) read them; the answer is the gateway's scan."""
    from pyiceberg.expressions import GreaterThanOrEqual

    a, _ = two
    catalog = pyiceberg_catalog(s3.gw, token=a.key)  # the catalog's default: server
    table = catalog.load_table("shop.orders")
    columns = ("id", "name", "_partition", "_offset")
    got = table.scan(row_filter=GreaterThanOrEqual("id", 2), selected_fields=columns).to_arrow()
    with s3.gw.client(api_key=a.key) as c:
        expected = c.scan("shop.orders", columns=list(columns), filter="id >= 2")
    assert expected.num_rows > 10  # tiered rows and a hot tail
    order = [("_partition", "ascending"), ("_offset", "ascending")]
    assert got.sort_by(order).to_pylist() == expected.sort_by(order).to_pylist()
    with s3.gw.http_client(api_key=a.key) as h:
        answer = h.post(f"{CATALOG}/namespaces/shop/tables/orders/plan", json={}).json()
    paths = [t["data-file"]["file-path"] for t in answer["file-scan-tasks"]]
    (cred,) = answer["storage-credentials"]
    assert any("/tidegate-plans/" in p for p in paths)
    assert all(p.startswith(cred["prefix"]) for p in paths)
    assert cred["config"]["s3.access-key-id"] != s3.keys[0]


def test_duckdb_reads_the_tiered_rows_with_vended_credentials(
    s3: S3Setup, two: tuple[Tenant, Tenant]
) -> None:
    a, _ = two
    con = duckdb_with_extensions()
    try:
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{s3.gw.http_url}/iceberg', "
            f"TOKEN '{a.key}')"
        )
        got = con.sql("SELECT * FROM tg.shop.orders").arrow().read_all()
    finally:
        con.close()
    with s3.gw.http_client(api_key=a.key) as h:
        marks = watermarks(h.get(f"{CATALOG}/namespaces/shop/tables/orders").json())
    assert rows_of(got) == rows_of(tiered_rows(s3.gw, a, "shop.orders", marks))


def _denied(call: Any) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


def test_vended_credentials_cannot_read_another_tenants_objects_nor_write(
    s3: S3Setup, two: tuple[Tenant, Tenant]
) -> None:
    a, b = two
    with s3.gw.http_client(api_key=a.key) as h:
        (cred,) = h.get(f"{CATALOG}/namespaces/shop/tables/orders/credentials").json()[
            "storage-credentials"
        ]
    mine = s3.s3(cred["config"])
    own = s3.objects(a, ".parquet")[0]
    assert mine.get_object(Bucket=BUCKET, Key=own)["Body"].read()[:4] == b"PAR1"
    for key in s3.objects(b, ".parquet")[:1] + s3.objects(b, ".metadata.json")[:1]:
        assert _denied(lambda k=key: mine.get_object(Bucket=BUCKET, Key=k)) == "AccessDenied"
    assert _denied(lambda: mine.list_objects_v2(Bucket=BUCKET)) == "AccessDenied"
    put = f"{PREFIX}/{a.name}/shop/forged.parquet"
    assert _denied(lambda: mine.put_object(Bucket=BUCKET, Key=put, Body=b"x")) == "AccessDenied"
    assert _denied(lambda: mine.delete_object(Bucket=BUCKET, Key=own)) == "AccessDenied"
    # What b's own credentials read, a's cannot, and the other way round.
    with s3.gw.http_client(api_key=b.key) as h:
        (theirs,) = h.get(f"{CATALOG}/namespaces/shop/tables/orders/credentials").json()[
            "storage-credentials"
        ]
    other = s3.s3(theirs["config"])
    theirs_file = s3.objects(b, ".parquet")[0]
    assert other.get_object(Bucket=BUCKET, Key=theirs_file)["Body"].read()[:4] == b"PAR1"
    assert _denied(lambda: other.get_object(Bucket=BUCKET, Key=own)) == "AccessDenied"
