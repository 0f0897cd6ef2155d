"""The restart policy, driven tick by tick by a controllable clock."""

from __future__ import annotations

import pytest

from services.oracle.policy import PolicyParams, RestartPolicy, StartReason
from tests.support.clock import FakeClock


def make_policy(**params) -> tuple[RestartPolicy, FakeClock]:
    clock = FakeClock(0.0)
    return RestartPolicy(PolicyParams(**params), clock=clock), clock


def run_script(
    policy: RestartPolicy,
    clock: FakeClock,
    script: dict[float, tuple],
    until: float,
    tick: float = 0.5,
) -> list[tuple[float, StartReason]]:
    """Apply transcript events at their times and poll every `tick`; the starts made."""
    starts = []
    steps = round(until / tick)
    for step in range(steps + 1):
        clock.now = step * tick
        for at, (kind, utterance, text) in sorted(script.items()):
            if clock.now - tick < at <= clock.now:
                getattr(policy, f"on_{kind}")(utterance, text)
        if (reason := policy.decide()) is not None:
            starts.append((clock.now, reason))
    return starts


def test_first_words_start_then_restarts_need_two_new_words_or_a_final():
    policy, clock = make_policy()
    script = {
        0.1: ("partial", "u1", "What"),  # first text -> start
        0.6: ("partial", "u1", "What is"),  # +1 word: no restart
        1.1: ("partial", "u1", "What is the"),  # +2 since the start
        1.6: ("partial", "u1", "What is the capital"),  # +1
        2.1: ("partial", "u1", "What is the capital of"),  # +2
        2.6: ("final", "u1", "What is the capital of France?"),  # final (+1 word)
        3.1: ("partial", "u2", "And"),  # +1
        3.6: ("partial", "u2", "And Spain"),  # +2
    }
    starts = run_script(policy, clock, script, until=5.0)
    assert starts == [
        (0.5, StartReason.FIRST_TEXT),
        (1.5, StartReason.NEW_WORDS),
        (2.5, StartReason.NEW_WORDS),
        (3.0, StartReason.FINAL),
        (4.0, StartReason.NEW_WORDS),
    ]


def test_words_count_over_finals_plus_the_longest_partial():
    policy, _clock = make_policy()
    policy.on_partial("u1", "one two three")
    assert policy.decide() is StartReason.FIRST_TEXT
    policy.on_partial("u1", "one two")  # a revision shrinks the partial ...
    policy.on_partial("u1", "one two three four")  # ... the longest (4) counts: +1
    assert policy.user_words == 4
    assert policy.decide() is None
    policy.on_partial("u1", "one two three four five")
    assert policy.decide() is StartReason.NEW_WORDS
    policy.on_final("u1", "one two three four five")
    policy.on_partial("u2", "six")
    assert policy.user_words == 6
    assert policy.decide() is StartReason.FINAL  # a final always restarts
    assert policy.decide() is None  # ... once
    policy.on_partial("u2", "six seven eight")
    assert policy.decide() is StartReason.NEW_WORDS


def test_a_final_restarts_even_without_new_words():
    policy, _clock = make_policy()
    policy.on_partial("u1", "hello there")
    assert policy.decide() is StartReason.FIRST_TEXT
    policy.on_final("u1", "hello there")
    assert policy.decide() is StartReason.FINAL


def test_an_answered_final_starts_nothing_and_later_words_still_count():
    policy, clock = make_policy()
    policy.on_partial("u1", "what is the capital of France")
    assert policy.decide() is StartReason.FIRST_TEXT
    clock.now = 0.5
    # The session found the running stream started from these very words.
    policy.on_final("u1", "What is the capital of France?", answered=True)
    assert policy.user_words == 6
    assert policy.decide() is None
    clock.now = 1.0
    assert policy.decide() is None  # not later either
    policy.on_partial("u2", "And Spain")
    assert policy.decide() is StartReason.NEW_WORDS  # counted from the last start


def test_an_answered_final_leaves_an_earlier_pending_final_pending():
    policy, clock = make_policy(max_starts=1)
    policy.on_partial("u1", "hello")
    assert policy.decide() is StartReason.FIRST_TEXT
    policy.on_final("u1", "hello there")  # held back by the start limit ...
    assert policy.decide() is None
    policy.on_final("u2", "yes", answered=True)
    clock.now = 2.0
    assert policy.decide() is StartReason.FINAL  # ... and still due


def test_blank_final_starts_nothing():
    policy, _clock = make_policy()
    policy.on_final("u1", "  ")
    assert policy.decide() is None
    assert policy.user_words == 0


def test_never_more_than_five_starts_in_two_seconds():
    policy, clock = make_policy()
    starts = []
    words = []
    for step in range(61):  # 6 s, a tick every 0.1 s, two new words every tick
        clock.now = round(step * 0.1, 6)
        words += ["w", "w"]
        policy.on_partial("u1", " ".join(words))
        if policy.decide() is not None:
            starts.append(clock.now)
    for start in starts:
        in_window = [s for s in starts if start <= s < start + 2.0]
        assert len(in_window) <= 5, f"{len(in_window)} starts in [{start}, {start + 2.0})"
    # Starts come in bursts of 5 as the window frees up, never faster.
    assert starts[:6] == [0.0, 0.1, 0.2, 0.3, 0.4, 2.0]
    assert len(starts) == 5 * 3 + 1  # t = 0-0.4, 2.0-2.4, 4.0-4.4, 6.0


