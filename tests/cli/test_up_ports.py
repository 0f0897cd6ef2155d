"""`kame up` counts a process as started only when the sockets on its ports are
its own: gRPC servers bind with SO_REUSEPORT, so a server started on a port
another process already serves comes up without error and the two share the
connections (how a second `kame up` once reported "up" on the first one's
servers). Real processes and sockets, no stack needed."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from kame_cli.child import Child, StackError
from kame_cli.listeners import describe_holder, holders, port_is_free
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, StackOptions, free_ports

SHARING_SERVER = """
import socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("listening", flush=True)
time.sleep(120)
"""


def reuseport_listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def sharing_child(port: int) -> Child:
    child = Child(
        "sharer",
        [sys.executable, "-c", SHARING_SERVER, str(port)],
        {},
        ready=lambda: child.has_logged("listening"),
        endpoint=f"127.0.0.1:{port}",
        ports=(port,),
    )
    return child


def test_the_holder_of_a_port_is_named_with_its_pid_and_command():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free(port)
        (holder,) = holders(port)
        assert holder.pid == os.getpid()
        assert "python" in holder.command
        assert describe_holder(port).startswith(f"PID {os.getpid()} (")
    assert port_is_free(port) and holders(port) == []


def test_a_process_listening_alone_on_its_port_counts_as_started(tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    port = free_ports(1)[0]
    try:
        stack.start_and_wait([sharing_child(port)])
        assert [h.pid for h in holders(port)] == [stack.children[0].process.pid]
    finally:
        stack.stop()


def test_a_port_shared_with_another_process_is_refused(tmp_path):
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path))
    port = free_ports(1)[0]
    with reuseport_listener(port):  # "the first stack" already serves this port
        try:
            with pytest.raises(
                StackError,
                match=rf"sharer answers, but another process listens on its port {port}: "
                rf"PID {os.getpid()} ",
            ):
                stack.start_and_wait([sharing_child(port)])
        finally:
            stack.stop()
