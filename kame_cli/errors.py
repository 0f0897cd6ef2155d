"""How every `kame` command fails: one line on stderr that says what went wrong
and what to do, and a non-zero exit status.

A command raises `CliError` (or a subclass) with that line; `kame_cli.main`
catches it once, prints `kame COMMAND: message` and exits with its code.
Anything else that escapes a command is reported the same way, in one line,
with a hint to rerun with `kame --debug`, which shows the traceback instead.
`from_rpc_error` turns a failed gRPC call into the line a user can act on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kame_common.config import ConfigError

if TYPE_CHECKING:  # not at run time: `kame llm-server` (the llm image) has no gRPC
    import grpc

# Exit statuses: 1 = the command ran and failed, 2 = it was used wrongly
# (argparse uses 2 too), 130 = interrupted (Ctrl-C, as shells report it).
FAILED = 1
USAGE = 2
INTERRUPTED = 130

# Words gRPC puts in UNAVAILABLE details when the TLS handshake, not the
# connection, failed.
_TLS_WORDS = ("ssl", "tls", "handshake", "certificate", "peer name")
# ... and when the server hung up on the client: a TLS port spoken to in plaintext.
_CLOSED_WORDS = ("socket closed", "connection reset", "end of file")


class CliError(Exception):
    """A failure the user can act on; str(self) is the one line to print."""

    def __init__(self, message: str, exit_code: int = FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code(exc: Exception) -> int:
    """The exit status for an exception a command raised."""
    if isinstance(exc, CliError):
        return exc.exit_code
    return USAGE if isinstance(exc, ConfigError) else FAILED


def one_line(exc: Exception) -> str:
    """The line to print for an exception a command raised."""
    if isinstance(exc, CliError | ConfigError):
        return " ".join(str(exc).split())
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename} does not exist"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    text = " ".join(str(exc).split()) or "no details"
    return (
        f"unexpected {type(exc).__name__}: {text} (rerun as `kame --debug ...` for the traceback)"
    )


def file_error(path: object, what: str = "file") -> CliError:
    """The line for a file that is not there."""
    return CliError(f"{what} {path} does not exist", USAGE)


def from_rpc_error(
    code: grpc.StatusCode, details: str, address: str, service: str = "gateway"
) -> CliError:
    """The one line for a gRPC call to `service` at `address` that failed."""
    name = code.name
    details = " ".join((details or "").split())
    lowered = details.lower()
    if name == "UNAVAILABLE" and any(word in lowered for word in _TLS_WORDS):
        # The OpenSSL reason, without gRPC's wrapping around it.
        reason = details.rsplit("OPENSSL_internal:", 1)[-1].removesuffix(": OK")
        return CliError(
            f"TLS to the {service} at {address} failed ({reason}): check that it serves TLS, "
            "--ca-file names the CA that signed its certificate, and --tls-server-name the "
            "name on it"
        )
    if name == "UNAVAILABLE" and any(word in lowered for word in _CLOSED_WORDS):
        return CliError(
            f"the {service} at {address} closed the connection before answering: if it serves "
            "TLS, pass --ca-file (or --tls); otherwise check --gateway"
        )
    if name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and (
        "connect" in lowered or "deadline" in lowered or name == "DEADLINE_EXCEEDED"
    ):
        return CliError(
            f"{service} unreachable at {address}: is `kame up` running? "
            "(or pass --gateway HOST:PORT)"
        )
    if name == "UNAUTHENTICATED":
        return CliError(
            f"the {service} at {address} refused the credentials ({details}): set "
            "KAME_AUTH_TOKEN to one of its KAME_GATEWAY_AUTH_TOKENS"
        )
    if name == "PERMISSION_DENIED":
        return CliError(f"the {service} at {address} denied the request: {details}")
    return CliError(f"the {service} at {address} failed the call: {code.name}: {details}")
