"""Consumer groups with membership, against real gateways on both hot tiers: members
share a table's partitions (both SDK flavours), rebalance on join and leave, and a fenced
member's commit is refused on both edges."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.client import GroupNotEmpty, IllegalGeneration, UnknownMember
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from tests.integration.flavours import flavoured_client
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

#: Short sessions, so that a silent member is noticed within the test.
MEMBER = {
    "session_timeout": 1.5,
    "heartbeat_interval": 0.1,
    "poll_interval": 0.02,
    "auto_commit_interval": 0,
}


@pytest.fixture(params=["sync", "aio"])
def sdk(request: pytest.FixtureRequest, gateway: GatewayProcess) -> Iterator[Any]:
    with flavoured_client(request.param, gateway) as client:
        yield client


def wait_for(
    what: str, done: Callable[[], bool], timeout: float = 60, interval: float = 0.02
) -> None:
    """Until ``done()``: asked every ``interval`` seconds, for at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def _fill(sdk: Any, table: str, partitions: int, per_partition: int, first: int = 0) -> None:
    for p in range(partitions):
        rows = [{"n": p * 1_000_000 + first + i} for i in range(per_partition)]
        sdk.append(table, rows, partition=p)


def _offsets(batches: list[Any]) -> list[tuple[int, int]]:
    return [
        (b.column("_partition")[0].as_py(), o)
        for b in batches
        for o in b.column("_offset").to_pylist()
    ]


