from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AudioFrame(_message.Message):
    __slots__ = ("pcm", "sample_rate_hz", "seq", "capture_time_us")
    PCM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_US_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    sample_rate_hz: int
    seq: int
    capture_time_us: int
    def __init__(self, pcm: _Optional[bytes] = ..., sample_rate_hz: _Optional[int] = ..., seq: _Optional[int] = ..., capture_time_us: _Optional[int] = ...) -> None: ...

class AudioSpan(_message.Message):
    __slots__ = ("start_s", "end_s")
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    end_s: float
    def __init__(self, start_s: _Optional[float] = ..., end_s: _Optional[float] = ...) -> None: ...

class WordTiming(_message.Message):
    __slots__ = ("word", "start_s", "end_s", "probability")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    word: str
    start_s: float
    end_s: float
    probability: float
    def __init__(self, word: _Optional[str] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., probability: _Optional[float] = ...) -> None: ...

class TranscriptEvent(_message.Message):
    __slots__ = ("utterance_id", "is_final", "stability", "text", "stable_text", "words", "span", "lag_s")
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STABLE_TEXT_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    SPAN_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    utterance_id: str
    is_final: bool
    stability: float
    text: str
    stable_text: str
    words: _containers.RepeatedCompositeFieldContainer[WordTiming]
    span: AudioSpan
    lag_s: float
    def __init__(self, utterance_id: _Optional[str] = ..., is_final: _Optional[bool] = ..., stability: _Optional[float] = ..., text: _Optional[str] = ..., stable_text: _Optional[str] = ..., words: _Optional[_Iterable[_Union[WordTiming, _Mapping]]] = ..., span: _Optional[_Union[AudioSpan, _Mapping]] = ..., lag_s: _Optional[float] = ...) -> None: ...

class SpeechActivity(_message.Message):
    __slots__ = ("kind", "utterance_id", "at_s")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[SpeechActivity.Kind]
        SPEECH_START: _ClassVar[SpeechActivity.Kind]
        SPEECH_END: _ClassVar[SpeechActivity.Kind]
    KIND_UNSPECIFIED: SpeechActivity.Kind
    SPEECH_START: SpeechActivity.Kind
    SPEECH_END: SpeechActivity.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AT_S_FIELD_NUMBER: _ClassVar[int]
    kind: SpeechActivity.Kind
    utterance_id: str
    at_s: float
    def __init__(self, kind: _Optional[_Union[SpeechActivity.Kind, str]] = ..., utterance_id: _Optional[str] = ..., at_s: _Optional[float] = ...) -> None: ...

class CandidateSource(_message.Message):
    __slots__ = ("utterance_id", "is_final", "text")
    UTTERANCE_ID_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    utterance_id: str
    is_final: bool
    text: str
    def __init__(self, utterance_id: _Optional[str] = ..., is_final: _Optional[bool] = ..., text: _Optional[str] = ...) -> None: ...

class OracleUpdate(_message.Message):
    __slots__ = ("op", "generation", "text", "created_time_us", "source")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OP_UNSPECIFIED: _ClassVar[OracleUpdate.Op]
        RESET: _ClassVar[OracleUpdate.Op]
        APPEND: _ClassVar[OracleUpdate.Op]
    OP_UNSPECIFIED: OracleUpdate.Op
    RESET: OracleUpdate.Op
    APPEND: OracleUpdate.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_US_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    op: OracleUpdate.Op
    generation: int
    text: str
    created_time_us: int
    source: CandidateSource
    def __init__(self, op: _Optional[_Union[OracleUpdate.Op, str]] = ..., generation: _Optional[int] = ..., text: _Optional[str] = ..., created_time_us: _Optional[int] = ..., source: _Optional[_Union[CandidateSource, _Mapping]] = ...) -> None: ...

class AgentText(_message.Message):
    __slots__ = ("text", "start_s", "end_s", "generation")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    text: str
    start_s: float
    end_s: float
    generation: int
    def __init__(self, text: _Optional[str] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., generation: _Optional[int] = ...) -> None: ...
