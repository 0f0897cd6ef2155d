from kamepb import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SttConfig(_message.Message):
    __slots__ = ("session_id", "language", "model", "partial_interval_s", "endpoint_silence_s", "max_utterance_s", "vad_threshold")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_SILENCE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_UTTERANCE_S_FIELD_NUMBER: _ClassVar[int]
    VAD_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    language: str
    model: str
    partial_interval_s: float
    endpoint_silence_s: float
    max_utterance_s: float
    vad_threshold: float
    def __init__(self, session_id: _Optional[str] = ..., language: _Optional[str] = ..., model: _Optional[str] = ..., partial_interval_s: _Optional[float] = ..., endpoint_silence_s: _Optional[float] = ..., max_utterance_s: _Optional[float] = ..., vad_threshold: _Optional[float] = ...) -> None: ...

class EndOfTurn(_message.Message):
    __slots__ = ("speech_end_s",)
    SPEECH_END_S_FIELD_NUMBER: _ClassVar[int]
    speech_end_s: float
    def __init__(self, speech_end_s: _Optional[float] = ...) -> None: ...

class TranscribeRequest(_message.Message):
    __slots__ = ("config", "audio", "end_of_turn")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_FIELD_NUMBER: _ClassVar[int]
    config: SttConfig
    audio: _common_pb2.AudioFrame
    end_of_turn: EndOfTurn
    def __init__(self, config: _Optional[_Union[SttConfig, _Mapping]] = ..., audio: _Optional[_Union[_common_pb2.AudioFrame, _Mapping]] = ..., end_of_turn: _Optional[_Union[EndOfTurn, _Mapping]] = ...) -> None: ...

class TranscribeResponse(_message.Message):
    __slots__ = ("transcript", "activity")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    transcript: _common_pb2.TranscriptEvent
    activity: _common_pb2.SpeechActivity
    def __init__(self, transcript: _Optional[_Union[_common_pb2.TranscriptEvent, _Mapping]] = ..., activity: _Optional[_Union[_common_pb2.SpeechActivity, _Mapping]] = ...) -> None: ...
