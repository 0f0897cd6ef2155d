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
- `send_dtmf`: `digits`, 1 to MAX_DIGITS keys.

Every function has side effects (not read-only: the oracle runs it on the
final transcript only). Arguments that are not a JSON object with exactly the
declared string arguments, or a name this call did not declare, get an error
result in words; the call goes on. None is declared when none is enabled (the
default).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from kamepb import common_pb2
from services.telephony.call import PhoneCall
from services.telephony.call_control import (
    MAX_DIGITS,
    CallControlPolicy,
    CallControlRequest,
    act,
)

log = logging.getLogger(__name__)

# The keys a send_dtmf call may press (call_control.DTMF_KEYS, either case).
DIGITS_PATTERN = f"^[0-9*#A-Da-d]{{1,{MAX_DIGITS}}}$"


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
                "description": f"The keys to press in order: 0-9, *, #, A-D; {MAX_DIGITS} at most.",
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

    async def run(self, call: PhoneCall, name: str, arguments_json: str) -> tuple[str, bool]:
        """Do what a call of `name` asks of `call`: the words for the model, and
        whether they are an error. A transfer may take a minute (the phone rings
        the target first)."""
        try:
            request = self.request(name, arguments_json)
        except ArgumentError as error:
            info = call.info
            log.info("%s call %s: %s", info.provider, info.provider_call_id, error)
            return str(error), True
        result = await act(call, request, self.policy)
        return result.detail, not result.ok
