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
from pathlib import Path

import pytest

from tests.docs.markdown import README, blocks
from tests.e2e.conftest import QUESTION
from tests.support import word_recall

pytestmark = pytest.mark.asyncio(loop_scope="module")

README_ADDRESS = "127.0.0.1:8088"
ANSWER_TIMEOUT_S = 120.0
# After the agent's first words, how long more of its output is read (the rest
# of a delta-by-delta transcript, the answer after a hold phrase).
MORE_S = 10.0

SNIPPETS = [b for b in blocks(README.read_text()) if b.language == "python"]


def agent_words(output: str) -> str:
    """What a snippet printed of the agent: its output but the caller's lines."""
    lines = [line for line in output.splitlines() if not line.startswith("you:")]
    return " ".join(line.removeprefix("agent:") for line in lines).strip()


async def run_until_the_agent_spoke(program: str, cwd: Path) -> str:
    """What `program` printed until the agent spoke and MORE_S after (its stderr
    goes to cwd/stderr.txt)."""
    with (cwd / "stderr.txt").open("w") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", program, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    assert process.stdout is not None
    output = ""
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            while not agent_words(output):
                chunk = await process.stdout.read(4096)
                assert chunk, (
                    "the snippet ended before the agent spoke:\n" + (cwd / "stderr.txt").read_text()
                )
                output += chunk.decode()
        try:
            async with asyncio.timeout(MORE_S):
                while chunk := await process.stdout.read(4096):
                    output += chunk.decode()
        except TimeoutError:
            pass  # the snippet runs until stopped
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    return output


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda b: f"README-line{b.line}")
async def test_a_readme_snippet_talks_to_the_stack(snippet, web, question_wav, tmp_path):
    assert README_ADDRESS in snippet.text, "the snippet no longer talks to kame up's address"
    program = snippet.text.replace(README_ADDRESS, f"127.0.0.1:{web.port}")
    shutil.copy(question_wav, tmp_path / "q.wav")
    output = await run_until_the_agent_spoke(program, tmp_path)
    assert agent_words(output), output
    heard = " ".join(
        line.removeprefix("you:") for line in output.splitlines() if line.startswith("you:")
    )
    if "you:" in snippet.text:  # the snippet prints the caller's transcript
        assert word_recall(QUESTION, heard) >= 0.5, output
