"""The tts engine's commit policy on its own, with a fake clock: which candidate
is spoken at a turn end, holds, replacements mid-speech, barge-in. No audio:
a line "plays" when the test says it started."""

from __future__ import annotations

import pytest

from services.frontend.engines.base import CandidateSource, Transcript
from services.frontend.engines.commit import (
    COVER_TOLERANCE_S,
    QUIET_HOLD_S,
    AnswerPolicy,
    Cut,
    Floor,
    Line,
    LineKind,
)
from tests.support.clock import FakeClock
from tests.support.metrics import metric

QUESTION = "What is the capital of France?"
SPEECH_START_S, SPEECH_END_S = 0.48, 2.4


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_policy(clock: FakeClock, hold=("Hmm,", "Let me see,"), hold_max_s=3.0) -> AnswerPolicy:
    policy = AnswerPolicy(hold_phrases=hold, hold_max_s=hold_max_s, clock=clock)
    policy.caller_speech_started(SPEECH_START_S)
    assert policy.take_cut() is Cut.NOW  # caller speech always stops the agent
    return policy


def heard(policy, text: str, final=False, end_s=SPEECH_END_S, utterance="u1", settled=True) -> None:
    """stt's hypothesis; a partial's words all stable (`settled`) unless a test says not."""
    policy.transcript(Transcript(utterance, text, final, end_s, settled))


def source(text: str, utterance="u1", final=False) -> CandidateSource:
    return CandidateSource(utterance, text, final)


def say_all(policy: AnswerPolicy, queued_s: float = 0.0) -> list[Line]:
    """Every line the policy hands out now, each started as soon as it is out."""
    lines = []
    while (line := policy.next_line(queued_s)) is not None:
        policy.lines_started([line])
        lines.append(line)
    return lines


def text_of(lines: list[Line]) -> list[tuple[str, int]]:
    return [(" ".join(line.words), line.generation) for line in lines]


def test_a_fresh_candidate_is_spoken_at_once_at_the_turn_end(clock):
    policy = make_policy(clock)
    heard(policy, "What is the capital of", end_s=1.9)
    heard(policy, QUESTION, end_s=SPEECH_END_S)  # a partial that covers the end of speech
    policy.candidate_reset(1, "The capital", source(QUESTION))
    assert policy.speculative_line() is None  # a first phrase is prepared once complete
    policy.candidate_append(1, "of France is Paris.")
    ahead = policy.speculative_line()
    assert ahead is not None and ahead.words == ("The", "capital", "of")
    assert policy.next_line(0.0) is None  # the caller still holds the turn
    answers_before = metric("kame_frontend_answer_seconds_count")
    answer_s_before = metric("kame_frontend_answer_seconds_sum")

    clock.now += 0.4
    policy.caller_turn_ended(SPEECH_END_S)
    clock.now += 0.05
    lines = say_all(policy)

    assert policy.floor is Floor.ANSWERING
    assert text_of(lines) == [("The capital of", 1), ("France is Paris.", 1)]
    assert lines[0].words == ahead.words and lines[0].start == 0  # the prepared phrase fits
    assert metric("kame_frontend_answer_seconds_count") == answers_before + 1
    # Answer latency: from the turn end to the first answer line's start, on the fake clock.
    assert metric("kame_frontend_answer_seconds_sum") - answer_s_before == pytest.approx(0.05)


def test_a_stale_candidate_is_held_with_a_hold_phrase_then_the_fresh_answer_follows(clock):
    policy = make_policy(clock)
    heard(policy, "What is the capital", end_s=1.7)
    policy.candidate_reset(1, "The capital of Italy is Rome.", source("What is the capital"))
    heard(policy, QUESTION, final=True, end_s=SPEECH_END_S + 0.2)
    answered_before = metric("kame_frontend_holds_total", outcome="answered")

    policy.caller_turn_ended(SPEECH_END_S)

    assert policy.floor is Floor.HOLDING
    assert text_of(say_all(policy)) == [("Hmm,", 0)]  # one hold phrase, then it waits
    clock.now += 0.6
    policy.tick()
    assert policy.next_line(0.0) is None
    policy.candidate_reset(2, "Paris is the capital", source(QUESTION, final=True))
    policy.candidate_append(2, "of France.")
    assert text_of(say_all(policy, queued_s=0.3)) == [
        ("Paris is the", 2),
        ("capital of France.", 2),
    ]
    assert metric("kame_frontend_holds_total", outcome="answered") == answered_before + 1
    assert policy.take_cut() is Cut.NONE  # the hold phrase is never cut


