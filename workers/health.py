"""A process's health probes, as controller-runtime's health probe endpoint: `/healthz` answers 200 while
the process runs, `/readyz` 200 once it serves (connected to Temporal, its Temporal worker polling) and 503
before and once it stops. The kubelet's readinessProbe reads `/readyz` (deploy/base, deploy/pool): the
metrics port, which the Temporal runtime opens before the client connects, would say Ready of a worker
about to fail its connection. HealthSettings.port; 0 serves no probe."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("tidepool.health")


class HealthProbes:
    def __init__(self, port: int, *, host: str = "0.0.0.0") -> None:  # noqa: S104 - the kubelet probes the pod IP
        self._ready = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        if port:
            self._server = ThreadingHTTPServer((host, port), self._handler())
            self._server.daemon_threads = True

    @property
    def port(self) -> int | None:
        """The port it listens on (the bound one when asked for 0 in tests); None when off."""
        return self._server.server_address[1] if self._server else None

    def start(self) -> HealthProbes:
        if self._server is not None:
            threading.Thread(target=self._server.serve_forever, name="health-probes", daemon=True).start()
            log.info("health probes on :%s (/healthz, /readyz)", self.port)
        return self

    def ready(self) -> None:
        self._ready.set()

    def stop(self) -> None:
        """Not ready any more, then closed: a stopping process leaves its Service's endpoints first."""
        self._ready.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        ready = self._ready

        class Probe(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/healthz":
                    self._answer(200, b"ok\n")
                elif self.path == "/readyz":
                    self._answer(*((200, b"ok\n") if ready.is_set() else (503, b"not ready\n")))
                else:
                    self._answer(404, b"/healthz or /readyz\n")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
                pass  # a probe every few seconds is no news

        return Probe
