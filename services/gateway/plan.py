"""A session's plan: the client's ConverseConfig checked against the gateway's
settings before any upstream is touched. Every problem is a SessionError whose
message names the field."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from kame_client.codecs import AudioFormat, CodecError, resolve_format
from kame_client.status import RETRY_AFTER_KEY
from kame_common.client_functions import FunctionError, check_functions
from kame_common.delegation import delegation_timeout_s
from kame_common.hold import (
    check_hold_delay_s,
    check_hold_max_s,
    hold_phrases,
    split_hold_phrases,
)
from kame_common.llm import backend_name
from kame_common.streams import StreamError
from kamepb import common_pb2, gateway_pb2
from services.gateway.config import GatewaySettings

ProtoMode = gateway_pb2.ConverseConfig.Mode
TurnDetection = gateway_pb2.ConverseConfig.TurnDetection
Target = gateway_pb2.DelegationConfig.Target
_TURN_DETECTIONS = (TurnDetection.TURN_DETECTION_UNSPECIFIED, TurnDetection.MANUAL)


class SessionError(StreamError):
    """Ends the session with this gRPC status; the message says what went wrong
    in words a client may see (no internal addresses)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s  # sent as RETRY_AFTER_KEY trailing metadata

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after_s is None:
            return ()
        return ((RETRY_AFTER_KEY, f"{self.retry_after_s:g}"),)


class Mode(enum.Enum):
    """A frontend engine plus an oracle policy (docs/design.md, "Engines and modes")."""

    TANDEM = "tandem"  # oracle on partial transcripts
    CASCADE = "cascade"  # oracle on final transcripts only
    S2S = "s2s"  # the speech LM alone, no oracle

    @property
    def uses_oracle(self) -> bool:
        return self is not Mode.S2S


_FROM_PROTO = {
    ProtoMode.TANDEM: Mode.TANDEM,
    ProtoMode.CASCADE: Mode.CASCADE,
    ProtoMode.S2S: Mode.S2S,
}


# CallInfo's fields, each kept in the session's Redis record when set.
CALL_INFO_FIELDS = ("provider", "caller", "callee", "provider_call_id")
MAX_CALL_INFO_CHARS = 256


@dataclass(frozen=True)
class SessionPlan:
    """A validated ConverseConfig."""

    mode: Mode
    input_format: AudioFormat
    output_format: AudioFormat
    voice: str
    language: str
    llm: gateway_pb2.LlmOverride | None
    include_oracle_updates: bool
    hold_phrases: tuple[str, ...]
    hold_max_s: float
    call: gateway_pb2.CallInfo
    hold_delay_s: float = 0.0  # the hold phrase waits this long for the answer
    manual_turns: bool = False  # push-to-talk: the caller ends turns and asks for answers
    instructions: str = ""  # the caller's own, for the oracle's system prompt
    # The caller's own functions for the oracle's LLM, passed on as declared
    # (kame_common/client_functions.py checks them); an s2s session has no
    # oracle to call them.
    functions: tuple[common_pb2.ClientFunction, ...] = ()
    # Who the call is for (kame_common/auth.py's principal), once admitted: the
    # oracle's caller_token_budget is counted per caller.
    caller: str = ""
    # Client delegation (services/gateway/delegation.py): how long a delegation waits
    # for the caller's back-end; 0 = the stack's own oracle answers.
    delegation_timeout_s: float = 0.0

    @property
    def client_delegation(self) -> bool:
        return self.delegation_timeout_s > 0

    @property
    def oracle_may_refuse(self) -> str:
        """What of the client's own the oracle checks at each opening, in words
        ("" = nothing): its refusal of them ends the session (session.py)."""
        parts = [("llm override", self.llm is not None), ("functions", bool(self.functions))]
        return " and ".join(name for name, present in parts if present)

    @property
    def side_services(self) -> tuple[str, ...]:
        """The side services whose capacity the call takes (services/gateway/admission.py):
        stt always; the oracle unless the call brings its own LLM endpoint or its
        client's back-end answers (client delegation)."""
        if self.mode.uses_oracle and not own_llm_endpoint(self.llm) and not self.client_delegation:
            return ("stt", "oracle")
        return ("stt",)


def llm_override(config: gateway_pb2.ConverseConfig) -> gateway_pb2.LlmOverride | None:
    """The client's llm override; None when absent or all empty, which the oracle
    serves with its own LLM exactly as no override."""
    if not config.HasField("llm") or config.llm == gateway_pb2.LlmOverride():
        return None
    return config.llm


def own_llm_endpoint(llm: gateway_pb2.LlmOverride | None) -> bool:
    """Whether the override names an endpoint and a key of its own, so that its
    LLM requests do not go to the oracle's LLM. Without a base_url the oracle
    answers with its configured server (or a vendor API on the operator's key),
    whatever model or back-end the override names: that takes oracle capacity."""
    return llm is not None and bool(llm.base_url) and bool(llm.api_key)


