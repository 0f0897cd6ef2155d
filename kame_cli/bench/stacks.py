"""One `kame up` stack per frontend engine.

A frontend replica serves one engine, so the runs are grouped by engine and
each group gets its own stack on free ports, with its own Redis server so that
the frontend registry holds only this stack's replica.
"""

from __future__ import annotations

from kame_cli.bench.config import BenchConfig
from kame_cli.bench.runs import Run
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, StackOptions, free_ports, options_from_args

MIN_FRONTEND_SLOTS = 4


class BenchStack(Stack):
    """`kame up`'s stack, with enough frontend slots for the largest load level."""

    def __init__(self, options: StackOptions, frontend_slots: int) -> None:
        super().__init__(options)
        self.frontend_slots = frontend_slots

    def service_env(self, service: str) -> dict[str, str]:
        env = super().service_env(service)
        if service == "frontend":
            env["KAME_FRONTEND_BATCH_SLOTS"] = str(self.frontend_slots)
        return env


def group_by_engine(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by frontend engine (one stack each), in plan order, without repeats."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run not in groups.setdefault(run.engine, []):
            groups[run.engine].append(run)
    return groups


def engine_stack(config: BenchConfig, engine: str) -> BenchStack:
    """The stack for `engine` as the bench's options ask (logs under its scratch folder)."""
    redis_port = free_ports(1)[0]  # a free port: the stack starts its own Redis there
    ports = Ports.free(redis=redis_port)
    options = options_from_args(config, ports, engine, config.scratch / f"logs-{engine}")
    return BenchStack(options, max([MIN_FRONTEND_SLOTS, *config.load]))
