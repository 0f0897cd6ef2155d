"""What a stack is made of (`StackOptions`, with its `Ports`) and `kame up`'s
flags that set it (`add_arguments`, `options_from_args`), whose stack
settings kame bench's config shares by name (`SharedStackSettings`).

Tools: `--mcp-server NAME=COMMAND_OR_URL` (repeatable) gives the oracle an
operator's MCP server; `--tools-allowed SERVER.TOOL[:readonly][:SECONDS]`
(repeatable) is the allow-list. A server named with --mcp-server is allowed
whole (`NAME.*`) unless a --tools-allowed entry names it: then only its listed
tools are offered. The operator who types a server on kame up's command line
means its tools to be used; narrowing is one flag away. Both become the
oracle's KAME_ORACLE_MCP_SERVERS and KAME_ORACLE_TOOLS_ALLOWED
(services/oracle/README.md, Tools).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

from kame_cli.errors import USAGE, CliError
from kame_common.llm import BACKEND_NAMES
from kame_common.ports import LLM_PORT, REDIS_PORT, SERVICE_PORTS, TELEPHONY_PORTS, WEB_PORTS
from services.frontend.config import DTYPES
from services.oracle.tools.settings import parse_allowed, parse_servers

LOOPBACK = "127.0.0.1"
# The ports with a --<name>-port flag; the metrics ports keep their defaults.
PORT_FLAGS = (
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
)


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
    def free(cls, redis: int = REDIS_PORT) -> Ports:
        """Free ephemeral ports for everything but Redis (shared by design)."""
        names = [f.name for f in fields(cls) if f.name != "redis"]
        return cls(redis=redis, **dict(zip(names, free_ports(len(names)), strict=True)))


# Where free_ports looks: "LOW-HIGH" (the test workers each take a range of their own).
FREE_PORT_RANGE_ENV = "KAME_FREE_PORT_RANGE"
FREE_PORTS_FROM = 20000  # the default range's start; it ends where the ephemeral range begins
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_ports_rng = random.Random()  # its own: a test that seeds `random` must not pick its ports


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that are free on loopback now (TCP and UDP: sip takes
    a UDP port), picked at random below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range) or in KAME_FREE_PORT_RANGE. Not from the
    ephemeral range: until its service binds a port, any bind to port 0 or outgoing
    connection on the machine can take it there (one did, in a two-worker test run:
    `kame up --free-ports` found another test's server on its LLM port)."""
    low, high = free_port_range()
    if high - low < 4 * count:
        return _kernel_ports(count)  # no room below the ephemeral range: the old way
    ports: list[int] = []
    while len(ports) < count:
        port = _ports_rng.randrange(low, high)
        if port not in ports and _bindable(port):
            ports.append(port)
    return ports


def free_port_run(length: int, even: bool = False) -> int:
    """The first of `length` consecutive ports free now (TCP and UDP), picked as
    free_ports picks them; `even`: the first is even (RTP's, with RTCP's after it)."""
    low, high = free_port_range()
    for _ in range(1000):
        start = _ports_rng.randrange(low, high - length)
        start -= start % 2 if even else 0
        if all(_bindable(port) for port in range(start, start + length)):
            return start
    raise CliError(f"no {length} free consecutive ports in {low}-{high}")


def free_port_range() -> tuple[int, int]:
    """[low, high) where free_ports picks: KAME_FREE_PORT_RANGE, else from
    FREE_PORTS_FROM up to the start of the ephemeral range."""
    given = os.environ.get(FREE_PORT_RANGE_ENV, "")
    if given:
        try:
            low, high = (int(part) for part in given.split("-"))
        except ValueError:
            raise CliError(
                f"{FREE_PORT_RANGE_ENV}={given!r}: expected LOW-HIGH, e.g. 20000-26000", USAGE
            ) from None
        if not 1024 <= low < high <= 65536:
            raise CliError(
                f"{FREE_PORT_RANGE_ENV}={given!r}: expected 1024 <= LOW < HIGH <= 65536", USAGE
            )
        return low, high
    try:
        ephemeral_low = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    return FREE_PORTS_FROM, ephemeral_low


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                return False
    return True


def _kernel_ports(count: int) -> list[int]:
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
    # The oracle's MCP servers (NAME=COMMAND_OR_URL each) and tool allow-list
    # (SERVER.TOOL[:readonly][:SECONDS] each); empty: the oracle's own settings.
    mcp_servers: tuple[str, ...] = ()
    tools_allowed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mcp_servers or self.tools_allowed:
            effective_allow_list(self.mcp_servers, self.tools_allowed)  # refuse bad ones now

    def servers_allowed_whole(self) -> list[str]:
        """The --mcp-server names no --tools-allowed entry narrows: all their tools are
        offered, those that change or delete things included."""
        allowed = effective_allow_list(self.mcp_servers, self.tools_allowed)
        return [entry.removesuffix(".*") for entry in allowed[len(self.tools_allowed) :]]

    def oracle_tool_env(self) -> dict[str, str]:
        """The oracle's MCP_SERVERS and TOOLS_ALLOWED settings for these options
        (none without --mcp-server: then the oracle's environment decides)."""
        if not self.mcp_servers:
            return {}
        return {
            "MCP_SERVERS": "; ".join(self.mcp_servers),
            "TOOLS_ALLOWED": ",".join(effective_allow_list(self.mcp_servers, self.tools_allowed)),
        }


