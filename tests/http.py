"""A local HTTP server standing for another owner's server in tests of what a client does with its answers
(a tenant control plane that answers garbage, connections kept alive): not an API server, only answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonAnswers(BaseHTTPRequestHandler):
    """Answers every GET with `answer(path)` as JSON, quietly."""

    def answer(self, path: str) -> bytes:
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
        body = self.answer(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None: ...


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The server's URL while it serves."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
