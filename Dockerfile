# syntax=docker/dockerfile:1
# otel-ofu as a node agent, a sidecar or a jobs-tier instance (deploy/helm/otel-ofu, docs/deploy.md).
#
#   docker build -t otel-ofu .                                   # sources dcgm_exporter, nvml, otlp
#   docker build -t otel-ofu:dcgm --build-arg DCGM_STAGE=dcgm .  # + the dcgm source (DCGM bindings)
#   docker run --rm -p 9464:9464 otel-ofu                        # the simulated fleet on :9464/metrics
#
# DCGM's Python bindings ship with DCGM, not on PyPI. DCGM_STAGE=dcgm copies them and the client
# library (libdcgm.so.4) from NVIDIA's DCGM image; pick DCGM_IMAGE with the same DCGM major version
# as the nv-hostengine the agent connects to. Without them, mount a host's DCGM install instead:
#   -v /usr/share/datacenter-gpu-manager-4:/usr/share/datacenter-gpu-manager-4:ro
#   -v /usr/lib/x86_64-linux-gnu/libdcgm.so.4:/opt/dcgm/lib/libdcgm.so.4:ro
#
# Bases are pinned to exact versions; pin digests too in a release pipeline
# (`docker buildx imagetools inspect python:3.11.14-slim-bookworm`).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG DCGM_IMAGE=nvcr.io/nvidia/cloud-native/dcgm:4.5.2-1-ubuntu22.04
# nodcgm | dcgm
ARG DCGM_STAGE=nodcgm

# --- build: otel-ofu and its dependencies (all published as wheels) into a virtual environment.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m venv /opt/otel-ofu
COPY pyproject.toml README.md ./
COPY otel_ofu ./otel_ofu
RUN /opt/otel-ofu/bin/pip install --no-cache-dir . \
    && /opt/otel-ofu/bin/pip uninstall --yes pip

# --- DCGM's bindings and client library, from NVIDIA's image (DCGM_STAGE=dcgm) ...
FROM ${DCGM_IMAGE} AS dcgm
RUN mkdir -p /dcgm/lib \
    && cp -a /usr/share/datacenter-gpu-manager-4/bindings/python3 /dcgm/bindings \
    && cp -a /usr/lib/*-linux-gnu/libdcgm.so* /dcgm/lib/

# --- ... or none (DCGM_STAGE=nodcgm, the default).
FROM ${PYTHON_IMAGE} AS nodcgm
RUN mkdir -p /dcgm/bindings /dcgm/lib

FROM ${DCGM_STAGE} AS dcgm-files

# --- the image: the base's Python, the virtual environment, no pip, no compiler, a non-root user.
FROM ${PYTHON_IMAGE}
RUN python -m pip uninstall --yes pip setuptools wheel \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin otelofu
COPY --from=build /opt/otel-ofu /opt/otel-ofu
COPY --from=dcgm-files /dcgm/bindings /usr/share/datacenter-gpu-manager-4/bindings/python3
COPY --from=dcgm-files /dcgm/lib /opt/dcgm/lib
COPY collector-config /app/collector-config
ENV PATH=/opt/otel-ofu/bin:$PATH \
    LD_LIBRARY_PATH=/opt/dcgm/lib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    OFU_PROMETHEUS_ENDPOINT=0.0.0.0:9464
WORKDIR /tmp
USER 10001:10001
EXPOSE 9464
# Healthy while the prometheus exporter answers (the default config and the chart's agent serve
# it on :9464); set OFU_HEALTH_URL for another port. Kubernetes uses the chart's probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('OFU_HEALTH_URL', 'http://127.0.0.1:9464/metrics'), timeout=4)"]
ENTRYPOINT ["otel-ofu"]
CMD ["run", "--config", "/app/collector-config/prometheus.yaml"]
