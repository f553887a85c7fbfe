"""Hot-tier placement through the admin API (issue 13): the gRPC ``Admin`` placement calls
and the SDK's admin client, move status, reserved shards (``tidegate tenant pin``),
``tidegate rebalance`` executing its plan through a gateway, and the per-shard gauges.

Real processes: three redis-server shards and a gateway process on them; the CLI runs as
a subprocess on the same configuration, as an operator's job would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import grpc
import pytest

from gateway.client import AdminClient
from gateway.wire._proto.tidegate.v1 import admin_pb2 as apb
from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc as apb_grpc
from gateway.wire.errors import InvalidRequest
from tests.integration.test_shards import SHARDS, Mover, shard_env, shards  # noqa: F401
from tests.services import GatewayProcess, RedisServer, run_cli

pytestmark = pytest.mark.integration

#: Seconds to reach the gateway: the shared test machine is often loaded far beyond its cores.
WAIT = 30.0


def tidegate(
    gw: GatewayProcess, env: dict[str, str], *args: str, operator: bool = True
) -> subprocess.CompletedProcess[str]:
    """The CLI, with the gateway's shard configuration and (unless told not to) its
    operator key in the environment."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    full.update(env)
    full["TIDEGATE_DATA_DIR"] = str(gw.data_dir)
    full["TIDEGATE_CONNECT_TIMEOUT"] = str(WAIT)
    if operator:
        full["TIDEGATE_OPERATOR_KEY"] = gw.operator_key
    return run_cli([*args, "--target", gw.grpc_target], full)


def metric(text: str, name: str, shard: str) -> float:
    m = re.search(rf'^{name}{{shard="{shard}"}} (\S+)$', text, re.M)
    assert m, f"{name} of {shard} missing"
    return float(m.group(1))


