"""Vended S3 credentials: the session policy, and a refusal that names the role, not a key."""

from __future__ import annotations

import pytest

from gateway.cold.iceberg.vending import StsVendor, read_policy
from gateway.wire.errors import Unavailable
from tests.services import free_port


def test_the_session_policy_reads_one_folder_and_nothing_else() -> None:
    policy = read_policy("s3://bucket/wh/tenant/ns/t-1234/")
    assert policy["Statement"] == [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::bucket/wh/tenant/ns/t-1234/*"],
        }
    ]


def test_an_unreachable_sts_is_unavailable_naming_the_role_not_the_keys() -> None:
    vendor = StsVendor(
        "arn:aws:iam::123456789012:role/tg-{tenant}",
        900,
        {
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "region_name": "us-east-1",
            "aws_access_key_id": "AKIAMASTERKEY",
            "aws_secret_access_key": "master-secret",
            "config": __import__("botocore.config").config.Config(
                retries={"max_attempts": 1}, connect_timeout=2
            ),
        },
    )
    with pytest.raises(Unavailable) as info:
        vendor.vend("acme", "s3://bucket/wh/acme/ns/t", {"s3.region": "us-east-1"})
    message = info.value.message
    assert "arn:aws:iam::123456789012:role/tg-acme" in message
    assert "AKIAMASTERKEY" not in message and "master-secret" not in message
    assert info.value.retry_after_ms == 1000
