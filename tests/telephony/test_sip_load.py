"""kame_cli/bench/sip_load.py, briefly, against a real telephony stack: the
telephony service it starts in this process in front of tests/e2e/conftest.py's
`stack` (the real gateway, stt, oracle and tts frontend), a warm-up call and one
load level of one baresip call. The bench reads the service's side through
supported hooks (Telephony.on_call_ended, PhoneCall.turns); when one goes or
stops working, its figures go missing and this fails (the bench once patched a
PhoneCall method that had been renamed, and nothing noticed)."""

from __future__ import annotations

import pytest

from kame_cli.bench import sip_load
from kame_cli.bench.paths import ESPEAK_QUESTIONS
from kame_cli.bench.questions import load_questions
from tests.e2e.conftest import e2e_redis_url, stack  # noqa: F401 (fixtures)

pytestmark = pytest.mark.asyncio(loop_scope="module")

LISTEN_S = 10.0  # silence after the question: time for an answer before the hang-up


async def test_one_call_is_measured_on_both_sides(stack):  # noqa: F811
    args = sip_load.parse_args(["--calls", "1", "--listen-s", str(LISTEN_S)])
    questions = load_questions(ESPEAK_QUESTIONS)[:1]
    (level,) = await sip_load.run_levels(args, stack.gateway.address, questions)
    # The phone's side: baresip dialed, talked and hung up when its file ended.
    assert (level["calls"], level["established"], level["completed"]) == (1, 1, 1)
    # The service's side, of the call once it ended: its playout sent the agent's
    # audio in 20 ms packets for the whole call...
    (playout,) = level["per_call_playout"]
    assert playout["packets"] == level["packets"] > 0
    assert level["late_packets"] is not None and level["underruns"] is not None
    # ... and the gateway's TurnSummary of the question's turn came with it.
    assert level["gateway_turns"] >= 1
    assert level["gateway_response_latency_s"]["median"] is not None
