"""The stack as processes on loopback (`Stack`): what `kame up` runs, and
`kame demo`, `kame bench` and the tests, on free ports.

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
the children share our session (see kame_cli.child.Child.start).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kame_cli import llm_server
from kame_cli.child import Child, StackError, grpc_serving, http_ok, redis_answers
from kame_cli.listeners import describe_holder, port_is_free
from kame_cli.stack_options import LOOPBACK, StackOptions
from kame_common.store import redacted_url

SERVICES = ("stt", "oracle", "frontend", "gateway")
SIDE_PROCESSES = ("llm", "stt", "oracle")  # off the voice path: they may wait for a core
REDIS_MAXMEMORY = "256mb"  # the Redis kame up starts: far above what 64 calls keep
UDP_PORTS = ("sip",)  # the rest of the ports are TCP
INGRESS = ("web", "telephony")  # HTTP services in front of the gateway
# What the oracle logs once it has listed its MCP servers' tools (services/oracle/tools).
TOOLS_LINE = re.compile(r" oracle: tools (.*)$", re.M)
# What it logs for an MCP server it could not start or reach (services/oracle/tools).
MCP_FAILURE_LINE = re.compile(r" oracle: MCP server (\S+) unavailable: (.*)$", re.M)


def stack_file(gateway_port: int) -> Path:
    """Where a running stack whose gateway listens on `gateway_port` lists its
    endpoints (for `kame status`); private to this user."""
    return Path(tempfile.gettempdir()) / f"kame-{os.getuid()}" / f"stack-{gateway_port}.json"


def llm_threads() -> int:
    """CPU threads of the embedded LLM server: half the cores, at least one."""
    return max(1, (os.cpu_count() or 2) // 2)


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
            env.update(self.options.oracle_tool_env())
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
                # No admission at all: the answer-time bound (docs/capacity.md) too.
                **({} if self.options.capacity_admission else {"ANSWER_TIME_FACTOR": 0}),
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
        self.check_tools()
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

    def offered_tools(self) -> str | None:
        """The tools the oracle offers its LLM, as it logged them once its MCP servers
        were listed ('vault.door_code (read-only), ...' or 'none'); None when it has
        no MCP servers (it logs no such line)."""
        oracle = next((c for c in self.children if c.name == "oracle"), None)
        if oracle is None or oracle.log_path is None or not oracle.log_path.exists():
            return None
        said = TOOLS_LINE.findall(oracle.log_path.read_text(errors="replace"))
        return said[-1].strip() if said else None  # the last start's, after a restart

    def check_tools(self) -> None:
        """StackError when the oracle could not start an MCP server named with
        --mcp-server (its reason from the oracle's log, before its tools line): the
        stack would otherwise run without the tools asked for, saying 'tools none'."""
        oracle = next((c for c in self.children if c.name == "oracle"), None)
        if not self.options.mcp_servers or oracle is None or oracle.log_path is None:
            return
        text = oracle.log_path.read_text(errors="replace") if oracle.log_path.exists() else ""
        started = TOOLS_LINE.search(text)
        failed = MCP_FAILURE_LINE.search(text, 0, started.start() if started else len(text))
        if failed is not None:
            name, reason = failed.groups()
            raise StackError(
                f"oracle: MCP server {name} did not start: {reason.strip()} "
                f"(log {oracle.log_path}); fix its --mcp-server {name}=... or leave it out"
            )

    def endpoints(self) -> list[tuple[str, str]]:
        rows = [(c.name, c.endpoint) for c in self.children]
        if not self.started_redis:
            rows.insert(0, ("redis", f"{redacted_url(self.redis_url)} (already running)"))
        if not self.embedded_llm:
            rows.insert(1, ("llm", f"{self.llm_base_url} (external)"))
        tools = self.offered_tools()
        if tools is not None:
            rows.append(("tools", tools))
        rows.append(
            (
                "metrics",
                ", ".join(f"{s} {self.metrics_url(s)}" for s in (*SERVICES, *INGRESS)),
            )
        )
        return rows
