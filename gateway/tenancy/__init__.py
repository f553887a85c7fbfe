"""Tenancy: API keys, authentication, quotas with back-pressure, fair admission, metering.

The edges ask a :class:`~gateway.tenancy.gate.Gate` (the :class:`Tenancy` of a served
gateway) who a request comes from and whether it may proceed; the stream-table core below
only ever sees a tenant name. Admin operations are :attr:`Tenancy.admin`.
"""

from gateway.meta.tenants import KeyInfo, TenantInfo, UsageRow
from gateway.tenancy.auth import OPERATOR_KEY_FILE, Principal, load_operator_key
from gateway.tenancy.gate import Gate, OpenGate
from gateway.tenancy.quotas import Quotas
from gateway.tenancy.service import Tenancy

__all__ = [
    "OPERATOR_KEY_FILE",
    "Gate",
    "KeyInfo",
    "OpenGate",
    "Principal",
    "Quotas",
    "Tenancy",
    "TenantInfo",
    "UsageRow",
    "load_operator_key",
]
