"""The provider's watch on its foreign Advertisement, without a cluster: what it tells the workflow, and
how it retries a foreign cluster it cannot reach."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from kube.clients import SecretClients
from kube.streams import StatusError, list_then_watch
from models.api.common import SecretReference
from models.names import SPARE_CAPACITY_ANNOTATION
from models.peering import backoff_seconds
from models.resources import Resources
from workers.decision_watch import DecisionWatch

pytestmark = [pytest.mark.provider, pytest.mark.steady]
REF = SecretReference(name="tidepool-peer-b", namespace="tidepool-system")


class _Secrets(SecretClients):
    def __init__(self) -> None:
        self.reachable = False
        self.lookups = 0

    def get(self, *, name: str, namespace: str, key: str = "kubeconfig") -> k8s.ApiClient:
        self.lookups += 1
        if not self.reachable:
            raise ApplicationError(f"Secret {namespace}/{name} does not exist", type="MissingCredentials")
        return k8s.ApiClient()


def _watch(secrets: SecretClients, changes: list[int]) -> DecisionWatch:
    return DecisionWatch(foreign_cluster_id="b", kube_config_ref=REF, advertisement="advertisement-a",
                         secrets=secrets, on_change=lambda: changes.append(1), backoff_max_seconds=40)  # fmt: skip


def _ad(ttl: str, **status: str) -> dict[str, Any]:
    return {"metadata": {"name": "advertisement-a"}, "spec": {"timeToLive": ttl}, "status": status}


def test_the_workflow_is_told_of_a_decision_not_of_a_ttl_refresh() -> None:
    changes: list[int] = []
    watch = _watch(_Secrets(), changes)
    watch._sync([])  # nothing there yet: what the workflow assumes before its first push
    assert changes == []
    watch._event("ADDED", _ad("12:30"))  # the first push
    watch._event("MODIFIED", _ad("12:40"))  # the next push renews the TTL
    watch._event("MODIFIED", _ad("12:50", vkCreated="true"))  # status the peering does not read
    assert len(changes) == 1
    watch._event("MODIFIED", _ad("12:50", phase="Accepted"))
    assert len(changes) == 2
    watch._sync([_ad("13:00", phase="Accepted")])  # a relist that finds the same decision
    assert len(changes) == 2
    watch._event("MODIFIED", _ad("13:00", phase="Accepted", reason="ManuallyAccepted"))  # the details show it
    assert len(changes) == 3
    watch._event("DELETED", _ad("13:00", phase="Accepted"))
    assert len(changes) == 4


def test_a_change_whose_signal_did_not_get_through_is_told_again_at_the_next_event_or_relist() -> None:
    changes: list[int] = []
    watch = _watch(_Secrets(), changes)
    watch._event("ADDED", _ad("12:30", phase="Accepted"))
    watch.forget()  # Temporal did not take the signal
    watch._event("MODIFIED", _ad("12:40", phase="Accepted"))  # only a TTL refresh, but the news is still untold
    assert len(changes) == 2
    watch._sync([_ad("12:50", phase="Accepted")])  # told now: a relist of the same decision is quiet again
    assert len(changes) == 2


class _Endpoint:
    """A foreign API server as the stream sees it: one list, then watches that each tell one event and end
    as the script says."""

    def __init__(self, watches: list[str]) -> None:
        self.watches = watches  # per watch: "refused" (not taken), "gone" (410 after one event) or "ends"
        self.lists = 0

    async def list(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "1"}, "items": [_ad("12:30")]}

    async def watch(self, path: str, params: dict[str, str], on_open: Any) -> AsyncIterator[tuple[str, Any]]:
        how = self.watches.pop(0) if self.watches else "hang"
        if how == "refused":
            raise StatusError(403, "Forbidden")
        on_open()
        yield "MODIFIED", _ad("12:40", phase="Accepted")
        if how == "gone":
            raise StatusError(410, "Gone")
        if how == "hang":
            await asyncio.Event().wait()


async def test_an_unreachable_foreign_cluster_is_retried_with_backoff_and_its_credentials_looked_up_each_time() -> None:
    lookups: list[str] = []
    waits: list[int] = []
    events: list[str] = []
    syncs: list[int] = []
    endpoint = _Endpoint(["gone", "refused", "ends"])

    async def current() -> Any:
        lookups.append("lookup")
        if len(lookups) <= 5:
            raise ApplicationError("Secret tidepool-system/tidepool-peer-b does not exist", type="MissingCredentials")
        return endpoint

    async def back_off(failures: int) -> None:
        waits.append(backoff_seconds(failures, ceiling=40))

    stream = asyncio.create_task(list_then_watch(
        "decision-b", current, "/apis/x", {}, on_sync=lambda items: syncs.append(len(items)),
        on_event=lambda kind, obj: events.append(kind), on_failure=back_off, lists=asyncio.Semaphore(1),
    ))  # fmt: skip
    while endpoint.watches or len(events) < 3:
        await asyncio.sleep(0.01)
    stream.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stream
    # Five lists failed (doubling up to the ceiling); then a watch that expired (410) is listed again at once;
    # a watch the server refused is a failure and waits; one that ends is opened again without a list.
    assert waits == [5, 10, 20, 40, 40, 5]
    assert endpoint.lists == 3 and syncs == [1, 1, 1]
    assert events == ["MODIFIED"] * 3
    # The credentials are looked up before every list and every watch.
    assert len(lookups) == 5 + endpoint.lists + 4


def test_every_push_seen_hands_its_spare_capacity_on_whichever_replica_pushed_it_and_nothing_wakes() -> None:
    changes: list[int] = []
    baselines: list[Resources] = []
    watch = DecisionWatch(foreign_cluster_id="b", kube_config_ref=REF, advertisement="advertisement-a",
                          secrets=_Secrets(), on_change=lambda: changes.append(1), backoff_max_seconds=40,
                          on_pushed=baselines.append)  # fmt: skip

    def pushed(ttl: str, spare: str | None) -> dict[str, Any]:
        ad = _ad(ttl, phase="Accepted")
        if spare is not None:
            ad["metadata"]["annotations"] = {SPARE_CAPACITY_ANNOTATION: spare}
        return ad

    watch._sync([pushed("12:30", '{"cpu": "3500m", "memory": "6Gi"}')])
    watch._event("MODIFIED", pushed("12:40", '{"cpu": "3", "memory": "6Gi"}'))
    watch._event("MODIFIED", pushed("12:50", None))  # a provider release before the annotation: nothing to take
    watch._event("MODIFIED", pushed("13:00", '{"cpu": "lots"}'))  # unreadable: ignored, not fatal
    watch._event("DELETED", pushed("13:00", '{"cpu": "1"}'))
    assert baselines == [Resources(cpu="3500m", memory="6Gi"), Resources(cpu="3", memory="6Gi")]
    assert len(changes) == 2  # the first list's decision and the deletion: pushes alone wake no workflow
