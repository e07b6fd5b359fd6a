"""How the thread-based programs (network module, syncer, virtual kubelet, kubelet stand-in) live as
processes: they run informers in threads and block the main thread until they are told to stop."""

from __future__ import annotations

import signal
import threading


def wait_for_termination() -> None:
    """Blocks until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
