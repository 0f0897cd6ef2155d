"""`kame bench`: tandem vs cascade vs s2s on the same spoken questions, through
the whole local stack (gateway, frontend, stt, oracle, LLM server, Redis) at
real time.

Runs (runs.py). A run is a mode (the gateway's oracle policy) on a frontend
engine. Without --checkpoint: tandem and cascade on the tts engine. With one,
also tandem on kame ("tandem-kame") and s2s on moshi.

Stacks (stacks.py, runner.py). A frontend replica serves one engine, so the
runs are grouped by engine and each group gets its own `kame up` stack
(`kame_cli.stack.Stack` on free ports, with its own Redis server so that the
frontend registry holds only this stack's replica). A stack's first call is its
cold call, recorded apart from the measured calls; then --warmup unrecorded
calls; then every question is asked once per run before the next question
starts, the run order flipping from one question to the next (ABBA), so slow
drift on a shared machine favours no run.

Questions (questions.py): six built-in ones spoken by the piper voice, or
--questions FILE (bench/questions/espeak/questions.json: spoken by espeak-ng
in several English voices, speeds and pitches; kame_cli/bench/make_questions.py).

A call is `kame talk` (`kame_cli.talk.talk`): the question streamed at real
time in 80 ms chunks, then silence until the agent has answered and been quiet
for --tail-s (or --max-wait-s passed). Where the run has an oracle, only a word
of an oracle generation counts as answering: a hold phrase alone does not end
the call. Measured per call (conversation.py, answer.py):

- first audio (the JSON's `response_latency_s`): the caller's end of speech
  (measured on the WAV) -> the first agent audio at the client; negative when
  the agent started first;
- answer latency: the caller's end of speech -> the first word of the answer
  itself: the first agent word of an oracle generation (generation != 0),
  after any hold phrase, filler or other generation-0 words, placed in time
  where that word's audio (its start_s on the agent stream) reached the
  client. A filler that arrives early does not make an answer early;
  `gateway_answer_latency_s` is the gateway's own figure, when it sends one;
- coherent: the answer's words (the agent's words after the question, in
  order) are, after an optional leading hold phrase (generation-0 words), a
  prefix of ONE generation's text as the oracle updates show it, compared on
  normalized words. Two generations spliced, a repair (generation-0 words
  after the answer began, counted in `answer_repairs`) or words off the
  generation's text make it incoherent (`coherence_note` says which). Not
  scored (None) for s2s, which has no oracle;
- oracle first update: the first transcript event (partial, or the final if
  there was no partial) -> the first oracle update, both as the client saw them;
- STT final lag: the final transcript's `lag_s` (emission minus arrival of the
  last frame it covers, as the stt service measures it);
- frame lag (client): agent frame k received minus the moment caller frame k
  was due (its last sample spoken); a frame is late above --late-ms;
- per-frame timings from the services' histograms (metrics.py), the
  difference of two scrapes of /metrics around the call: frontend step time
  (kame_frontend_step_seconds), gateway frame round trip
  (kame_gateway_frame_round_trip_seconds) and transport overhead per frame,
  the round trip minus the frontend's step time for the same frame
  (kame_gateway_frame_transport_seconds);
- correct: after the stacks stopped (so that it steals no CPU from them), the
  agent's audio is transcribed with the stt engine and every expected keyword
  must be heard (a keyword may list alternatives: "eight|8"); text-correct:
  the same on the words the frontend reports it spoke.

Summary (summary.py): median and p90 per run over the measured calls, correct,
coherent, held and repaired counts; each stack's cold call with its ratio to
the same run's warm median.

Load: --load 1,4,8 runs N concurrent sessions of one run (arrivals spread over
the first second) and reports late frames, per-frame timings and latencies.

Options (config.py): parsed once into a frozen BenchConfig.

Outputs in --out-dir (cli.py, report.py, plots.py): NAME.json (everything),
NAME.md (tables, the machine and the exact command), NAME.png (latency
distributions, breakdown, frame timings, load and an annotated timeline of the
first question in every run) and NAME_timeline.png (`kame talk`'s timeline of
one call). Scratch files (answer WAVs, service logs) go to
--out-dir/tmp/NAME/.
"""

from __future__ import annotations

import argparse

# The command's modules are imported when `kame bench` runs, not with the
# package: importing one of the benchmark scripts or helpers here (gpu_check,
# kame_step_bench, report) then loads that module alone, not the whole stack's
# install (gRPC clients, Redis, the gateway's codecs).


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kame_cli.bench.config import add_arguments as add_bench_arguments

    add_bench_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from kame_cli.bench.cli import run as run_bench

    return run_bench(args)
