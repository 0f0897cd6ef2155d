# syntax=docker/dockerfile:1
# The one image recipe of the KAME services: the four gRPC services, web (the browser page and
# its WebSocket bridge to the gateway) and telephony (SIP, Twilio Media Streams and Asterisk
# AudioSocket to the gateway). Build from the repository root:
#
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=gateway -t kame/gateway:0.1.0 .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=stt     -t kame/stt:0.1.0 .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=oracle  -t kame/oracle:0.1.0 .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=web     -t kame/web:0.1.0 .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=telephony -t kame/telephony:0.1.0 .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=frontend \
#     --build-arg DEPS=frontend-cpu  -t kame/frontend:0.1.0-cpu .
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=frontend \
#     --build-arg DEPS=frontend-cuda -t kame/frontend:0.1.0-cuda .
#
# With podman (buildah), pass --build-arg DEPS=python too for the plain services: it resolves a
# FROM that names a stage through an argument only when the argument is passed (make images
# does; see docker-compose.yml).
#
# SERVICE picks the code (services/<SERVICE>/), the requirements set (requirements/<SERVICE>.txt),
# the command (python -m services.<SERVICE>) and the exposed ports (the service-* stages below,
# the defaults of kame_common/ports.py; tests/deploy checks that they agree). DEPS picks how the
# dependencies install:
#   python         requirements/<SERVICE>.txt at the lock's versions (gateway, stt, oracle, web,
#                  telephony)
#   frontend-cpu   the same on python:3.11, with the lock's CPU torch from PyTorch's CPU index
#   frontend-cuda  on a CUDA torch base image (moshi needs torch<2.10, the lock pins the CPU 2.13)
# Both frontend images carry the Smart Turn end-of-turn model (the smart-turn-model stage), at
# $KAME_SMART_TURN_MODEL.
# Configure the container with KAME_<SERVICE>_* variables (services/<SERVICE>/config.py).
# BuildKit builds only the stages the chosen SERVICE and DEPS need.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Another CUDA: --build-arg TORCH_IMAGE=pytorch/pytorch:<2.9.x tag> (with DEPS=frontend-cuda).
ARG TORCH_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
ARG DEPS=python
ARG SERVICE

FROM ${PYTHON_IMAGE} AS base-python
FROM ${PYTHON_IMAGE} AS base-frontend-cpu
FROM ${TORCH_IMAGE} AS base-frontend-cuda

FROM base-${DEPS} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/home/kame
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/kame --shell /usr/sbin/nologin kame
WORKDIR /app
# Dependencies before code so that code edits reuse these layers. constraints.txt is the lock:
# the same versions as make setup and CI.
COPY constraints.txt ./
COPY requirements/ requirements/

# pip's cache is a build cache mount (PIP_CACHE_DIR, a build argument, so not in the image):
# a rebuild downloads nothing it already has, and no layer carries the cache. Optional, for
# builds behind a TLS-intercepting proxy or without PyTorch's index (scripts/images.py passes
# them, with the files mounted into the build): PIP_CERT, the proxy's CA bundle; PIP_FIND_LINKS,
# a folder of wheels to prefer (the CPU torch).
FROM base AS deps-python
ARG SERVICE
ARG PIP_CACHE_DIR=/var/cache/pip
ARG PIP_CERT
ARG PIP_FIND_LINKS
RUN --mount=type=cache,target=/var/cache/pip \
    case "${SERVICE}" in \
      gateway|stt|oracle|web|telephony) ;; \
      frontend) echo "SERVICE=frontend: build with DEPS=frontend-cpu or DEPS=frontend-cuda" >&2; exit 1 ;; \
      *) echo "SERVICE=${SERVICE}: expected gateway, stt, oracle, frontend, web or telephony" >&2; exit 1 ;; \
    esac \
 && pip install -c constraints.txt -r "requirements/${SERVICE}.txt"

# The lock pins torch==2.13.0; PyPI's Linux wheel of it pulls the CUDA libraries, so the CPU
# wheel of the same version comes from PyTorch's CPU index (TORCH_CPU_INDEX: a mirror of it).
# moshi pins torch<2.10, so it installs without its deps; requirements/frontend.txt lists them.
# TORCH_CPU_INDEX= (empty): no extra index, the CPU torch comes from PIP_FIND_LINKS.
FROM base AS deps-frontend-cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_CACHE_DIR=/var/cache/pip
ARG PIP_CERT
ARG PIP_FIND_LINKS
RUN --mount=type=cache,target=/var/cache/pip \
    pip install ${TORCH_CPU_INDEX:+--extra-index-url "${TORCH_CPU_INDEX}"} -c constraints.txt -r requirements/frontend.txt \
 && pip install --no-deps -c constraints.txt moshi \
 && python -c "import torch; assert not torch.version.cuda, torch.__version__"

