# syntax=docker/dockerfile:1.7
# specserve: OpenAI-compatible server with lossless draft-model speculative decoding.
#
#   DOCKER_BUILDKIT=1 docker build -t specserve:0.1.0 .
#   docker run --gpus all -p 8000:8000 -v /data/models:/models specserve:0.1.0 \
#       --model /models/target --draft-model /models/draft --num-speculative-tokens 4
#
# Arguments after the image name are appended to `specserve serve --host 0.0.0.0 --port 8000`
# Keep the container port at 8000 (the HEALTHCHECK probes it) and map it with -p instead.
# The API key comes from the environment: -e SPECSERVE_API_KEY=... (comma-separated for several).
#
# One CUDA: the base is plain Debian + Python, and CUDA comes only from torch's own nvidia-* wheels
# (runtime, cuBLAS, cuDNN, NCCL, ...). The driver (libcuda) is mounted by the NVIDIA container
# toolkit at run time, which the two NVIDIA_* variables below ask for.
#
# A C compiler in the final stage: Triton compiles a small launcher (C, against Python.h and
# libcuda) the first time each kernel signature runs, on the serving machine. Without gcc every Triton
# kernel fails at first use (sglang issue 1067 hit this after moving to a CUDA runtime image). The
# python:*-slim images carry Python.h; gcc and libc6-dev come from Debian.
#
# Base images are pinned by digest (the tag is for readers; the digest is what is pulled). The
# digests below are the multi-arch index digests of those tags as published in public Dockerfiles;
# they could not be checked against the registries from the machine this was written on (no
# Docker, no registry access). Refresh them together with the apt pins, e.g.
#   docker buildx imagetools inspect python:3.12.14-slim-bookworm
#   docker run --rm python:3.12.14-slim-bookworm@sha256:... sh -c 'apt-get update -qq && apt-cache policy gcc libc6-dev'

ARG PYTHON_IMAGE=python:3.12.14-slim-bookworm@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.9.5@sha256:f459f6f73a8c4ef5d69f4e6fbbdb8af751d6fa40ec34b39a1ab469acd6e289b7

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------- build: venv, torch, specserve
FROM ${PYTHON_IMAGE} AS build
# torch pinned to 2.11.0 + CUDA 13.0 (with it Triton 3.6.0): the GPU machine's tested stack, on which
# tests/gpu passed. CI on the CPU machine installs 2.13.0's CPU wheel; pyproject allows both (torch>=2.11).
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_CACHE_DIR=/root/.cache/uv \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}
COPY --from=uv /uv /usr/local/bin/uv
# Layer 1, torch and its nvidia-* wheels (GBs): rebuilt only when TORCH_VERSION or the index changes.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv venv --python /usr/local/bin/python3 /opt/venv \
 && uv pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
# Layer 2, specserve's dependencies, read from pyproject.toml alone: a source change does not
# reinstall them. torch is already satisfied, so it stays the pinned CUDA build.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install -r pyproject.toml
# Layer 3, the package itself (no dependency resolution left to do).
COPY specserve ./specserve
COPY kernels ./kernels
COPY engine ./engine
COPY server ./server
COPY bench ./bench
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install --no-deps . \
 && specserve --help > /dev/null

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ARG SPECSERVE_UID=10001
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="specserve" \
      org.opencontainers.image.description="OpenAI-compatible LLM server with lossless draft-model speculative decoding" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/specserve/specserve" \
      org.opencontainers.image.url="https://github.com/specserve/specserve" \
      org.opencontainers.image.documentation="https://github.com/specserve/specserve/blob/main/deploy/README.md" \
      org.opencontainers.image.vendor="specserve" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="docker.io/library/python:3.12.14-slim-bookworm"
# Triton's launcher compiler (see the top of this file). Versions are Debian bookworm's current ones:
# update them with the base digest.
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    rm -f /etc/apt/apt.conf.d/docker-clean \
 && apt-get update \
 && apt-get install -y --no-install-recommends gcc=4:12.2.0-3 libc6-dev=2.36-9+deb12u14 \
 && gcc --version > /dev/null
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models/.hf \
    CC=/usr/bin/gcc \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build /opt/venv /opt/venv
RUN groupadd --system --gid "${SPECSERVE_UID}" specserve \
 && useradd --system --uid "${SPECSERVE_UID}" --gid specserve --home-dir /home/specserve \
        --create-home --shell /usr/sbin/nologin specserve \
 && mkdir -p /models \
 && chown specserve:specserve /models
USER ${SPECSERVE_UID}:${SPECSERVE_UID}
WORKDIR /home/specserve
EXPOSE 8000
# Weight loading can take minutes: give the first check a long grace period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["specserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD []
