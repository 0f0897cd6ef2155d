"""free_ports: `kame up --free-ports` and the tests' stacks pick ports below the
kernel's ephemeral range (where no bind to port 0 or outgoing connection can take
one before its service binds it), or in KAME_FREE_PORT_RANGE, and never one in use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kame_cli import stack_options
from kame_cli.errors import USAGE, CliError
from kame_cli.stack_options import FREE_PORT_RANGE_ENV, free_port_range, free_ports


def test_ports_come_from_the_range_given_distinct_and_free(monkeypatch):
    monkeypatch.setenv(FREE_PORT_RANGE_ENV, "21000-21200")
    ports = free_ports(16)
    assert len(set(ports)) == 16
    assert all(21000 <= port < 21200 for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_over_tcp_or_udp_is_never_picked(monkeypatch):
    monkeypatch.setenv(FREE_PORT_RANGE_ENV, "21300-21304")
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(2)]
    held.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        for port, sock in zip((21300, 21301, 21302), held, strict=True):
            sock.bind(("127.0.0.1", port))
        held[0].listen()
        assert {port for _ in range(20) for port in free_ports(1)} == {21303}
    finally:
        for sock in held:
            sock.close()


def test_by_default_ports_come_from_below_the_ephemeral_range(monkeypatch):
    monkeypatch.delenv(FREE_PORT_RANGE_ENV, raising=False)
    low, high = free_port_range()
    ephemeral_low = int(Path(stack_options.EPHEMERAL_RANGE_FILE).read_text().split()[0])
    assert (low, high) == (stack_options.FREE_PORTS_FROM, ephemeral_low)
    assert all(low <= port < high for port in free_ports(8))


@pytest.mark.parametrize("given", ["20000", "a-b", "30000-20000", "80-90000"])
def test_a_malformed_range_is_a_usage_error_that_names_the_variable(monkeypatch, given):
    monkeypatch.setenv(FREE_PORT_RANGE_ENV, given)
    with pytest.raises(CliError) as refused:
        free_ports(1)
    assert refused.value.exit_code == USAGE
    assert FREE_PORT_RANGE_ENV in str(refused.value)
