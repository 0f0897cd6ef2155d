"""The tests' Redis, one per pytest process.

A single process (`pytest`, or the first pytest-xdist worker) uses the Redis at
KAME_TEST_REDIS_URL (default 127.0.0.1:6379, database 0: CI's). Every further
xdist worker starts a redis-server of its own on a free port: test modules give
each stack a fixed database of its own (its registry must hold only its own
frontend), and two workers on one server would see each other's replicas there.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/0"
START_TIMEOUT_S = 10.0


def with_db(url: str, db: int) -> str:
    """`url` (host, port and password kept) naming database `db`."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))


def shares_the_main_redis() -> bool:
    """Whether this process uses KAME_TEST_REDIS_URL's server (not an xdist worker
    after the first)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"


@contextlib.contextmanager
def tests_redis() -> Iterator[str]:
    """The URL of this process's Redis (database 0), for as long as the block runs."""
    if shares_the_main_redis():
        yield os.environ.get("KAME_TEST_REDIS_URL", DEFAULT_URL)
        return
    from kame_cli.stack_options import free_ports

    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="kame-test-redis-") as data_dir:
        command = ["redis-server", "--bind", "127.0.0.1", "--port", str(port)]
        command += ["--save", "", "--appendonly", "no", "--dir", data_dir]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            _wait_answering(url, server)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=10)


def _wait_answering(url: str, server: subprocess.Popen[bytes]) -> None:
    client = redis.Redis.from_url(url, socket_timeout=1.0)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"redis-server exited ({server.returncode}) before answering")
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer at {url} in {START_TIMEOUT_S} s")
            time.sleep(0.05)
    finally:
        client.close()
