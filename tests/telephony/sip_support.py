"""SIPp (a SIP traffic generator, the Debian package sip-tester) for the SIP
tests: `sipp()` runs one scenario (XML the test writes) against an address and
says whether it passed. The tests' other SIP peer, baresip, is driven by
kame_cli/bench/baresip.py (the load bench's callers too).
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path

from kame_cli.stack import free_ports

SIPP = shutil.which("sipp") or "sipp"
SIPP_PCAPS = Path("/usr/share/sip-tester")


@dataclass
class SippResult:
    returncode: int
    output: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def sipp_errors(workdir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in workdir.glob("*_errors.log"))


async def sipp(
    scenario: str,
    target: str,
    workdir: Path,
    *,
    calls: int = 1,
    timeout_s: float = 30.0,
    extra: tuple[str, ...] = (),
) -> SippResult:
    """Run a SIPp scenario (its XML text) against `target` (host:port) on loopback:
    `calls` calls, one at a time; exit 0 when every call passed."""
    path = workdir / "scenario.xml"
    path.write_text(scenario)
    (sip_port,) = free_ports(1)
    media_port = free_ports(1)[0]
    command = [
        SIPP,
        target,
        "-sf",
        str(path),
        "-m",
        str(calls),
        "-l",
        "1",
        "-i",
        "127.0.0.1",
        "-p",
        str(sip_port),
        "-mi",
        "127.0.0.1",
        "-mp",
        str(media_port),
        "-timeout",
        f"{int(timeout_s)}s",
        "-timeout_error",
        "-nostdin",
        "-bg" if False else "-trace_err",
        *extra,
    ]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout_s + 10)
    except TimeoutError:
        process.kill()
        out, _ = await process.communicate()
    errors = sipp_errors(workdir)
    return SippResult(
        process.returncode if process.returncode is not None else -1,
        out.decode(errors="replace")[-2000:] + errors,
    )