def test_a_transcript_that_confirms_the_candidate_ends_the_hold(clock):
    policy = make_policy(clock, hold=())
    # The last partial stopped 0.4 s before the end of speech: it may lack a word.
    heard(policy, QUESTION, end_s=SPEECH_END_S - 0.4)
    policy.candidate_reset(1, "Paris.", source(QUESTION))
    policy.caller_turn_ended(SPEECH_END_S)
    assert policy.floor is Floor.HOLDING
    assert say_all(policy) == []  # no hold phrases configured: it holds in silence
    heard(policy, QUESTION.upper().rstrip("?"), final=True, end_s=SPEECH_END_S + 0.2)
    assert text_of(say_all(policy)) == [("Paris.", 1)]


def test_the_cover_tolerance_is_two_frames(clock):
    inside = make_policy(clock)
    heard(inside, QUESTION, end_s=SPEECH_END_S - COVER_TOLERANCE_S + 0.01)
    inside.candidate_reset(1, "Paris.", source(QUESTION))
    inside.caller_turn_ended(SPEECH_END_S)
    assert inside.floor is Floor.ANSWERING
    outside = make_policy(clock)
    heard(outside, QUESTION, end_s=SPEECH_END_S - COVER_TOLERANCE_S - 0.01)
    outside.candidate_reset(1, "Paris.", source(QUESTION))
    outside.caller_turn_ended(SPEECH_END_S)
    assert outside.floor is Floor.HOLDING
    assert COVER_TOLERANCE_S == pytest.approx(0.16)


def test_a_hold_that_runs_out_gives_the_floor_back(clock):
    policy = make_policy(clock, hold_max_s=2.0)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Berlin.", source("What is the capital of Germany?"))
    timed_out_before = metric("kame_frontend_holds_total", outcome="timed_out")
    policy.caller_turn_ended(SPEECH_END_S)
    hold = policy.next_line(0.0)  # handed out, not started yet
    assert hold is not None and hold.kind is LineKind.HOLD

    clock.now += 1.99
    policy.tick()
    assert policy.floor is Floor.HOLDING
    clock.now += 0.01
    policy.tick()

    assert policy.floor is Floor.IDLE
    assert policy.take_cut() is Cut.AFTER_PHRASE  # the unstarted hold phrase is dropped
    assert metric("kame_frontend_holds_total", outcome="timed_out") == timed_out_before + 1
    # A candidate that does not answer the question is still not spoken...
    policy.candidate_reset(2, "Rome.", source("What is the capital of Italy?", final=True))
    assert policy.next_line(0.0) is None and policy.floor is Floor.IDLE
    # ...but an answer that comes after the floor was given back is (a restarted
    # oracle's): the caller has not spoken since, so it still waits for it.
    policy.candidate_reset(3, "Paris.", source(QUESTION, final=True))
    line = policy.next_line(0.0)
    assert line is not None and line.kind is LineKind.ANSWER and line.words == ("Paris.",)


def test_a_late_answer_is_not_spoken_once_the_caller_has_moved_on(clock):
    policy = make_policy(clock, hold_max_s=1.0)
    heard(policy, QUESTION, final=True)
    policy.caller_turn_ended(SPEECH_END_S)
    clock.now += 1.0
    policy.tick()
    assert policy.floor is Floor.IDLE
    policy.caller_speech_started(SPEECH_END_S + 2.0)
    policy.candidate_reset(1, "Paris.", source(QUESTION, final=True))
    assert policy.next_line(0.0) is None