def effective_allow_list(mcp_servers: Sequence[str], tools_allowed: Sequence[str]) -> list[str]:
    """`tools_allowed`, plus `NAME.*` for each server it does not name (allowed whole).
    CliError (USAGE) for a bad entry or an entry naming no --mcp-server."""
    try:
        servers = [entry.name for value in mcp_servers for entry in parse_servers(value)]
        allowed = [entry.server for value in tools_allowed for entry in parse_allowed(value)]
    except ValueError as exc:
        raise CliError(f"--mcp-server/--tools-allowed: {exc}", USAGE) from None
    if len(set(servers)) < len(servers):
        twice = next(name for name in servers if servers.count(name) > 1)
        raise CliError(f"--mcp-server: the name {twice!r} is used twice", USAGE)
    unknown = [name for name in allowed if name not in servers]
    if unknown:
        raise CliError(
            f"--tools-allowed names {unknown[0]!r}, which no --mcp-server NAME=... gives", USAGE
        )
    return [*tools_allowed, *(f"{name}.*" for name in servers if name not in allowed)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = StackOptions()  # the one home of each default
    parser.add_argument(
        "--frontend-engine",
        choices=("tts", "kame", "moshi"),
        default=defaults.frontend_engine,
        help="tts (CPU, default) or kame/moshi with --checkpoint",
    )
    parser.add_argument(
        "--checkpoint",
        default=defaults.checkpoint,
        help="KAME/Moshi checkpoint directory (Hugging Face layout)",
    )
    parser.add_argument(
        "--device", default=defaults.device, help="torch device of the kame/moshi engine"
    )
    add_dtype_argument(parser)
    parser.add_argument(
        "--redis-url", default=defaults.redis_url, help="use this Redis instead of 127.0.0.1"
    )
    parser.add_argument(
        "--llm-base-url",
        default=defaults.llm_base_url,
        help="an OpenAI-compatible server to use instead of the embedded LLM",
    )
    parser.add_argument(
        "--llm-backend",
        choices=("", *BACKEND_NAMES),
        default=defaults.llm_backend,
        help="oracle back-end (anthropic: the Anthropic API unless "
        "--llm-base-url; keys from OPENAI_API_KEY / ANTHROPIC_API_KEY)",
    )
    parser.add_argument("--llm-model", default=defaults.llm_model, help="model name for the oracle")
    parser.add_argument(
        "--free-ports",
        action="store_true",
        help="pick free ports instead of the defaults (below the ephemeral range, or in "
        f"{FREE_PORT_RANGE_ENV}=LOW-HIGH)",
    )
    for name in PORT_FLAGS:
        parser.add_argument(f"--{name}-port", type=int, default=getattr(defaults.ports, name))
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=defaults.log_dir,
        help="where each process logs (default: a new temp directory)",
    )
    parser.add_argument("--startup-timeout-s", type=float, default=defaults.startup_timeout_s)
    parser.add_argument(
        "--side-nice",
        type=int,
        default=defaults.side_niceness,
        choices=range(20),
        metavar="0-19",
        help="niceness of stt, oracle and the LLM server, so that gateway and frontend "
        "keep the voice on time on a busy machine (0 = no difference)",
    )
    parser.add_argument(
        "--mcp-server",
        dest="mcp_servers",
        action="append",
        default=[],
        metavar="NAME=COMMAND_OR_URL",
        help="an MCP server whose tools the oracle's LLM may call: a stdio command "
        "(NAME='python -m my_mcp') or a streamable HTTP URL (NAME=http://host/mcp); "
        "repeatable; all its tools are allowed unless --tools-allowed names it",
    )
    parser.add_argument(
        "--tools-allowed",
        action="append",
        default=[],
        metavar="SERVER.TOOL[:readonly][:SECONDS]",
        help="allow only these tools of a --mcp-server (SERVER.* = all of them); "
        ":readonly lets a tool run on partial transcripts, :SECONDS is its timeout; "
        "repeatable, or comma-separated",
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
    parser.add_argument("--dtype", choices=DTYPES, default=StackOptions.dtype, help=DTYPE_HELP)


def ports_from_args(args: argparse.Namespace) -> Ports:
    if args.free_ports:
        return Ports.free(redis=args.redis_port)
    return Ports(**{name: getattr(args, f"{name}_port") for name in PORT_FLAGS})


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
        # kame up's and the bench scripts' flags (add_arguments); kame bench's config
        # has no tools.
        mcp_servers=tuple(getattr(args, "mcp_servers", None) or ()),
        tools_allowed=tuple(getattr(args, "tools_allowed", None) or ()),
    )
