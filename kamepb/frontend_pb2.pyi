from kamepb import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FrontendConfig(_message.Message):
    __slots__ = ("session_id", "engine", "voice", "turn_end_silence_s", "hold_phrases", "hold_max_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    TURN_END_SILENCE_S_FIELD_NUMBER: _ClassVar[int]
    HOLD_PHRASES_FIELD_NUMBER: _ClassVar[int]
    HOLD_MAX_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    engine: str
    voice: str
    turn_end_silence_s: float
    hold_phrases: _containers.RepeatedScalarFieldContainer[str]
    hold_max_s: float
    def __init__(self, session_id: _Optional[str] = ..., engine: _Optional[str] = ..., voice: _Optional[str] = ..., turn_end_silence_s: _Optional[float] = ..., hold_phrases: _Optional[_Iterable[str]] = ..., hold_max_s: _Optional[float] = ...) -> None: ...

class FrontendRequest(_message.Message):
    __slots__ = ("config", "audio", "oracle", "user_transcript")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    ORACLE_FIELD_NUMBER: _ClassVar[int]
    USER_TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    config: FrontendConfig
    audio: _common_pb2.AudioFrame
    oracle: _common_pb2.OracleUpdate
    user_transcript: _common_pb2.TranscriptEvent
    def __init__(self, config: _Optional[_Union[FrontendConfig, _Mapping]] = ..., audio: _Optional[_Union[_common_pb2.AudioFrame, _Mapping]] = ..., oracle: _Optional[_Union[_common_pb2.OracleUpdate, _Mapping]] = ..., user_transcript: _Optional[_Union[_common_pb2.TranscriptEvent, _Mapping]] = ...) -> None: ...

class FrontendReady(_message.Message):
    __slots__ = ("engine", "replica_id", "slot")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    engine: str
    replica_id: str
    slot: int
    def __init__(self, engine: _Optional[str] = ..., replica_id: _Optional[str] = ..., slot: _Optional[int] = ...) -> None: ...

class AgentAudio(_message.Message):
    __slots__ = ("frame", "speaking", "step_s", "received_time_us")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    SPEAKING_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_TIME_US_FIELD_NUMBER: _ClassVar[int]
    frame: _common_pb2.AudioFrame
    speaking: bool
    step_s: float
    received_time_us: int
    def __init__(self, frame: _Optional[_Union[_common_pb2.AudioFrame, _Mapping]] = ..., speaking: _Optional[bool] = ..., step_s: _Optional[float] = ..., received_time_us: _Optional[int] = ...) -> None: ...

class TurnEnd(_message.Message):
    __slots__ = ("speech_end_s", "seq")
    SPEECH_END_S_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    speech_end_s: float
    seq: int
    def __init__(self, speech_end_s: _Optional[float] = ..., seq: _Optional[int] = ...) -> None: ...

class FrontendResponse(_message.Message):
    __slots__ = ("ready", "audio", "text", "turn_end")
    READY_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TURN_END_FIELD_NUMBER: _ClassVar[int]
    ready: FrontendReady
    audio: AgentAudio
    text: _common_pb2.AgentText
    turn_end: TurnEnd
    def __init__(self, ready: _Optional[_Union[FrontendReady, _Mapping]] = ..., audio: _Optional[_Union[AgentAudio, _Mapping]] = ..., text: _Optional[_Union[_common_pb2.AgentText, _Mapping]] = ..., turn_end: _Optional[_Union[TurnEnd, _Mapping]] = ...) -> None: ...
