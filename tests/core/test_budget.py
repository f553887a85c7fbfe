"""The read budget's bookkeeping (pure, on an event loop of its own)."""

from __future__ import annotations

import asyncio

from gateway.core.budget import ReadBudget


def test_an_empty_read_alongside_another_read_of_the_tenant_releases_cleanly() -> None:
    """Found by three follow consumers of one tenant polling caught-up partitions: an
    empty answer (0 bytes) held while another read of the tenant gave its bytes back
    used to fail its release with a KeyError (an INTERNAL error to the client)."""

    async def run() -> None:
        budget = ReadBudget(1000, 500)
        await budget.reserve("t", 100)
        async with budget.hold("t", 0, force=True):
            budget.release("t", 100)  # the other read ends first: the entry goes
        assert (budget.held, budget.held_by("t")) == (0, 0)
        async with budget.hold("t", 10):
            assert budget.held_by("t") == 10
        assert budget.held_by("t") == 0

    asyncio.run(run())
