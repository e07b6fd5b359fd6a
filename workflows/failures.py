"""How a workflow names an activity failure it waits out, for the Web UI's current details: the error type a
user can search for, then its message (the error vocabulary's messages name fields, never values)."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError


def describe_failure(failure: ActivityError) -> str:
    cause = failure.cause or failure
    if isinstance(cause, ApplicationError) and cause.type:
        return f"{failure.activity_type}: {cause.type}: {cause.message}"
    return f"{failure.activity_type}: {type(cause).__name__}: {cause}"
