"""Web abuse run: what callers without a token can take from a running stack's
web service, black-box, over its real sockets (issue #42):

- squat: `--sockets` idle sockets without a token on each WebSocket route
  (/v1/realtime, /v1/live/sessions, /api/chat, /converse), each from one of
  a few client addresses (X-Forwarded-For, which the web service believes only
  from its `trusted_proxies`): how many it accepted, and whether a page caller
  with the token, meanwhile, gets a call (its `started` event);
- flood: `--big` sockets each sending a `--big-mib` message on each route: the
  web process's resident memory before and at its peak (VmHWM), against the
  Helm chart's 256 Mi limit for the web pod;
- declare: a function declaration of `--declaration-kb` at every door that
  takes one (the gateway's gRPC Converse, /v1/realtime's session.update,
  /v1/live/sessions' session.start): the error each answers with.

    KAME_GATEWAY_AUTH_TOKENS=$TOKEN KAME_WEB_TRUSTED_PROXIES=127.0.0.1 kame up
    .venv/bin/python -m kame_cli.bench.web_abuse --web 127.0.0.1:PORT \
        --gateway 127.0.0.1:PORT --token $TOKEN

Prints a table and writes bench/results/web_abuse.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import websockets
from websockets.asyncio.client import ClientConnection

from kame_cli.bench.machine import load_average
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import print_table, write_json
from kame_client.client import ConverseClient
from kame_client.status import CallEnd
from kamepb import common_pb2, gateway_pb2

ROUTES = ("/v1/realtime?model=kame-tandem", "/v1/live/sessions", "/api/chat", "/converse")
CHART_LIMIT_MIB = 256  # deploy/helm: the web pod's memory limit
ADDRESSES = 32  # squatters' client addresses (documentation range 203.0.113.0/24)
OPEN_TIMEOUT_S = 10.0


@dataclass
class Report:
    sockets_per_route: int
    accepted: dict[str, int] = field(default_factory=dict)
    page_served: bool = False
    page_first_event: str = ""
    rss_start_mib: float = 0.0
    rss_squat_peak_mib: float = 0.0
    rss_before_mib: float = 0.0  # the flood's
    rss_peak_mib: float = 0.0
    flood_closed: dict[str, str] = field(default_factory=dict)
    declaration_refusals: dict[str, str] = field(default_factory=dict)


def listening_pid(port: int) -> int:
    """The process listening on TCP `port` on this machine (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                local, state, inode = (line.split()[i] for i in (1, 3, 9))
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{inode}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds(pid)):
                return int(pid)
    raise RuntimeError(f"no process of ours listens on port {port}")


def fds(pid: str) -> Iterator[str]:
    with contextlib.suppress(OSError):
        yield from os.listdir(f"/proc/{pid}/fd")


