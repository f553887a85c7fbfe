"""The gateway process and its network edges: gRPC (:mod:`~gateway.server.grpc.server`, its
service by resource in :mod:`~gateway.server.grpc.service`), HTTP
(:mod:`~gateway.server.http`), Arrow Flight (:mod:`~gateway.server.flight`), the data-plane
calls they share (:mod:`~gateway.server.calls`), and the process that runs them
(:mod:`~gateway.server.app`)."""
