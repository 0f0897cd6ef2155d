"""What a GPT-Live session may choose (services/web/protocols/live.py): its
session.start (and session.update) checked into the gateway call it opens.

- `model`: gpt-live-1 or gpt-live-1.1 take the web service's first mode (the
  operator's default), kame-<mode> a mode the web service offers; any other
  name is the protocol's error and no session starts.
- `audio.format`: audio/pcm at 16 or 24 kHz, audio/pcmu or audio/pcma at
  8 kHz, the same both ways; `audio.output.voice`: OpenAI's voices take the
  stack's default voice, another name goes to the gateway (which refuses a
  voice the front-end does not serve).
- `delegation`: omitted, null or `client` (the published default): the
  caller's back-end answers (the gateway's client delegation); `responses`:
  the stack's own oracle does, with `responses.model` (`default`: the
  operator's model; another only if the web service offers it, `llm_models`,
  and the oracle allows it),
  `responses.instructions` (the gateway's instructions: only if the operator
  allows callers' instructions) and function `tools` the client runs (MCP and
  hosted tools are the operator's, never a caller's). `decisions` is not
  served. kame-s2s has no oracle: it delegates nothing (client delegation is
  then a no-op, responses an error).
- `acknowledgement_delay_ms`: how long the hold phrase waits for the answer
  (the gateway's hold delay), at most the front-end's longest hold.
- `instructions` are the front-end's in GPT-Live: the stack's front-end
  speaks the oracle's words and reads none, so they are kept and shown back;
  `input` (prior text history) joins the conversation as context notes.

session.update may change nothing the call was opened with: the delegation
it carries must say what the session has (an update that changes a setting
is the protocol's error, the session going on), and `triggers` (Decisions)
are not served.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kamepb import gateway_pb2
from services.web.protocols.realtime_config import (
    MODEL_PREFIX,
    OPENAI_VOICES,
    AudioCoding,
    ClientError,
    Event,
    FunctionTool,
    check_declared,
    function_tool,
    sendable,
)

Codec = gateway_pb2.AudioFormat
Config = gateway_pb2.ConverseConfig
# The Live models OpenAI names: each takes the web service's default mode.
LIVE_MODELS = ("gpt-live-1", "gpt-live-1.1")
CODINGS = {
    ("audio/pcm", 16000): AudioCoding("audio/pcm", Codec.PCM16, 16000, 2, b"\x00"),
    ("audio/pcm", 24000): AudioCoding("audio/pcm", Codec.PCM16, 24000, 2, b"\x00"),
    ("audio/pcmu", 8000): AudioCoding("audio/pcmu", Codec.MULAW, 8000, 1, b"\xff"),
    ("audio/pcma", 8000): AudioCoding("audio/pcma", Codec.ALAW, 8000, 1, b"\xd5"),
}
DEFAULT_CODING = CODINGS[("audio/pcm", 24000)]
DEFAULT_VOICE = "marin"  # GPT-Live's
# The front-end holds the floor at most this long (services/frontend/server.py
# MAX_HOLD_MAX_S): a hold phrase cannot wait longer.
MAX_ACKNOWLEDGEMENT_DELAY_MS = 10_000
# session.input: at most this many prior messages (GPT-Live's limit too).
MAX_INPUT_ITEMS = 128
RESPONSES_DEFAULT_MODEL = "default"  # responses.model: the operator's own


@dataclass(frozen=True)
class Responses:
    """Responses delegation: the stack's oracle answers, with these."""

    model: str = RESPONSES_DEFAULT_MODEL
    instructions: str = ""
    tools: tuple[FunctionTool, ...] = ()

    def described(self) -> Event:
        return {
            "model": self.model,
            "instructions": self.instructions,
            "tools": [tool.described() for tool in self.tools],
        }


