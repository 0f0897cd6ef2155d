"""The agent acts on the phone call it is in, end to end through `kame up` (#33).

`kame up` with call control on for SIP (env KAME_TELEPHONY_CALL_CONTROL and
KAME_TELEPHONY_TRANSFER_TARGETS: the telephony service's own settings); a
softphone nobody here wrote, baresip, calls its SIP port and says in piper's
voice (8 kHz through G.711) "Please transfer me to sales.", then "Please hang
up the call now.". The phone's call declares hang_up and transfer_call in its
Converse config, the gateway passes them to the oracle, whose LLM calls them,
and the gateway hands each call back to the telephony service, which acts on
the phone:

- the transfer: baresip gets our REFER naming the operator's URI for "sales"
  (the model only ever sees the name). Nothing listens at that URI: baresip's
  call to it fails and it says so in its NOTIFY, so the call goes on with the
  agent;
- the hang-up: baresip gets our BYE within BYE_WITHIN_S of the request, long
  before its own microphone file would end the call, and the gateway's record
  says the session ended OK.

OpenAI cannot be reached from here: the LLM is tests/oracle/tool_support.py's
fake on the OpenAI wire, which says goodbye and calls hang_up when asked to
hang up, and calls transfer_call to "sales" when asked for a transfer. One
`kame up` (~30-60 s to start on a busy CPU), one call of ~30 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kame_cli.bench.baresip import Baresip, caller_wav
from kame_common.audio import SAMPLE_RATE
from tests.e2e.conftest import with_db
from tests.e2e.test_tools_stack import FAKE_LLM, UP_TIMEOUT_S, read_until_up
from tests.oracle.conftest import StubHttpServer
from tests.support import conversation, session_record
from tests.telephony.phone_support import quiet_at_end, speech_seconds

pytestmark = pytest.mark.slow

ASK_TRANSFER = "Please transfer me to sales."
ASK_HANG_UP = "Please hang up the call now."
SALES = "sip:sales@127.0.0.1:5999"  # nothing listens here: baresip's call to it fails
CALL_CONTROL_ENV = {
    "KAME_TELEPHONY_CALL_CONTROL": "hang_up,transfer",
    "KAME_TELEPHONY_TRANSFER_TARGETS": f"sales={SALES}",
}
CALL_CONTROL_DB = 13  # the stack's own Redis database: its registry holds only its frontend
LEAD_S = 1.0  # silence before the first request
GAP_S = 12.0  # after the transfer request: its answer, the failure, the agent's apology
TAIL_S = 60.0  # silence after the hang-up request: baresip hangs up when its file ends
# From the end of the hang-up request to our BYE: the stt's final, the LLM, the
# goodbye played, on a busy CPU.
BYE_WITHIN_S = 25.0


def kame_up_with_call_control(args: list[str]) -> subprocess.Popen:
    """`kame up ARGS` with call control on for its telephony service, its output piped,
    in a session of its own (a Ctrl-C to its group reaches it alone)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kame_cli", *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **CALL_CONTROL_ENV},
    )


def caller_says(tmp_path: Path, speak) -> tuple[Path, float]:
    """baresip's microphone: the transfer request, a pause, the hang-up request,
    then silence; and when (from the call's start) the hang-up request ends."""
    transfer, hang_up = speak(ASK_TRANSFER), speak(ASK_HANG_UP)
    speech = np.concatenate([transfer, np.zeros(int(GAP_S * SAMPLE_RATE), np.float32), hang_up])
    wav = caller_wav(tmp_path, "caller", speech, SAMPLE_RATE, lead_s=LEAD_S, tail_s=TAIL_S)
    return wav, LEAD_S + len(speech) / SAMPLE_RATE


def offered_tools(llm: StubHttpServer) -> set[str]:
    return {
        tool["function"]["name"]
        for post in llm.posts()
        if post.json().get("max_tokens") != 1
        for tool in post.json().get("tools", [])
    }


