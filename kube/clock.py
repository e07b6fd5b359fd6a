"""The one clock of tidepool's processes and activities: aware UTC, to the microsecond. Workflows read
workflow.now() instead (replay must see the same time); pure decisions in models/ take `now` as a parameter.
Modules call it as `utcnow()` after `from kube.clock import utcnow`, so that a test can set a module's clock
with monkeypatch.setattr(module, "utcnow", ...)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
