# otel-ofu as a node daemon or sidecar image.
#   docker build -t otel-ofu .
#   docker run --rm otel-ofu run --config /app/collector-config/demo.yaml --duration 60
# On GPU nodes run with the NVIDIA container runtime (NVML comes from the driver). For the
# dcgm receiver, mount DCGM's Python bindings and library from the host, e.g.
#   -v /usr/share/datacenter-gpu-manager-4:/usr/share/datacenter-gpu-manager-4:ro
# or point the receiver at a remote nv-hostengine (host:5555).
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY otel_ofu ./otel_ofu
COPY collector-config ./collector-config
RUN pip install --no-cache-dir . && useradd --system --uid 10001 otelofu
USER 10001
ENTRYPOINT ["otel-ofu"]
CMD ["run", "--config", "/app/collector-config/demo.yaml"]
