"""Independent API calls made at once, a bounded number at a time (each thread waits on an API server)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def write_all(writes: list[Callable[[], None]], *, at_once: int, name: str) -> None:
    """Every call tried, `at_once` at a time; the first failure raised once all have ended (those that went
    through stand: the callers' handlers are level-triggered and do the rest next time)."""
    if not writes:
        return
    with ThreadPoolExecutor(min(len(writes), at_once), thread_name_prefix=name) as pool:
        failures = [f.exception() for f in [pool.submit(write) for write in writes]]
    for failure in failures:
        if failure is not None:
            raise failure
