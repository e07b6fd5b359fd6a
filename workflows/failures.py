"""How a workflow names an activity failure it waits out, for the Web UI's current details: the error type a
user can search for, then its message (the error vocabulary's messages name fields, never values)."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError


def describe_failure(failure: ActivityError) -> str:
    cause = failure.cause or failure
    kind = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
    return f"{failure.activity_type}: {kind}: {cause}"
