"""Whisper decodes sized to their audio, several utterances in one call.

faster-whisper's `transcribe` always encodes a 30 s window (the audio, then
zero features), and the encoder's cost follows the window, not the speech: a
2 s partial cost as much as a 30 s one (about 0.35 s of tiny.en on two CPU
cores). Whisper's encoder also takes shorter windows (CTranslate2 cuts the
positional table to the window), so `WindowedWhisper` encodes the audio plus
`pad_s` of zero features: about seven times less work for a question, with
the same words on the bench's piper and espeak-ng clips.

Without that padding Whisper loops into the window's end ("What is 12 times
4? What is 12 times 4? ..."); with a second or more it usually closes its
segment as in the full window, but not always (it loops in the full window
too, more rarely). So a loop is cut wherever it shows: a segment that starts
past the audio or repeats the one before it is dropped, and a phrase of
REPEAT_MIN_TOKENS or more said twice in a row ends its segment.

A loop can also start inside the audio: when the speech begins right at the
audio's start (a stream's first words, with no silence before them), Whisper
may close its segment before the speech ends and say the utterance again from
its start ("What is the door code for the Paris office?<|2.00|><|2.00|> What
is the door code for the Paris" on 2.5 s of piper speech). A segment that
repeats the start of the text before it, cut off or whole, is such a loop and
is dropped too.

Utterances decoded together share one window (the longest one's): on two CPU
cores eight questions decode in one batch in about half the time they take
one by one (`kame_cli/bench/stt_bench.py` measures the whole service).
"""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ctranslate2
import numpy as np
import numpy.typing as npt
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import merge_punctuations

from kame_common.audio import Samples
from services.stt import metrics
from services.stt.agreement import Word

WHISPER_RATE = 16_000
FULL_WINDOW_FRAMES = 3000  # 30 s of 10 ms mel frames: the most the encoder takes
SECONDS_PER_FRAME = 0.01
TIMESTAMP_STEP_S = 0.02
# faster-whisper's defaults: a window counts as silence when the no-speech token is
# likely and the text is not; the first timestamp may come at most this late.
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
MAX_INITIAL_TIMESTAMP_S = 1.0
# A phrase of this many tokens twice in a row is a decoding loop, not speech.
REPEAT_MIN_TOKENS = 4
# Temperature fallback (a request's `fallback`), as faster-whisper's transcribe does
# it: a decode whose text compresses more than this (it repeats itself) or whose
# average log probability is under LOG_PROB_THRESHOLD is decoded again by sampling
# SAMPLES_PER_TEMPERATURE candidates at each temperature in turn until one passes;
# if none does, the most probable decode is kept. Sampling is random: the same
# audio may give other words the next time.
COMPRESSION_RATIO_THRESHOLD = 2.4
FALLBACK_TEMPERATURES = (0.2, 0.4, 0.6, 0.8, 1.0)
SAMPLES_PER_TEMPERATURE = 5
# Punctuation is glued to the word before or after it as faster-whisper's own
# transcribe does (its defaults, so both ways of decoding write words alike).
_TRANSCRIBE_DEFAULTS = inspect.signature(WhisperModel.transcribe).parameters
PREPEND_PUNCTUATION: str = _TRANSCRIBE_DEFAULTS["prepend_punctuations"].default
APPEND_PUNCTUATION: str = _TRANSCRIBE_DEFAULTS["append_punctuations"].default


@dataclass(frozen=True)
class DecodeRequest:
    """One utterance to transcribe: 16 kHz audio, times reported from `offset_s`.
    Whisper hears `lead_in_s` of silence before the audio (no word is timed in it)."""

    audio: Samples
    offset_s: float
    language: str
    beam_size: int
    max_new_tokens: int
    lead_in_s: float = 0.0
    fallback: bool = False  # temperature fallback when the decode looks wrong


@dataclass(frozen=True)
class _Segment:
    start_s: float
    end_s: float
    tokens: tuple[int, ...]


