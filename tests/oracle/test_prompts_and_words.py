"""Word-boundary cutting of streamed text, and the prompts each back-end gets."""

from __future__ import annotations

from kame_common.words import normalize_words
from services.oracle.candidate import WordCutter
from services.oracle.prompts import (
    AGENT,
    GEMMA_HEADER,
    USER,
    Turn,
    build_turns,
    chat_user_message,
    gemma_prompt,
    is_gemma_270m_base,
)


def cut(chunks: list[str]) -> list[str]:
    cutter = WordCutter()
    pieces = [cutter.feed(chunk) for chunk in chunks]
    return [p for p in [*pieces, cutter.flush()] if p]


def test_words_are_never_cut_in_the_middle():
    chunks = [" Pa", "ris", " is the cap", "ital", " of Fr", "ance."]
    assert cut(chunks) == ["Paris is the", "capital of", "France."]


def test_a_trailing_space_releases_the_last_word_at_once():
    assert cut([" Paris ", "is ", "lovely.\n"]) == ["Paris", "is", "lovely."]


def test_blank_chunks_and_extra_whitespace_send_nothing():
    assert cut(["  ", "\n", "Hello  ", "  ", "world"]) == ["Hello", "world"]


def test_joined_pieces_give_back_the_text():
    text = " Tokyo is   the capital\nof Japan, and Kyoto was before it."
    chunks = [text[i : i + 3] for i in range(0, len(text), 3)]
    assert " ".join(cut(chunks)) == " ".join(text.split())


def test_finals_and_sources_compare_words_without_case_or_punctuation():
    assert normalize_words("What's the U.S.  capital?") == ("what's", "the", "us", "capital")
    assert normalize_words("what's the US capital") == ("what's", "the", "us", "capital")
    assert normalize_words("twelve-four ... ok") == ("twelvefour", "ok")
    assert normalize_words("What is it?") != normalize_words("What is it now?")


def test_build_turns_merges_speakers_and_adds_the_current_text():
    history = [Turn(USER, "Hi"), Turn(AGENT, "Hello."), Turn(USER, "One"), Turn(USER, "more")]
    turns = build_turns(history, agent_pending="Sure", user_pending="what is  the", max_turns=10)
    assert turns == [
        Turn(USER, "Hi"),
        Turn(AGENT, "Hello."),
        Turn(USER, "One more"),
        Turn(AGENT, "Sure"),
        Turn(USER, "what is the"),
    ]


def test_build_turns_keeps_only_the_latest_history():
    history = [Turn(USER, f"q{i}") if i % 2 == 0 else Turn(AGENT, f"a{i}") for i in range(10)]
    turns = build_turns(history, "", "now", max_turns=2)
    assert turns == [Turn(USER, "q8"), Turn(AGENT, "a9"), Turn(USER, "now")]


def test_gemma_prompt_is_few_shot_and_ends_where_the_agent_speaks():
    prompt = gemma_prompt([Turn(USER, "What is the capital of")])
    assert prompt.startswith(GEMMA_HEADER)
    assert prompt.endswith("User: What is the capital of\nAssistant:")
    assert prompt.count("Assistant:") == 5  # four examples, then ours


def test_chat_message_holds_the_transcript():
    message = chat_user_message([Turn(USER, "Hi"), Turn(AGENT, "Hello."), Turn(USER, "What")])
    assert "User: Hi\nAssistant: Hello.\nUser: What" in message


def test_gemma_270m_base_is_recognized_by_name_or_file():
    assert is_gemma_270m_base("gemma-3-270m")
    assert is_gemma_270m_base("/root/.cache/x/gemma-3-270m-q4_k_m.gguf")
    assert not is_gemma_270m_base("gemma-3-270m-it")
    assert not is_gemma_270m_base("gpt-4o-mini")
    assert not is_gemma_270m_base("gemma-3-4b")
