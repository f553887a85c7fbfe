"""Tidegate client SDK. Installs with grpcio and pyarrow; imports no server code."""

from gateway.client._admin import AdminClient
from gateway.client._sync import AppendRange, Client, TableRef, error_from_rpc

__all__ = ["AdminClient", "AppendRange", "Client", "TableRef", "error_from_rpc"]
