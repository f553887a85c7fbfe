"""Temporary S3 credentials for engines outside Tidegate: STS AssumeRole with a session
policy that allows reading one table's files and nothing else.

The warehouse's own keys sign the AssumeRole call and never leave the gateway. The role
(``cold.rest_catalog.role_arn``, ``{tenant}`` replaced by the tenant's name) bounds what a
tenant's credentials can ever do; the session policy narrows each set to ``s3:GetObject``
under one table's folder. With one role per tenant, whose own policy allows only that
tenant's prefix, a credential can never reach another tenant's objects even where the
session policy were not enforced (moto's IAM, for one, evaluates only the role's).

Credentials are kept per (tenant, table folder) and handed out again while more than half
of their lifetime is left, so a busy engine does not cost an STS call per table load.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from gateway.cold.base import DataAccess
from gateway.wire.errors import Unavailable

__all__ = ["StsVendor", "read_policy"]

log = logging.getLogger(__name__)

#: Credentials kept at once (one per tenant and table folder).
_KEPT = 4096


def read_policy(location: str) -> dict[str, Any]:
    """The session policy for reading the objects under ``location`` (``s3://bucket/key``):
    ``s3:GetObject`` (which covers HEAD) on ``bucket/key/*``, nothing else."""
    bucket, _, key = location.split("://", 1)[1].partition("/")
    key = key.rstrip("/")
    resource = f"arn:aws:s3:::{bucket}/{key}/*" if key else f"arn:aws:s3:::{bucket}/*"
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [resource]}],
    }


def _session_name(tenant: str) -> str:
    # RoleSessionName: 2-64 characters of [\w+=,.@-]; tenant names are letters, digits,
    # '_' and '-' (gateway.core.names), so only the length needs care.
    return f"tidegate-{tenant}"[:64]


class StsVendor:
    """AssumeRole per tenant and table folder, cached while fresh.

    Args:
        role_arn: the role to assume; ``{tenant}`` is replaced by the tenant's name.
        duration_s: lifetime asked of STS.
        client_options: ``boto3.client("sts", ...)`` keyword arguments (endpoint, region,
            the warehouse's keys).
        external_id: sent as ``ExternalId`` when set.
    """

    def __init__(
        self,
        role_arn: str,
        duration_s: int,
        client_options: Mapping[str, Any],
        external_id: str | None = None,
        clock: Any = time.time,
    ) -> None:
        self.role_arn = role_arn
        self.duration_s = duration_s
        self.external_id = external_id
        self._options = dict(client_options)
        self._client: Any = None
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], tuple[float, float, DataAccess]] = OrderedDict()

    def _sts(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.client("sts", **self._options)
            return self._client

    def vend(self, tenant: str, location: str, config: Mapping[str, str]) -> DataAccess:
        """Read-only credentials for ``tenant`` under ``location``, with the table's
        FileIO ``config`` (no secret in it).

        Raises:
            Unavailable: STS refused or could not be reached (the message names the role
                and STS's reason, never a key).
        """
        key = (tenant, location)
        now = self._clock()
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None and hit[1] > now:
                self._kept.move_to_end(key)
                return hit[2]
        role = self.role_arn.replace("{tenant}", tenant)
        ask: dict[str, Any] = {
            "RoleArn": role,
            "RoleSessionName": _session_name(tenant),
            "Policy": json.dumps(read_policy(location)),
            "DurationSeconds": self.duration_s,
        }
        if self.external_id:
            ask["ExternalId"] = self.external_id
        try:
            answer = self._sts().assume_role(**ask)
        except Exception as exc:  # botocore's ClientError, connection errors
            detail = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
            log.warning("AssumeRole of %s for tenant %s failed: %s", role, tenant, exc)
            raise Unavailable(
                f"could not vend storage credentials: STS refused to assume {role} ({detail})",
                retry_after_ms=1000,
            ) from None
        creds = answer["Credentials"]
        expires = creds["Expiration"].timestamp()
        access = DataAccess(
            config=dict(config),
            credentials={
                "s3.access-key-id": creds["AccessKeyId"],
                "s3.secret-access-key": creds["SecretAccessKey"],
                "s3.session-token": creds["SessionToken"],
                "s3.session-token-expires-at-ms": str(int(expires * 1000)),
            },
            prefix=location,
            expires_at_ms=int(expires * 1000),
        )
        # Handed out again while more than half of their lifetime is left.
        fresh_until = now + (expires - now) / 2
        with self._lock:
            self._kept[key] = (expires, fresh_until, access)
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
        return access
