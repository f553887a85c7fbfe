"""The gRPC edge: the call interceptor that decides who is calling from a call's metadata
(``calls``), the Tidegate servicer by resource (``service``), the server with health,
reflection and its connection bounds (``server``) and the admin servicer (``admin``)."""
