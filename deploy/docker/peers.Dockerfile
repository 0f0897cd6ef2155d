# Stand-ins for the compose file's third-party images (redis:7.4-alpine, prom/prometheus) where
# no registry can be reached: the same programs from Debian's packages, on the locally built base
# (scripts/images.py). deploy/compose/local.yml points the compose services at them.
#
#   podman build -f deploy/docker/peers.Dockerfile --build-arg PEER=redis \
#     --build-arg PYTHON_IMAGE=localhost/kame-base:bookworm -t localhost/kame-peers/redis:bookworm .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG PEER

# redis-server and redis-cli (the compose health check), as Debian's redis user. Like the
# official image, without protected mode (which refuses every client not on loopback when no
# password is set): the container network is the boundary, and KAME_REDIS_PASSWORD sets one.
FROM ${PYTHON_IMAGE} AS peer-redis
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && printf '%s\n' '#!/bin/sh' \
      'if [ "$1" = redis-server ]; then shift; exec redis-server --protected-mode no "$@"; fi' \
      'exec "$@"' > /usr/local/bin/redis-entrypoint \
 && chmod 755 /usr/local/bin/redis-entrypoint
USER redis
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server", "--save", "", "--appendonly", "no"]

# Prometheus with a writable /prometheus, as in prom/prometheus (its storage volume).
FROM ${PYTHON_IMAGE} AS peer-prometheus
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus", "--storage.tsdb.path=/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml"]

FROM peer-${PEER}
