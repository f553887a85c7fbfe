"""The gateway process and its network edges: gRPC (:mod:`~gateway.server.grpc_server`),
HTTP (:mod:`~gateway.server.http`), the data-plane calls both share
(:mod:`~gateway.server.calls`), and the process that runs them (:mod:`~gateway.server.app`)."""