def test_a_hold_delay_waits_before_the_hold_phrase_and_an_answer_meanwhile_needs_none(clock):
    policy = AnswerPolicy(hold_phrases=("Hmm,",), hold_max_s=3.0, clock=clock, hold_delay_s=0.4)
    policy.caller_speech_started(SPEECH_START_S)
    heard(policy, QUESTION, final=True)
    policy.caller_turn_ended(SPEECH_END_S)
    assert policy.floor is Floor.HOLDING
    clock.now += 0.39
    assert say_all(policy) == []  # the delay is not over
    policy.candidate_reset(1, "Paris.", source(QUESTION, final=True))
    assert text_of(say_all(policy)) == [("Paris.", 1)]  # no hold phrase before it

    policy.caller_speech_started(SPEECH_START_S + 5)
    heard(policy, "And of Italy?", final=True, utterance="u2", end_s=SPEECH_END_S + 5)
    policy.caller_turn_ended(SPEECH_END_S + 5)
    clock.now += 0.39
    assert say_all(policy) == []
    clock.now += 0.01
    assert text_of(say_all(policy)) == [("Hmm,", 0)]  # no answer within the delay


def test_no_dead_air_a_second_different_hold_then_the_answer(clock):
    """A slow answer (a restarting oracle, a slow LLM: 3.5 s here), frame by frame,
    each line's audio 0.5 s: after the first hold phrase the caller never hears
    more than QUIET_HOLD_S and a frame of silence before the next, a different
    one, and the answer follows the holds."""
    policy = make_policy(clock, hold=("Hmm,", "Let me see,", "One moment,"), hold_max_s=5.0)
    heard(policy, QUESTION, final=True)
    policy.caller_turn_ended(SPEECH_END_S)
    frame_s, queued_s, played, said = 0.08, 0.0, [], []
    for frame in range(80):
        if frame == round(3.5 / frame_s):
            policy.candidate_reset(1, "Paris.", source(QUESTION, final=True))
        policy.tick()
        for line in say_all(policy, queued_s):
            said.append((" ".join(line.words), line.kind))
            queued_s += 0.5
        played.append(queued_s > 0)
        queued_s = max(0.0, queued_s - frame_s)
        clock.now += frame_s
    assert said == [
        ("Hmm,", LineKind.HOLD),
        ("Let me see,", LineKind.HOLD),
        ("One moment,", LineKind.HOLD),
        ("Paris.", LineKind.ANSWER),
    ]
    first = played.index(True)
    gaps = "".join("x" if p else "." for p in played[first:]).strip(".").split("x")
    assert max(len(gap) for gap in gaps) * frame_s <= QUIET_HOLD_S + 2 * frame_s


def test_holds_are_never_repeated_within_a_turn(clock):
    policy = make_policy(clock)  # two phrases: after both, the hold is silent
    heard(policy, QUESTION, final=True)
    policy.caller_turn_ended(SPEECH_END_S)
    assert text_of(say_all(policy)) == [("Hmm,", 0)]
    assert say_all(policy, queued_s=0.4) == []  # its audio plays: not quiet
    assert say_all(policy) == []  # over: the quiet starts
    clock.now += QUIET_HOLD_S - 0.01
    assert say_all(policy) == []
    clock.now += 0.01
    assert text_of(say_all(policy)) == [("Let me see,", 0)]  # the other one
    clock.now += 1.5
    assert say_all(policy) == [] and policy.floor is Floor.HOLDING  # no third, no repeat
    policy.candidate_reset(1, "Paris.", source(QUESTION, final=True))
    assert text_of(say_all(policy)) == [("Paris.", 1)]


def test_hold_phrases_rotate_turn_by_turn(clock):
    policy = make_policy(clock)
    said = []
    for turn in range(3):
        policy.caller_speech_started(SPEECH_START_S + 5 * turn)
        policy.caller_turn_ended(SPEECH_END_S + 5 * turn)
        said += text_of(say_all(policy))
    assert said == [("Hmm,", 0), ("Let me see,", 0), ("Hmm,", 0)]


