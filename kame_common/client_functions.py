"""What a caller may declare as its own functions (ConverseConfig.functions, which
the gateway passes on as OracleConfig.client_functions), checked by the same
rules in both places: the gateway refuses at the start of the call what the
oracle would refuse when its session opens, so a client learns it at once.

- at most the service's max_client_functions functions;
- a name of 1-64 characters `[A-Za-z0-9_-]`, not declared twice (whether it
  clashes with one of the operator's tools only the oracle knows);
- a description of at most MAX_DESCRIPTION_CHARS, counted with runs of
  whitespace as one space, as the model reads it;
- `parameters_json` empty (no arguments) or, in at most MAX_PARAMETERS_CHARS,
  a valid JSON Schema with `"type": "object"` at its root;
- all of them together at most MAX_DECLARATIONS_BYTES of JSON, as the model
  reads them (name, description and schema of each, compact UTF-8).

The bounds keep what a caller puts into the prompt the LLM reads with every
request small: that prompt is paid for by the operator (a vendor's key, or
the GPU), with every request of the call. 32 functions of 16 KiB schemas each
were 380 KB of tools sent with each request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from kamepb import common_pb2

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_DESCRIPTION_CHARS = 1024
MAX_PARAMETERS_CHARS = 16384
# All of a call's declarations together, as JSON the model reads (declared_bytes).
MAX_DECLARATIONS_BYTES = 16384


class FunctionError(ValueError):
    """A declared function that cannot be offered; the message names it."""


@dataclass(frozen=True)
class DeclaredFunction:
    """A function as declared, checked: the model's view of it."""

    name: str
    description: str  # runs of whitespace as one space; may be empty
    parameters: dict[str, Any]  # the JSON Schema of its arguments (an object)


def check_functions(
    functions: Sequence[common_pb2.ClientFunction], max_count: int, field: str, service: str
) -> tuple[DeclaredFunction, ...]:
    """The functions, checked; FunctionError names the first problem. `field` and
    `service` say where the functions came from and whose max_count it is."""
    if len(functions) > max_count:
        raise FunctionError(
            f"{field}: {len(functions)} declared, at most {max_count} allowed "
            f"(the {service}'s max_client_functions)"
        )
    declared: list[DeclaredFunction] = []
    for index, function in enumerate(functions):
        # Not "functions[0]": the scrubbing of internal addresses takes [0] for IPv6.
        where = f"function #{index + 1}"
        if not NAME.fullmatch(function.name):
            raise FunctionError(
                f"{where}: the name must be 1-64 characters of A-Z a-z 0-9 _ -, "
                f"got {function.name[:80]!r}"
            )
        if any(earlier.name == function.name for earlier in declared):
            raise FunctionError(f"{where}: {function.name!r} is declared twice")
        description = " ".join(function.description.split())
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise FunctionError(
                f"{where}: the description may have at most {MAX_DESCRIPTION_CHARS} characters"
            )
        parameters = _parameters(where, function.parameters_json)
        declared.append(DeclaredFunction(function.name, description, parameters))
    total = sum(declared_bytes(function) for function in declared)
    if total > MAX_DECLARATIONS_BYTES:
        raise FunctionError(
            f"{field}: the declarations take {total} bytes of JSON together (names, "
            f"descriptions and parameters), at most {MAX_DECLARATIONS_BYTES} allowed"
        )
    return tuple(declared)


def declared_bytes(function: DeclaredFunction) -> int:
    """How many bytes of JSON the model reads for `function`: its name, description
    and parameters, compact, in UTF-8."""
    shown = {
        "name": function.name,
        "description": function.description,
        "parameters": function.parameters,
    }
    return len(json.dumps(shown, separators=(",", ":"), ensure_ascii=False).encode())


def _parameters(where: str, parameters_json: str) -> dict[str, Any]:
    """The JSON Schema of a function's arguments (empty: it takes none)."""
    if not parameters_json.strip():
        return {"type": "object", "properties": {}}
    if len(parameters_json) > MAX_PARAMETERS_CHARS:
        raise FunctionError(
            f"{where}: parameters_json may have at most {MAX_PARAMETERS_CHARS} characters, "
            f"got {len(parameters_json)}"
        )
    try:
        schema: Any = json.loads(parameters_json)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise FunctionError(f"{where}: parameters_json is not JSON ({exc})") from None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise FunctionError(
            f"{where}: parameters_json must be the JSON Schema of an object "
            '("type": "object" at its root)'
        )
    try:
        validator_for(schema).check_schema(schema)
    except (SchemaError, RecursionError) as exc:
        message = exc.message if isinstance(exc, SchemaError) else "nested too deep"
        raise FunctionError(
            f"{where}: parameters_json is not a valid JSON Schema ({message})"
        ) from None
    return schema