def plan_session(config: gateway_pb2.ConverseConfig, settings: GatewaySettings) -> SessionPlan:
    """Check the client's config; raise SessionError naming the bad field."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    mode = _mode(config.mode, settings)
    try:
        input_format = resolve_format(config.input_format, "input_format")
        output_format = resolve_format(config.output_format, "output_format")
    except CodecError as exc:
        raise SessionError(invalid, str(exc)) from None
    llm = llm_override(config)
    if llm is not None:
        try:
            backend_name(llm.backend)
        except ValueError as exc:
            raise SessionError(invalid, f"llm.backend: {exc}") from None
    try:
        phrases = _hold_phrases(config.hold, mode, settings)
        check_hold_max_s(config.hold.max_s, "hold.max_s")
        check_hold_delay_s(config.hold.delay_s, "hold.delay_s")
    except ValueError as exc:
        raise SessionError(invalid, str(exc)) from None
    if config.turn_detection not in _TURN_DETECTIONS:
        raise SessionError(
            invalid,
            f"turn_detection: unknown value {config.turn_detection}; "
            "choose TURN_DETECTION_UNSPECIFIED (auto) or MANUAL",
        )
    for name in CALL_INFO_FIELDS:
        if len(value := getattr(config.call, name)) > MAX_CALL_INFO_CHARS:
            raise SessionError(
                invalid, f"call.{name}: at most {MAX_CALL_INFO_CHARS} characters, got {len(value)}"
            )
    try:
        check_functions(config.functions, settings.max_client_functions, "functions", "gateway")
    except FunctionError as exc:
        raise SessionError(invalid, str(exc)) from None
    return SessionPlan(
        mode=mode,
        input_format=input_format,
        output_format=output_format,
        voice=config.voice,
        language=config.language or "en",
        llm=llm,
        include_oracle_updates=config.include_oracle_updates,
        hold_phrases=phrases,
        hold_max_s=config.hold.max_s or settings.hold_max_s,
        hold_delay_s=config.hold.delay_s,
        call=config.call,
        manual_turns=config.turn_detection == TurnDetection.MANUAL,
        instructions=_instructions(config.instructions, settings),
        functions=tuple(config.functions),
        delegation_timeout_s=_delegation_timeout_s(config, mode, llm),
    )


def _delegation_timeout_s(
    config: gateway_pb2.ConverseConfig, mode: Mode, llm: gateway_pb2.LlmOverride | None
) -> float:
    """Client delegation's timeout (kame_common/delegation.py); 0 for the stack's oracle."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    delegation = config.delegation
    if delegation.target not in (Target.TARGET_UNSPECIFIED, Target.CLIENT):
        raise SessionError(
            invalid,
            f"delegation.target: unknown value {delegation.target}; "
            "choose TARGET_UNSPECIFIED (the stack's oracle) or CLIENT",
        )
    if delegation.target != Target.CLIENT:
        if delegation.timeout_s:
            raise SessionError(invalid, "delegation.timeout_s: only with delegation.target CLIENT")
        return 0.0
    clashes = [
        ("mode S2S", mode is Mode.S2S),
        ("an llm override", llm is not None),
        ("functions", bool(config.functions)),
    ]
    for name, clash in clashes:
        if clash:
            raise SessionError(
                invalid,
                f"delegation.target: CLIENT (the client's back-end answers) cannot go with "
                f"{name}: the call has no LLM of the stack's to use it",
            )
    try:
        return delegation_timeout_s(delegation.timeout_s, "delegation.timeout_s")
    except ValueError as exc:
        raise SessionError(invalid, str(exc)) from None


def _instructions(text: str, settings: GatewaySettings) -> str:
    """The caller's instructions, if the operator lets callers add any."""
    text = text.strip()
    if not text:
        return ""
    if not settings.allow_instructions:
        raise SessionError(
            grpc.StatusCode.PERMISSION_DENIED,
            "instructions: this gateway takes none from callers (allow_instructions is off)",
        )
    if len(text) > settings.instructions_max_chars:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"instructions: at most {settings.instructions_max_chars} characters "
            f"(instructions_max_chars), got {len(text)}",
        )
    return text


def _mode(requested: gateway_pb2.ConverseConfig.Mode.ValueType, settings: GatewaySettings) -> Mode:
    if requested == ProtoMode.MODE_UNSPECIFIED:
        return Mode(settings.default_mode)
    if requested not in _FROM_PROTO:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"mode: unknown mode {requested}; choose TANDEM, CASCADE or S2S",
        )
    return _FROM_PROTO[requested]


def _hold_phrases(
    hold: gateway_pb2.HoldConfig, mode: Mode, settings: GatewaySettings
) -> tuple[str, ...]:
    """The client's phrases (ValueError naming hold.phrases when kame_common.hold
    refuses them); else the gateway's defaults in tandem mode (the mode that
    speculates, so the one that may have to wait for a fresh answer); silence
    otherwise."""
    if hold.silent:
        return ()
    if hold.phrases:
        return hold_phrases(hold.phrases, "hold.phrases")
    if mode is not Mode.TANDEM:
        return ()
    return split_hold_phrases(settings.hold_phrases)