class WindowedWhisper:
    def __init__(self, model: WhisperModel, pad_s: float, word_timestamps: bool) -> None:
        self.model = model
        self.pad_frames = math.ceil(pad_s / SECONDS_PER_FRAME)
        self.word_timestamps = word_timestamps
        self._tokenizers: dict[str, Tokenizer] = {}

    def decode(self, requests: Sequence[DecodeRequest]) -> list[list[Word]]:
        """Each request's words (blocking; every request must share language and
        beam size). One encoder call and one generate call for the batch, and for
        the requests with `fallback` whose decode looks wrong, one more of each per
        temperature tried."""
        if not requests:
            return []
        language, beam_size = requests[0].language, requests[0].beam_size
        if any((r.language, r.beam_size) != (language, beam_size) for r in requests):
            raise ValueError("a decode batch shares one language and one beam size")
        tokenizer = self._tokenizer(language)
        features = [self.model.feature_extractor(_with_lead_in(r)) for r in requests]
        # The extractor adds a frame; an utterance cut at max length plus its pre-roll
        # can pass 30 s by a little, and the encoder takes no more.
        content_frames = [min(f.shape[-1] - 1, FULL_WINDOW_FRAMES) for f in features]
        window = self._window(features, max(content_frames))
        encoded = self.model.model.encode(window, to_cpu=False)
        prompt = self.model.get_prompt(tokenizer, [])
        options = {
            "max_length": len(prompt) + max(r.max_new_tokens for r in requests),
            "return_scores": True,
            "return_no_speech_prob": True,
            "suppress_blank": True,
            "suppress_tokens": [-1],
            "max_initial_timestamp_index": round(MAX_INITIAL_TIMESTAMP_S / TIMESTAMP_STEP_S),
        }
        results = self.model.model.generate(
            encoded, [prompt] * len(requests), beam_size=beam_size, **options
        )
        retry = [
            i for i, r in enumerate(requests) if r.fallback and _looks_wrong(results[i], tokenizer)
        ]
        if retry:
            metrics.FALLBACKS.inc(len(retry))
            resampled = self._fallback(
                [features[i] for i in retry],
                [results[i] for i in retry],
                prompt,
                options,
                tokenizer,
            )
            for i, result in zip(retry, resampled, strict=True):
                results[i] = result
        segments = [
            _spoken_segments(result, tokenizer, frames * SECONDS_PER_FRAME)
            for result, frames in zip(results, content_frames, strict=True)
        ]
        return self._words(segments, tokenizer, encoded, content_frames, requests)

    def _fallback(
        self,
        features: list[npt.NDArray[np.float32]],
        first: list[Any],
        prompt: list[int],
        options: dict[str, Any],
        tokenizer: Tokenizer,
    ) -> list[Any]:
        """Each utterance (whose `first` decode looked wrong) decoded again by
        sampling, temperature after temperature, until a decode passes; where none
        does, the most probable of all, the first included."""
        frames = max(min(f.shape[-1] - 1, FULL_WINDOW_FRAMES) for f in features)
        encoded = self.model.model.encode(self._window(features, frames), to_cpu=False)
        tried: list[list[Any]] = [[result] for result in first]
        pending = list(range(len(features)))
        for temperature in FALLBACK_TEMPERATURES:
            results = self.model.model.generate(
                encoded,
                [prompt] * len(features),
                beam_size=1,
                num_hypotheses=SAMPLES_PER_TEMPERATURE,
                sampling_topk=0,
                sampling_temperature=temperature,
                **options,
            )
            for i in pending:
                tried[i].append(results[i])
            pending = [i for i in pending if _looks_wrong(results[i], tokenizer)]
            if not pending:
                break
        return [
            row[-1] if i not in pending else max(row, key=_average_log_probability)
            for i, row in enumerate(tried)
        ]

    def _tokenizer(self, language: str) -> Tokenizer:
        if language not in self._tokenizers:
            self._tokenizers[language] = Tokenizer(
                self.model.hf_tokenizer,
                self.model.model.is_multilingual,
                task="transcribe",
                language=language,
            )
        return self._tokenizers[language]

    def _window(
        self, features: list[npt.NDArray[np.float32]], longest: int
    ) -> ctranslate2.StorageView:
        """The batch's mel features, zero-padded to one even length (the encoder halves it)."""
        frames = min(FULL_WINDOW_FRAMES, 2 * math.ceil((longest + self.pad_frames) / 2))
        window = np.zeros((len(features), features[0].shape[0], frames), dtype=np.float32)
        for row, feature in zip(window, features, strict=True):
            kept = feature[:, :frames]
            row[:, : kept.shape[-1]] = kept
        return ctranslate2.StorageView.from_array(window)

    def _words(
        self,
        segments: list[list[_Segment]],
        tokenizer: Tokenizer,
        encoded: ctranslate2.StorageView,
        content_frames: list[int],
        requests: Sequence[DecodeRequest],
    ) -> list[list[Word]]:
        if not self.word_timestamps:
            return [
                [word for segment in spoken for word in _spread_words(segment, tokenizer, r)]
                for spoken, r in zip(segments, requests, strict=True)
            ]
        tokens = [[t for segment in spoken for t in segment.tokens] for spoken in segments]
        # One batched alignment; a row without text aligns to nothing.
        alignments = self.model.find_alignment(
            tokenizer,
            tokens,
            encoded,
            content_frames,  # CTranslate2 takes one frame count per row
        )
        words = []
        for alignment, frames, request in zip(alignments, content_frames, requests, strict=True):
            merge_punctuations(alignment, PREPEND_PUNCTUATION, APPEND_PUNCTUATION)
            duration = frames * SECONDS_PER_FRAME
            words.append(
                [
                    _word(t["word"], t["start"], t["end"], t["probability"], request, duration)
                    for t in alignment
                    if t["word"].strip()
                ]
            )
        return words


