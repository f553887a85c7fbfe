"""What the server and the client SDK share: the wire vocabulary of Tidegate.

Errors and their gRPC status form (:mod:`~gateway.wire.errors`, :mod:`~gateway.wire.status`),
table schemas as Arrow type names (:mod:`~gateway.wire.schema`), JSON rows
(:mod:`~gateway.wire.jsonrows`), key routing (:mod:`~gateway.wire.routing`), the Arrow IPC
codec (:mod:`~gateway.wire.codec`), hot batches as stored (:mod:`~gateway.wire.stored`),
retry policies (:mod:`~gateway.wire.retry`), small value types (:mod:`~gateway.wire.types`)
and the generated gRPC stubs (``_proto``).

Light by rule: it imports only the standard library, pyarrow, numpy, grpcio and protobuf,
and nothing else of ``gateway`` (the SDK is built on it).
"""