def reset_peak(pid: int) -> None:
    """VmHWM starts again from VmRSS (proc(5): clear_refs, 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def memory_mib(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


async def opened(web: str, route: str, address: str) -> ClientConnection | None:
    """A socket to `route` without a token, from `address` (X-Forwarded-For); None if refused."""
    headers = {"X-Forwarded-For": address, "Origin": f"http://{web}"}
    if route != "/converse":
        headers.pop("Origin")
    try:
        return await websockets.connect(
            f"ws://{web}{route}", additional_headers=headers, open_timeout=OPEN_TIMEOUT_S
        )
    except (websockets.InvalidStatus, OSError, TimeoutError):
        return None


async def page_call(web: str, token: str) -> str:
    """A page caller with the token (its own address): the first event it gets."""
    origin = {"Origin": f"http://{web}", "X-Forwarded-For": "198.51.100.1"}
    async with websockets.connect(f"ws://{web}/converse", additional_headers=origin) as page:
        await page.send(json.dumps({"type": "start", "rate": 24000, "token": token}))
        async with asyncio.timeout(30):
            while True:
                await page.send(bytes(4800))  # 100 ms of silence, as a microphone sends
                message = await page.recv()
                if isinstance(message, str):
                    event = json.loads(message)
                    return str(event.get("type")) + (
                        f" {event.get('code')}" if "code" in event else ""
                    )


async def squat(web: str, token: str, count: int, report: Report) -> None:
    held: list[ClientConnection] = []
    try:
        for route in ROUTES:
            sockets = [await opened(web, route, f"203.0.113.{n % ADDRESSES}") for n in range(count)]
            kept = [s for s in sockets if s is not None]
            report.accepted[route.split("?")[0]] = len(kept)
            held += kept
        report.page_first_event = await page_call(web, token)
        report.page_served = report.page_first_event == "started"
    finally:
        await asyncio.gather(*(s.close() for s in held), return_exceptions=True)


async def flood_one(web: str, route: str, address: str, size: int) -> str:
    socket = await opened(web, route, address)
    if socket is None:
        return "refused"
    try:
        payload = json.dumps({"type": "session.update", "session": {"instructions": "x" * size}})
        await socket.send(payload.encode() if route == "/api/chat" else payload)
        async with asyncio.timeout(30):
            while True:
                await socket.recv()
    except websockets.ConnectionClosed:
        return str(socket.close_code)
    except TimeoutError:
        return "open"
    finally:
        await socket.close()


async def flood(web: str, pid: int, count: int, size: int, report: Report) -> None:
    reset_peak(pid)
    report.rss_before_mib = memory_mib(pid)[0]
    for route in ROUTES:
        codes = await asyncio.gather(
            *(flood_one(web, route, f"203.0.113.{100 + n}", size) for n in range(count))
        )
        report.flood_closed[route.split("?")[0]] = ",".join(sorted(set(codes)))
    report.rss_peak_mib = memory_mib(pid)[1]


def big_tool(kb: int) -> dict[str, Any]:
    words = {f"field_{n}": {"type": "string", "description": "x" * 1000} for n in range(kb)}
    schema = {"type": "object", "properties": words}
    return {"type": "function", "name": "huge", "description": "a big schema", "parameters": schema}


async def first_error(socket: ClientConnection, event: dict[str, Any]) -> str:
    await socket.send(json.dumps(event))
    async with asyncio.timeout(15):
        while True:
            reply = json.loads(await socket.recv())
            if reply.get("type") == "error":
                return f"{reply['error'].get('code')}: {reply['error'].get('message')}"


async def declare(web: str, gateway: str, token: str, kb: int, report: Report) -> None:
    tool = big_tool(kb)
    bearer = {"Authorization": f"Bearer {token}"}
    realtime = await websockets.connect(f"ws://{web}{ROUTES[0]}", additional_headers=bearer)
    async with realtime:
        update = {"type": "session.update", "session": {"type": "realtime", "tools": [tool]}}
        report.declaration_refusals["/v1/realtime"] = await first_error(realtime, update)
    live = await websockets.connect(f"ws://{web}{ROUTES[1]}", additional_headers=bearer)
    async with live:
        delegation = {"type": "responses", "responses": {"model": "default", "tools": [tool]}}
        session = {"model": "gpt-live-1", "delegation": delegation}
        start = {"type": "session.start", "session": session}
        report.declaration_refusals["/v1/live/sessions"] = await first_error(live, start)
    report.declaration_refusals["gRPC Converse"] = await grpc_declaration(gateway, token, tool)


async def grpc_declaration(gateway: str, token: str, tool: dict[str, Any]) -> str:
    declared = common_pb2.ClientFunction(
        name=tool["name"],
        description=tool["description"],
        parameters_json=json.dumps(tool["parameters"]),
    )
    config = gateway_pb2.ConverseConfig(functions=[declared])
    client = ConverseClient(grpc.aio.insecure_channel(gateway), token, own_channel=True)
    try:
        await client.start(config)
        async for _ in client.events():
            pass
        return "accepted"
    except grpc.aio.AioRpcError as exc:
        end = CallEnd.of(exc, client.channel)
        return f"{end.name}: {end.message()}"
    finally:
        client.cancel()
        await client.close()


async def abuse(web: str, gateway: str, token: str, args: argparse.Namespace) -> Report:
    """The whole run against the stack at `web` and `gateway` (HOST:PORT each)."""
    report = Report(args.sockets)
    pid = listening_pid(int(web.rsplit(":", 1)[1]))
    reset_peak(pid)
    report.rss_start_mib = memory_mib(pid)[0]
    await squat(web, token, args.sockets, report)
    report.rss_squat_peak_mib = memory_mib(pid)[1]
    await flood(web, pid, args.big, args.big_mib << 20, report)
    await declare(web, gateway, token, args.declaration_kb, report)
    return report


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--web", required=True, help="the web service's HOST:PORT")
    parser.add_argument("--gateway", required=True, help="the gateway's HOST:PORT")
    parser.add_argument("--token", required=True, help="one of the gateway's auth tokens")
    parser.add_argument("--sockets", type=int, default=64, help="idle sockets per route")
    parser.add_argument("--big", type=int, default=16, help="sockets sending a big message")
    parser.add_argument("--big-mib", type=int, default=15, help="the big message's MiB")
    parser.add_argument("--declaration-kb", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "web_abuse.json")
    return parser


def print_report(report: Report) -> None:
    rows = [
        f"{route:<20} {n:>4} of {report.sockets_per_route}" for route, n in report.accepted.items()
    ]
    print_table("idle sockets without a token, accepted", rows)
    print(f"page caller with the token: {report.page_first_event or 'nothing'}")
    print_table(
        "flood",
        [f"{route:<20} closed {codes}" for route, codes in report.flood_closed.items()]
        + [
            f"web RSS {report.rss_start_mib:.0f} MiB at the start, "
            f"peak {report.rss_squat_peak_mib:.0f} MiB with the idle sockets",
            f"web RSS {report.rss_before_mib:.0f} MiB before, peak {report.rss_peak_mib:.0f} MiB "
            f"(chart limit {CHART_LIMIT_MIB} Mi)",
        ],
    )
    print_table(
        "400 KB declaration",
        [f"{d:<20} {why[:110]}" for d, why in report.declaration_refusals.items()],
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.time()
    report = asyncio.run(abuse(args.web, args.gateway, args.token, args))
    print_report(report)
    write_json(
        args.out,
        asdict(report) | {"load_average": load_average(), "duration_s": time.time() - started},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
