"""The Tidegate gRPC service, by resource: tables (:mod:`.tables`), appends
(:mod:`.appends`), reads (:mod:`.reads`), consumer groups (:mod:`.groups`), scans and plans
(:mod:`.scans`), each a part over :class:`~.base.ServicerBase`.

The servicer only turns messages into :class:`~gateway.server.calls.DataCalls` and their
answers back into messages; who is calling, admission and error translation are the
:class:`~gateway.server.grpc.calls.CallInterceptor`'s.
"""

from __future__ import annotations

from gateway.server.grpc.service.appends import AppendMethods
from gateway.server.grpc.service.groups import GroupMethods, group_info
from gateway.server.grpc.service.reads import ReadMethods
from gateway.server.grpc.service.scans import ScanMethods
from gateway.server.grpc.service.tables import TableMethods, table_info

__all__ = ["TidegateServicer", "group_info", "table_info"]


class TidegateServicer(TableMethods, AppendMethods, ReadMethods, GroupMethods, ScanMethods):
    """The Tidegate service (``tidegate.v1.Tidegate``) of one gateway process."""