@dataclass(frozen=True)
class LiveConfig:
    """A checked session.start."""

    model: str
    mode: str
    coding: AudioCoding = DEFAULT_CODING
    voice: str = DEFAULT_VOICE
    instructions: str = ""  # the front-end's: kept and shown back (module doc)
    acknowledgement_delay_ms: int = 0
    responses: Responses | None = None  # None: client delegation
    delegation_timeout_s: float = 0.0  # client delegation: the gateway's timeout (0: its default)
    history: tuple[tuple[str, str], ...] = ()  # session.input: (role, text)

    @property
    def delegates(self) -> bool:
        """The mode has an oracle, so something answers delegations (not s2s)."""
        return self.mode != "s2s"

    def converse_config(self) -> gateway_pb2.ConverseConfig:
        hold = gateway_pb2.HoldConfig(delay_s=self.acknowledgement_delay_ms / 1000)
        config = Config(
            mode=Config.Mode.Value(self.mode.upper()),
            input_format=self.coding.gateway_format(),
            output_format=self.coding.gateway_format(),
            voice="" if self.voice in OPENAI_VOICES else self.voice,
            hold=hold,
        )
        if self.responses is not None:
            config.instructions = self.responses.instructions
            config.functions.extend(tool.declared() for tool in self.responses.tools)
            if self.responses.model != RESPONSES_DEFAULT_MODEL:
                config.llm.model = self.responses.model
        elif self.delegates:
            config.delegation.target = gateway_pb2.DelegationConfig.CLIENT
            config.delegation.timeout_s = self.delegation_timeout_s
        return config

    def resource(self, session_id: str, expires_at: int) -> Event:
        """The SessionResource of session.started, .updated and .closed."""
        return {
            "id": session_id,
            "object": "live.session",
            "status": "active",
            "expires_at": expires_at,
            "model": self.model,
            "instructions": self.instructions,
            "audio": {"format": self.coding.described(), "output": {"voice": self.voice}},
            "delegation": self._delegation(),
            "input": [
                {"type": "message", "role": role, "content": [_content(role, text)]}
                for role, text in self.history
            ],
            "store": False,
        }

    def _delegation(self) -> Event:
        delay = {"acknowledgement_delay_ms": self.acknowledgement_delay_ms}
        if self.responses is None:
            return {"type": "client", **delay}
        return {"type": "responses", "responses": self.responses.described(), **delay}


def _content(role: str, text: str) -> Event:
    return {"type": "output_text" if role == "assistant" else "input_text", "text": text}


def start_config(
    session: Any,
    offered_modes: list[str],
    offered_models: list[str],
    delegation_timeout_s: float = 0.0,
) -> LiveConfig:
    """session.start's `session`, checked; ClientError names the first problem."""
    if not isinstance(session, dict):
        raise ClientError("invalid_type", "session must be an object", "session")
    model = session.get("model")
    if not isinstance(model, str) or not model:
        raise ClientError(
            "missing_required_parameter", "session.model is required", "session.model"
        )
    config = LiveConfig(
        model=model, mode=_mode(model, offered_modes), delegation_timeout_s=delegation_timeout_s
    )
    audio = session.get("audio") or {}
    if not isinstance(audio, dict):
        raise ClientError("invalid_type", "audio must be an object", "session.audio")
    instructions = session.get("instructions") or ""
    if not isinstance(instructions, str):
        raise ClientError("invalid_type", "instructions must be a string", "session.instructions")
    if session.get("triggers"):
        raise ClientError(
            "unsupported_value", "triggers (Decisions) are not served here", "session.triggers"
        )
    config = dataclasses.replace(
        config,
        coding=_coding(audio.get("format")),
        voice=_voice(audio.get("output")),
        instructions=instructions,
        history=_history(session.get("input")),
    )
    config = _delegated(config, session.get("delegation"))
    model = config.responses.model if config.responses is not None else RESPONSES_DEFAULT_MODEL
    if model != RESPONSES_DEFAULT_MODEL and model not in offered_models:
        names = ", ".join([RESPONSES_DEFAULT_MODEL, *offered_models])
        raise ClientError(
            "model_not_found",
            f"responses.model {model!r} is not served here; choose {names}",
            "session.delegation.responses.model",
        )
    return config


def updated_config(session: Any, config: LiveConfig) -> LiveConfig:
    """session.update's `session` applied: nothing the call was opened with may
    change (module doc); ClientError otherwise."""
    if not isinstance(session, dict):
        raise ClientError("invalid_type", "session must be an object", "session")
    if session.get("triggers"):
        raise ClientError(
            "unsupported_value", "triggers (Decisions) are not served here", "session.triggers"
        )
    if "delegation" not in session:
        return config
    delegation = session["delegation"]
    kind = delegation.get("type") if isinstance(delegation, dict) else None
    if kind != ("client" if config.responses is None else "responses"):
        raise ClientError(
            "invalid_value", "the delegation type cannot change", "session.delegation.type"
        )
    assert isinstance(delegation, dict)
    merged = dict(delegation)
    merged.setdefault("acknowledgement_delay_ms", config.acknowledgement_delay_ms)
    if config.responses is not None:
        given = delegation.get("responses") or {}
        if not isinstance(given, dict):
            raise ClientError(
                "invalid_type", "responses must be an object", "session.delegation.responses"
            )
        merged["responses"] = config.responses.described() | given
    new = _delegated(config, merged)
    if new != config:
        raise ClientError(
            "session_locked",
            "the delegation is the call's: its settings cannot change once the session started",
            "session.delegation",
        )
    return config


def _mode(model: str, offered: list[str]) -> str:
    if model in LIVE_MODELS:
        return offered[0]
    mode = model.removeprefix(MODEL_PREFIX) if model.startswith(MODEL_PREFIX) else ""
    if mode not in offered:
        names = ", ".join([*LIVE_MODELS, *(MODEL_PREFIX + m for m in offered)])
        raise ClientError(
            "model_not_found",
            f"model {model!r} is not served here; choose {names}",
            "session.model",
        )
    return mode