def test_a_start_held_back_by_the_limit_fires_when_the_window_frees():
    policy, clock = make_policy(max_starts=1, start_window_s=2.0)
    policy.on_partial("u1", "a b")
    assert policy.decide() is StartReason.FIRST_TEXT
    clock.now = 0.5
    policy.on_final("u1", "a b c")
    assert policy.decide() is None  # the final waits ...
    clock.now = 1.999
    assert policy.decide() is None
    clock.now = 2.0
    assert policy.decide() is StartReason.FINAL  # ... and is not lost


def test_cascade_starts_only_on_finals():
    policy, _clock = make_policy(name="cascade")
    policy.on_partial("u1", "What is the capital of France")
    assert policy.decide() is None
    policy.on_partial("u1", "What is the capital of France you know")
    assert policy.decide() is None
    policy.on_final("u1", "What is the capital of France?")
    assert policy.decide() is StartReason.FINAL
    assert policy.decide() is None


def test_min_new_words_is_configurable():
    policy, _clock = make_policy(min_new_words=4)
    policy.on_partial("u1", "a")
    assert policy.decide() is StartReason.FIRST_TEXT
    policy.on_partial("u1", "a b c d")
    assert policy.decide() is None
    policy.on_partial("u1", "a b c d e")
    assert policy.decide() is StartReason.NEW_WORDS


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(name="eager"), "policy 'eager' is unknown"),
        (dict(poll_interval_s=0), "poll_interval_s must be > 0"),
        (dict(min_new_words=0), "min_new_words must be >= 1"),
        (dict(max_starts=-1), "max_starts must be >= 1"),
        (dict(start_window_s=-2), "start_window_s must be > 0"),
    ],
)
def test_bad_parameters_are_named(params, message):
    with pytest.raises(ValueError, match=message):
        RestartPolicy(PolicyParams(**params))


def test_a_settled_partial_starts_at_once_in_tandem_only_and_not_when_answered():
    tandem, _clock = make_policy()
    tandem.on_partial("u1", "What is the capital of France?", settled=True)
    assert tandem.decide() is StartReason.SETTLED
    # The same words again, already answered by that start: nothing more.
    tandem.on_partial("u1", "What is the capital of France?", settled=True, answered=True)
    assert tandem.decide() is None

    cascade, _clock = make_policy(name="cascade")
    cascade.on_partial("u1", "What is the capital of France?", settled=True)
    assert cascade.decide() is None  # the baseline waits for the final
    cascade.on_final("u1", "What is the capital of France?")
    assert cascade.decide() is StartReason.FINAL


def test_ordinary_partials_start_nothing_while_stt_decodes_the_final():
    """final_priority: from FINAL_DECODE until the decode's words (a settled partial,
    or the final) arrive, new partial words of the decoded audio start nothing."""
    policy, clock = make_policy()
    policy.on_partial("u1", "What is", end_s=0.8)
    assert policy.decide() is StartReason.FIRST_TEXT
    assert policy.on_final_decode(2.4) is True
    policy.on_partial("u1", "What is the capital of", end_s=2.2)
    clock.now = 0.5
    assert policy.decide() is None
    policy.on_partial("u1", "What is the capital of France?", settled=True, end_s=2.4)
    assert policy.decide() is StartReason.SETTLED


def test_the_yield_ends_with_a_final_with_speech_past_the_decode_or_after_its_bound():
    policy, clock = make_policy()
    policy.on_final_decode(1.0)
    policy.on_partial("u1", "Tell me", end_s=0.9)
    assert policy.decide() is None
    policy.on_partial("u1", "Tell me about", end_s=1.5)  # the caller went on talking
    assert policy.decide() is StartReason.FIRST_TEXT

    policy, clock = make_policy()
    policy.on_final_decode(1.0)
    policy.on_partial("u1", "Tell me", end_s=0.9)
    clock.now = 1.9
    assert policy.decide() is None
    clock.now = 2.0  # FINAL_DECODE_YIELD_S: a decode whose words never came
    assert policy.decide() is StartReason.FIRST_TEXT

    policy, clock = make_policy()
    policy.on_final_decode(1.0)
    policy.on_final("u1", "Tell me")
    assert policy.decide() is StartReason.FINAL


def test_without_final_priority_or_in_cascade_nothing_yields():
    for params in ({"final_priority": False}, {"name": "cascade"}):
        policy, _clock = make_policy(**params)
        assert policy.on_final_decode(1.0) is False
    policy, _clock = make_policy(final_priority=False)
    policy.on_partial("u1", "Tell me", end_s=0.9)
    assert policy.decide() is StartReason.FIRST_TEXT


def test_without_partial_starts_only_settled_partials_and_finals_start():
    policy, clock = make_policy(partial_starts=False)
    for step, words in enumerate(("What", "What is the", "What is the capital of")):
        clock.now = step * 0.5
        policy.on_partial("u1", words)
        assert policy.decide() is None
    policy.on_partial("u1", "What is the capital of France?", settled=True)
    assert policy.decide() is StartReason.SETTLED
    policy.on_final("u2", "And Germany?")
    assert policy.decide() is StartReason.FINAL
