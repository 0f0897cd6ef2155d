"""Fixtures of the security tests: certificates on disk (tests/security/certs.py)
and a loopback HTTP server that records every request with its headers, to see
which key an LLM back-end would receive."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.security.certs import CertificateAuthority


@dataclass(frozen=True)
class Pki:
    """Files of one test PKI: a CA with a server and a client certificate, and
    an unrelated CA with a client certificate of its own."""

    folder: Path
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    ca_file: Path
    other_ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate signed by other_ca
    stranger_key: Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other_ca = CertificateAuthority("kame test CA"), CertificateAuthority("unrelated CA")
    server_cert, server_key = ca.server().write(folder, "server")
    client_cert, client_key = ca.client().write(folder, "client")
    stranger_cert, stranger_key = other_ca.client("stranger").write(folder, "stranger")
    return Pki(
        folder=folder,
        ca=ca,
        other_ca=other_ca,
        ca_file=ca.write(folder, "ca"),
        other_ca_file=other_ca.write(folder, "other-ca"),
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        stranger_cert=stranger_cert,
        stranger_key=stranger_key,
    )


@dataclass(frozen=True)
class CapturedRequest:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class CaptureServer:
    """HTTP on loopback standing in for an LLM API (OpenAI and Anthropic paths):
    it records method, path and headers of every request. GET .../models lists
    one model; chat completions stream one short answer; anything else is 404."""

    requests: list[CapturedRequest] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet test output
                pass

            def _record(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                self.rfile.read(length)
                capture.requests.append(
                    CapturedRequest(
                        self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
                    )
                )

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._record()
                if self.path.split("?")[0].endswith("/models"):
                    models = {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}
                    self._send(200, "application/json", json.dumps(models).encode())
                else:
                    self._send(404, "application/json", b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:
                self._record()
                if self.path.endswith("/chat/completions"):
                    chunk = {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": "stub-model",
                        "choices": [{"index": 0, "delta": {"content": "Paris. "}}],
                    }
                    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                    self._send(200, "text/event-stream", body)
                else:
                    self._send(404, "application/json", b'{"error": {"message": "not found"}}')

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def headers_seen(self) -> list[str]:
        """Every header value of every request, for a search for a key."""
        return [value for request in self.requests for value in request.headers.values()]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def capture():
    server = CaptureServer()
    server.start()
    yield server
    server.close()
