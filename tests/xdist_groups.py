"""Which tests share a pytest-xdist worker, and a scheduler that keeps each group on one.

Hooks of ``tests/conftest.py`` (it imports them). ``make test`` runs the suite with
``-n 4 --dist loadgroup``: every test of an xdist group runs on one worker, tests in no
group go to whichever worker is free (docs/decisions/test-suite.md).

- :func:`group_of` gives a test its group: ``spark`` when it uses the run's SparkSession
  (one JVM for the run, not one per worker), or its module's path when it uses a module-,
  class- or package-scoped fixture (a gateway process, a browser: started once, not once per
  worker that happens to get one of its tests). An ``xdist_group`` mark of the test's own
  wins; a test that asks for the SparkSession with ``request.getfixturevalue("spark")``
  must carry ``pytest.mark.xdist_group("spark")``, as nothing else can tell.
- :class:`GroupScheduling` runs each group on one worker. pytest-xdist's own ``loadgroup``
  tells its scheduler the groups by appending ``@group`` to the test ids the workers report,
  which pytest 9.2's structured node ids silently undo (pytest-dev/pytest-xdist#1386): every
  test then goes anywhere, and a Spark test on each worker starts a JVM of its own. Here each
  worker writes the groups it collected to a file the controller named for it, and the
  controller's scheduler reads them (and fails if one is missing), whatever the ids say.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: The group of the tests that share the one SparkSession of a run.
SPARK_GROUP = "spark"
#: ``workerinput`` key: where a worker writes the groups it collected.
_GROUPS_FILE = "tidegate_groups_file"
_FOLDER = pytest.StashKey[Path]()


def fixture_group(item: pytest.Item) -> str | None:
    """The group ``item``'s fixtures put it in, or None (see the module docstring)."""
    names = getattr(item, "fixturenames", ())
    if "spark" in names:
        return SPARK_GROUP
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in names:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "class", "package"):
            return item.nodeid.split("::", 1)[0].removeprefix("tests/").removesuffix(".py")
    return None


def group_of(item: pytest.Item) -> str | None:
    """The group of ``item``: its ``xdist_group`` marks (joined as pytest-xdist joins them)."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the group :func:`fixture_group` gives, unless it has one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = fixture_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))


# In the controller ---------------------------------------------------------------------
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Name the file each worker writes its groups to, in a folder of this run."""
    config = node.config
    if _FOLDER not in config.stash:
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="tidegate-xdist-groups-"))
    node.workerinput[_GROUPS_FILE] = str(config.stash[_FOLDER] / f"{node.gateway.id}.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """:class:`GroupScheduling` for ``--dist loadgroup``; xdist's own for the others."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """LoadScope scheduling whose scopes are the groups the workers wrote: a group is
        one unit of work (one worker runs all of it), a test in no group a unit alone.
        Units go out largest first (xdist's ``--loadscope-reorder``)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = self._read_groups()
            group = self._groups.get(nodeid)
            # A group's scope cannot be mistaken for a test's: ids hold "::", these do not.
            return f"group {group}" if group else nodeid

        def _read_groups(self) -> dict[str, str]:
            groups: dict[str, str] = {}
            for node in self.registered_collections:
                path = Path(node.workerinput[_GROUPS_FILE])
                if not path.exists():
                    raise RuntimeError(
                        f"worker {node.gateway.id} wrote no xdist groups to {path}: "
                        "is tests/xdist_groups.py loaded by its conftest?"
                    )
                groups.update(json.loads(path.read_text()))
            return groups

    return GroupScheduling(config, log)


# In each worker ------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before xdist tells the controller its collection is done
def pytest_collection_finish(session: pytest.Session) -> None:
    target = getattr(session.config, "workerinput", {}).get(_GROUPS_FILE)
    if target is None:
        return
    groups = {item.nodeid: g for item in session.items if (g := group_of(item)) is not None}
    partial = f"{target}.{os.getpid()}.tmp"
    Path(partial).write_text(json.dumps(groups))
    os.replace(partial, target)  # whole or absent when the controller reads it
