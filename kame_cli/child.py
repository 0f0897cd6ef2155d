"""One process of the stack (`Child`: its command, its log, its niceness and
the probe that says it is ready), those probes (gRPC health SERVING, an HTTP
200, a Redis PONG), and `StackError`, how starting a stack fails.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kame_cli.errors import CliError
from kame_cli.listeners import holders, process_group


class StackError(CliError):
    """A port is taken, or a process did not start or answer; the message says
    which and where its log is."""


def redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def grpc_serving(address: str, ca_pem: bytes | None = None) -> bool:
    """Whether the gRPC server at `address` answers its health check SERVING
    (over TLS verified with `ca_pem` when given)."""
    channel = (
        grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca_pem))
        if ca_pem
        else grpc.insecure_channel(address)
    )
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
    serving: bool = reply.status == health_pb2.HealthCheckResponse.SERVING
    return serving


@dataclass
class Child:
    name: str
    command: list[str]
    env: dict[str, str]
    ready: Callable[[], bool]
    endpoint: str
    ports: tuple[int, ...] = ()  # where it listens: must be its own sockets once ready
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    niceness: int = 0  # added to ours before the child starts, so all its threads inherit it
    restarts: int = 0  # starts after the first (kame_cli.supervise)

    def start(self, log_dir: Path) -> None:
        self.log_path = log_dir / f"{self.name}.log"
        # nice(1) execs the command at the niceness. Not preexec_fn: it makes Python
        # fork (not vfork) and run Python code in the child of our threaded process
        # (gRPC's), where a restarted oracle segfaulted before it could exec.
        command = (
            ["nice", "-n", str(self.niceness), *self.command] if self.niceness else self.command
        )
        # A restart appends: the log keeps why the process died.
        with open(self.log_path, "ab" if self.process is not None else "wb") as log:
            self.process = subprocess.Popen(
                command,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group, so that Ctrl-C reaches `kame up` alone, which
                # stops us in order; but our session, not a new one: with the kernel's
                # autogroups (sched_autogroup_enabled) each session is scheduled as one
                # group with an equal share, so a niceness would rank threads only
                # within the child's own group, never against gateway and frontend.
                process_group=0,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def has_logged(self, prefix: str) -> bool:
        """Whether a line of the child's output so far starts with `prefix`."""
        if self.log_path is None or not self.log_path.exists():
            return False
        return any(
            line.startswith(prefix)
            for line in self.log_path.read_text(errors="replace").splitlines()
        )

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the child's output (why a start failed)."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def last_log_line(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line]
        return lines[-1].strip() if lines else ""

    def exit_error(self) -> StackError:
        assert self.process is not None
        return StackError(
            f"{self.name} exited with status {self.process.returncode}: "
            f"{self.last_log_line() or '(no output)'} (log {self.log_path})"
        )

    def foreign_listener(self) -> str | None:
        """What else listens on one of our ports ('port N: PID ...'), or None when
        every socket there is this child's (its process group, which the servers
        it spawns share)."""
        assert self.process is not None
        for port in self.ports:
            for holder in holders(port):
                if holder.pid is None or process_group(holder.pid) != self.process.pid:
                    return f"port {port}: {holder}"
        return None

    def signal(self, signum: int) -> None:
        if self.process is not None and self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)
