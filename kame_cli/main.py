"""`kame`: the command line of the stack. Each subcommand lives in its own
module under kame_cli/ exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when their command runs, so `kame --help` is fast."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "up": ("kame_cli.stack", "run the whole stack as processes on loopback"),
    "say": ("kame_cli.say", "synthesize a spoken question with the piper voice"),
    "talk": ("kame_cli.talk", "stream a WAV to the gateway and save the agent's answer"),
    "demo": ("kame_cli.demo", "kame up + say + talk + a printed summary, offline"),
    "bench": ("kame_cli.bench", "tandem vs cascade vs s2s on the same spoken questions"),
    "replay": ("kame_cli.replay", "run a KAME parity trace through the kame engine"),
    "llm-server": ("kame_cli.llm_server", "serve the embedded LLM (llama.cpp, Gemma 3 270M)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="kame", description="The KAME stack's command line.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    command_parser = argparse.ArgumentParser(
        prog=f"kame {argv[0]}", description=COMMANDS[argv[0]][1]
    )
    module.add_arguments(command_parser)
    return int(module.run(command_parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