def test_grpc_admin_placements_moves_and_reserved_shards(
    shards: dict[str, RedisServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    env = shard_env(shards, tmp_path, tiering=False)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        with gw.client(connect_timeout=WAIT) as c:
            c.create_table("ga.ev", {"i": "int64"}, partitions=2)
            c.append("ga.ev", [{"i": i} for i in range(5)], partition=0)
        with AdminClient(
            gw.grpc_target, operator_key=gw.operator_key, connect_timeout=WAIT
        ) as admin:
            listed = admin.placements(gw.tenant)
            assert listed["shards"] == list(SHARDS)
            assert [(p["table"], p["partition"]) for p in listed["placements"]] == [
                ("ga.ev", 0),
                ("ga.ev", 1),
            ]
            source = listed["placements"][0]["shard"]
            target = next(s for s in SHARDS if s != source)
            moved = admin.move_partition(gw.tenant, "ga.ev", 0, target)
            assert (moved["state"], moved["source"], moved["target"], moved["start"]) == (
                "done",
                source,
                target,
                5,
            )
            (p0, _) = admin.placements(gw.tenant)["placements"]
            assert p0["segments"] == [
                {"shard": source, "start": 0, "end": 5},
                {"shard": target, "start": 5, "end": None},
            ]
            # Reserved shards: a shard that does not exist is refused in one sentence...
            with pytest.raises(InvalidRequest, match="no hot-tier shard 'nope': the shards are"):
                admin.pin_shards(gw.tenant, ["nope"])
            admin.create_tenant("other")
            pins = admin.pin_shards("other", [source])["pins"]
            assert pins == {source: "other"}
            # ...and a move onto another tenant's shard fails, and is listed as failed.
            with pytest.raises(InvalidRequest, match="reserved for another tenant"):
                admin.move_partition(gw.tenant, "ga.ev", 0, source)
            moves = admin.moves()
            assert [(m["state"], m["target"]) for m in moves] == [
                ("failed", source),
                ("done", target),
            ]
            assert moves[0]["error"].startswith("INVALID_REQUEST: shard")
            with pytest.raises(InvalidRequest, match="not reserved for other"):
                admin.unpin_shards("other", [target])
            assert admin.unpin_shards("other")["pins"] == {}
        # The HTTP edge lists the same moves.
        auth = {"authorization": f"Bearer {gw.operator_key}"}
        with gw.http_client(api_key=None, headers=auth) as h:
            listed_http = h.get("/v1/admin/moves").json()["moves"]
            assert [(m["state"], m["target"]) for m in listed_http] == [
                ("failed", source),
                ("done", target),
            ]
            pinned = h.put(f"/v1/admin/tenants/{gw.tenant}/shards", json={"shards": [source]})
            assert pinned.status_code == 200 and pinned.json()["pins"] == {source: gw.tenant}
            released = h.post(f"/v1/admin/tenants/{gw.tenant}/shards/release", json={})
            assert released.status_code == 200 and released.json()["pins"] == {}
            # Per-shard gauges: partitions (active segments), segments and bytes held.
            text = h.get("/metrics").text
        assert metric(text, "tidegate_hot_shard_partitions", target) >= 1
        assert sum(metric(text, "tidegate_hot_shard_partitions", s) for s in SHARDS) == 2
        assert sum(metric(text, "tidegate_hot_shard_segments", s) for s in SHARDS) == 3
        assert metric(text, "tidegate_hot_shard_bytes", source) > 0  # the sealed 5 records
        assert 'tidegate_hot_move_requests_total{outcome="done"} 1.0' in text
        assert 'tidegate_hot_move_requests_total{outcome="failed"} 1.0' in text
        # A tenant key is refused on every placement call, naming what is needed.
        with gw.channel() as channel:
            stub = apb_grpc.AdminStub(channel)
            for call, request in (
                (stub.ListPlacements, apb.ListPlacementsRequest()),
                (stub.MovePartition, apb.MovePartitionRequest(tenant=gw.tenant)),
                (stub.ListMoves, apb.ListMovesRequest()),
                (stub.PinShards, apb.PinShardsRequest(tenant=gw.tenant, shards=["b"])),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "operator key" in (refused.value.details() or "")
    finally:
        gw.stop()


def test_rebalance_and_tenant_pin_through_the_admin_api(
    shards: dict[str, RedisServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    """``tidegate rebalance`` measures heat on the shards and executes its moves through the
    gateway's admin API; ``tidegate shard moves`` shows them; ``tidegate tenant pin``
    reserves shards the same way."""
    env = shard_env(shards, tmp_path, tiering=False)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    mover = Mover(shards, tmp_path)
    try:
        with AdminClient(
            gw.grpc_target, operator_key=gw.operator_key, connect_timeout=WAIT
        ) as admin:
            admin.create_tenant("quiet")
            quiet_key = admin.issue_key("quiet")[1]
        # The bootstrap tenant's six partitions all append to 'default' and are hot.
        with gw.client(connect_timeout=WAIT) as c:
            c.create_table("rb.hot", {"s": "string"}, partitions=6)
        with AdminClient(
            gw.grpc_target, operator_key=gw.operator_key, connect_timeout=WAIT
        ) as admin:
            for p in admin.placements(gw.tenant)["placements"]:
                if p["shard"] != "default":
                    admin.move_partition(gw.tenant, "rb.hot", p["partition"], "default")
        with gw.client(connect_timeout=WAIT) as c:
            for p in range(6):
                c.append("rb.hot", [{"s": "x" * 2000} for _ in range(50)], partition=p)
        with gw.client(api_key=quiet_key, connect_timeout=WAIT) as c:
            c.create_table("rb.cold", {"s": "string"}, partitions=3)
            for p in range(3):
                c.append("rb.cold", [{"s": "y"}], partition=p)

        # Without the operator key, nothing is measured or moved: one sentence.
        refused = tidegate(gw, env, "rebalance", "--runner", "local", operator=False)
        assert refused.returncode == 2
        assert "needs the operator key" in refused.stderr
        assert "Traceback" not in refused.stderr

        dry = tidegate(gw, env, "rebalance", "--runner", "local", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)
        assert planned["moves"] and planned["moved"] == 0

        done = tidegate(gw, env, "rebalance", "--runner", "local", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["moved"] == len(result["moves"]) > 0
        assert {o["state"] for o in result["outcomes"]} == {"done"}
        assert {o["tenant"] for o in result["outcomes"]} == {gw.tenant}
        # The gateway ran them: its move list has each, done, and the placements show it.
        listed = tidegate(gw, env, "shard", "moves", "--json")
        assert listed.returncode == 0, listed.stderr
        rebalanced = [m for m in json.loads(listed.stdout)["moves"] if m["source"] == "default"]
        assert len(rebalanced) == result["moved"]
        assert all(m["state"] == "done" for m in rebalanced)
        text = tidegate(gw, env, "shard", "moves")
        assert text.stdout.splitlines()[0].split()[:3] == ["STATE", "TENANT", "TABLE"]
        assert "done" in text.stdout
        shards_now = {p.shard for p in mover.meta.placements(tenant=gw.tenant)}
        assert len(shards_now) > 1
        # Data stays where it was acknowledged.
        with gw.client(connect_timeout=WAIT) as c:
            for p in range(6):
                rows = c.read("rb.hot", partition=p, offset=0, max_records=100).to_pylist()
                assert [r["_offset"] for r in rows] == list(range(50))

        # tidegate tenant pin / unpin, through the same API.
        pinned = tidegate(gw, env, "tenant", "pin", "quiet", "c")
        assert pinned.returncode == 0, pinned.stderr + gw.log()
        assert pinned.stdout.strip() == "quiet reserves c"
        assert mover.meta.shard_pins() == {"c": "quiet"}
        with gw.client(api_key=quiet_key, connect_timeout=WAIT) as c:
            c.create_table("rb.new", {"s": "string"}, partitions=2)
        new = [p for p in mover.meta.placements(tenant="quiet") if p.name == "new"]
        assert {p.shard for p in new} == {"c"}
        bad = tidegate(gw, env, "tenant", "pin", "quiet", "zz")
        assert bad.returncode == 2
        assert "no hot-tier shard 'zz'" in bad.stderr and "Traceback" not in bad.stderr
        released = tidegate(gw, env, "tenant", "unpin", "quiet")
        assert released.returncode == 0, released.stderr
        assert released.stdout.strip() == "quiet reserves no shard"
        assert mover.meta.shard_pins() == {}
    except BaseException:
        print(gw.log())  # shown with the failure
        raise
    finally:
        mover.close()
        gw.stop()


def test_admin_client_is_refused_with_a_tenant_key(
    shards: dict[str, RedisServer],  # noqa: F811
    tmp_path: Path,
) -> None:
    gw = GatewayProcess(tmp_path / "gw", shard_env(shards, tmp_path, tiering=False)).start()
    try:
        from gateway.wire.errors import PermissionDenied

        assert gw.api_key is not None
        with AdminClient(gw.grpc_target, operator_key=gw.api_key) as admin:
            with pytest.raises(PermissionDenied, match="operator key"):
                admin.placements()
            with pytest.raises(PermissionDenied, match="operator key"):
                admin.move_partition(gw.tenant, "x.y", 0, "b")
    finally:
        gw.stop()
