"""How the agent holds the floor (tts engine): the short phrases it says while
it waits for a fresh answer, and the longest hold before it gives the floor
back. One home for their limits and default, read by everything that takes
them: the gateway's settings (checked at start) and a caller's HoldConfig
(checked before any upstream is touched), and the frontend's session config
(checked again: any client may open a frontend stream).

The hold phrase may also wait for the answer (`hold_delay_s`, GPT-Live's
acknowledgement delay): at most as long as the longest hold.

Each check raises ValueError with a message that names the field and the
limit; the caller turns it into its own error (ConfigError, INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_HOLD_MAX_S = 5.0
MAX_HOLD_MAX_S = 10.0
# Hold phrases are short acknowledgements that the engine synthesizes once and
# caches; a long one would delay the answer (a hold phrase is never cut).
MAX_HOLD_PHRASES = 8
MAX_HOLD_PHRASE_CHARS = 60


def hold_phrases(phrases: Iterable[str], field: str = "hold_phrases") -> tuple[str, ...]:
    """The phrases with their whitespace collapsed and empty ones left out;
    ValueError when there are more than MAX_HOLD_PHRASES or one is longer
    than MAX_HOLD_PHRASE_CHARS."""
    kept = tuple(" ".join(p.split()) for p in phrases if p.strip())
    if len(kept) > MAX_HOLD_PHRASES:
        raise ValueError(f"{field}: at most {MAX_HOLD_PHRASES} phrases, got {len(kept)}")
    too_long = [p for p in kept if len(p) > MAX_HOLD_PHRASE_CHARS]
    if too_long:
        raise ValueError(
            f"{field}: at most {MAX_HOLD_PHRASE_CHARS} characters each, "
            f"got {too_long[0][:MAX_HOLD_PHRASE_CHARS]!r}..."
        )
    return kept


def split_hold_phrases(text: str, field: str = "hold_phrases") -> tuple[str, ...]:
    """A setting's '|'-separated phrases, checked as `hold_phrases` checks them."""
    return hold_phrases(text.split("|"), field)


def check_hold_max_s(value: float, field: str = "hold_max_s") -> float:
    """`value` when it is 0 (the default, DEFAULT_HOLD_MAX_S: the frontend
    applies it) to MAX_HOLD_MAX_S seconds; ValueError otherwise (NaN too)."""
    if not 0 <= value <= MAX_HOLD_MAX_S:
        raise ValueError(
            f"{field}: must be 0 (the default, {DEFAULT_HOLD_MAX_S:g} s) to "
            f"{MAX_HOLD_MAX_S:g} seconds, got {value}"
        )
    return value


def check_hold_delay_s(value: float, field: str = "hold_delay_s") -> float:
    """`value` when it is 0 (the hold phrase at once) to MAX_HOLD_MAX_S seconds;
    ValueError otherwise (NaN too)."""
    if not 0 <= value <= MAX_HOLD_MAX_S:
        raise ValueError(f"{field}: must be 0 (at once) to {MAX_HOLD_MAX_S:g} seconds, got {value}")
    return value
