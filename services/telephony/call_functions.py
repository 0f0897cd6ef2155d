"""Call control offered to the agent as client functions (#33).

A phone call declares, in its Converse config, the call control the operator
enabled and its protocol allows (`CallControlPolicy.offered`) as
`ClientFunction`s: the oracle offers them to its LLM beside its other tools,
and a call of one comes back to the call as a `function_call` event. Here a
call becomes a `CallControlRequest` for `call_control.act`, and its result the
words the model reads:

- `hang_up`: no arguments;
- `transfer_call`: `target`, one of the operator's target NAMES (the URIs stay
  in the telephony service: the model never sees nor chooses one);
- `send_dtmf`: `digits`, 1 to MAX_DIGITS keys, of those the operator allows
  (its pattern and the call's cap are in the description; call_control.py
  refuses the rest).

Every function has side effects (not read-only: the oracle runs it on the
final transcript only). Arguments that are not a JSON object with exactly the
declared string arguments, or a name this call did not declare, get an error
result in words; the call goes on. None is declared when none is enabled (the
default).

A call is answered within ANSWER_WITHIN_S, under the oracle's tool_timeout_s
(5 s by default): the outcome when the action is over by then (keys pressed,
a refusal, a transfer the phone refused, a hang-up after a short goodbye),
else words saying what is under way ("hanging up once your last words have
played", "the transfer to sales is under way ..."), and the action goes on:
a transfer's target may ring for a minute, and a model left waiting that long
would time out and tell the caller it failed. Its outcome is then logged and
counted (call_control.act); a transfer that worked ends the call, one that
failed leaves the caller with the agent, who is not told (the Converse
protocol has no message for a late result).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from kamepb import common_pb2
from services.telephony.call import Answer, PhoneCall
from services.telephony.call_control import (
    MAX_DIGITS,
    CallControlPolicy,
    CallControlRequest,
    act,
)

log = logging.getLogger(__name__)

# The keys a send_dtmf call may press (call_control.DTMF_KEYS, either case).
DIGITS_PATTERN = f"^[0-9*#A-Da-d]{{1,{MAX_DIGITS}}}$"
# A call is answered within this: under the oracle's tool_timeout_s (5 s by
# default), with room for the hops back to it on a busy machine.
ANSWER_WITHIN_S = 3.0


@dataclass(frozen=True)
class CallFunction:
    """One call-control action as the model sees it."""

    name: str
    action: str  # the CallControlRequest's
    description: str
    argument: str = ""  # its one string argument ("" = none)


FUNCTIONS = {
    function.action: function
    for function in (
        CallFunction(
            "hang_up",
            "hang_up",
            "End this phone call. Use it only when the caller asks to end the call or "
            "the conversation is clearly over, and only after you have said goodbye: "
            "your last words play out before the line closes.",
        ),
        CallFunction(
            "transfer_call",
            "transfer",
            "Transfer the caller to another line (a blind transfer): tell the caller "
            "first. If it works, your part of the call ends; if it fails, the call "
            "goes on with you and the result says why.",
            "target",
        ),
        CallFunction(
            "send_dtmf",
            "send_dtmf",
            "Press phone keys (DTMF tones) on this call, e.g. to choose an option in "
            "the menu of a phone system on the line.",
            "digits",
        ),
    )
}


class ArgumentError(ValueError):
    """A call of a function with arguments it does not take; the words are the result."""


class CallFunctions:
    """The functions one call offers the agent (`declared`), and running them."""

    def __init__(self, policy: CallControlPolicy, provider: str) -> None:
        self.policy = policy
        actions, self.targets = policy.offered(provider)
        self.functions = {FUNCTIONS[a].name: FUNCTIONS[a] for a in actions}
        self.declared = [self._declaration(f) for f in self.functions.values()]

    def _declaration(self, function: CallFunction) -> common_pb2.ClientFunction:
        return common_pb2.ClientFunction(
            name=function.name,
            description=function.description,
            parameters_json=json.dumps(self._schema(function)),
            read_only=False,
        )

    def _schema(self, function: CallFunction) -> dict[str, object]:
        properties: dict[str, object] = {}
        if function.argument == "target":
            properties["target"] = {
                "type": "string",
                "enum": self.targets,
                "description": "Where to transfer the call: one of these names.",
            }
        elif function.argument == "digits":
            properties["digits"] = {
                "type": "string",
                "pattern": DIGITS_PATTERN,
                "maxLength": MAX_DIGITS,
                "description": (
                    f"The keys to press in order. This line allows keys that match "
                    f"{self.policy.dtmf_allowed} (a regular expression), at most "
                    f"{self.policy.dtmf_max_keys} keys in the whole call."
                ),
            }
        return {
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }

    def request(self, name: str, arguments_json: str) -> CallControlRequest:
        """The request a call of `name` makes; ArgumentError when it is not one
        this call declared or its arguments do not fit the declaration."""
        function = self.functions.get(name)
        if function is None:
            offered = ", ".join(self.functions) or "none"
            raise ArgumentError(f"no function {name!r} on this call (offered: {offered})")
        try:
            arguments = json.loads(arguments_json or "{}")
        except ValueError:
            raise ArgumentError(f"{name}: the arguments are not JSON") from None
        expected = {function.argument} - {""}
        if not isinstance(arguments, dict) or set(arguments) != expected:
            wanted = f"{{{', '.join(repr(a) for a in expected)}}}" if expected else "none"
            raise ArgumentError(f"{name}: wrong arguments (takes {wanted})")
        value = arguments.get(function.argument, "")
        if not isinstance(value, str):
            raise ArgumentError(f"{name}: {function.argument} must be a string")
        if function.argument == "target" and value not in self.targets:
            raise ArgumentError(
                f"{name}: {value!r} is not a transfer target (allowed: {', '.join(self.targets)})"
            )
        return CallControlRequest(
            function.action,
            target=value if function.argument == "target" else "",
            digits=value if function.argument == "digits" else "",
            reason="the agent hung up" if function.action == "hang_up" else "",
        )

    async def run(self, call: PhoneCall, name: str, arguments_json: str, answer: Answer) -> None:
        """Do what a call of `name` asks of `call`, answering within
        ANSWER_WITHIN_S: the outcome if it is in by then, else what is under
        way (the action goes on)."""
        try:
            request = self.request(name, arguments_json)
        except ArgumentError as error:
            info = call.info
            log.info("%s call %s: %s", info.provider, info.provider_call_id, error)
            answer(str(error), True)
            return
        loop = asyncio.get_running_loop()
        early = loop.call_later(ANSWER_WITHIN_S, answer, under_way(request), False)
        try:
            result = await act(call, request, self.policy)
        finally:
            early.cancel()
        detail = result.detail
        if target := self.policy.target(request.target):
            # The leg's words name the URI (for the log); the model knows the name only.
            detail = detail.replace(target.uri, target.name)
        answer(detail, not result.ok)


def under_way(request: CallControlRequest) -> str:
    """The answer for an action still going on after ANSWER_WITHIN_S."""
    if request.action == "hang_up":
        return "hanging up: the call ends once your last words have played"
    if request.action == "transfer":
        return (
            f"the transfer to {request.target} is under way: the phone has been asked to "
            f"call it. If {request.target} answers, this call ends; if not, the caller "
            "stays on the line with you"
        )
    return f"pressing {request.digits.upper()}"
