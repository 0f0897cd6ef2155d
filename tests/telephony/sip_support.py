"""SIPp (a SIP traffic generator, the Debian package sip-tester) for the SIP
tests: `sipp()` runs one scenario (XML: `scenario()` of the steps `request`,
`in_dialog`, ... write) against an address and says whether it passed. The
tests' other SIP peer, baresip, is driven by kame_cli/bench/baresip.py (the
load bench's callers too).
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import textwrap
from dataclasses import dataclass
from pathlib import Path

from kame_cli.stack_options import free_ports

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
        "-trace_err",  # the errors log, which sipp_errors() reads
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


def rtp_pcap(path: Path, ulaw: bytes) -> Path:
    """`ulaw` (8 kHz mu-law) as a PCMU RTP stream of 20 ms packets, 20 ms apart, in a
    pcap file (Ethernet, IPv4, UDP) that SIPp's play_pcap_audio replays to the
    service's media port: a SIPp caller that speaks."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    loopback = bytes([127, 0, 0, 1])
    for n, start in enumerate(range(0, len(ulaw) - 159, 160)):
        rtp = struct.pack("!BBHII", 0x80, 0, n & 0xFFFF, n * 160, 0x4B414D45)
        udp = struct.pack("!HHHH", 6000, 6000, 8 + 12 + 160, 0) + rtp + ulaw[start : start + 160]
        ip = struct.pack(
            "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), n, 0, 64, 17, 0, loopback, loopback
        )
        frame = bytes(12) + b"\x08\x00" + ip + udp
        seconds, micros = divmod(n * 20_000, 1_000_000)
        out += struct.pack("<IIII", seconds, micros, len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))
    return path


# ---- scenarios ----------------------------------------------------------------------

SDP_PCMU = """\
v=0
o=sipp 1 1 IN IP4 [media_ip]
s=-
c=IN IP4 [media_ip]
t=0 0
m=audio [media_port] RTP/AVP {formats}
{rtpmaps}
a=ptime:20
a=sendrecv
"""


def sdp(formats: str = "0 101") -> str:
    names = {"0": "PCMU/8000", "8": "PCMA/8000", "9": "G722/8000", "101": "telephone-event/8000"}
    rtpmaps = "\n".join(f"a=rtpmap:{f} {names[f]}" for f in formats.split())
    return SDP_PCMU.format(formats=formats, rtpmaps=rtpmaps)


# Header lines of the requests SIPp sends (its [keywords] fill them in).
AGENT_URI = "sip:agent@[remote_ip]:[remote_port]"
VIA = "Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]"
FROM = "From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]"
TO_AGENT = f"To: <{AGENT_URI}>"
CALL_ID = "Call-ID: [call_id]"
CONTACT = "Contact: <sip:sipp@[local_ip]:[local_port]>"


def send(
    start_line: str,
    headers: list[str],
    body: str = "",
    retrans: bool = True,
    content_type: str = "application/sdp",
) -> str:
    """A SIPp <send> of one request; `retrans` makes SIPp resend it until answered,
    as UDP needs. An ACK is never answered; these tests send a CANCEL once too."""
    content = [f"Content-Type: {content_type}"] if body else []
    message = "\n".join(
        [start_line, *headers, "Max-Forwards: 70", *content, "Content-Length: [len]", "", body]
    )
    attributes = ' retrans="500"' if retrans else ""
    return f"  <send{attributes}>\n    <![CDATA[\n{message}\n    ]]>\n  </send>\n"


def request(method: str, body: str = "", cseq: int = 1) -> str:
    """An out-of-dialog request (INVITE, OPTIONS)."""
    headers = [VIA, FROM, TO_AGENT, CALL_ID, f"CSeq: {cseq} {method}", CONTACT]
    return send(f"{method} {AGENT_URI} SIP/2.0", headers, body)


def in_dialog(method: str, cseq: int, body: str = "") -> str:
    """A request within the dialog the last 200 made."""
    headers = [VIA, FROM, "[last_To:]", CALL_ID, f"CSeq: {cseq} {method}", CONTACT]
    return send(f"{method} [next_url] SIP/2.0", headers, body, retrans=method != "ACK")


# The ACK of a final error response: the INVITE's own transaction (its Via, From, To).
ACK_ERROR = send(
    f"ACK {AGENT_URI} SIP/2.0",
    ["[last_Via:]", "[last_From:]", "[last_To:]", CALL_ID, "CSeq: 1 ACK"],
    retrans=False,
)
CANCEL = send(
    f"CANCEL {AGENT_URI} SIP/2.0",
    ["[last_Via:]", FROM, TO_AGENT, CALL_ID, "CSeq: 1 CANCEL"],
    retrans=False,
)