async def test_the_agent_transfers_and_hangs_up_a_baresip_call(tmp_path, redis_url, speak):
    llm = StubHttpServer(FAKE_LLM)
    llm_url = await llm.start()
    logs = tmp_path / "logs"
    command = [
        *("up", "--free-ports", "--log-dir", str(logs)),
        *("--redis-url", with_db(redis_url, CALL_CONTROL_DB)),
        *("--llm-base-url", llm_url + "/v1", "--llm-model", "stub-model"),
        *("--startup-timeout-s", str(UP_TIMEOUT_S)),
    ]
    wav, asked_to_hang_up_at = caller_says(tmp_path, speak)
    process = kame_up_with_call_control(command)
    phone: Baresip | None = None
    try:
        started = time.monotonic()
        printed = await asyncio.wait_for(asyncio.to_thread(read_until_up, process), UP_TIMEOUT_S)
        print(f"kame up was up after {time.monotonic() - started:.0f} s:\n{printed}")
        sip = re.search(r"SIP udp (127\.0\.0\.1:\d+)", printed).group(1)

        phone = await Baresip(wav).start()
        await phone.dial(f"sip:agent@{sip}")
        established = await phone.wait_for("CALL_ESTABLISHED", timeout_s=15)

        # "Transfer me to sales": a REFER to the operator's URI for the name.
        transfer = await phone.wait_for("TRANSFER", timeout_s=LEAD_S + GAP_S + 20)
        assert transfer["param"] == f"<{SALES}>", transfer

        # "Please hang up the call now": our BYE, long before the file would end the call.
        bye_by = asked_to_hang_up_at + BYE_WITHIN_S
        remaining = established["at"] + bye_by - time.monotonic()
        closed = await phone.wait_for("CALL_CLOSED", timeout_s=max(remaining, 1.0))
        print(f"BYE {closed['at'] - established['at'] - asked_to_hang_up_at:.1f} s after the ask")
        heard, rate = phone.heard()
    finally:
        if phone is not None:
            await phone.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: kame up stops what it started
            await asyncio.to_thread(process.wait, 60)
        await llm.close()

    # The phone's functions reached the LLM, the URI never did.
    assert {"hang_up", "transfer_call"} <= offered_tools(llm)
    assert SALES not in json.dumps([post.json() for post in llm.posts()])
    # The goodbye said before the call played whole before the line closed.
    after_the_ask = heard[int(asked_to_hang_up_at * rate) :]
    print(f"the phone heard {speech_seconds(after_the_ask):.2f} s of speech after the ask")
    assert speech_seconds(after_the_ask) >= 0.3
    assert quiet_at_end(heard, 0.5)

    telephony = (logs / "telephony.log").read_text()
    oracle = (logs / "oracle.log").read_text()
    # The service hung up (not the phone), and the Converse call ended without error.
    ended = re.search(r"sip call \S+ \(session (\S+)\) ended: (\w+) ?(.*)$", telephony, re.M)
    assert ended is not None, telephony[-3000:]
    session_id, how, status = ended.groups()
    assert (how, status) == ("agent_hung_up", "the agent hung up"), ended.group(0)
    stack_redis = with_db(redis_url, CALL_CONTROL_DB)
    record = await session_record(stack_redis, session_id)
    assert (record.get("state"), record.get("outcome")) == ("ended", "ok"), record
    # Both results reached the oracle: the conversation has them as tool turns.
    tools = [t["text"] for t in await conversation(stack_redis, session_id) if t["role"] == "tool"]
    print(f"tool turns: {tools}")
    assert len(tools) == 2, tools
    assert tools[0].startswith("transfer_call(") and "transfer to sales failed" in tools[0]
    assert tools[1].startswith("hang_up(") and re.search(r"-> (hung up|hanging up)", tools[1])
    # Every function answered within the oracle's wait: no timeout, no error logged.
    assert "did not answer within" not in oracle and "got no result within" not in oracle
    assert "Traceback" not in telephony and "Traceback" not in oracle