def test_a_replacement_mid_speech_is_repaired_and_said_as_its_own_sentence(clock):
    policy = make_policy(clock)
    heard(policy, "What is the biggest planet", final=True)
    policy.candidate_reset(
        1, "The Sun is a star, and Jupiter", source("What is the biggest planet")
    )
    policy.caller_turn_ended(SPEECH_END_S)
    first = policy.next_line(0.0)
    policy.lines_started([first])  # "The Sun is" plays
    queued = policy.next_line(0.4)  # "a star," is queued behind it
    assert text_of([first, queued]) == [("The Sun is", 1), ("a star,", 1)]
    repairs_before = metric("kame_frontend_repairs_total")

    # The caller's question was longer than the final the agent answered: a new final.
    heard(policy, "What is the biggest planet near Earth", final=True, utterance="u2")
    assert policy.take_cut() is Cut.NONE  # a new transcript alone does not stop the answer
    policy.candidate_reset(
        2, "Earth is the third", source("What is the biggest planet near Earth", "u2")
    )
    policy.candidate_append(2, "planet. The Sun is a star.")

    assert policy.take_cut() is Cut.AFTER_PHRASE  # "The Sun is" finishes, "a star," is dropped
    lines = say_all(policy)
    assert text_of(lines) == [
        ("Sorry,", 0),
        ("Earth is the", 2),
        ("third planet.", 2),
        ("The Sun is a star.", 2),
    ]
    assert [line.kind for line in lines[:2]] == [LineKind.REPAIR, LineKind.ANSWER]
    assert lines[1].start == 0  # from its first word
    assert metric("kame_frontend_repairs_total") == repairs_before + 1


def test_a_replacement_that_says_the_same_thing_is_kept_without_a_repair(clock):
    policy = make_policy(clock)
    heard(policy, "When does the museum open", final=True)
    museum = source("When does the museum open")
    policy.candidate_reset(1, "The museum opens at nine.", museum)
    policy.caller_turn_ended(SPEECH_END_S)
    policy.lines_started([policy.next_line(0.0)])  # "The museum opens" plays
    repairs_before = metric("kame_frontend_repairs_total")

    policy.candidate_reset(2, "The museum", museum)  # a restarted oracle, same answer so far
    assert policy.take_cut() is Cut.AFTER_PHRASE
    assert policy.next_line(0.0) is None  # undecided: does it go on with "opens"?
    policy.candidate_append(2, "opens at nine and closes at six.")

    assert text_of(say_all(policy)) == [("at nine and closes at six.", 2)]
    assert metric("kame_frontend_repairs_total") == repairs_before


