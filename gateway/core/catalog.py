"""The stream-tables of one tenant as an Iceberg catalog sees them (the REST catalog the
HTTP edge serves at ``/iceberg``): its namespaces, its tables, each table's committed
metadata and how an engine reads the table's files without the warehouse's keys.

A primary-key table is its state table under its own name (one live row per key, what an
engine expects of a table) and its changelog under ``<name>$changelog`` (every change with
``_change``, Fluss's name for it); docs/decisions/primary-keys.md.

Tidegate has no namespace of its own: a namespace exists while the tenant has a table in
it. Everything is scoped by the tenant, and a name that is not a valid table name answers
exactly as a table that does not exist (or is another tenant's): ``TableNotFound``.
"""

from __future__ import annotations

import re

from gateway.cold.base import CatalogEntry, DataAccess
from gateway.core.base import CoreBase
from gateway.wire.errors import NotFound, TableNotFound

__all__ = ["CHANGELOG_SUFFIX", "CatalogOps"]

#: The catalog name of a primary-key table's changelog: ``<name>$changelog``.
CHANGELOG_SUFFIX = "$changelog"

# The same rule as gateway.core.names.check_ident: a name no table can have is not looked up.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,127}")


def _valid(name: str) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _missing(namespace: str, name: str) -> TableNotFound:
    # Only the names the caller gave (quoted as text, cut short): an unknown table and
    # another tenant's read the same.
    return TableNotFound(f"table {namespace[:200]!r}.{name[:200]!r} does not exist")


class CatalogOps(CoreBase):
    async def catalog_namespaces(self, tenant: str) -> list[str]:
        """The namespaces the tenant has tables in, sorted (empty without a cold tier)."""
        if self.cold is None:
            return []
        defs = await self._run(self.meta.list_tables, tenant, None)
        return sorted({d.namespace for d in defs})

    async def catalog_tables(self, tenant: str, namespace: str) -> list[str]:
        """The names of the tenant's tables in ``namespace`` (empty when it has none, so
        the namespace does not exist for the catalog)."""
        if self.cold is None or not _valid(namespace):
            return []
        defs = await self._run(self.meta.list_tables, tenant, namespace)
        names = []
        for d in defs:
            names.append(d.name)
            if d.primary_key is not None:
                names.append(d.name + CHANGELOG_SUFFIX)
        return names

    async def catalog_entry(self, tenant: str, namespace: str, name: str) -> CatalogEntry:
        """The table's current committed metadata file and document.

        Raises:
            TableNotFound: no such table in this tenant (or no Iceberg table for it yet).
        """
        changelog = isinstance(name, str) and name.endswith(CHANGELOG_SUFFIX)
        base = name[: -len(CHANGELOG_SUFFIX)] if changelog else name
        if self.cold is None or not (_valid(namespace) and _valid(base)):
            raise _missing(namespace, name)
        try:
            view = await self.table(tenant, namespace, base)
            keyed = view.definition.primary_key is not None
            if changelog and not keyed:
                raise _missing(namespace, name)
            cold = self._state_table(view) if keyed and not changelog else self._cold_table(view)
            return await self._run(cold.catalog_entry)
        except NotFound:
            # No such table, or its Iceberg table is not there (yet, or any more).
            raise _missing(namespace, name) from None

    async def catalog_access(self, tenant: str, entry: CatalogEntry) -> DataAccess:
        """How the tenant's engine reads the files of ``entry`` (one of its own tables,
        from :meth:`catalog_entry`) without the warehouse's keys.

        Raises:
            Unavailable: credentials could not be vended.
        """
        assert self.cold is not None
        return await self._run(self.cold.data_access, tenant, entry.location)
