"""What a Realtime session may choose (services/web/realtime.py): the mode its
`?model=` names, its audio formats, voice and functions (`tools`) in
session.update, and the protocol's error for a choice it may not make."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kamepb import common_pb2, gateway_pb2

Event = dict[str, Any]
Codec = gateway_pb2.AudioFormat
# The modes a client names as `?model=` (each only if the web service offers it).
MODEL_PREFIX = "kame-"
# OpenAI's built-in voices: a client that names one (most send "alloy" or
# "marin" by default) gets the stack's default voice; any other name is passed
# to the gateway, which refuses a voice the frontend does not serve.
OPENAI_VOICES = frozenset(
    ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")
)
# tool_choice values taken. "auto" is what the stack does; "none" declares no
# function to the agent; "required" and a named function ({"type": "function",
# "name": ...}) cannot be forced on the oracle's model: taken as "auto".
TOOL_CHOICES = frozenset(("auto", "none", "required"))
# The most a client's text may take on its way to the gateway, in UTF-8 bytes:
# a typed message, a function's output, and the relayed instructions and tools
# the call opens with. The gateway's port takes messages up to ~385 KB (as much
# as max_chunk_s of 192 kHz audio: pacing.max_message_bytes), and a larger one
# ends the whole call (RESOURCE_EXHAUSTED); the endpoint refuses more with an
# error and the session goes on. The gateway's own limits (user_text_max_chars,
# instructions_max_chars) are smaller, and its to apply: it refuses with a notice.
MAX_TEXT_BYTES = 64 << 10


@dataclass(frozen=True)
class AudioCoding:
    """One Realtime audio format, as the gateway codes it."""

    name: str
    codec: gateway_pb2.AudioFormat.Codec.ValueType
    rate: int
    bytes_per_sample: int
    silent_byte: bytes

    @property
    def bytes_per_s(self) -> int:
        return self.rate * self.bytes_per_sample

    def seconds(self, data: bytes) -> float:
        return len(data) / self.bytes_per_s

    def silence(self, seconds: float) -> bytes:
        return self.silent_byte * (int(seconds * self.rate) * self.bytes_per_sample)

    def gateway_format(self) -> gateway_pb2.AudioFormat:
        return gateway_pb2.AudioFormat(codec=self.codec, sample_rate_hz=self.rate)

    def described(self) -> Event:
        return (
            {"type": self.name, "rate": self.rate}
            if self.name == "audio/pcm"
            else {"type": self.name}
        )


CODINGS = {
    coding.name: coding
    for coding in (
        AudioCoding("audio/pcm", Codec.PCM16, 24000, 2, b"\x00"),
        AudioCoding("audio/pcmu", Codec.MULAW, 8000, 1, b"\xff"),
        AudioCoding("audio/pcma", Codec.ALAW, 8000, 1, b"\xd5"),
    )
}


@dataclass(frozen=True)
class FunctionTool:
    """One of the client's functions (a session.update `tools` entry), declared
    to the agent as a ConverseConfig function."""

    name: str
    description: str
    parameters: str  # the JSON Schema of the arguments, as JSON text ("" if none)

    def described(self) -> Event:
        parameters = json.loads(self.parameters) if self.parameters else None
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": parameters,
        }

    def declared(self) -> common_pb2.ClientFunction:
        return common_pb2.ClientFunction(
            name=self.name, description=self.description, parameters_json=self.parameters
        )


class ClientError(ValueError):
    """A client event the session cannot honour: the protocol's `error` event."""

    def __init__(self, code: str, message: str, param: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def sendable(text: str, param: str) -> str:
    """`text` if it is not too long to reach the gateway (MAX_TEXT_BYTES);
    ClientError (OpenAI's code for a string too long) if it is."""
    size = len(text.encode())
    if size > MAX_TEXT_BYTES:
        raise ClientError(
            "string_above_max_length",
            f"{param}: at most {MAX_TEXT_BYTES} bytes (UTF-8), got {size}",
            param,
        )
    return text


def check_declared(instructions: str, tools: Sequence[FunctionTool], param: str) -> None:
    """ClientError (on `param`) if instructions and tools together are more than
    MAX_TEXT_BYTES: more would not reach the gateway, and is not kept either."""
    size = len(instructions.encode()) + sum(tool.declared().ByteSize() for tool in tools)
    if size > MAX_TEXT_BYTES:
        raise ClientError(
            "invalid_value",
            f"the instructions and tools take {size} bytes: at most {MAX_TEXT_BYTES} "
            "reach the gateway",
            param,
        )


def error_event(
    code: str, message: str, error_type: str = "invalid_request_error", **fields: Any
) -> Event:
    """An `error` server event (no event_id yet: `RealtimeSession.stamp` adds it);
    `fields`: the client event_id and param it is about, when known."""
    error = {"type": error_type, "code": code, "message": message}
    error.update({name: value for name, value in fields.items() if value})
    return {"type": "error", "error": error}


def mode_of_model(model: str, offered: list[str]) -> str:
    """The gateway mode `?model=` names; ClientError if the web service offers none such."""
    mode = model.removeprefix(MODEL_PREFIX) if model.startswith(MODEL_PREFIX) else ""
    if mode not in offered:
        names = ", ".join(MODEL_PREFIX + m for m in offered)
        raise ClientError("model_not_found", f"model {model!r} is not served here; choose {names}")
    return mode


def _field(session: dict[str, Any], path: str) -> Any:
    """session["a"]["b"] for "a.b"; None where a level is missing."""
    value: Any = session
    for name in path.split("."):
        value = value.get(name) if isinstance(value, dict) else None
    return value


@dataclass
class SessionConfig:
    """What the client chose in session.update, within what the stack does."""

    input: AudioCoding = CODINGS["audio/pcm"]
    output: AudioCoding = CODINGS["audio/pcm"]
    voice: str = "alloy"
    instructions: str = ""
    # Give the instructions to the agent (ConverseConfig.instructions): the web
    # service's realtime_relay_instructions. Else they are kept and shown back only.
    relay_instructions: bool = False
    # turn_detection null: push-to-talk (the client commits turns and asks for
    # answers), the gateway's MANUAL turn detection.
    manual_turns: bool = False
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: str | Event = "auto"

    def updated(self, session: Any, locked: bool) -> SessionConfig:
        """This config with `session`'s fields applied; ClientError (nothing
        applied) if one cannot be. `locked`: the call is open, so what it was
        opened with (formats, voice, instructions, turn detection) stays."""
        if not isinstance(session, dict):
            raise ClientError("invalid_value", "session must be an object", "session")
        if session.get("type", "realtime") != "realtime":
            raise ClientError("invalid_value", "only realtime sessions are served", "session.type")
        new = dataclasses.replace(
            self,
            input=self._coding(session, "audio.input.format", self.input),
            output=self._coding(session, "audio.output.format", self.output),
            voice=self._voice(session),
            instructions=session.get("instructions", self.instructions),
            manual_turns=self._manual_turns(session),
            tools=self._tools(session),
            tool_choice=self._tool_choice(session),
        )
        if not isinstance(new.instructions, str):
            raise ClientError(
                "invalid_type", "instructions must be a string", "session.instructions"
            )
        new.check_sendable()
        if locked and new.call_config() != self.call_config():
            raise ClientError(
                "session_locked",
                "the audio formats, voice, instructions, turn detection and tools are the "
                "call's: they cannot change once it is open (audio, a commit, a message or "
                "response.create opened it)",
                "session",
            )
        return new

    def call_config(self) -> tuple[Any, ...]:
        """What the gateway call is opened with."""
        return (
            self.input,
            self.output,
            self.voice,
            self.manual_turns,
            self.agent_instructions,
            self.agent_functions,
        )

    def check_sendable(self) -> None:
        """ClientError if the instructions and the functions declared are too long
        to reach the gateway (MAX_TEXT_BYTES). Whether relayed or not: what is not
        relayed is still kept and shown back, and a session keeps no more than
        what it could send (a 15 MiB `instructions` must not sit in memory)."""
        sendable(self.instructions, "session.instructions")
        check_declared(self.instructions, self.tools, "session.tools")

    @property
    def agent_instructions(self) -> str:
        return self.instructions if self.relay_instructions else ""

    @property
    def agent_functions(self) -> tuple[FunctionTool, ...]:
        """The functions the agent may call: none with tool_choice "none"."""
        return () if self.tool_choice == "none" else self.tools

    @staticmethod
    def _coding(session: dict[str, Any], path: str, current: AudioCoding) -> AudioCoding:
        described = _field(session, path)
        if described is None:
            return current
        name = described.get("type") if isinstance(described, dict) else None
        coding = CODINGS.get(name) if isinstance(name, str) else None
        if coding is None:
            raise ClientError(
                "invalid_value", f"{path}: one of {', '.join(CODINGS)}", f"session.{path}"
            )
        if described.get("rate", coding.rate) != coding.rate:
            raise ClientError(
                "invalid_value", f"{path}: {name} is at {coding.rate} Hz", f"session.{path}.rate"
            )
        return coding

    def _voice(self, session: dict[str, Any]) -> str:
        voice = _field(session, "audio.output.voice")
        if isinstance(voice, dict):
            voice = voice.get("id")
        if voice is None:
            return self.voice
        if not isinstance(voice, str) or not voice:
            raise ClientError("invalid_value", "voice must be a name", "session.audio.output.voice")
        return voice

    def _manual_turns(self, session: dict[str, Any]) -> bool:
        """turn_detection null: push-to-talk; server_vad or semantic_vad: the
        stack's own turn detection (their tuning fields are the stack's too)."""
        audio_input = _field(session, "audio.input")
        if not isinstance(audio_input, dict) or "turn_detection" not in audio_input:
            return self.manual_turns
        turn_detection = audio_input["turn_detection"]
        if turn_detection is None:
            return True
        kind = turn_detection.get("type") if isinstance(turn_detection, dict) else None
        if kind not in ("server_vad", "semantic_vad"):
            raise ClientError(
                "invalid_value",
                "turn_detection: server_vad or semantic_vad (the stack's own), or null "
                "(push-to-talk)",
                "session.audio.input.turn_detection",
            )
        return False

    def _tools(self, session: dict[str, Any]) -> tuple[FunctionTool, ...]:
        """`tools`: function tools only (the agent's other tools are the operator's
        MCP servers). The gateway judges the names and schemas when the call
        opens, and refuses the call if the oracle would refuse them."""
        tools = session.get("tools")
        if tools is None:
            return self.tools
        if not isinstance(tools, list):
            raise ClientError("invalid_type", "tools must be a list", "session.tools")
        return tuple(function_tool(tool, f"session.tools[{n}]") for n, tool in enumerate(tools))

    def _tool_choice(self, session: dict[str, Any]) -> str | Event:
        choice = session.get("tool_choice", self.tool_choice)
        if isinstance(choice, str) and choice in TOOL_CHOICES:
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            if isinstance(choice.get("name"), str):
                return choice
        raise ClientError(
            "invalid_value",
            "tool_choice: auto, none, required or {type: function, name}",
            "session.tool_choice",
        )

    def described(self, model: str) -> Event:
        """The session object of session.created/updated."""
        return {
            "type": "realtime",
            "object": "realtime.session",
            "model": model,
            "output_modalities": ["audio"],
            "instructions": self.instructions,
            "tools": [tool.described() for tool in self.tools],
            "tool_choice": self.tool_choice,
            "audio": {
                "input": {
                    "format": self.input.described(),
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": None if self.manual_turns else {"type": "server_vad"},
                },
                "output": {"format": self.output.described(), "voice": self.voice},
            },
        }

    def converse_config(self, mode: str) -> gateway_pb2.ConverseConfig:
        Config = gateway_pb2.ConverseConfig  # noqa: N806 (the proto's name)
        return Config(
            mode=Config.Mode.Value(mode.upper()),
            input_format=self.input.gateway_format(),
            output_format=self.output.gateway_format(),
            voice="" if self.voice in OPENAI_VOICES else self.voice,
            instructions=self.agent_instructions,
            functions=[tool.declared() for tool in self.agent_functions],
            turn_detection=Config.MANUAL
            if self.manual_turns
            else Config.TURN_DETECTION_UNSPECIFIED,
        )


def function_tool(tool: Any, where: str) -> FunctionTool:
    """One `tools` entry: {type: function, name, description, parameters}."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ClientError("unsupported_value", "only function tools are served", f"{where}.type")
    name, description = tool.get("name"), tool.get("description") or ""
    parameters = tool.get("parameters")
    if not isinstance(name, str) or not name:
        raise ClientError("invalid_value", "a function needs a name", f"{where}.name")
    if not isinstance(description, str):
        raise ClientError("invalid_type", "description must be a string", f"{where}.description")
    if parameters is not None and not isinstance(parameters, dict):
        raise ClientError(
            "invalid_type", "parameters must be a JSON Schema object", f"{where}.parameters"
        )
    return FunctionTool(name, description, json.dumps(parameters) if parameters else "")
