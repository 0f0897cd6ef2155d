"""Who listens on a TCP port of this machine: `kame up` checks its ports before
it starts anything, and afterwards that the process answering on each port is
the one it started (gRPC servers bind with SO_REUSEPORT, so a second server on
a busy port starts without error and shares the connections with the first).

Linux only, without extra packages: the listening sockets come from
/proc/net/tcp and /proc/net/tcp6 (port and socket inode), and the process that
holds a socket from the /proc/<pid>/fd links to `socket:[inode]`. Processes of
other users cannot be looked into; they show as holders with an unknown PID.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"  # the `st` column of /proc/net/tcp
COMMAND_CHARS = 80


@dataclass(frozen=True)
class Holder:
    """A process listening on a port; pid None when it is not ours to look at."""

    pid: int | None
    command: str = ""

    def __str__(self) -> str:
        if self.pid is None:
            return "a process of another user"
        return f"PID {self.pid} ({self.command})" if self.command else f"PID {self.pid}"


def port_is_free(port: int, host: str = "127.0.0.1", udp: bool = False) -> bool:
    """Whether a server could bind host:port (TCP, or UDP) now (a socket in
    TIME_WAIT does not count: servers bind with SO_REUSEADDR too)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def listening_inodes(port: int) -> set[int]:
    """Inodes of the sockets listening on `port` (any address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                cells = line.split()
                local, state, inode = cells[1], cells[3], int(cells[9])
                if state == TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in (PROC / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def command_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
        return command if len(command) <= COMMAND_CHARS else command[: COMMAND_CHARS - 3] + "..."
    return ""


def holders(port: int) -> list[Holder]:
    """The processes listening on `port`; one Holder(None) stands for sockets
    no process we may look into owns."""
    wanted = listening_inodes(port)
    found: list[Holder] = []
    for entry in PROC.iterdir():
        if not wanted:
            break
        if not entry.name.isdigit():
            continue
        owned = _socket_inodes(int(entry.name)) & wanted
        if owned:
            found.append(Holder(int(entry.name), command_of(int(entry.name))))
            wanted -= owned
    if wanted:
        found.append(Holder(None))
    return found


def describe_holder(port: int) -> str:
    """'PID 123 (python -m ...)' of what holds `port`, or why that is unknown."""
    found = holders(port)
    if not found:
        return "a process that could not be identified"
    return ", ".join(str(holder) for holder in found)


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
