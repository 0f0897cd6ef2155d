"""tests/support/tiers.py: every test module has a tier, the map names no module
that is gone, and a unit test cannot reach the network."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from tests.support.tiers import TIER_NAMES, TIERS, NetworkInUnitTest, tier_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_tier_and_every_entry_names_one_that_exists():
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert [m for m in modules if tier_of(m) is None] == []
    assert sorted(set(TIERS.values()) - set(TIER_NAMES)) == []
    assert [key for key in TIERS if not (ROOT / key).exists()] == []


def test_a_module_entry_wins_over_its_folder_and_an_unknown_module_has_no_tier():
    assert tier_of("tests/e2e/test_anything_new.py") == "e2e"
    assert tier_of("tests/web/test_pacer.py") == "unit"
    assert tier_of("tests/web/test_not_registered.py") is None


def test_a_unit_test_cannot_open_ip_sockets_or_grpc_but_has_unix_sockets():
    """This module is of the unit tier, so conftest's guard (no_network) is on."""
    with socket.socket() as sock, pytest.raises(NetworkInUnitTest, match="service tier"):
        sock.bind(("127.0.0.1", 0))
    with socket.socket() as sock, pytest.raises(NetworkInUnitTest):
        sock.connect(("127.0.0.1", 9))
    with pytest.raises(NetworkInUnitTest):
        grpc.aio.insecure_channel("127.0.0.1:9")
    left, right = socket.socketpair()
    left.close()
    right.close()
    asyncio.run(asyncio.sleep(0))


@pytest.mark.service
def test_a_service_test_has_the_network():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
