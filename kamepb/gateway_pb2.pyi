from kamepb import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioFormat(_message.Message):
    __slots__ = ("codec", "sample_rate_hz")
    class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CODEC_UNSPECIFIED: _ClassVar[AudioFormat.Codec]
        PCM16: _ClassVar[AudioFormat.Codec]
        MULAW: _ClassVar[AudioFormat.Codec]
        ALAW: _ClassVar[AudioFormat.Codec]
        OPUS: _ClassVar[AudioFormat.Codec]
    CODEC_UNSPECIFIED: AudioFormat.Codec
    PCM16: AudioFormat.Codec
    MULAW: AudioFormat.Codec
    ALAW: AudioFormat.Codec
    OPUS: AudioFormat.Codec
    CODEC_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    codec: AudioFormat.Codec
    sample_rate_hz: int
    def __init__(self, codec: _Optional[_Union[AudioFormat.Codec, str]] = ..., sample_rate_hz: _Optional[int] = ...) -> None: ...

class LlmOverride(_message.Message):
    __slots__ = ("backend", "model", "base_url", "api_key")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    backend: str
    model: str
    base_url: str
    api_key: str
    def __init__(self, backend: _Optional[str] = ..., model: _Optional[str] = ..., base_url: _Optional[str] = ..., api_key: _Optional[str] = ...) -> None: ...

class HoldConfig(_message.Message):
    __slots__ = ("silent", "phrases", "max_s")
    SILENT_FIELD_NUMBER: _ClassVar[int]
    PHRASES_FIELD_NUMBER: _ClassVar[int]
    MAX_S_FIELD_NUMBER: _ClassVar[int]
    silent: bool
    phrases: _containers.RepeatedScalarFieldContainer[str]
    max_s: float
    def __init__(self, silent: _Optional[bool] = ..., phrases: _Optional[_Iterable[str]] = ..., max_s: _Optional[float] = ...) -> None: ...

class ConverseConfig(_message.Message):
    __slots__ = ("mode", "input_format", "output_format", "voice", "llm", "include_oracle_updates", "language", "hold")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MODE_UNSPECIFIED: _ClassVar[ConverseConfig.Mode]
        TANDEM: _ClassVar[ConverseConfig.Mode]
        CASCADE: _ClassVar[ConverseConfig.Mode]
        S2S: _ClassVar[ConverseConfig.Mode]
    MODE_UNSPECIFIED: ConverseConfig.Mode
    TANDEM: ConverseConfig.Mode
    CASCADE: ConverseConfig.Mode
    S2S: ConverseConfig.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ORACLE_UPDATES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    mode: ConverseConfig.Mode
    input_format: AudioFormat
    output_format: AudioFormat
    voice: str
    llm: LlmOverride
    include_oracle_updates: bool
    language: str
    hold: HoldConfig
    def __init__(self, mode: _Optional[_Union[ConverseConfig.Mode, str]] = ..., input_format: _Optional[_Union[AudioFormat, _Mapping]] = ..., output_format: _Optional[_Union[AudioFormat, _Mapping]] = ..., voice: _Optional[str] = ..., llm: _Optional[_Union[LlmOverride, _Mapping]] = ..., include_oracle_updates: _Optional[bool] = ..., language: _Optional[str] = ..., hold: _Optional[_Union[HoldConfig, _Mapping]] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("config", "audio")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    config: ConverseConfig
    audio: bytes
    def __init__(self, config: _Optional[_Union[ConverseConfig, _Mapping]] = ..., audio: _Optional[bytes] = ...) -> None: ...

class SessionStarted(_message.Message):
    __slots__ = ("session_id", "frontend_replica", "engine")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_REPLICA_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    frontend_replica: str
    engine: str
    def __init__(self, session_id: _Optional[str] = ..., frontend_replica: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class AgentAudioChunk(_message.Message):
    __slots__ = ("data", "seq", "speaking")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SPEAKING_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    seq: int
    speaking: bool
    def __init__(self, data: _Optional[bytes] = ..., seq: _Optional[int] = ..., speaking: _Optional[bool] = ...) -> None: ...

class TurnSummary(_message.Message):
    __slots__ = ("utterance_id", "user_text", "response_latency_s", "stt_final_lag_s", "oracle_first_update_s", "answer_latency_s")
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    USER_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    STT_FINAL_LAG_S_FIELD_NUMBER: _ClassVar[int]
    ORACLE_FIRST_UPDATE_S_FIELD_NUMBER: _ClassVar[int]
    ANSWER_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    utterance_id: str
    user_text: str
    response_latency_s: float
    stt_final_lag_s: float
    oracle_first_update_s: float
    answer_latency_s: float
    def __init__(self, utterance_id: _Optional[str] = ..., user_text: _Optional[str] = ..., response_latency_s: _Optional[float] = ..., stt_final_lag_s: _Optional[float] = ..., oracle_first_update_s: _Optional[float] = ..., answer_latency_s: _Optional[float] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("kind", "message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Notice.Kind]
        ORACLE_UNAVAILABLE: _ClassVar[Notice.Kind]
        ORACLE_ERROR: _ClassVar[Notice.Kind]
    KIND_UNSPECIFIED: Notice.Kind
    ORACLE_UNAVAILABLE: Notice.Kind
    ORACLE_ERROR: Notice.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: Notice.Kind
    message: str
    def __init__(self, kind: _Optional[_Union[Notice.Kind, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("started", "audio", "user_transcript", "agent_text", "oracle_update", "turn", "notice")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    USER_TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    AGENT_TEXT_FIELD_NUMBER: _ClassVar[int]
    ORACLE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    started: SessionStarted
    audio: AgentAudioChunk
    user_transcript: _common_pb2.TranscriptEvent
    agent_text: _common_pb2.AgentText
    oracle_update: _common_pb2.OracleUpdate
    turn: TurnSummary
    notice: Notice
    def __init__(self, started: _Optional[_Union[SessionStarted, _Mapping]] = ..., audio: _Optional[_Union[AgentAudioChunk, _Mapping]] = ..., user_transcript: _Optional[_Union[_common_pb2.TranscriptEvent, _Mapping]] = ..., agent_text: _Optional[_Union[_common_pb2.AgentText, _Mapping]] = ..., oracle_update: _Optional[_Union[_common_pb2.OracleUpdate, _Mapping]] = ..., turn: _Optional[_Union[TurnSummary, _Mapping]] = ..., notice: _Optional[_Union[Notice, _Mapping]] = ...) -> None: ...
