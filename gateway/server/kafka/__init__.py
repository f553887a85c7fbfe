"""The Kafka edge: Kafka's wire protocol over the same stream-tables (docs/kafka.md).

One more edge beside gRPC, HTTP and Flight: it turns Kafka requests into the calls of
:class:`~gateway.server.calls.DataCalls` and the :class:`~gateway.tenancy.Gate`, and their
answers back into Kafka responses. ``protocol`` holds the message codecs (kio), ``records``
the record batches (aiokafka's), ``apis`` what each request does, ``server`` the listener.
"""

from gateway.server.kafka.server import KafkaEdge

__all__ = ["KafkaEdge"]