def answered(invite: str = "", ok: str = '  <recv response="200" rrs="true"/>\n') -> list[str]:
    """A call's opening steps: the INVITE (`invite`, or one offering sdp()), its
    provisional responses, our 200 OK (`ok`: the step receiving it) and the ACK."""
    return [
        invite or request("INVITE", sdp()),
        '  <recv response="100" optional="true"/>\n',
        '  <recv response="180" optional="true"/>\n',
        ok,
        in_dialog("ACK", 1),
    ]


def scenario(*steps: str) -> str:
    body = "".join(textwrap.dedent(step) if step.startswith(" ") else step for step in steps)
    return (
        f'<?xml version="1.0" encoding="ISO-8859-1" ?>\n<scenario name="kame">\n{body}</scenario>\n'
    )


def invite_scenario(expect: int, formats: str = "0 101") -> str:
    """INVITE, refused with `expect`, ACKed."""
    return scenario(
        request("INVITE", sdp(formats)),
        '  <recv response="100" optional="true"/>\n',
        f'  <recv response="{expect}"/>\n',
        ACK_ERROR,
    )


# Our answer to a BYE the service sends.
BYE_200 = send(
    "SIP/2.0 200 OK",
    ["[last_Via:]", "[last_From:]", "[last_To:]", "[last_Call-ID:]", "[last_CSeq:]"],
    retrans=False,
)


# ---- a transferee (RFC 3515): SIPp as the phone our REFER goes to -----------------


def reply(status: str) -> str:
    """A response to the request just received (a REFER, our BYE)."""
    return send(
        f"SIP/2.0 {status}",
        ["[last_Via:]", "[last_From:]", "[last_To:]", "[last_Call-ID:]", "[last_CSeq:]"],
        retrans=False,
    )


# Our 200 OK, its To (the service's address and tag) kept in $1 for the NOTIFYs.
OK_KEEPING_TO = (
    '  <recv response="200" rrs="true">\n'
    '    <action><ereg regexp=".*" search_in="hdr" header="To:" assign_to="1"/></action>\n'
    "  </recv>\n"
)


def notify_refer(cseq: int, sipfrag: str, final: bool) -> str:
    """A NOTIFY of the REFER's implicit subscription: the sipfrag status line of the
    transferee's call to the target (RFC 3515 2.4.4)."""
    state = "terminated;reason=noresource" if final else "active;expires=60"
    headers = [
        VIA,
        FROM,
        "To:[$1]",
        CALL_ID,
        f"CSeq: {cseq} NOTIFY",
        CONTACT,
        "Event: refer",
        f"Subscription-State: {state}",
    ]
    body = f"SIP/2.0 {sipfrag}\n"
    return send("NOTIFY [next_url] SIP/2.0", headers, body, content_type="message/sipfrag")


def transferee(refer_to: str, outcome: str, ring_ms: int = 0, says: Path | None = None) -> str:
    """A call answered (SIPp then plays the RTP in the pcap `says`, if given),
    then our REFER, whose Refer-To must match the regular expression
    `refer_to`; 202 Accepted, NOTIFY 100 Trying and, `ring_ms` later (the
    target ringing), NOTIFY `outcome` (e.g. "200 OK", "486 Busy Here"). After a
    2xx outcome the service must send BYE; after another it must not, and SIPp
    ends the call."""
    check = (
        f'  <recv request="REFER">\n    <action><ereg regexp="{refer_to}" search_in="hdr" '
        'header="Refer-To:" check_it="true" assign_to="2"/></action>\n  </recv>\n'
        '  <Reference variables="2"/>\n'  # only checked: SIPp wants it marked as used
    )
    play = f'  <nop><action><exec play_pcap_audio="{says}"/></action></nop>\n' if says else ""
    steps = [
        *answered(ok=OK_KEEPING_TO),
        play,
        check,
        reply("202 Accepted"),
        notify_refer(2, "100 Trying", final=False),
        '  <recv response="200"/>\n',
        f'  <pause milliseconds="{ring_ms}"/>\n' if ring_ms else "",
        notify_refer(3, outcome, final=True),
        '  <recv response="200"/>\n',
    ]
    if outcome.startswith("2"):
        steps += ['  <recv request="BYE"/>\n', reply("200 OK")]
    else:
        steps += [
            '  <pause milliseconds="500"/>\n',
            in_dialog("BYE", 4),
            '  <recv response="200"/>\n',
        ]
    return scenario(*steps)
