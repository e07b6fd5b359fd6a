"""How a workflow names an activity failure it waits out, for the Web UI's current details: the error type a
user can search for, then its message (the error vocabulary's messages name fields, never values). And how
it tries the other cluster again after a forced unpeer, until what it left there expires."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

T = TypeVar("T")

# After a forced unpeer, the other cluster is tried one quick attempt at a time (ONE_ATTEMPT, within
# OTHER_SIDE_TIMEOUT), every OTHER_SIDE_RETRY_FIRST doubling to OTHER_SIDE_RETRY_MAX, while the last
# Advertisement could live there; past that, that side's TTL and keepalive clean it.
OTHER_SIDE_RETRY_FIRST = timedelta(seconds=15)
OTHER_SIDE_RETRY_MAX = timedelta(minutes=5)
OTHER_SIDE_TIMEOUT = timedelta(seconds=30)
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
# Marks the histories where a refusal is tried again once before it is believed (0.1.0 believed the first).
REFUSAL_CONFIRMED = "refusal-confirmed"


def describe_failure(failure: ActivityError) -> str:
    cause = failure.cause or failure
    if isinstance(cause, ApplicationError) and cause.type:
        return f"{failure.activity_type}: {cause.type}: {cause.message}"
    return f"{failure.activity_type}: {type(cause).__name__}: {cause}"


class GaveUp:
    """The other side was not cleaned: a failure no retry helps (non-retryable, as a 401 or 403 when it
    refuses our credentials), or it stayed out of reach until the deadline. `failure` is the last one, as
    describe_failure tells it."""

    # A plain class: the sandbox runs this module again for every new run, and a dataclass costs more to make.
    __slots__ = ("failure", "non_retryable", "stopped", "until")

    def __init__(self, failure: str, *, non_retryable: bool, until: datetime, stopped: bool = False) -> None:
        self.failure, self.non_retryable, self.until, self.stopped = failure, non_retryable, until, stopped

    def not_reached(self) -> str:
        """What the details say of a side that stayed out of reach (the caller adds who cleans it now)."""
        return (f"not reached before its Advertisement expired ({self.until:%Y-%m-%d %H:%M:%S} UTC; last failure: "
                f"{self.failure})")  # fmt: skip


async def until_expired(attempt: Callable[[], Awaitable[T]], *, until: datetime, retrying: Callable[[str], None],
                        summary: str, between: Callable[[], None] = lambda: None,
                        stop: Callable[[], bool] = lambda: False) -> T | GaveUp:  # fmt: skip
    """`attempt` (an activity of ONE_ATTEMPT) at once, then again after each retryable failure, backing off,
    until it succeeds, fails for good (a non-retryable failure, said again after the first wait), or `until`
    has passed. `retrying` is told each failure waited out (for the current details); `between` runs after
    each wait (a loop of thousands of retries continues as new there); `stop` ends a wait, and the attempts,
    at once (GaveUp.stopped: someone peered again meanwhile)."""
    backoff, refused_before = OTHER_SIDE_RETRY_FIRST, False
    while True:
        try:
            return await attempt()
        except ActivityError as e:
            failure, left = describe_failure(e), until - workflow.now()
            if isinstance(e.cause, ApplicationError) and e.cause.non_retryable:
                # An API server just started answers 403 until its RBAC cache has synced (kubernetes#121635),
                # and a cluster back from an outage is just that: a refusal is believed once said twice.
                if refused_before or left <= timedelta(0) or not workflow.patched(REFUSAL_CONFIRMED):
                    return GaveUp(failure, non_retryable=True, until=until)
                refused_before = True
            if left <= timedelta(0):
                return GaveUp(failure, non_retryable=False, until=until)
            if stop():
                return GaveUp(failure, non_retryable=False, until=until, stopped=True)
            retrying(failure)
            try:
                await workflow.wait_condition(stop, timeout=min(backoff, left), timeout_summary=summary)
            except TimeoutError:
                pass
            if stop():
                return GaveUp(failure, non_retryable=False, until=until, stopped=True)
            backoff = min(backoff * 2, OTHER_SIDE_RETRY_MAX)
            between()
