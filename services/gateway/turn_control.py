"""The caller's turn controls and typed messages (push-to-talk), relayed.

A caller (an app with a talk button, the OpenAI Realtime endpoint with
`turn_detection: null`) may end its own turn, ask for the answer, stop the
agent, and type a message instead of saying it (gateway.proto: TurnControl,
UserText). `CallerTurns` turns each request into what stt and the front-end
need; the front-end's engine decides what the agent does (frontend.proto):

- END_TURN: stt finalizes the open utterance now (EndOfTurn at what the caller
  has sent so far: stt takes the speech end its VAD heard), so the oracle gets
  the final at once; the front-end ends the turn (in MANUAL mode it then waits
  for RESPOND).
- RESPOND: the same end of turn (nothing happens in stt without an open
  utterance), then the front-end answers.
- CANCEL: to the front-end only; it stops the agent and says so (BargeIn,
  cancelled).
- UserText: a final transcript of an utterance of its own
  ("<session_id>-text-<n>", its span empty at what the caller has sent so far),
  handed to the session's transcript path (client echo, oracle, records) and
  to the front-end as a typed turn.

Requests that cannot be acted on do not end the call: a blank text, a text over
`user_text_max_chars`, texts faster than `user_text_per_s` (after a burst of
USER_TEXT_BURST: each starts an LLM answer and a Redis write), turn controls
faster than TURN_CONTROLS_PER_S (after TURN_CONTROL_BURST; one notice per run
of them), an action this
gateway does not know get Notice REFUSED (the caller may have a newer client,
or a user who typed too much). Requests
that change nothing (END_TURN with nothing said, a second RESPOND) are no-ops
in the front-end: nothing is sent back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kamepb import common_pb2, frontend_pb2, gateway_pb2
from services.gateway import metrics
from services.gateway.config import GatewaySettings
from services.gateway.oracle_health import notice
from services.gateway.pacing import KeyRate
from services.gateway.turns import TurnTracker

Action = common_pb2.TurnControl.Action
_NAMES = {Action.END_TURN: "end_turn", Action.RESPOND: "respond", Action.CANCEL: "cancel"}
USER_TEXT_BURST = 5
# Turn controls a second, after a burst: far above what a talk button sends, and
# a bound on what a flood costs (each END_TURN or RESPOND is an EndOfTurn queued
# for stt, whose buffer drops the oldest: a flood would push out caller audio).
TURN_CONTROLS_PER_S = 5.0
TURN_CONTROL_BURST = 10


@dataclass(frozen=True)
class TurnRoutes:
    """Where the session sends what a request becomes."""

    to_frontend: Callable[[frontend_pb2.FrontendRequest], Awaitable[None]]
    end_stt_turn: Callable[[], None]  # stt: EndOfTurn at what the caller has sent so far
    to_client: Callable[[gateway_pb2.ConverseResponse], Awaitable[None]]
    typed_turn: Callable[[common_pb2.TranscriptEvent], Awaitable[None]]  # the transcript path


class CallerTurns:
    """One call's turn controls and typed messages (the module doc says what each does)."""

    def __init__(
        self,
        session_id: str,
        settings: GatewaySettings,
        manual: bool,
        routes: TurnRoutes,
        heard_s: Callable[[], float],
        tracker: TurnTracker,
    ) -> None:
        self._session_id = session_id
        self._manual = manual  # MANUAL turn detection: answers start only at RESPOND
        self._heard_s = heard_s  # seconds of caller audio so far
        self._tracker = tracker  # MANUAL: a turn's latencies count from its RESPOND
        self._max_chars = settings.user_text_max_chars
        self._per_s = settings.user_text_per_s
        self._rate = KeyRate(settings.user_text_per_s, USER_TEXT_BURST)
        self._control_rate = KeyRate(TURN_CONTROLS_PER_S, TURN_CONTROL_BURST)
        self._controls_refused = False  # told once per run of refused controls
        self._routes = routes
        self._texts = 0  # typed messages so far (their utterance ids count them)

    async def handle(self, request: gateway_pb2.ConverseRequest) -> None:
        """A turn_control or user_text request."""
        if request.WhichOneof("msg") == "user_text":
            await self._user_text(request.user_text.text)
        else:
            await self._turn_control(request.turn_control)

    async def _turn_control(self, control: common_pb2.TurnControl) -> None:
        name = _NAMES.get(control.action)
        if name is None:
            await self._refuse(
                f"turn_control.action: END_TURN, RESPOND or CANCEL, got {control.action}"
            )
            return
        if not self._control_rate.admit():
            if not self._controls_refused:
                self._controls_refused = True
                await self._refuse(
                    f"turn_control: more than {TURN_CONTROLS_PER_S:g} a second; "
                    "the ones over are dropped"
                )
            return
        self._controls_refused = False
        metrics.CALLER_REQUESTS.labels(name).inc()
        if control.action != Action.CANCEL:
            self._routes.end_stt_turn()
        if control.action == Action.RESPOND and self._manual:
            self._tracker.on_answer_asked(time.time())
        await self._routes.to_frontend(frontend_pb2.FrontendRequest(turn_control=control))

    async def _user_text(self, text: str) -> None:
        text = " ".join(text.split())
        if not text:
            await self._refuse("user_text.text: empty; type a message")
            return
        if len(text) > self._max_chars:
            await self._refuse(
                f"user_text.text: at most {self._max_chars} characters "
                f"(user_text_max_chars), got {len(text)}"
                if self._max_chars
                else "user_text: this gateway takes no typed messages (user_text_max_chars 0)"
            )
            return
        if not self._rate.admit():
            await self._refuse(
                f"user_text: more than {self._per_s:g} typed messages a second (user_text_per_s)"
            )
            return
        metrics.CALLER_REQUESTS.labels("user_text").inc()
        self._texts += 1
        at_s = self._heard_s()
        event = common_pb2.TranscriptEvent(
            utterance_id=f"{self._session_id}-text-{self._texts}",
            is_final=True,
            stability=1.0,
            text=text,
            stable_text=text,
            span=common_pb2.AudioSpan(start_s=at_s, end_s=at_s),
        )
        await self._routes.typed_turn(event)

    async def _refuse(self, message: str) -> None:
        metrics.CALLER_REQUESTS.labels("refused").inc()
        await self._routes.to_client(notice(gateway_pb2.Notice.REFUSED, message))