# The base image brings a CUDA torch 2.9.x, which moshi accepts. The lock's CPU torch (and any
# CUDA wheels) are dropped from it and torch is pinned to the base image's own build, so pip keeps
# that torch and installs everything else at the locked versions.
FROM base AS deps-frontend-cuda
ARG PIP_CACHE_DIR=/var/cache/pip
ARG PIP_CERT
RUN --mount=type=cache,target=/var/cache/pip \
    python -c "import sys; assert sys.version_info >= (3, 11), 'KAME needs Python >= 3.11, base has ' + sys.version" \
 && base_torch="$(python -c 'import torch; print(torch.__version__)')" \
 && python -c "import torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); assert v < (2, 10) and torch.version.cuda, 'moshi needs a CUDA torch<2.10, base has ' + torch.__version__" \
 && grep -v -E '^torch($|[^A-Za-z0-9_.-])' requirements/frontend.txt > requirements/frontend-cuda.txt \
 && grep -v -i -E '^(torch|triton|nvidia-[A-Za-z0-9_.-]+)($|[^A-Za-z0-9_.-])' constraints.txt > constraints-cuda.txt \
 && echo "torch==${base_torch}" >> constraints-cuda.txt \
 && pip install -c constraints-cuda.txt -r requirements/frontend-cuda.txt \
 && pip install --no-deps -c constraints-cuda.txt moshi \
 && python -c "import torch, moshi.models; assert torch.__version__ == '${base_torch}', torch.__version__"
ENV KAME_FRONTEND_ENGINE=kame \
    KAME_FRONTEND_DEVICE=cuda \
    KAME_FRONTEND_DTYPE=bfloat16

# The Smart Turn model, with which the frontend's tts engine ends the caller's turn (without it
# the engine falls back to a fixed pause). The stage runs what make setup runs,
# kame_cli/smart_turn_model.py: pip downloads the pipecat-ai wheel that kame_common/turn_model.py
# pins (alone, through PIP_CERT, PIP_FIND_LINKS and the cache mount), the one file comes out and
# its sha256 is checked against the pinned one; --check then runs it once on the image's own
# onnxruntime. The version and the hash live only in turn_model.py. Only service-frontend copies
# the file, to a path outside /home/kame/.cache, over which compose and the chart mount a cache.
FROM deps-${DEPS} AS smart-turn-model
ARG PIP_CACHE_DIR=/var/cache/pip
ARG PIP_CERT
ARG PIP_FIND_LINKS
COPY kame_common/ kame_common/
COPY kame_cli/__init__.py kame_cli/smart_turn_model.py kame_cli/
ENV KAME_SMART_TURN_MODEL=/opt/kame/models/smart-turn-v3.2-cpu.onnx
RUN --mount=type=cache,target=/var/cache/pip \
    python -m kame_cli.smart_turn_model \
 && python -m kame_cli.smart_turn_model --check

FROM deps-${DEPS} AS app
ARG SERVICE
COPY kamepb/ kamepb/
COPY kame_common/ kame_common/
# The gateway's client package: the gateway shares its codecs and status words, web and
# telephony call the gateway through it.
COPY kame_client/ kame_client/
COPY services/__init__.py services/
COPY services/${SERVICE}/ services/${SERVICE}/
COPY deploy/docker/healthcheck.py deploy/docker/
ENV KAME_SERVICE=${SERVICE}
USER 10001:10001
# grpc.health.v1 on the service's plaintext health port (KAME_<SERVICE>_HEALTH_PORT), or on its
# gRPC port when that is off: the check the Kubernetes probes make, NOT_SERVING while draining
# (web, telephony: GET /healthz on their HTTP port, 503 while draining).
# The start period covers model load (a 7B model onto a GPU); a healthy answer ends it at once.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "deploy/docker/healthcheck.py", "service"]
# SIGTERM starts the drain: health NOT_SERVING, open sessions get grace_s to finish. `exec`
# makes python PID 1, so it receives the signal itself.
STOPSIGNAL SIGTERM
CMD ["sh", "-c", "exec python -m \"services.${KAME_SERVICE}\""]

# Ports of each service (gRPC, Prometheus metrics, plaintext health): kame_common/ports.py.
FROM app AS service-gateway
EXPOSE 50051 9101 9111
FROM app AS service-frontend
# Root's file, mode 0644: the service's user reads it, nothing writes it.
COPY --from=smart-turn-model /opt/kame/models/ /opt/kame/models/
ENV KAME_SMART_TURN_MODEL=/opt/kame/models/smart-turn-v3.2-cpu.onnx
EXPOSE 50052 9102 9112
FROM app AS service-stt
EXPOSE 50053 9103 9113
FROM app AS service-oracle
EXPOSE 50054 9104 9114
# web: HTTP (the page and its WebSocket) and metrics; kame_common/ports.py's WEB_PORTS.
FROM app AS service-web
EXPOSE 8088 9105
# telephony: SIP (UDP), HTTP (Twilio's webhook and Media Streams WebSocket), AudioSocket, metrics
# and the RTP range of SIP calls; kame_common/ports.py's TELEPHONY_PORTS. SIP over TCP is not
# served.
FROM app AS service-telephony
EXPOSE 5060/udp 8089 9092 9106 40000-40999/udp

FROM service-${SERVICE}
