"""README's Python snippets run, as README prints them, against the whole stack
(this folder's conftest: stt, oracle, a frontend, a gateway and the web service
with its OpenAI Realtime and GPT-Live endpoints). Each snippet is taken from
README.md, its address pointed at the test's web service, and run as a program
in a folder holding the question as q.wav, the file README makes with `kame say`.
It prints what the caller said and what the agent said until it is stopped,
as README says (until Ctrl-C): the test reads its output until the agent spoke,
then stops it."""

from __future__ import annotations

import asyncio
import shutil
import sys

import pytest

from tests.docs.markdown import README, blocks
from tests.e2e.conftest import QUESTION
from tests.support import word_recall

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

README_ADDRESS = "127.0.0.1:8088"
ANSWER_TIMEOUT_S = 120.0
# After the agent's first words, how long more of its output is read (the rest
# of a delta-by-delta transcript, the answer after a hold phrase).
MORE_S = 10.0

SNIPPETS = [b for b in blocks(README.read_text()) if b.language == "python"]


async def run_until_the_agent_spoke(program: str, cwd) -> list[str]:
    """The lines `program` printed until the agent spoke and MORE_S after."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        program,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            while not any(line.startswith("agent:") for line in lines):
                line = await process.stdout.readline()
                assert line, "the snippet ended before the agent spoke:\n" + "\n".join(lines)
                lines.append(line.decode().rstrip())
        try:
            async with asyncio.timeout(MORE_S):
                while line := await process.stdout.readline():
                    lines.append(line.decode().rstrip())
        except TimeoutError:
            pass  # the snippet runs until stopped
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    return lines


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda b: f"README-line{b.line}")
async def test_a_readme_snippet_talks_to_the_stack(snippet, web, question_wav, tmp_path):
    assert README_ADDRESS in snippet.text, "the snippet no longer talks to kame up's address"
    program = snippet.text.replace(README_ADDRESS, f"127.0.0.1:{web.port}")
    shutil.copy(question_wav, tmp_path / "q.wav")
    lines = await run_until_the_agent_spoke(program, tmp_path)
    said = " ".join(line.removeprefix("agent:") for line in lines if line.startswith("agent:"))
    assert said.strip(), "\n".join(lines)
    heard = " ".join(line.removeprefix("you:") for line in lines if line.startswith("you:"))
    if "you:" in snippet.text:  # the snippet prints the caller's transcript
        assert word_recall(QUESTION, heard) >= 0.5, "\n".join(lines)
