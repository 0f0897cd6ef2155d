"""What the oracle asks the LLM.

Every back-end sees the same conversation: the history from Redis (committed
user finals and the agent text actually spoken), the agent words spoken since
then, and the caller's current (possibly unfinished) utterance.

- Chat models (OpenAI-compatible chat completions, Anthropic messages) get the
  KAME reference system prompt and the conversation as one transcript in a
  single user message, as the reference KAME server does: no role alternation
  rules to satisfy, and the model plainly sees that the last line may be cut off.
- Gemma 3 270M is a BASE model that does not follow instructions. It gets a
  few-shot completion prompt (examples of unfinished questions answered in one
  spoken sentence, then the conversation, then "Assistant:") sent to
  /v1/completions with a newline stop, so it writes exactly one agent line.

Every prompt starts with a fixed prefix (the few-shot header and examples, or
the system prompt and the opening of the user message). Servers that cache
prompt prefixes (llama.cpp reuses the longest common prefix of its previous
request; vLLM caches prefixes) evaluate it once: `warm_up_*` below are that
prefix alone, sent once at start (`max_tokens` 1), so the first caller does
not pay for it. They are built from the same pieces as the real prompts, so
the prefix is byte-identical.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

USER = "user"
AGENT = "agent"
TOOL = "tool"  # a tool call the agent made and its result (services/oracle/tools)
# Context the client added (AgentContext THINKING, or COMMENTARY for no delegation):
# the model reads it, nobody said it.
CONTEXT = "context"

# The reference KAME prompt, in our words: a spoken, confident answer of at
# most 30 words that predicts the user's intent from a partial transcript.
KAME_SYSTEM_PROMPT = """\
You are the voice agent in a live spoken conversation. The user may still be \
speaking, so the last user line of the transcript can stop mid-sentence. \
Predict what the user is getting at and answer it right away, confidently, \
without asking for confirmation.
Reply with only the words the agent says next: no speaker label, no commentary.
Keep it short and spoken in style: at most 30 words.
The agent sometimes says wrong things; pay attention to what the user said and \
give correct information.
Your words will be read aloud, so use no symbols, lists or markup that cannot \
be pronounced."""

# Added to the system prompt when tools are offered.
TOOLS_PROMPT = """\
You can call the tools offered to look things up or act for the user: when the \
answer depends on one, call it, then say its result in your own words. Tool lines \
in the transcript are calls made earlier in the conversation. If a tool reports \
an error, say briefly that you could not reach it, and go on."""

GEMMA_HEADER = """\
Below are conversations with a helpful voice assistant. The user may still be \
speaking, so the transcript can stop mid-sentence: the assistant guesses what \
the user is asking and answers in one short spoken sentence."""

# (user text as heard so far, assistant answer). Half of the questions are cut
# off, which teaches the base model to answer the intent, not the literal words.
GEMMA_EXAMPLES = (
    ("What is the tallest mountain", "Mount Everest is the tallest mountain in the world."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What's the boiling point of", "Water boils at one hundred degrees Celsius at sea level."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare wrote Romeo and Juliet."),
)

_LABELS = {USER: "User", AGENT: "Assistant", TOOL: "Tool", CONTEXT: "Note"}


@dataclass(frozen=True)
class Turn:
    role: str  # USER, AGENT, TOOL or CONTEXT
    text: str


def build_turns(
    history: Sequence[Turn], agent_pending: str, user_pending: str, max_turns: int
) -> list[Turn]:
    """The last `max_turns` turns of history + unsaved agent words + the current user text,
    with consecutive turns of one speaker merged."""
    turns: list[Turn] = []
    for turn in [*history[-max_turns:], Turn(AGENT, agent_pending), Turn(USER, user_pending)]:
        text = " ".join(turn.text.split())
        if not text:
            continue
        if turns and turns[-1].role == turn.role:
            turns[-1] = Turn(turn.role, f"{turns[-1].text} {text}")
        else:
            turns.append(Turn(turn.role, text))
    return turns


def transcript(turns: Iterable[Turn]) -> str:
    return "\n".join(f"{_LABELS[t.role]}: {t.text}" for t in turns)


_CHAT_OPENING = "Conversation so far (the last user line may be unfinished):\n"


def chat_user_message(turns: Sequence[Turn]) -> str:
    return f"{_CHAT_OPENING}{transcript(turns)}\n\nWhat does the assistant say next?"


def chat_messages(turns: Sequence[Turn], system_prompt: str = "") -> list[dict[str, str]]:
    """OpenAI chat messages: the system prompt (empty = KAME's), then the transcript."""
    return [
        {"role": "system", "content": system_prompt or KAME_SYSTEM_PROMPT},
        {"role": "user", "content": chat_user_message(turns)},
    ]


def gemma_prefix(header: str = GEMMA_HEADER) -> str:
    """The fixed start of every few-shot prompt: the header and the examples."""
    examples = [transcript([Turn(USER, q), Turn(AGENT, a)]) for q, a in GEMMA_EXAMPLES]
    return "".join(f"{part}\n\n" for part in [header, *examples])


def gemma_prompt(turns: Sequence[Turn], header: str = GEMMA_HEADER) -> str:
    """Few-shot completion prompt; the model continues after the final "Assistant:"."""
    return f"{gemma_prefix(header)}{transcript(turns)}\n{_LABELS[AGENT]}:"


def warm_up_chat_messages(system_prompt: str = "") -> list[dict[str, str]]:
    """The fixed prefix of chat prompts: the system prompt and the user message's
    opening (a chat template closes the message after it, so only that much is shared)."""
    return [
        {"role": "system", "content": system_prompt or KAME_SYSTEM_PROMPT},
        {"role": "user", "content": _CHAT_OPENING},
    ]


def with_instructions(system_prompt: str, instructions: str, model: str) -> str:
    """`system_prompt` (empty = the model's default: the few-shot header or KAME's
    prompt) with the caller app's instructions after it."""
    if not instructions:
        return system_prompt
    default = GEMMA_HEADER if is_gemma_270m_base(model) else KAME_SYSTEM_PROMPT
    return f"{system_prompt or default}\n{instructions}"


def is_gemma_270m_base(model: str) -> bool:
    """Gemma 3 270M base (the embedded default) by name or GGUF path. Instruction-tuned
    variants ("-it") follow chat prompts and take the chat path."""
    name = model.lower()
    return "gemma" in name and "270m" in name and "-it" not in name
