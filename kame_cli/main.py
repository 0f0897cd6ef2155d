"""`kame`: the command line of the stack. Each subcommand lives in its own
module under kame_cli/ exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when their command runs, so `kame --help` is fast.

Every command fails the same way (kame_cli.errors): one line on stderr,
`kame COMMAND: what went wrong and what to do`, and a non-zero exit status.
`kame --debug COMMAND ...` shows the traceback instead."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from kame_cli.errors import INTERRUPTED, USAGE, exit_code, one_line

COMMANDS = {
    "up": ("kame_cli.up", "run the whole stack as processes on loopback"),
    "status": ("kame_cli.status", "health, load and latency of a running stack"),
    "say": ("kame_cli.say", "synthesize a spoken question with the piper voice"),
    "talk": ("kame_cli.talk", "stream a WAV to the gateway and save the agent's answer"),
    "demo": ("kame_cli.demo", "kame up + say + talk + a printed summary, offline"),
    "bench": ("kame_cli.bench", "tandem vs cascade vs s2s on the same spoken questions"),
    "replay": ("kame_cli.replay", "run a KAME parity trace through the kame engine"),
    "llm-server": ("kame_cli.llm_server", "serve the embedded LLM (llama.cpp, Gemma 3 270M)"),
}
DEBUG_FLAG = "--debug"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = False
    while argv and argv[0] == DEBUG_FLAG:
        debug, argv = True, argv[1:]
    parser = argparse.ArgumentParser(prog="kame", description="The KAME stack's command line.")
    parser.add_argument(
        DEBUG_FLAG, action="store_true", help="show the traceback when a command fails"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else USAGE
    try:
        return run_command(argv[0], argv[1:])
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"kame {argv[0]}: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        return INTERRUPTED


def run_command(name: str, argv: list[str]) -> int:
    module = importlib.import_module(COMMANDS[name][0])
    command_parser = argparse.ArgumentParser(prog=f"kame {name}", description=COMMANDS[name][1])
    module.add_arguments(command_parser)
    return int(module.run(command_parser.parse_args(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