def _average_log_probability(result: Any) -> float:
    """Per token, counting the end of text (faster-whisper's measure)."""
    tokens = result.sequences_ids[0]
    return float(result.scores[0] * len(tokens) / (len(tokens) + 1))


def _is_silence(result: Any) -> bool:
    """Whisper's own silence rule: the no-speech token is likely and the text is not."""
    return bool(
        result.no_speech_prob > NO_SPEECH_THRESHOLD
        and _average_log_probability(result) < LOG_PROB_THRESHOLD
    )


def _looks_wrong(result: Any, tokenizer: Tokenizer) -> bool:
    """faster-whisper's reasons to decode again: text that repeats itself (compresses
    too well) or is improbable, unless it is silence."""
    if _is_silence(result):
        return False
    text = tokenizer.decode(result.sequences_ids[0]).strip().encode()
    repeats = bool(text) and len(text) / len(zlib.compress(text)) > COMPRESSION_RATIO_THRESHOLD
    return repeats or _average_log_probability(result) < LOG_PROB_THRESHOLD


def _spoken_segments(result: Any, tokenizer: Tokenizer, content_s: float) -> list[_Segment]:
    """The segments of one generated sequence that lie in the audio, loops dropped."""
    tokens = result.sequences_ids[0]
    if _is_silence(result):
        return []
    kept: list[_Segment] = []
    for segment in _segments(tokens, tokenizer, content_s):
        if segment.start_s >= content_s:
            break  # a loop into the padding after the audio
        if kept and _repeats_start(segment.tokens, kept):
            break  # a loop over the same words
        kept.append(segment)
    return kept


def _repeats_start(tokens: tuple[int, ...], before: list[_Segment]) -> bool:
    """Whether `tokens` say again the start of the segment before them or of the
    first one, whole or cut off (a cut-off one of REPEAT_MIN_TOKENS or more:
    a short one may be speech, "No. No, I said")."""
    for earlier in (before[-1].tokens, before[0].tokens):
        if tokens == earlier or (
            len(tokens) >= REPEAT_MIN_TOKENS and earlier[: len(tokens)] == tokens
        ):
            return True
    return False


def _segments(tokens: list[int], tokenizer: Tokenizer, content_s: float) -> list[_Segment]:
    """Split `<|t0|> text <|t1|><|t1|> text <|t2|> ...` into timed segments."""
    segments: list[_Segment] = []
    text: list[int] = []
    start_s = 0.0
    for token in tokens:
        if token >= tokenizer.timestamp_begin:
            at_s = (token - tokenizer.timestamp_begin) * TIMESTAMP_STEP_S
            if text:
                segments.append(_Segment(start_s, at_s, tuple(text)))
                text = []
            start_s = at_s
        elif token < tokenizer.eot:
            text.append(token)
    if text:  # no closing timestamp: the segment runs to the end of the audio
        segments.append(_Segment(start_s, max(content_s, start_s), tuple(text)))
    return [
        _Segment(segment.start_s, segment.end_s, _without_loop(segment.tokens))
        for segment in segments
    ]


def _without_loop(tokens: tuple[int, ...]) -> tuple[int, ...]:
    """`tokens` up to where a phrase of REPEAT_MIN_TOKENS or more repeats at once."""
    for end in range(2 * REPEAT_MIN_TOKENS, len(tokens) + 1):
        for length in range(REPEAT_MIN_TOKENS, end // 2 + 1):
            if tokens[end - length : end] == tokens[end - 2 * length : end - length]:
                return tokens[: end - length]
    return tokens


def _with_lead_in(request: DecodeRequest) -> Samples:
    """The request's audio after its lead-in of silence."""
    if not request.lead_in_s:
        return request.audio
    silence = np.zeros(round(request.lead_in_s * WHISPER_RATE), dtype=np.float32)
    return np.concatenate([silence, request.audio])


def _spread_words(segment: _Segment, tokenizer: Tokenizer, request: DecodeRequest) -> list[Word]:
    """Without alignment: the segment's words spread evenly over its span."""
    texts = tokenizer.decode(list(segment.tokens)).split()
    step = (segment.end_s - segment.start_s) / max(len(texts), 1)
    duration = request.lead_in_s + len(request.audio) / WHISPER_RATE
    return [
        _word(
            text,
            segment.start_s + i * step,
            segment.start_s + (i + 1) * step,
            1.0,
            request,
            duration,
        )
        for i, text in enumerate(texts)
    ]


def _word(
    text: str,
    start: float,
    end: float,
    probability: float,
    request: DecodeRequest,
    duration_s: float,
) -> Word:
    """A word in stream seconds, inside the decoded audio (Whisper's 20 ms steps can
    overshoot the end of a short clip; its alignment can start a word in the lead-in).
    `start`, `end` and `duration_s` are window seconds, lead-in included."""

    def stream_s(window_s: float) -> float:
        return (
            request.offset_s + min(max(window_s, request.lead_in_s), duration_s) - request.lead_in_s
        )

    return Word(text.strip(), stream_s(float(start)), stream_s(float(end)), float(probability))
