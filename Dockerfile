# specserve: OpenAI-compatible server with lossless draft-model speculative decoding.
#
#   docker build -t specserve:0.1.0 .
#   docker run --gpus all -p 8000:8000 -v /data/models:/models specserve:0.1.0 \
#       --model /models/target --draft-model /models/draft --num-speculative-tokens 4
#
# Arguments after the image name are appended to `specserve serve --host 0.0.0.0 --port 8000`
# Keep the container port at 8000 (the HEALTHCHECK probes it) and map it with -p instead.
# The API key comes from the environment: -e SPECSERVE_API_KEY=... (comma-separated for several).
#
# Python comes from uv's standalone builds and torch's CUDA wheels carry their own CUDA libraries,
# so the image needs no apt packages; the CUDA runtime base provides the driver hooks and labels
# that the NVIDIA container toolkit looks for.

ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.9.5

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------- build: python, torch, specserve
FROM ${CUDA_IMAGE} AS build
ARG PYTHON_VERSION=3.12
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}
COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install "${PYTHON_VERSION}" \
 && uv venv --python "${PYTHON_VERSION}" /opt/venv \
 && uv pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml ./
COPY kernels ./kernels
COPY engine ./engine
COPY server ./server
COPY bench ./bench
COPY specserve ./specserve
# torch is already satisfied, so this adds only specserve and its pure-Python dependencies.
RUN uv pip install . \
 && specserve --help > /dev/null

# ---------------------------------------------------------------- runtime
FROM ${CUDA_IMAGE}
ARG SPECSERVE_UID=10001
LABEL org.opencontainers.image.title="specserve" \
      org.opencontainers.image.description="OpenAI-compatible LLM server with lossless draft-model speculative decoding" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models/.hf
COPY --from=build /opt/python /opt/python
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
