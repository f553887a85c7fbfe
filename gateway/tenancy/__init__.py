"""Tenancy: API keys, authentication, quotas with back-pressure, fair admission, metering.

The edges ask :class:`~gateway.tenancy.service.Tenancy` who a request comes from and whether
it may proceed; the stream-table service below only ever sees a tenant name.
"""

from gateway.tenancy.service import Principal, Quotas, Tenancy, load_operator_key

__all__ = ["Principal", "Quotas", "Tenancy", "load_operator_key"]
