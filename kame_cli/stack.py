"""`kame up`: the whole stack as processes on loopback, until Ctrl-C.

Starts Redis (unless one answers on the Redis port, or --redis-url names
one), the embedded LLM server (`kame llm-server`, unless --llm-base-url points
at another OpenAI-compatible server or --llm-backend anthropic uses the
Anthropic API; API keys come from OPENAI_API_KEY / ANTHROPIC_API_KEY in the
environment, which the oracle inherits), then stt, oracle, frontend and gateway
(`python -m services.<name>`), configured through their KAME_<SVC>_* variables
to find each other on 127.0.0.1, and the web service (the browser page, a
client of the gateway). It waits until every one is ready (gRPC
health SERVING, which the oracle reports only after warming up its LLM's
prompt; the LLM server's ready line, which it prints after its own warm-up;
the web service's /healthz; Redis PING; and the gateway reports SERVING only
once stt, the oracle and a frontend do: services/gateway/readiness.py), prints
the endpoints and the page's URL, restarts any process that dies (with
backoff, printed: kame_cli.supervise), and on Ctrl-C
or SIGTERM stops them all (SIGTERM to each process group, SIGKILL after a
timeout). Each child's output goes to a log file in --log-dir.

Before it starts anything it checks that every port it needs (each service's
gRPC and metrics port, the LLM server's, Redis's when it starts Redis) is
free, and refuses naming the busy port and the process holding it. A process
counts as ready only when the sockets listening on its ports belong to it (its
process group; kame_cli.listeners), so a stack never reports "up" on the
strength of another stack's servers. While it runs, the stack's endpoints are
in a stack file (`stack_file(gateway_port)`) that `kame status` reads.

The side services (stt, oracle and the embedded LLM server) run at a lower
CPU priority (niceness --side-nice, 10 by default) than gateway and frontend:
on a small machine Whisper and the LLM would otherwise take the cores the
voice path needs to deliver every agent frame on time. That holds only while
the children share our session (see Child.start).

`Stack` is also what `kame demo` uses, with free ports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kame_cli import llm_server
from kame_cli.errors import USAGE, CliError
from kame_cli.listeners import describe_holder, holders, port_is_free, process_group
from kame_cli.supervise import Supervisor
from kame_common.ports import LLM_PORT, REDIS_PORT, SERVICE_PORTS, TELEPHONY_PORTS, WEB_PORTS
from kame_common.store import redacted_url
from services.frontend.config import DTYPES

LOOPBACK = "127.0.0.1"
SERVICES = ("stt", "oracle", "frontend", "gateway")
SIDE_PROCESSES = ("llm", "stt", "oracle")  # off the voice path: they may wait for a core
REDIS_MAXMEMORY = "256mb"  # the Redis kame up starts: far above what 64 calls keep
UDP_PORTS = ("sip",)  # the rest of the ports are TCP
INGRESS = ("web", "telephony")  # HTTP services in front of the gateway


class StackError(CliError):
    """A port is taken, or a process did not start or answer; the message says
    which and where its log is."""


def stack_file(gateway_port: int) -> Path:
    """Where a running stack whose gateway listens on `gateway_port` lists its
    endpoints (for `kame status`); private to this user."""
    return Path(tempfile.gettempdir()) / f"kame-{os.getuid()}" / f"stack-{gateway_port}.json"


@dataclass
class Ports:
    gateway: int = SERVICE_PORTS["gateway"].grpc
    frontend: int = SERVICE_PORTS["frontend"].grpc
    stt: int = SERVICE_PORTS["stt"].grpc
    oracle: int = SERVICE_PORTS["oracle"].grpc
    llm: int = LLM_PORT
    redis: int = REDIS_PORT
    gateway_metrics: int = SERVICE_PORTS["gateway"].metrics
    frontend_metrics: int = SERVICE_PORTS["frontend"].metrics
    stt_metrics: int = SERVICE_PORTS["stt"].metrics
    oracle_metrics: int = SERVICE_PORTS["oracle"].metrics
    web: int = WEB_PORTS.http
    web_metrics: int = WEB_PORTS.metrics
    telephony: int = TELEPHONY_PORTS.http
    telephony_metrics: int = TELEPHONY_PORTS.metrics
    sip: int = TELEPHONY_PORTS.sip  # UDP
    audiosocket: int = TELEPHONY_PORTS.audiosocket

    @classmethod
    def free(cls, redis: int = 6379) -> Ports:
        """Free ephemeral ports for everything but Redis (shared by design)."""
        names = [f.name for f in fields(cls) if f.name != "redis"]
        return cls(redis=redis, **dict(zip(names, free_ports(len(names)), strict=True)))


def llm_threads() -> int:
    """CPU threads of the embedded LLM server: half the cores, at least one."""
    return max(1, (os.cpu_count() or 2) // 2)


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((LOOPBACK, 0))
        sockets.append(sock)
    ports = [s.getsockname()[1] for s in sockets]
    for sock in sockets:
        sock.close()
    return ports


@dataclass
class StackOptions:
    ports: Ports = field(default_factory=Ports)
    frontend_engine: str = "tts"
    checkpoint: str = ""
    device: str = "cpu"
    dtype: str = "auto"  # bfloat16 on CUDA, float32 otherwise
    redis_url: str = ""  # empty: 127.0.0.1:<ports.redis>, started if none answers
    llm_base_url: str = ""  # empty: the embedded llm server (or the vendor API, anthropic)
    llm_backend: str = ""
    llm_model: str = ""
    grace_s: float = 5.0
    startup_timeout_s: float = 300.0
    log_dir: Path | None = None
    side_niceness: int = 10  # of SIDE_PROCESSES (0 = the same priority as the rest)
    # stt and the oracle publish what they can serve; the gateway refuses calls beyond it.
    capacity_admission: bool = True


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
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class Child:
    name: str
    command: list[str]
    env: dict[str, str]
    ready: Callable[[], bool]
    endpoint: str
    ports: tuple[int, ...] = ()  # where it listens: must be its own sockets once ready
    process: subprocess.Popen | None = None
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
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.ports = options.ports
        self.log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="kame-up-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis_url = options.redis_url or f"redis://{LOOPBACK}:{self.ports.redis}/0"
        self.embedded_llm = not options.llm_base_url and options.llm_backend in ("", "openai")
        self.llm_base_url = options.llm_base_url or self._default_llm_url()
        self.started_redis = False
        self.resume_secret = secrets.token_urlsafe(24)
        self.children: list[Child] = []

    def _default_llm_url(self) -> str:
        """The embedded server for the OpenAI-compatible back-end; a vendor's own
        API for another back-end (anthropic) named without a base URL."""
        if self.embedded_llm:
            return f"http://{LOOPBACK}:{self.ports.llm}/v1"
        from services.oracle.config import VENDOR_BASE_URLS

        return VENDOR_BASE_URLS[self.options.llm_backend]

    @property
    def web_url(self) -> str:
        return self.ingress_url("web")

    @property
    def telephony_url(self) -> str:
        return self.ingress_url("telephony")

    @property
    def phone_endpoints(self) -> str:
        """Where phones reach the stack, as the telephony service says at start."""
        return (
            f"SIP udp {LOOPBACK}:{self.ports.sip}, Twilio {self.telephony_url}twilio/voice, "
            f"AudioSocket tcp {LOOPBACK}:{self.ports.audiosocket}"
        )

    @property
    def gateway_address(self) -> str:
        return f"{LOOPBACK}:{self.ports.gateway}"

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- the processes ----------------------------------------------------------

    def _redis_child(self) -> Child | None:
        if self.options.redis_url or redis_answers(LOOPBACK, self.ports.redis):
            return None
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackError(
                f"no Redis answers on {LOOPBACK}:{self.ports.redis} and there is no "
                "redis-server binary: install redis-server or pass --redis-url"
            )
        self.started_redis = True
        return Child(
            "redis",
            [
                binary,
                "--port",
                str(self.ports.redis),
                "--bind",
                LOOPBACK,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.log_dir),
                # Bounded: session records and conversations carry a TTL and go first.
                "--maxmemory",
                REDIS_MAXMEMORY,
                "--maxmemory-policy",
                "volatile-lru",
            ],
            {},
            lambda: redis_answers(LOOPBACK, self.ports.redis),
            self.redis_url,
            (self.ports.redis,),
        )

    def _llm_child(self) -> Child | None:
        if not self.embedded_llm:
            return None
        child = Child(
            "llm",
            [
                sys.executable,
                "-m",
                "kame_cli",
                "llm-server",
                "--host",
                LOOPBACK,
                "--port",
                str(self.ports.llm),
                # Half the cores: Whisper's decode of the caller's last words, on the
                # path to every answer, must not wait behind speculative LLM work.
                "--threads",
                str(llm_threads()),
            ],
            {},
            lambda: child.has_logged(llm_server.READY_LINE),  # printed once it is warm
            self.llm_base_url,
            (self.ports.llm,),
        )
        return child

    def service_env(self, service: str) -> dict[str, str]:
        """The KAME_<SVC>_* settings that wire one service into the stack."""
        ports, prefix = self.ports, f"KAME_{service.upper()}_"
        env = {
            "HOST": LOOPBACK,
            "PORT": getattr(ports, service),
            "METRICS_PORT": getattr(ports, f"{service}_metrics"),
            "GRACE_S": self.options.grace_s,
        }
        if service not in ("web", "telephony"):  # they keep no state in Redis
            env["REDIS_URL"] = self.redis_url
        if service in ("stt", "oracle") and self.options.capacity_admission:
            env.update(
                PUBLISH_CAPACITY="1", ADVERTISE_ADDRESS=f"{LOOPBACK}:{getattr(ports, service)}"
            )
        if service == "oracle":
            env["BASE_URL"] = self.llm_base_url
            env.update(
                {
                    k: v
                    for k, v in (
                        ("BACKEND", self.options.llm_backend),
                        ("MODEL", self.options.llm_model),
                    )
                    if v
                }
            )
        elif service == "frontend":
            env.update(
                ENGINE=self.options.frontend_engine,
                CHECKPOINT=self.options.checkpoint,
                DEVICE=self.options.device,
                DTYPE=self.options.dtype,
                ADVERTISE_ADDRESS=f"{LOOPBACK}:{ports.frontend}",
            )
        elif service == "gateway":
            env.update(
                STT_ADDRESS=f"{LOOPBACK}:{ports.stt}",
                ORACLE_ADDRESS=f"{LOOPBACK}:{ports.oracle}",
                FRONTEND_ADDRESS=f"{LOOPBACK}:{ports.frontend}",
                # one local replica serves every mode, s2s included
                S2S_ENGINE="" if self.options.frontend_engine != "moshi" else "moshi",
                CAPACITY_ADMISSION=int(self.options.capacity_admission),
                # A call survives a restart of the gateway (kame_cli.supervise): the client
                # continues it with its resume token. One secret per stack, unless given.
                RESUME_SECRET=os.environ.get("KAME_GATEWAY_RESUME_SECRET", self.resume_secret),
            )
        elif service == "web":
            env["GATEWAY_ADDRESS"] = self.gateway_address
        elif service == "telephony":
            env.update(
                GATEWAY_ADDRESS=self.gateway_address,
                SIP_PORT=ports.sip,
                AUDIOSOCKET_PORT=ports.audiosocket,
            )
        return {prefix + name: str(value) for name, value in env.items()}

    def _service_child(self, service: str) -> Child:
        address = f"{LOOPBACK}:{getattr(self.ports, service)}"
        return Child(
            service,
            [sys.executable, "-m", f"services.{service}"],
            self.service_env(service),
            lambda: grpc_serving(address),
            address,
            (getattr(self.ports, service), getattr(self.ports, f"{service}_metrics")),
        )

    def needed_ports(self) -> dict[str, int]:
        """Every port this stack will listen on, by what listens there."""
        needed = {
            name.replace("_", " "): port
            for name, port in vars(self.ports).items()
            if name not in ("llm", "redis")
        }
        if self.embedded_llm:
            needed["llm"] = self.ports.llm
        if not self.options.redis_url and not redis_answers(LOOPBACK, self.ports.redis):
            needed["redis"] = self.ports.redis
        return needed

    def check_ports_free(self) -> None:
        """StackError naming the first port another process holds (nothing started yet)."""
        for name, port in self.needed_ports().items():
            if not port_is_free(port, LOOPBACK, udp=name in UDP_PORTS):
                flag = "" if " " in name else f", --{name}-port"  # metrics ports have none
                raise StackError(
                    f"port {port} ({name}) is in use by {describe_holder(port)}: stop it "
                    f"(another `kame up`?) or choose other ports (--free-ports{flag})"
                )

    def _web_child(self) -> Child:
        return Child(
            "web",
            [sys.executable, "-m", "services.web"],
            self.service_env("web"),
            lambda: http_ok(f"{self.web_url}healthz"),
            self.web_url,
            (self.ports.web, self.ports.web_metrics),
        )

    def _telephony_child(self) -> Child:
        return Child(
            "telephony",
            [sys.executable, "-m", "services.telephony"],
            self.service_env("telephony"),
            lambda: http_ok(f"{self.telephony_url}healthz"),
            self.phone_endpoints,
            (self.ports.telephony, self.ports.telephony_metrics, self.ports.audiosocket),
        )

    def start(self) -> None:
        """Check the ports, start every process and wait until all answer
        (StackError if a port is taken or a process does not answer)."""
        self.check_ports_free()
        redis = self._redis_child()
        if redis is not None:
            self.start_and_wait([redis])
        others = [
            c
            for c in (
                self._llm_child(),
                *map(self._service_child, SERVICES),
                self._web_child(),
                self._telephony_child(),
            )
            if c
        ]
        for child in others:
            if child.name in SIDE_PROCESSES:
                child.niceness = self.options.side_niceness
        self.start_and_wait(others)
        self.write_stack_file()

    def start_and_wait(self, children: list[Child]) -> None:
        for child in children:
            child.start(self.log_dir)
            self.children.append(child)
        waiting = list(children)
        deadline = time.monotonic() + self.options.startup_timeout_s
        while waiting:
            for child in list(waiting):
                if not child.running():
                    raise child.exit_error()
                if child.ready():
                    self.check_owner(child)
                    waiting.remove(child)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                raise StackError(
                    f"{names} did not answer within "
                    f"{self.options.startup_timeout_s:g} s (logs in {self.log_dir})"
                )
            time.sleep(0.3)

    def check(self) -> None:
        """StackError if a process has died since it started."""
        for child in self.children:
            if not child.running():
                raise child.exit_error()

    @staticmethod
    def check_owner(child: Child) -> None:
        """StackError if what answered for `child` is (also) another process."""
        foreign = child.foreign_listener()
        if foreign is not None:
            raise StackError(
                f"{child.name} answers, but another process listens on its {foreign}: "
                "stop it, or choose other ports (--free-ports)"
            )

    def describe(self) -> dict[str, object]:
        """The stack file's content: every endpoint and the process behind it."""
        return {
            "gateway": self.gateway_address,
            "redis_url": self.redis_url,
            "llm_url": self.llm_base_url,
            "log_dir": str(self.log_dir),
            "processes": {
                child.name: {
                    "endpoint": child.endpoint,
                    "pid": child.process.pid if child.process else None,
                    "restarts": child.restarts,
                    **(
                        {"metrics_url": self.metrics_url(child.name)}
                        if child.name in (*SERVICES, *INGRESS)
                        else {}
                    ),
                    **(
                        {"health_url": f"{self.ingress_url(child.name)}healthz"}
                        if child.name in INGRESS
                        else {}
                    ),
                }
                for child in self.children
            },
        }

    def ingress_url(self, service: str) -> str:
        return f"http://{LOOPBACK}:{getattr(self.ports, service)}/"

    def metrics_url(self, service: str) -> str:
        return f"http://{LOOPBACK}:{getattr(self.ports, f'{service}_metrics')}/metrics"

    def write_stack_file(self) -> None:
        """Write the stack file, 0600 (the Redis URL may carry a password). It lives in the
        shared temporary directory, where another user may have made our folder first or
        planted a symlink at the file's path (to make us truncate a file of ours): the
        folder must be ours and private, and the file is opened without following links."""
        path = stack_file(self.ports.gateway)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = path.parent.lstat()
        if path.parent.is_symlink() or folder.st_uid != os.getuid() or folder.st_mode & 0o077:
            raise StackError(f"{path.parent} is not a private folder of this user: remove it")
        if path.is_symlink():
            raise StackError(f"{path} is a symbolic link, not the stack file: remove it")
        # O_NOFOLLOW: a link planted after that check makes the open fail (ELOOP).
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(path, flags, 0o600)
        with os.fdopen(descriptor, "w") as out:
            os.fchmod(out.fileno(), 0o600)  # a file left from before keeps its own mode
            json.dump(self.describe(), out, indent=2)

    def remove_stack_file(self) -> None:
        if self.children:  # only the stack that wrote it (a refused one started nothing)
            stack_file(self.ports.gateway).unlink(missing_ok=True)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every process group (gateway first), SIGKILL what is left after
        `timeout_s`."""
        self.remove_stack_file()
        for child in reversed(self.children):
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
                child.process.wait()
        self.children = []

    def endpoints(self) -> list[tuple[str, str]]:
        rows = [(c.name, c.endpoint) for c in self.children]
        if not self.started_redis:
            rows.insert(0, ("redis", f"{redacted_url(self.redis_url)} (already running)"))
        if not self.embedded_llm:
            rows.insert(1, ("llm", f"{self.llm_base_url} (external)"))
        rows.append(
            (
                "metrics",
                ", ".join(f"{s} {self.metrics_url(s)}" for s in (*SERVICES, *INGRESS)),
            )
        )
        return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Ports()
    parser.add_argument(
        "--frontend-engine",
        choices=("tts", "kame", "moshi"),
        default="tts",
        help="tts (CPU, default) or kame/moshi with --checkpoint",
    )
    parser.add_argument(
        "--checkpoint", default="", help="KAME/Moshi checkpoint directory (Hugging Face layout)"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the kame/moshi engine")
    add_dtype_argument(parser)
    parser.add_argument("--redis-url", default="", help="use this Redis instead of 127.0.0.1")
    parser.add_argument(
        "--llm-base-url",
        default="",
        help="an OpenAI-compatible server to use instead of the embedded LLM",
    )
    parser.add_argument(
        "--llm-backend",
        choices=("", "openai", "anthropic"),
        default="",
        help="oracle back-end (anthropic: the Anthropic API unless "
        "--llm-base-url; keys from OPENAI_API_KEY / ANTHROPIC_API_KEY)",
    )
    parser.add_argument("--llm-model", default="", help="model name for the oracle")
    parser.add_argument(
        "--free-ports", action="store_true", help="pick free ports instead of the defaults"
    )
    for name in (
        "gateway",
        "frontend",
        "stt",
        "oracle",
        "llm",
        "redis",
        "web",
        "telephony",
        "sip",
        "audiosocket",
    ):
        parser.add_argument(f"--{name}-port", type=int, default=getattr(defaults, name))
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="where each process logs (default: a new temp directory)",
    )
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--side-nice",
        type=int,
        default=StackOptions.side_niceness,
        choices=range(20),
        metavar="0-19",
        help="niceness of stt, oracle and the LLM server, so that gateway and frontend "
        "keep the voice on time on a busy machine (0 = no difference)",
    )
    parser.add_argument(
        "--no-capacity-admission",
        dest="capacity_admission",
        action="store_false",
        help="admit every call: stt and the oracle do not publish what they can serve, "
        "and the gateway does not refuse calls beyond it",
    )


DTYPE_HELP = (
    "torch dtype of the kame/moshi engine (default auto: bfloat16 on CUDA, float32 otherwise)"
)


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help=DTYPE_HELP)


def ports_from_args(args: argparse.Namespace) -> Ports:
    if args.free_ports:
        return Ports.free(redis=args.redis_port)
    return Ports(
        gateway=args.gateway_port,
        frontend=args.frontend_port,
        stt=args.stt_port,
        oracle=args.oracle_port,
        llm=args.llm_port,
        redis=args.redis_port,
        web=args.web_port,
        telephony=args.telephony_port,
        sip=args.sip_port,
        audiosocket=args.audiosocket_port,
    )


class SharedStackSettings(Protocol):
    """The stack settings `kame up`'s flags (an argparse namespace) and `kame
    bench`'s config (kame_cli.bench.config.BenchConfig) share, by name."""

    @property
    def checkpoint(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def redis_url(self) -> str: ...
    @property
    def llm_base_url(self) -> str: ...
    @property
    def llm_backend(self) -> str: ...
    @property
    def llm_model(self) -> str: ...
    @property
    def startup_timeout_s(self) -> float: ...
    @property
    def capacity_admission(self) -> bool: ...


def options_from_args(
    args: SharedStackSettings, ports: Ports, engine: str, log_dir: Path | None
) -> StackOptions:
    """A stack of `engine` on `ports` with the checkpoint, device, Redis and LLM
    settings in `args`."""
    return StackOptions(
        ports=ports,
        frontend_engine=engine,
        checkpoint=args.checkpoint if engine != "tts" else "",
        device=args.device,
        dtype=args.dtype,
        redis_url=args.redis_url,
        llm_base_url=args.llm_base_url,
        llm_backend=args.llm_backend,
        llm_model=args.llm_model,
        startup_timeout_s=args.startup_timeout_s,
        log_dir=log_dir,
        capacity_admission=args.capacity_admission,
    )


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.frontend_engine != "tts" and not args.checkpoint:
        raise CliError(f"--frontend-engine {args.frontend_engine} needs --checkpoint DIR", USAGE)
    # Explicit handlers: a shell that starts us in the background ignores SIGINT.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    options = options_from_args(args, ports_from_args(args), args.frontend_engine, args.log_dir)
    options.side_niceness = args.side_nice
    stack = Stack(options)
    stack.check_ports_free()  # before saying anything starts
    print(
        f"kame up: starting the stack (gateway {stack.gateway_address}, logs in "
        f"{stack.log_dir}) ...",
        flush=True,
    )
    try:
        stack.start()
        print("KAME stack is up:")
        for name, endpoint in stack.endpoints():
            print(f"  {name:<9} {endpoint}")
        print(
            f"Talk to it in a browser: open {stack.web_url}\n"
            f"Call it from a phone: {stack.phone_endpoints} (README: Connect a phone)\n"
            f"or stream a WAV: kame talk --wav q.wav --out a.wav --timeline t.json "
            f"--gateway {stack.gateway_address}\n"
            f"How it is doing: kame status --gateway {stack.gateway_address}\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        supervisor = Supervisor(stack, say=lambda line: print(line, flush=True))
        while True:
            time.sleep(0.5)
            supervisor.poll()
    except KeyboardInterrupt:
        print("\nkame up: stopping ...", flush=True)
        return 0
    finally:
        stack.stop()
