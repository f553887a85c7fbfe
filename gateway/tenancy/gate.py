"""What an edge asks about every data-plane request, in one interface.

:class:`Gate` is who a request comes from, whether it may start, what it may take and what
it used. :class:`~gateway.tenancy.service.Tenancy` is the real one (API keys, quotas,
metering); :class:`OpenGate` serves one fixed tenant with no limits, for edges built in
process (tests, embedding) where nothing authenticates.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.meta import TableLimits
    from gateway.wire.errors import TidegateError

__all__ = ["Gate", "OpenGate"]


class Gate(ABC):
    @abstractmethod
    async def tenant_of(self, authorization: str | None) -> str:
        """The tenant of a data-plane request's credential; counts the request.

        Raises:
            Unauthenticated, TenantSuspended, PermissionDenied (the operator key on the
            data plane), Throttled (over requests/s).
        """

    @abstractmethod
    async def still_allowed(self, authorization: str | None, tenant: str) -> None:
        """Check, during a long-lived call, that its credential still stands (not revoked,
        tenant not suspended): called at least as often as the key cache expires.

        Raises:
            Unauthenticated, TenantSuspended.
        """

    @abstractmethod
    def admit(
        self, tenant: str, *, follow: bool = False, stream: bool = False
    ) -> AbstractAsyncContextManager[None]:
        """Hold one of the tenant's slots on this gateway for the call (a follow read's or
        an append stream's from pools of their own).

        Raises:
            Throttled: no free slot.
        """

    @abstractmethod
    def refuse_early(
        self,
        tenant: str,
        *,
        follow: bool = False,
        stream: bool = False,
        append: bool = False,
        slot: bool = True,
    ) -> None:
        """Refuse, at once and with no I/O, a call that would be refused anyway (no free
        slot, unless ``slot`` is False because the call holds one already; appends
        refused here for a while after a throttle): edges call it before they read a
        request's body, so an over-quota tenant costs next to nothing.

        Raises:
            Throttled.
        """

    async def append_refusal(self, authorization: str | None) -> TidegateError | None:
        """The refusal of an append with this credential that is refused from its headers
        alone (the tenant's appends are refused here for a while after a throttle),
        counted as one of the tenant's requests; None, with nothing counted, when it is not
        refused so or the credential names no tenant (the route then answers it as any
        request). For an edge that refuses before it routes a request (no I/O when the
        key is cached)."""
        return None

    def count_refused(self, tenant: str) -> None:  # noqa: B027 - optional hook
        """Count a call of the tenant refused again as an earlier one was (an edge that
        reuses a refusal for a moment, without asking :meth:`tenant_of` again)."""

    @abstractmethod
    async def table_limits(self, tenant: str) -> TableLimits | None:
        """The tenant's table and partition count quotas, which a create checks in the
        transaction that inserts the table (None: no limit)."""

    @abstractmethod
    def append_charge(self, tenant: str, nbytes: int) -> AbstractAsyncContextManager[None]:
        """Charge an append of ``nbytes`` on entry (or raise Throttled); refund it when the
        append then fails."""

    @abstractmethod
    def record_append(self, tenant: str, records: int, nbytes: int) -> None:
        """Meter an acknowledged append."""

    @abstractmethod
    async def check_read(self, tenant: str) -> None:
        """Raises: Throttled while the tenant's read bucket is in debt."""

    @abstractmethod
    async def record_read(self, tenant: str, records: int, nbytes: int) -> None:
        """Meter a read and charge the bytes it returned."""


class OpenGate(Gate):
    """Everything allowed, nothing metered: the tenant comes from the edge's own resolver."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    async def tenant_of(self, authorization: str | None) -> str:
        return self.tenant

    async def still_allowed(self, authorization: str | None, tenant: str) -> None:
        return None

    @contextlib.asynccontextmanager
    async def _nothing(self) -> AsyncIterator[None]:
        yield

    def admit(
        self, tenant: str, *, follow: bool = False, stream: bool = False
    ) -> AbstractAsyncContextManager[None]:
        return self._nothing()

    def refuse_early(
        self,
        tenant: str,
        *,
        follow: bool = False,
        stream: bool = False,
        append: bool = False,
        slot: bool = True,
    ) -> None:
        return None

    async def table_limits(self, tenant: str) -> TableLimits | None:
        return None

    def append_charge(self, tenant: str, nbytes: int) -> AbstractAsyncContextManager[None]:
        return self._nothing()

    def record_append(self, tenant: str, records: int, nbytes: int) -> None:
        return None

    async def check_read(self, tenant: str) -> None:
        return None

    async def record_read(self, tenant: str, records: int, nbytes: int) -> None:
        return None
