"""Noisy neighbour over the Kafka listener: does tenant A, producing with confluent-kafka
at several times its append quota, slow tenant B's confluent-kafka producer down?

As ``benchmarks.neighbours`` does over gRPC, on the Redis-backed gateway with both tenants
given the same append quota: B produces open loop at a fraction of its quota (100-byte
JSON records, ``acks=all``), first alone, then while A produces at a multiple of its quota
from a process of its own. Over Kafka the quota answers the Kafka way: an over-quota
Produce is held and answered with ``throttle_time_ms``, and librdkafka holds A's further
requests for that time, so A slows down instead of hammering. B's latency is measured
from each record's intended send time (open loop) to its delivery report; A's accepted
rate shows the quota holding. Each multiple is measured ``repeats`` times (rows of the
median run by B's p99 ratio, with the spread).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import threading
import time
import uuid
from dataclasses import asdict, replace
from typing import Any

from benchmarks.harness import Bench
from benchmarks.loadgen import Result, Workload
from benchmarks.neighbours import _Cpu, _p99
from gateway.client import Client
from tests.services import GatewayProcess

#: Record size of the noisy tenant: large enough that a Python loop offers 10x the quota.
NOISY_RECORD_BYTES = 2000


def _config(port: int, tenant: str, key: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": tenant,
        "sasl.password": key,
        "acks": "all",
        "linger.ms": 5,
    }


def _produce(
    config: dict[str, Any],
    topic: str,
    w: Workload,
    rate: float,
    seconds: float,
    result: Result,
    warmup: float = 0.0,
    purge: bool = False,
) -> None:
    """Produce ``rate`` records a second of ``w.record_bytes`` for ``seconds`` (open loop:
    record ``i`` is due at ``start + i / rate``), each record's latency from its due time
    to its delivery report; records that find librdkafka's queue full wait for room.
    Records due in the first ``warmup`` seconds are sent but not counted; with ``purge``,
    those still queued at the end are dropped (not counted) instead of waited for."""
    from confluent_kafka import KafkaError, Producer

    producer = Producer(config)
    producer.list_topics(topic, timeout=60)  # connected and logged in before the clock
    payload = "x" * max(1, w.record_bytes - 40)
    stop = threading.Event()

    def serve() -> None:  # delivery reports, as an application's poll thread
        while not stop.is_set():
            producer.poll(0.05)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    start = time.perf_counter()
    i = 0
    while True:
        due = start + i / rate
        now = time.perf_counter()
        if due - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)

        def done(err: Any, _msg: Any, due: float = due) -> None:
            if due - start < warmup:
                return
            if err is not None:
                if err.code() != KafkaError._PURGE_QUEUE:
                    result.errors += 1
                return
            result.records += 1
            result.bytes += w.record_bytes
            result.ack.record_value(max(1, int((time.perf_counter() - due) * 1e6)))

        value = json.dumps({"id": i, "payload": payload}).encode()
        while True:
            try:
                producer.produce(topic, value, partition=i % w.partitions, on_delivery=done)
                break
            except BufferError:
                time.sleep(0.001)
        i += 1
    if purge:  # what the quota has not let through yet is dropped, not waited for
        producer.purge(in_queue=True, in_flight=False)
    producer.flush(60)
    stop.set()
    server.join(5)
    result.batches = result.records
    result.seconds = time.perf_counter() - start - warmup


def _noisy(
    config: dict[str, Any], topic: str, fields: dict[str, Any], rate: float, out: Any
) -> None:
    """Tenant A, in a process of its own: "ready", then its summary on ``out``."""
    w = Workload(**fields)
    result = Result(w.name, "")
    out.put("ready")
    _produce(config, topic, w, rate, w.duration_s, result, purge=True)
    out.put(result.summary())


def _table(gw: GatewayProcess, key: str, w: Workload) -> str:
    topic = f"bench{uuid.uuid4().hex[:8]}.neighbour"
    with Client(gw.grpc_target, api_key=key) as client:
        client.create_table(topic, {"id": "int64", "payload": "string"}, partitions=w.partitions)
    return topic


async def _one_run(
    b: Bench, w: Workload, factor: float, a: tuple[str, str], bee: tuple[str, str]
) -> tuple[dict[str, Any], ...]:
    gw = b.tiered
    pid = gw.proc.pid  # type: ignore[union-attr]
    quota = w.quota_bytes_per_s
    topic_a, topic_b = _table(gw, a[1], w), _table(gw, bee[1], w)
    config_a, config_b = _config(gw.kafka_port, *a), _config(gw.kafka_port, *bee)
    quiet_rate = w.quiet_fraction * quota / w.record_bytes
    alone = Result(w.name, "tenant B alone, confluent-kafka (baseline)")
    with _Cpu(pid) as cpu_alone:
        await asyncio.to_thread(
            _produce, config_b, topic_b, w, quiet_rate, w.warmup_s + w.duration_s, alone, w.warmup_s
        )
    noisy = replace(
        w, record_bytes=NOISY_RECORD_BYTES, duration_s=2 * w.warmup_s + w.duration_s + 3
    )
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    noisy_rate = factor * quota / NOISY_RECORD_BYTES
    proc = ctx.Process(
        target=_noisy, args=(config_a, topic_a, asdict(noisy), noisy_rate, out), daemon=True
    )
    proc.start()
    ready = await asyncio.to_thread(out.get, True, 300)
    assert ready == "ready", ready
    await asyncio.sleep(w.warmup_s + 1)  # A at full rate (and throttled) before B starts
    beside = Result(w.name, f"tenant B beside A at {factor:g}x its quota, confluent-kafka")
    with _Cpu(pid) as cpu_beside:
        await asyncio.to_thread(
            _produce,
            config_b,
            topic_b,
            w,
            quiet_rate,
            w.warmup_s + w.duration_s,
            beside,
            w.warmup_s,
        )
        loud = await asyncio.to_thread(out.get, True, 600)
        await asyncio.to_thread(proc.join, 60)
    with Client(gw.grpc_target, api_key=a[1]) as client:
        client.drop_table(topic_a)
    with Client(gw.grpc_target, api_key=bee[1]) as client:
        client.drop_table(topic_b)
    base, row = alone.summary(), beside.summary()
    base["gateway_cpu"], row["gateway_cpu"] = cpu_alone.share, cpu_beside.share
    p99_alone, p99_beside = _p99(base), _p99(row)
    row["p99_vs_alone"] = p99_beside / p99_alone if p99_alone and p99_beside else None
    loud["system"] = f"tenant A at {factor:g}x its quota, confluent-kafka (throttled)"
    loud["offered_mb_per_s"] = noisy_rate * NOISY_RECORD_BYTES / 1e6
    loud["quota_mb_per_s"] = quota / 1e6
    return base, row, loud


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with b.named_tenants(b.tiered, 2, append_bytes_per_s=w.quota_bytes_per_s) as (a, bee):
        for factor in w.noisy_factors or (w.noisy_factor,):
            runs = [await _one_run(b, w, factor, a, bee) for _ in range(max(1, w.repeats))]
            measured = (
                sorted(
                    (r for r in runs if r[1]["p99_vs_alone"] is not None),
                    key=lambda r: r[1]["p99_vs_alone"],
                )
                or runs
            )
            ratios = [r[1]["p99_vs_alone"] for r in measured if r[1]["p99_vs_alone"]]
            base, row, loud = (dict(x) for x in measured[len(measured) // 2])
            base["name"] = row["name"] = loud["name"] = f"{w.name}-{factor:g}x"
            row.update(
                runs=len(runs),
                p99_vs_alone=statistics.median(ratios) if ratios else None,
                p99_ratio_min=min(ratios) if ratios else None,
                p99_ratio_max=max(ratios) if ratios else None,
                p99_alone_ms=[_p99(r[0]) for r in runs],
                p99_beside_ms=[_p99(r[1]) for r in runs],
            )
            rows += [base, row, loud]
    return rows
