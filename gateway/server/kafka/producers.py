"""Kafka's idempotent producer over the hot tier's: ``InitProducerId`` draws a producer id,
and a Produce batch that carries one is appended as a batch of the hot tier's producer
``kafka-<id>-e<epoch>`` at the batch's base sequence, its sequences counting records
(:class:`~gateway.hot.ProducerSequence`). The de-duplication is the hot tier's, the one
the SDK's producer uses: kept with the partition, so a retry after a gateway restart is
still answered with the offsets its first attempt got."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

from gateway.server.kafka.base import ApisBase
from gateway.server.kafka.protocol import (
    ErrorCode,
    ProducerFenced,
    Request,
    build,
    response_class,
)
from gateway.server.kafka.records import ProducedBatch
from gateway.wire.errors import MalformedPayload

__all__ = ["ProducerApis", "ProducerEpochs", "idempotence"]

#: Kafka's epochs are 16-bit: past this one a bump draws a new producer id.
_LAST_EPOCH = 32766


def hot_producer_id(producer_id: int, epoch: int) -> str:
    """The hot tier's producer of a Kafka producer id and epoch: a new epoch starts over
    at sequence 0, as Kafka's does."""
    return f"kafka-{producer_id}-e{epoch}"


class ProducerEpochs:
    """The newest epoch this listener saw of each Kafka producer id, per tenant (at most
    ``most`` ids, the least recently seen forgotten first): a Produce or a bump of an
    older epoch is fenced with ``INVALID_PRODUCER_EPOCH``, as Kafka fences a producer
    whose epoch was bumped. Kept in the process only: an id is drawn at random for one
    client, which bumps its own epoch only once its requests are done, so a stale epoch
    after a restart cannot come from another producer."""

    def __init__(self, most: int = 100_000) -> None:
        self._latest: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._most = most

    def see(self, tenant: str, producer_id: int, epoch: int) -> bool:
        """Whether ``epoch`` is the newest seen of the producer (it is then remembered);
        False when a newer one was seen."""
        key = (tenant, producer_id)
        latest = self._latest.get(key, -1)
        if epoch < latest:
            return False
        self._latest[key] = epoch
        self._latest.move_to_end(key)
        while len(self._latest) > self._most:
            self._latest.popitem(last=False)
        return True

    def draw(self, tenant: str) -> int:
        """A new producer id (random, 63 bits: no counter to share between replicas)."""
        producer_id = secrets.randbelow((1 << 63) - 1) + 1
        self.see(tenant, producer_id, 0)
        return producer_id


def idempotence(
    produced: ProducedBatch, epochs: ProducerEpochs, tenant: str, topic: str
) -> dict[str, Any]:
    """The producer fields of the append of ``produced`` (none for a batch without a
    producer id).

    Raises:
        MalformedPayload: an idempotent partition that is not one batch with a sequence
            and an epoch (Kafka takes exactly one batch per partition).
        ProducerFenced: the batch's epoch is older than one seen of its producer id.
    """
    if produced.producer_id < 0:
        return {}
    pid, epoch, sequence = produced.producer_id, produced.producer_epoch, produced.base_sequence
    if produced.batches != 1:
        raise MalformedPayload(
            f"{topic}: an idempotent produce carries {produced.batches} record batches for "
            "one partition; Kafka takes exactly one"
        )
    if sequence < 0 or epoch < 0:
        raise MalformedPayload(
            f"{topic}: producer id {pid} sent a batch with base sequence {sequence} and "
            f"epoch {epoch}; an idempotent batch needs both (0 or more)"
        )
    if not epochs.see(tenant, pid, epoch):
        raise ProducerFenced(
            f"{topic}: producer id {pid} sent epoch {epoch}, older than one it was given "
            "since; the producer was fenced",
            producer_id=str(pid),
            epoch=epoch,
        )
    return {
        "producer_id": hot_producer_id(pid, epoch),
        "sequence": sequence,
        "sequence_counts_records": True,
    }


class ProducerApis(ApisBase):
    """InitProducerId."""

    producers: ProducerEpochs

    async def init_producer_id(self, request: Request) -> Any:
        """A new producer id at epoch 0, or (v3+, KIP-360) the epoch after the one the
        producer holds. Transactions are not served: a transactional id is refused with
        ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, an error every client stops on."""
        body = request.body
        answer: dict[str, Any] = {"producer_id": -1, "producer_epoch": -1}
        if body.transactional_id is not None:
            answer["error_code"] = ErrorCode.transactional_id_authorization_failed
            return build(response_class(request), answer)
        pid = int(getattr(body, "producer_id", -1))
        epoch = int(getattr(body, "producer_epoch", -1))
        if pid >= 0 and epoch >= 0:
            if not self.producers.see(self.tenant, pid, epoch):
                answer["error_code"] = ErrorCode.invalid_producer_epoch
                return build(response_class(request), answer)
            if epoch < _LAST_EPOCH:
                self.producers.see(self.tenant, pid, epoch + 1)
                answer.update(producer_id=pid, producer_epoch=epoch + 1)
                return build(response_class(request), answer)
        answer.update(producer_id=self.producers.draw(self.tenant), producer_epoch=0)
        return build(response_class(request), answer)
