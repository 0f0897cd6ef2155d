"""What the caller says, as a Realtime client is told it (services/web/
realtime.py decides when): the caller's turn, a user item in the making, with
the server events that tell it (speech_started, transcription deltas,
speech_stopped, committed, completed), and the backchannels said over the
agent, which are no turn.

A backchannel ("uh-huh", "okay": words that are only phrases of the
`backchannel_phrases` setting, kame_common/words.py's list, or no words)
heard while a response is under way or the agent is held gets no
speech_started and no transcription events, and the response goes on: the
stack lets the agent talk through it (services/frontend/engines/
backchannel.py), and a client told of a turn would cut the agent itself. Its
final joins the conversation as a user item (conversation.item.added and
.done only), as the oracle keeps it: context, not a question. Should the
stack take it as a barge-in after all, its speech_started comes then, with
the words heard so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kame_client.events import UserPartial, UserTranscript
from kame_common.words import BACKCHANNEL_PHRASES, is_backchannel, normalize_words, parse_phrases
from services.web.protocols.realtime_config import Event
from services.web.protocols.realtime_items import History, UserMessage, new_id

# What a listener says to show it follows (kame_common/words.py: the frontend's
# and the oracle's list too), as a session takes it unless told otherwise.
DEFAULT_BACKCHANNELS = parse_phrases(", ".join(BACKCHANNEL_PHRASES))


@dataclass
class UserTurn:
    """What the caller is saying, as a user item."""

    item_id: str = field(default_factory=lambda: new_id("item"))
    heard: str = ""  # the transcript sent in deltas so far
    committed: bool = False  # input_audio_buffer.committed was sent (the client's commit)

    def speech_started(self, audio_start_ms: int) -> Event:
        return {
            "type": "input_audio_buffer.speech_started",
            "audio_start_ms": audio_start_ms,
            "item_id": self.item_id,
        }

    def partial(self, text: str) -> list[Event]:
        """A partial transcript: the words past those sent so far, as a delta."""
        if not text.startswith(self.heard) or text == self.heard:
            return []  # a revised partial: the final says it right
        delta, self.heard = text[len(self.heard) :], text
        return [self.transcription("delta", delta=delta)]

    def commit(self, history: History) -> Event:
        """input_audio_buffer.committed: the item goes after `history`'s last."""
        return {
            "type": "input_audio_buffer.committed",
            "previous_item_id": history.last_id,
            "item_id": self.item_id,
        }

    def said(self, text: str, history: History, audio_end_ms: int | None) -> list[Event]:
        """The caller's final transcript: the turn ends (speech_stopped at
        `audio_end_ms`, None with push-to-talk: no voice activity detection to
        report it, then committed; neither if the client's commit ended it) and
        its item joins the conversation (`history` too)."""
        message = UserMessage(self.item_id, [{"type": "input_audio", "transcript": text}])
        ended = []
        if audio_end_ms is not None and not self.committed:
            ended.append(
                {
                    "type": "input_audio_buffer.speech_stopped",
                    "audio_end_ms": audio_end_ms,
                    "item_id": self.item_id,
                }
            )
        if not self.committed:
            ended.append(self.commit(history))
        return [
            *ended,
            history.add(message),
            self.transcription(
                "completed", transcript=text, usage={"type": "duration", "seconds": 0}
            ),
            {"type": "conversation.item.done", "item": message.item()},
        ]

    def transcription(self, kind: str, **fields: Any) -> Event:
        return {
            "type": f"conversation.item.input_audio_transcription.{kind}",
            "item_id": self.item_id,
            "content_index": 0,
            **fields,
        }


@dataclass
class Backchannel:
    """A caller utterance over the agent whose words are, so far, a backchannel:
    kept from the client until its final, or a barge-in, says what it was."""

    utterance_id: str
    heard: str = ""  # its latest partial transcript


class Nods:
    """One session's backchannels: which of the caller's transcripts are one,
    what the client gets of them, and the one under way (`pending`)."""

    def __init__(self, phrases: tuple[tuple[str, ...], ...] = DEFAULT_BACKCHANNELS) -> None:
        self.phrases = phrases
        self.pending: Backchannel | None = None  # caller words over the agent, a backchannel so far

    def is_nod(self, event: UserTranscript, may_begin: bool) -> bool:
        """The caller's words are a backchannel: only backchannel phrases, or none
        (the frontend's rule, services/frontend/engines/backchannel.py), and
        either more of an utterance that was one so far or, if `may_begin`
        (the session's say: the agent speaks and the caller has no turn under
        way), a new one."""
        text = event.text
        if normalize_words(text) and not is_backchannel(text, self.phrases):
            return False
        if self.pending is not None and self.pending.utterance_id == event.utterance_id:
            return True
        return may_begin

    def nodded(self, event: UserTranscript, history: History) -> list[Event]:
        """A backchannel's transcript. No speech_started and no transcription
        events: LiveKit's and Pipecat's clients stop their playback on
        speech_started, and Pipecat's user aggregator takes any transcription
        while the bot speaks as the user's turn and interrupts too, so either
        would cut the agent the stack lets go on. Its final, with words, is
        still a user item of the conversation (added and done: the item
        events no client takes for a turn), after the agent's item it was
        said over, as the oracle keeps it: context for the next answer, no
        response of its own. A partial waits in `pending` for a barge-in."""
        if isinstance(event, UserPartial):
            self.pending = Backchannel(event.utterance_id, event.text)
            return []
        self.pending = None
        if not normalize_words(event.text):
            return []  # a cough: nothing was said
        message = UserMessage(content=[{"type": "input_audio", "transcript": event.text}])
        added = history.add(message)
        return [added, {"type": "conversation.item.done", "item": message.item()}]

    def was_a_turn(self, user: UserTurn | None) -> list[Event]:
        """The stack took the caller's speech over the agent as a barge-in: what
        was kept as a backchannel is the start of the caller's item `user`."""
        nod, self.pending = self.pending, None
        if nod is None or user is None or not nod.heard or user.heard:
            return []
        user.heard = nod.heard
        return [user.transcription("delta", delta=nod.heard)]
