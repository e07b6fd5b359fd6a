"""The one time codec: times on the wire are RFC 3339 in UTC, written the way the API server writes them, and
read leniently, because another cluster (or a person with kubectl) may have written them. Every module that
reads or writes a time in an object, an annotation, a message or a query goes through here; the clock is
elsewhere (kube/clock.py for processes and activities, workflow.now() in workflows)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import BeforeValidator


def format_rfc3339(moment: datetime) -> str:
    """A time as Kubernetes writes a Time (seconds, UTC, `Z`). A time without a zone is taken as UTC."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """A time as Kubernetes writes a MicroTime (a Lease's renewTime) and Temporal's visibility reads it."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: object) -> datetime | None:
    """The time `value` says, or None for anything that is not one: a missing field, a number, garbage, or a
    time without a zone, which cannot be compared with an aware now. Accepts what format_rfc3339 and
    format_micro_time write, Python's isoformat, and a datetime a model has parsed already."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)  # reads a trailing Z since Python 3.11
        except ValueError:
            return None
    else:
        return None
    return parsed if parsed.tzinfo is not None else None


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _zoned_time(value: object) -> datetime:
    moment = parse_rfc3339(value)
    if moment is None:
        shown = repr(value)[:64] if isinstance(value, str | datetime | None) else type(value).__name__
        raise ValueError(f"must be an RFC 3339 time with a zone, got {shown}")
    return moment


# A pydantic field type for a time another cluster writes: what parse_rfc3339 reads, nothing else (no number
# of seconds, no time without a zone, which could not be compared with one that has a zone).
ZonedTime = Annotated[datetime, BeforeValidator(_zoned_time)]
