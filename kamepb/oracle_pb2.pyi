from kamepb import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OraclePolicy(_message.Message):
    __slots__ = ("name", "poll_interval_s", "min_new_words", "max_starts", "start_window_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLL_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_WORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_STARTS_FIELD_NUMBER: _ClassVar[int]
    START_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    poll_interval_s: float
    min_new_words: int
    max_starts: int
    start_window_s: float
    def __init__(self, name: _Optional[str] = ..., poll_interval_s: _Optional[float] = ..., min_new_words: _Optional[int] = ..., max_starts: _Optional[int] = ..., start_window_s: _Optional[float] = ...) -> None: ...

class OracleConfig(_message.Message):
    __slots__ = ("session_id", "backend", "model", "base_url", "api_key", "system_prompt", "policy", "request_timeout_s", "max_tokens", "temperature")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    backend: str
    model: str
    base_url: str
    api_key: str
    system_prompt: str
    policy: OraclePolicy
    request_timeout_s: float
    max_tokens: int
    temperature: float
    def __init__(self, session_id: _Optional[str] = ..., backend: _Optional[str] = ..., model: _Optional[str] = ..., base_url: _Optional[str] = ..., api_key: _Optional[str] = ..., system_prompt: _Optional[str] = ..., policy: _Optional[_Union[OraclePolicy, _Mapping]] = ..., request_timeout_s: _Optional[float] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ...) -> None: ...

class GuideRequest(_message.Message):
    __slots__ = ("config", "user_transcript", "agent_text")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    USER_TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    AGENT_TEXT_FIELD_NUMBER: _ClassVar[int]
    config: OracleConfig
    user_transcript: _common_pb2.TranscriptEvent
    agent_text: _common_pb2.AgentText
    def __init__(self, config: _Optional[_Union[OracleConfig, _Mapping]] = ..., user_transcript: _Optional[_Union[_common_pb2.TranscriptEvent, _Mapping]] = ..., agent_text: _Optional[_Union[_common_pb2.AgentText, _Mapping]] = ...) -> None: ...

class OracleEvent(_message.Message):
    __slots__ = ("kind", "generation", "time_us", "detail")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[OracleEvent.Kind]
        REQUEST_START: _ClassVar[OracleEvent.Kind]
        FIRST_TOKEN: _ClassVar[OracleEvent.Kind]
        DONE: _ClassVar[OracleEvent.Kind]
        CANCELLED: _ClassVar[OracleEvent.Kind]
        ERROR: _ClassVar[OracleEvent.Kind]
    KIND_UNSPECIFIED: OracleEvent.Kind
    REQUEST_START: OracleEvent.Kind
    FIRST_TOKEN: OracleEvent.Kind
    DONE: OracleEvent.Kind
    CANCELLED: OracleEvent.Kind
    ERROR: OracleEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: OracleEvent.Kind
    generation: int
    time_us: int
    detail: str
    def __init__(self, kind: _Optional[_Union[OracleEvent.Kind, str]] = ..., generation: _Optional[int] = ..., time_us: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class GuideResponse(_message.Message):
    __slots__ = ("update", "event")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    update: _common_pb2.OracleUpdate
    event: OracleEvent
    def __init__(self, update: _Optional[_Union[_common_pb2.OracleUpdate, _Mapping]] = ..., event: _Optional[_Union[OracleEvent, _Mapping]] = ...) -> None: ...