def test_a_stale_replacement_is_ignored_until_a_transcript_makes_it_fresh(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Paris is the capital of France.", source(QUESTION))
    policy.caller_turn_ended(SPEECH_END_S)
    policy.lines_started([policy.next_line(0.0)])  # "Paris is the"
    later = "What is the capital of France and Spain"
    policy.candidate_reset(2, "Paris and Madrid.", source(later, "u2"))
    assert policy.take_cut() is Cut.NONE
    assert text_of([policy.next_line(0.4)]) == [("capital of France.", 1)]  # A goes on
    heard(policy, later, final=True, end_s=SPEECH_END_S + 1.0, utterance="u2")
    assert policy.take_cut() is Cut.AFTER_PHRASE
    assert text_of(say_all(policy)) == [("Sorry,", 0), ("Paris and Madrid.", 2)]


def test_a_repair_dropped_by_another_replacement_is_still_said(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "The Sun is hot.", source(QUESTION))
    policy.caller_turn_ended(SPEECH_END_S)
    policy.lines_started([policy.next_line(0.0)])  # "The Sun is"
    policy.candidate_reset(2, "Earth.", source(QUESTION))
    repair = policy.next_line(0.0)  # handed out, not started
    assert repair.kind is LineKind.REPAIR
    policy.candidate_reset(3, "Paris.", source(QUESTION))
    assert text_of(say_all(policy)) == [("Sorry,", 0), ("Paris.", 3)]


def test_an_earlier_utterances_transcript_never_makes_a_candidate_fresh(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Paris.", source(QUESTION))
    policy.caller_turn_ended(SPEECH_END_S)
    say_all(policy)
    # The caller speaks again; stt has nothing of this utterance yet at its turn end.
    policy.caller_speech_started(4.0)
    assert policy.take_cut() is Cut.NOW
    policy.candidate_reset(2, "Paris, as I said.", source(QUESTION))
    policy.caller_turn_ended(5.0)
    assert policy.floor is Floor.HOLDING  # u1's final is not this turn's
    assert text_of(say_all(policy)) == [("Hmm,", 0)]
    # A late partial of u1 after u2's first event changes nothing either.
    heard(policy, "And Germany", end_s=4.6, utterance="u2")
    heard(policy, QUESTION, final=True, end_s=5.2, utterance="u1")
    policy.candidate_reset(3, "Paris, again.", source(QUESTION))
    assert policy.floor is Floor.HOLDING and say_all(policy) == []
    heard(policy, "And Germany?", final=True, end_s=5.2, utterance="u2")
    policy.candidate_reset(4, "Berlin.", source("And Germany?", "u2", final=True))
    assert text_of(say_all(policy)) == [("Berlin.", 4)]


def test_a_transcript_without_words_changes_nothing(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Paris.", source(QUESTION))
    heard(policy, "", final=True, end_s=SPEECH_END_S + 0.3, utterance="u2")  # a cough
    policy.caller_turn_ended(SPEECH_END_S)
    assert text_of(say_all(policy)) == [("Paris.", 1)]


def test_caller_speech_stops_the_agent_and_closes_its_answer(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Paris is the capital", source(QUESTION))
    policy.caller_turn_ended(SPEECH_END_S)
    say_all(policy)
    policy.caller_speech_started(3.5)
    assert policy.take_cut() is Cut.NOW and policy.floor is Floor.LISTENING
    policy.candidate_append(1, "of France.")  # the barged-in answer is not resumed
    policy.caller_turn_ended(4.0)
    assert text_of(say_all(policy)) == [("Hmm,", 0)]


def test_a_barge_in_during_a_hold_is_counted(clock):
    policy = make_policy(clock)
    barged_before = metric("kame_frontend_holds_total", outcome="barged_in")
    policy.caller_turn_ended(SPEECH_END_S)
    policy.caller_speech_started(3.0)
    assert metric("kame_frontend_holds_total", outcome="barged_in") == barged_before + 1
    assert policy.floor is Floor.LISTENING


def test_a_candidate_without_a_source_is_never_spoken(clock):
    policy = make_policy(clock)
    heard(policy, QUESTION, final=True)
    policy.candidate_reset(1, "Paris is the capital of France.", None)
    assert policy.speculative_line() is None
    policy.caller_turn_ended(SPEECH_END_S)
    assert text_of(say_all(policy)) == [("Hmm,", 0)]


def test_a_covering_partial_whose_words_are_not_all_stable_waits_for_the_final(clock):
    """Whisper revises the last word of a partial often enough: an unsettled partial
    never makes a candidate fresh, the final does."""
    policy = make_policy(clock, hold=())
    heard(policy, QUESTION, end_s=SPEECH_END_S, settled=False)
    policy.candidate_reset(1, "Paris.", source(QUESTION))
    clock.now += 0.4
    policy.caller_turn_ended(SPEECH_END_S)
    assert say_all(policy) == [] and policy.floor is Floor.HOLDING  # held, in silence
    heard(policy, QUESTION, final=True, end_s=SPEECH_END_S + 0.2)
    assert text_of(say_all(policy)) == [("Paris.", 1)]