def test_members_share_partitions_and_rebalance_on_join_and_leave(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.shared"
    sdk.create_table(table, {"n": "int64"}, partitions=4)
    _fill(sdk, table, 4, 10)
    assigned: list[int] = []
    revoked: list[int] = []
    read_a: list[tuple[int, int]] = []
    read_b: list[tuple[int, int]] = []
    with sdk.consumer(
        table, group="g", on_assign=assigned.extend, on_revoke=revoked.extend, **MEMBER
    ) as a:
        wait_for(
            "a alone to read everything",
            lambda: bool(read_a.extend(_offsets(a.poll(0.05)))) or len(read_a) >= 40,
        )
        assert sorted(a.assignment()) == [0, 1, 2, 3] and sorted(assigned) == [0, 1, 2, 3]
        first_generation = a.generation
        with sdk.consumer(table, group="g", **MEMBER) as b:

            def split() -> bool:
                read_a.extend(_offsets(a.poll(0.02)))
                read_b.extend(_offsets(b.poll(0.02)))
                return len(a.assignment()) == 2 and len(b.assignment()) == 2

            wait_for("the two members to split the partitions", split)
            assert sorted(a.assignment() + b.assignment()) == [0, 1, 2, 3]
            # Cooperative: a gave up exactly what b took, and nothing else moved.
            assert sorted(revoked) == sorted(b.assignment())
            assert b.generation > first_generation
            info = sdk.describe_group("g", table)
            assert (info.state, len(info.members)) == ("stable", 2)
            holders = {p.partition: p.member_id for p in info.partitions}
            assert {p for p, m in holders.items() if m == b.member_id} == set(b.assignment())
            assert info.lag == 0 and all(p.committed == 10 for p in info.partitions)

            _fill(sdk, table, 4, 5, first=10)
            wait_for(
                "the new records",
                lambda: split() and len(read_a) + len(read_b) >= 60,
            )
        # b left on close: a takes its partitions back at once (no session timeout).
        wait_for(
            "a to get everything back",
            lambda: bool(read_a.extend(_offsets(a.poll(0.02)))) or len(a.assignment()) == 4,
        )
    got = read_a + read_b
    assert sorted(got) == sorted((p, o) for p in range(4) for o in range(15)), "lost or twice"
    final = sdk.describe_group("g", table)
    assert (final.state, final.members, final.lag) == ("empty", (), 0)


def test_more_members_than_partitions_and_a_non_following_member(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.few"
    sdk.create_table(table, {"n": "int64"}, partitions=1)
    _fill(sdk, table, 1, 3)
    with sdk.consumer(table, group="few", **MEMBER) as a:
        wait_for("a to hold the partition", lambda: bool(a.poll(0.02)) or a.assignment() == [0])
        # b gets nothing, and without follow its iteration ends at once, empty.
        with sdk.consumer(table, group="few", follow=False, **MEMBER) as b:
            assert list(b) == [] and b.assignment() == []
        assert a.assignment() == [0]


def heartbeat(
    client: Any, group: str, table: str, member: str, generation: int, owned: list[int], ms: int
) -> pb.GroupHeartbeatResponse:
    """One raw heartbeat, as a member of another SDK (or a zombie) would send it."""
    namespace, name = table.split(".")
    request = pb.GroupHeartbeatRequest(
        group=group,
        table=pb.TableRef(namespace=namespace, name=name),
        member_id=member,
        generation=generation,
        owned=owned,
        session_timeout_ms=ms,
        client_id="test",
    )
    return client._call("GroupHeartbeat", request)


def test_a_session_timeout_reassigns_and_fences_the_silent_member(
    gateway: GatewayProcess, namespace: str
) -> None:
    """A member that stops heartbeating loses its partitions after its session timeout;
    its late commit names the group, the member and the current generation."""
    table = f"{namespace}.silent"
    with gateway.client() as c:
        c.create_table(table, {"n": "int64"}, partitions=2)

        def beat(member: str, generation: int, owned: list[int]) -> pb.GroupHeartbeatResponse:
            return heartbeat(c, "z", table, member, generation, owned, 800)

        silent = beat("silent", 0, [])
        assert list(silent.assigned) == [0, 1]
        c.commit_offsets("z", table, {0: 0}, member_id="silent", generation=silent.generation)
        other = beat("other", 0, [])
        assert (list(other.assigned), other.pending) == ([], 1)
        # An outsider may not commit for a group with live members.
        with pytest.raises(GroupNotEmpty, match="has 2 live members"):
            c.commit_offsets("z", table, {0: 0})
        # "silent" says nothing; "other" keeps heartbeating until it gets both partitions.
        gen = other.generation
        wait_for(
            "the silent member's partitions to move",
            lambda: list(beat("other", gen, []).assigned) == [0, 1],
        )
        with pytest.raises(UnknownMember) as fenced:
            c.commit_offsets("z", table, {0: 5}, member_id="silent", generation=silent.generation)
        state = c.describe_group("z", table)
        assert fenced.value.details["generation"] == str(state.generation)
        assert "member silent is not in consumer group 'z'" in fenced.value.message
        assert f"the group is at generation {state.generation}" in fenced.value.message
        assert c.fetch_offsets("z", table) == {0: 0}  # nothing of the zombie's was stored
        # Its heartbeat is refused too: it must rejoin with generation 0.
        with pytest.raises(UnknownMember):
            beat("silent", silent.generation, [0, 1])


def test_a_reassigned_partition_refuses_the_old_generation(
    gateway: GatewayProcess, namespace: str
) -> None:
    table = f"{namespace}.moved"
    with gateway.client() as c:
        c.create_table(table, {"n": "int64"}, partitions=2)
        for p in (0, 1):  # commits are bounded by the high watermark
            c.append(table, [{"n": i} for i in range(5)], partition=p)

        def beat(member: str, generation: int, owned: list[int]) -> pb.GroupHeartbeatResponse:
            return heartbeat(c, "m", table, member, generation, owned, 30_000)

        a = beat("a", 0, [])
        old = a.generation
        beat("b", 0, [])
        a = beat("a", old, [0, 1])  # told to give one up
        kept = list(a.assigned)
        (gave,) = {0, 1} - set(kept)
        beat("a", a.generation, kept)  # gave it up
        b = beat("b", 1, [])
        assert list(b.assigned) == [gave]
        with pytest.raises(IllegalGeneration) as refused:
            c.commit_offsets("m", table, {gave: 3}, member_id="a", generation=old)
        assert refused.value.details["member"] == "a"
        assert f"committed partition {gave} at generation {old}" in refused.value.message
        # What a still holds it may commit; b commits what it got.
        c.commit_offsets("m", table, {kept[0]: 1}, member_id="a", generation=a.generation)
        c.commit_offsets("m", table, {gave: 2}, member_id="b", generation=b.generation)
        assert c.fetch_offsets("m", table) == {kept[0]: 1, gave: 2}


def test_the_http_edge_serves_membership(gateway: GatewayProcess, namespace: str) -> None:
    with gateway.client() as c:
        c.create_table(f"{namespace}.h", {"n": "int64"}, partitions=2)
    base = f"/v1/groups/web/tables/{namespace}/h"
    with gateway.http_client() as http:
        joined = http.post(f"{base}/heartbeat", json={"session_timeout_ms": 5000})
        assert joined.status_code == 200, joined.text
        body = joined.json()
        assert body["assigned"] == [0, 1] and body["member_id"] and body["generation"] == 1
        member, generation = body["member_id"], body["generation"]
        described = http.get(base).json()
        assert described["state"] == "stable"
        assert [m["member_id"] for m in described["members"]] == [member]
        assert described["members"][0]["assigned"] == [0, 1]
        ok = http.post(
            f"{base}/offsets",
            json={
                "offsets": [{"partition": 1, "offset": 0}],
                "member_id": member,
                "generation": generation,
            },
        )
        assert ok.status_code == 200, ok.text
        outsider = http.post(f"{base}/offsets", json={"offsets": [{"partition": 1, "offset": 0}]})
        assert (outsider.status_code, outsider.json()["error"]["reason"]) == (
            409,
            "NON_EMPTY_GROUP",
        )
        stale = http.post(
            f"{base}/offsets",
            json={
                "offsets": [{"partition": 1, "offset": 0}],
                "member_id": "ghost",
                "generation": 1,
            },
        )
        assert (stale.status_code, stale.json()["error"]["reason"]) == (409, "UNKNOWN_MEMBER_ID")
        bad = http.post(f"{base}/heartbeat", json={"session_timeout_ms": 5})
        assert bad.status_code == 400 and "session timeout 5 ms" in bad.json()["error"]["message"]
        left = http.post(
            f"{base}/heartbeat", json={"member_id": member, "generation": generation, "leave": True}
        )
        assert left.status_code == 200, left.text
        assert http.get(base).json()["state"] == "empty"
        groups = http.get("/v1/groups", params={"namespace": namespace, "name": "h"}).json()
        assert groups["groups"] == [{"group": "web", "namespace": namespace, "name": "h"}]
        metrics = http.get("/metrics").text
        assert 'tidegate_groups_rebalances_total{reason="join"}' in metrics
        assert 'tidegate_groups_rebalances_total{reason="leave"}' in metrics
        assert 'tidegate_groups_fenced_requests_total{reason="UNKNOWN_MEMBER_ID"}' in metrics
        assert f'tidegate_groups_lag_records{{group="web",table="{namespace}.h"' in metrics


def test_cli_group_describe_shows_members_partitions_generation_and_lag(
    gateway: GatewayProcess, namespace: str
) -> None:
    from tests.integration.test_first_hour import cli

    table = f"{namespace}.described"
    with gateway.client() as c:
        c.create_table(table, {"n": "int64"}, partitions=3)
        _fill(c, table, 3, 4)
        options = {**MEMBER, "session_timeout": 30.0, "auto_commit_interval": None}
        with (
            c.consumer(table, group="ops", client_id="first", **options) as a,
            c.consumer(table, group="ops", client_id="second", **options) as b,
        ):

            def settled() -> bool:
                a.poll(0.02)
                b.poll(0.02)
                stable = c.describe_group("ops", table).state == "stable"
                return stable and len(a.assignment()) + len(b.assignment()) == 3

            wait_for("the members to settle", settled)
            a.commit()
            text = cli(gateway, "group", "describe", "ops", table).stdout.splitlines()
            generation = c.describe_group("ops", table).generation
            lag = 12 - 4 * len(a.assignment())
            assert text[0] == (
                f"group ops on {table}: generation {generation}, stable, 2 members, lag {lag}"
            )
            members = {line.split()[0]: line.split() for line in text[3:5]}
            assert members[a.member_id][1:4] == [
                "first",
                str(a.generation),
                ",".join(map(str, a.assignment())),
            ]
            assert members[b.member_id][1:4] == [
                "second",
                str(b.generation),
                ",".join(map(str, b.assignment())),
            ]
            rows = {int(line.split()[0]): line.split() for line in text[7:]}
            for p in a.assignment():
                assert rows[p][1:3] == [a.member_id, "4"] and rows[p][-1] == "0"
            for p in b.assignment():
                assert rows[p][1] == b.member_id and rows[p][-1] == "4"  # b has not committed
            described = json.loads(cli(gateway, "group", "describe", "ops", table, "--json").stdout)
            assert described["state"] == "stable" and len(described["members"]) == 2
