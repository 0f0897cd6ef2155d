"""The LLM back-ends by name. Their one list is the proto enum `LlmBackend`
(protos/kamepb/common.proto); settings, flags and error messages spell a
back-end as the lower-case name after `LLM_BACKEND_`: "openai", "anthropic"."""

from __future__ import annotations

from kamepb.common_pb2 import LlmBackend

_PREFIX = "LLM_BACKEND_"
# The trailing metadata of an oracle stream ended with RESOURCE_EXHAUSTED because
# a token budget is spent (services/oracle/budget.py): the gateway then ends the
# call with its message instead of reopening the stream.
BUDGET_SPENT_METADATA = ("kame-refusal", "llm-token-budget")
UNSPECIFIED = LlmBackend.LLM_BACKEND_UNSPECIFIED

BACKEND_NAMES: tuple[str, ...] = tuple(
    name.removeprefix(_PREFIX).lower()
    for name, number in LlmBackend.items()
    if number != UNSPECIFIED
)


def _choices() -> str:
    return ", ".join(repr(name) for name in BACKEND_NAMES)


def backend_name(value: int) -> str:
    """The name of an `LlmBackend` value ("" for UNSPECIFIED); ValueError for a
    number the enum does not have (a peer's newer or made-up value)."""
    if value == UNSPECIFIED:
        return ""
    try:
        return LlmBackend.Name(value).removeprefix(_PREFIX).lower()  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"unknown back-end {value}; choose one of {_choices()}") from None


def backend_value(name: str) -> LlmBackend.ValueType:
    """The `LlmBackend` value of a name ("" = UNSPECIFIED); ValueError otherwise."""
    if not name:
        return UNSPECIFIED
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown back-end {name!r}; choose one of {_choices()}")
    return LlmBackend.Value(_PREFIX + name.upper())
