# syntax=docker/dockerfile:1
#
# One image for every role: `docker run IMAGE gateway|worker|planner|up …` runs
# `dspark-serve <role>` (every option also reads DSPARK_* variables). The base is ROCm PyTorch
# (AMD MI35x) unless BASE_IMAGE says otherwise; scripts/build-image.sh picks the base and tag for
# each flavor (rocm, cuda, cpu). Every Python dependency's version comes from requirements.lock
# (`make lock` writes it from pyproject.toml; the Makefile installs through it too), Ray with its
# `default` extra: the dashboard and the per-node agent whose HTTP ports the chart's probes call.
# The shipped drafters are package data, so the image carries them. Model weights are never
# baked in: mount them, e.g. at /models (the Helm chart mounts a PVC, host path or image volume
# there, read-only).
#
#   docker build -t dspark-serve:0.1.0-rocm .
#   docker build -t dspark-serve:0.1.0-cuda \
#     --build-arg BASE_IMAGE=docker.io/pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime .

ARG BASE_IMAGE=docker.io/rocm/pytorch:rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.8.0

# --- build: the project's wheel; the source tree stays in this stage ----------------------------
FROM ${BASE_IMAGE} AS build
# pip settings for builds behind a mirror or with a local wheel directory (build-image.sh);
# unset unless given.
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY services ./services
COPY training ./training
RUN python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS
# Bases without PyTorch (the cpu flavor) install this torch version first, from PIP_FIND_LINKS
# or TORCH_INDEX_URL (an extra index; empty: none); the ROCm and CUDA bases keep their own
# build, which satisfies `torch>=2.6`.
ARG TORCH_VERSION=""
ARG TORCH_INDEX_URL=""
ARG DSPARK_UID=10001

LABEL org.opencontainers.image.title="dspark-serve" \
      org.opencontainers.image.description="LLM serving with DSpark speculative decoding: gateway, prefill/decode workers, planner" \
      org.opencontainers.image.licenses="Apache-2.0"

# The bases' Python may be the distribution's (PEP 668): this image is that environment's owner.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/dspark \
    DSPARK_HOST=0.0.0.0 \
    DSPARK_PORT=8000

COPY --from=build /wheels /tmp/wheels
COPY requirements.lock /tmp/requirements.lock
RUN set -eux; \
    if [ -n "${TORCH_VERSION}" ]; then \
      python3 -m pip install --no-cache-dir -c /tmp/requirements.lock \
        ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} "torch==${TORCH_VERSION}"; \
    fi; \
    set -- /tmp/wheels/dspark_serve-*.whl; \
    python3 -m pip install --no-cache-dir -c /tmp/requirements.lock "dspark-serve[serve] @ file://$1"; \
    rm -rf /tmp/wheels /tmp/requirements.lock; \
    python3 -c "import torch, ray, fastapi, prometheus_client, aiohttp, aiohttp_cors, opencensus"; \
    python3 -c "import ray.dashboard.dashboard, ray.dashboard.agent"; \
    command -v dspark-serve; \
    groupadd --gid "${DSPARK_UID}" dspark; \
    useradd --uid "${DSPARK_UID}" --gid dspark --home-dir /home/dspark --create-home \
      --shell /bin/bash dspark

# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/dspark
EXPOSE 8000

# Only the HTTP roles (gateway, up) have an endpoint to probe; for worker and planner a running
# PID 1 is the health. Kubernetes ignores this and uses the chart's probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
  CMD ["python3", "-c", "import os, sys, urllib.request as r; argv = set(open('/proc/1/cmdline', 'rb').read().split(b'\\0')); sys.exit(0) if not argv & {b'gateway', b'up'} else r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DSPARK_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["dspark-serve"]
CMD ["gateway"]