def _coding(described: Any) -> AudioCoding:
    if described is None:
        return DEFAULT_CODING
    kind = described.get("type") if isinstance(described, dict) else None
    rate = described.get("rate") if isinstance(described, dict) else None
    if kind in ("audio/pcmu", "audio/pcma") and rate is None:
        rate = 8000
    coding = CODINGS.get((kind, rate)) if isinstance(kind, str) and isinstance(rate, int) else None
    if coding is None:
        raise ClientError(
            "invalid_value",
            "audio.format: audio/pcm at 16000 or 24000 Hz, audio/pcmu or audio/pcma at 8000 Hz",
            "session.audio.format",
        )
    return coding


def _voice(output: Any) -> str:
    voice = output.get("voice") if isinstance(output, dict) else None
    if isinstance(voice, dict):
        voice = voice.get("id")
    if voice is None:
        return DEFAULT_VOICE
    if not isinstance(voice, str) or not voice:
        raise ClientError("invalid_value", "voice must be a name", "session.audio.output.voice")
    return voice


def _history(items: Any) -> tuple[tuple[str, str], ...]:
    """session.input: developer, user and assistant messages of one text part each."""
    if items is None:
        return ()
    if not isinstance(items, list) or len(items) > MAX_INPUT_ITEMS:
        raise ClientError(
            "invalid_value", f"input: a list of at most {MAX_INPUT_ITEMS} messages", "session.input"
        )
    history = []
    for n, item in enumerate(items):
        where = f"session.input[{n}]"
        role = item.get("role") if isinstance(item, dict) else None
        content = item.get("content") if isinstance(item, dict) else None
        if role not in ("developer", "user", "assistant") or not isinstance(content, list):
            raise ClientError(
                "invalid_value", "a developer, user or assistant message with content", where
            )
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if len(parts) != 1 or not isinstance(parts[0], str):
            raise ClientError("invalid_value", "one text part per message", f"{where}.content")
        history.append((role, sendable(parts[0], f"{where}.content")))
    return tuple(history)


def _delegated(config: LiveConfig, delegation: Any) -> LiveConfig:
    kind = delegation.get("type") if isinstance(delegation, dict) else None
    if delegation is not None and kind not in ("client", "responses"):
        raise ClientError(
            "unsupported_value",
            "delegation: client or responses (Decisions are not served here)",
            "session.delegation.type",
        )
    settings = delegation if isinstance(delegation, dict) else {}
    delay = settings.get("acknowledgement_delay_ms")
    delay_ms = 0 if delay is None else delay
    if not isinstance(delay_ms, int) or not 0 <= delay_ms <= MAX_ACKNOWLEDGEMENT_DELAY_MS:
        raise ClientError(
            "invalid_value",
            f"acknowledgement_delay_ms: 0 to {MAX_ACKNOWLEDGEMENT_DELAY_MS}",
            "session.delegation.acknowledgement_delay_ms",
        )
    responses = _responses(settings.get("responses")) if kind == "responses" else None
    if responses is not None and config.mode == "s2s":
        raise ClientError(
            "unsupported_value",
            "kame-s2s has no oracle to delegate to: use client delegation (a no-op there)",
            "session.delegation.type",
        )
    return dataclasses.replace(config, acknowledgement_delay_ms=delay_ms, responses=responses)


def _responses(settings: Any) -> Responses:
    where = "session.delegation.responses"
    if not isinstance(settings, dict):
        raise ClientError("missing_required_parameter", "responses is required", where)
    model = settings.get("model")
    if not isinstance(model, str) or not model:
        raise ClientError(
            "missing_required_parameter", "responses.model is required", f"{where}.model"
        )
    instructions = settings.get("instructions") or ""
    if not isinstance(instructions, str):
        raise ClientError("invalid_type", "instructions must be a string", f"{where}.instructions")
    tools = settings.get("tools") or []
    if not isinstance(tools, list):
        raise ClientError("invalid_type", "tools must be a list", f"{where}.tools")
    declared = tuple(_tool(tool, f"{where}.tools[{n}]") for n, tool in enumerate(tools))
    check_declared(instructions, declared, f"{where}.tools")
    return Responses(
        model=model, instructions=sendable(instructions, f"{where}.instructions"), tools=declared
    )


def _tool(tool: Any, where: str) -> FunctionTool:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "mcp":
        raise ClientError(
            "unsupported_value",
            "MCP tools are the operator's own (the oracle's mcp_servers): a client names none",
            f"{where}.type",
        )
    if kind != "function":
        raise ClientError(
            "unsupported_value", f"only function tools are served, got {kind!r}", f"{where}.type"
        )
    return function_tool(tool, where)
