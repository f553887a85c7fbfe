# Tidegate's image: the gateway (`tidegate serve`), the metadata migrations (`tidegate
# migrate`) and the tiering job (`tidegate tier`, Spark in local mode or as the driver of a
# cluster). Build it from the repository root and push it to your registry:
#   docker build -t registry.example.com/tidegate:0.1.0 .
# The Helm chart (helm/tidegate) runs it as user 10001 with a read-only root filesystem:
# only /tmp and the data folder are written.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: a virtual environment with the server, PostgreSQL and Spark extras (not the
# benchmark or development ones).
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tidegate
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY tiering ./tiering
RUN /opt/tidegate/bin/pip install --no-cache-dir ".[server,postgres,spark]" \
    && /opt/tidegate/bin/python -m compileall -q /opt/tidegate/lib

# Runtime stage: Python, a headless Java 17 runtime and ps (Spark's launch scripts use it),
# the environment, nothing else.
FROM ${PYTHON_IMAGE}
# Debian's security updates replace package versions, so pinning one would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 tidegate \
    && useradd --system --uid 10001 --gid tidegate --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin tidegate \
    && mkdir -p /var/lib/tidegate \
    && chown tidegate:tidegate /var/lib/tidegate
COPY --from=build /opt/tidegate /opt/tidegate
ENV PATH=/opt/tidegate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TIDEGATE_DATA_DIR=/var/lib/tidegate \
    TIDEGATE_SERVER__HOST=0.0.0.0
USER 10001:10001
WORKDIR /var/lib/tidegate
VOLUME ["/var/lib/tidegate"]
# gRPC, HTTP, the metrics port the chart configures (TIDEGATE_SERVER__METRICS_PORT) and Kafka.
EXPOSE 50051 8080 9090 9092
CMD ["tidegate", "serve"]
