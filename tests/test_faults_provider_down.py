"""A provider's API server stopped for longer than a cycle (kwokctl stops the whole control plane of the
provider cluster, data kept), with a 10 s advertisement period.

The peering must say so (current details and the PeeringPhase search attribute: Unreachable) and recover
on the first cycle after the API server is back; the consumer must not tear down while the Advertisement's
TTL has not passed, and must once it has.

The consumer here runs no virtual kubelet, so its keepalive (a virtual node reporting ProviderUnreachable
for keepalive.thresholdFailures × retrySeconds) is out of play: that is the documented other path to a
teardown, and with a virtual kubelet it comes first whenever it is shorter than the TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, start_cluster, stop_cluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.consumer import AdvertisementState
from models.names import (
    ADVERTISEMENTS,
    SYSTEM_NAMESPACE,
    advertisement_name,
    advertisement_workflow_id,
    peering_workflow_id,
)
from models.peering import PeeringStatus, WithdrawResult
from tests.faults import failed_workflow_tasks
from tests.kube import apply_cluster_config, create_namespace, create_node
from tests.replay import run_histories
from tests.running import eventually, running_worker, worker_settings
from workers.peer import request_peering
from workflows.advertisement import AdvertisementWorkflow
from workflows.peering import PeeringWorkflow
from workflows.search_attributes import PEERING_PHASE

pytestmark = [pytest.mark.env, pytest.mark.faults]

PERIOD = 10  # seconds: one cycle
TTL = 45  # seconds: long enough that a short outage (and the recovery push) fits inside it
SHORT_OUTAGE = 15  # seconds: longer than a cycle, shorter than what is left of the TTL
# The first push after the API server is back comes within a cycle; the push itself, and scheduling it on a
# busy machine, take a few seconds more.
PUSH_SLACK = 8


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _advertisement(pair: dict[str, Any]) -> dict[str, Any] | None:
    return read_cluster_object(pair["consumer"].api_client(), ADVERTISEMENTS, advertisement_name(pair["provider_id"]))


def _teardown_began(obj: dict[str, Any] | None) -> datetime | None:
    """When the consumer began tearing the Advertisement down (its deletion, or the Deleting phase, which
    carries no time: now), or None while it has not."""
    if obj is None:
        return datetime.now(UTC)
    if obj["metadata"].get("deletionTimestamp"):
        return _parse(obj["metadata"]["deletionTimestamp"])
    return datetime.now(UTC) if (obj.get("status") or {}).get("phase") == "Deleting" else None


def _no_teardown_before(pair: dict[str, Any], expires: datetime) -> None:
    """The invariant, checked while waiting: an assertion, so that `eventually` fails on it at once."""
    began = _teardown_began(_advertisement(pair))
    # A deletionTimestamp has whole seconds: compare in whole seconds.
    assert began is None or began >= expires.replace(microsecond=0), f"teardown began at {began}, before the TTL ({expires})"


async def _hold(invariant: Callable[[], None], seconds: float) -> None:
    """Checks `invariant` every half second for `seconds`: the test fails the moment it breaks."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        invariant()
        if asyncio.get_running_loop().time() >= deadline:
            return
        await asyncio.sleep(0.5)


async def _details(handle: WorkflowHandle[Any, Any]) -> str:
    """The current details, as the Web UI reads them."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)


async def _first_push_after(client: Client, workflow_id: str, moment: datetime) -> datetime | None:
    """When the first push that succeeded after `moment` completed (from the workflow's histories)."""
    for history in await run_histories(client, workflow_id):
        pushes = {e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                  and e.activity_task_scheduled_event_attributes.activity_type.name == "push_advertisement"}  # fmt: skip
        for event in history.events:
            if (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                    and event.activity_task_completed_event_attributes.scheduled_event_id in pushes):  # fmt: skip
                completed = event.event_time.ToDatetime(tzinfo=UTC)
                if completed >= moment:
                    return completed
    return None


@pytest.mark.timeout(480)  # making the two clusters included
async def test_a_stopped_provider_api_server_shows_as_unreachable_recovers_next_cycle_and_expires_only_after_ttl(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str
) -> None:
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    pair: dict[str, Any] = {"consumer": consumer, "provider_id": f"prov-{unique}"}
    consumer_id = f"cons-{unique}"
    binaries, workdir = ensure_binaries(), Path(localenv.state_dir) / "kwok"
    create_node(provider.api_client(), "big", cpu="8", memory="16Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50, "advertisementPeriodSeconds": PERIOD,
                                                          "advertisementTimeToLiveSeconds": TTL})  # fmt: skip
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    request_peering(provider.api_client(), consumer.api_client(), provider_id=pair["provider_id"], consumer_id=consumer_id)
    peering: WorkflowHandle[PeeringWorkflow, WithdrawResult] = temporal_client.get_workflow_handle_for(
        PeeringWorkflow.run, peering_workflow_id(pair["provider_id"], consumer_id))
    lifecycle: WorkflowHandle[AdvertisementWorkflow, AdvertisementState] = temporal_client.get_workflow_handle_for(
        AdvertisementWorkflow.run, advertisement_workflow_id(consumer_id, pair["provider_id"]))

    async def phase() -> str | None:
        return (await peering.describe()).typed_search_attributes.get(PEERING_PHASE)

    async def status() -> PeeringStatus:
        return await peering.query(PeeringWorkflow.status)

    async with (running_worker(worker_settings(localenv, provider, pair["provider_id"])),
                running_worker(worker_settings(localenv, consumer, consumer_id))):  # fmt: skip
        await eventually(lambda: ((_advertisement(pair) or {}).get("status") or {}).get("phase") == "Accepted",
                         timeout=60, what="the Advertisement accepted")  # fmt: skip
        await eventually(lambda: _is(phase(), "Accepted"), timeout=60, what="the peering Accepted")

        # 1. An outage longer than a cycle, shorter than the TTL: no teardown at any moment of it.
        adv = _advertisement(pair)
        assert adv is not None
        first_expiry = _parse(adv["spec"]["timeToLive"])
        stop_cluster(provider.name, binaries=binaries, workdir=workdir)
        stopped = datetime.now(UTC)

        async def unreachable() -> bool:
            _no_teardown_before(pair, first_expiry)
            return await _is(phase(), "Unreachable")

        await eventually(unreachable, timeout=30, what="PeeringPhase Unreachable")
        details = await _details(peering)
        assert "phase **Unreachable**" in details and "last error" in details, details
        assert (await status()).last_error
        remaining = max(timedelta(0), stopped + timedelta(seconds=SHORT_OUTAGE) - datetime.now(UTC))
        await _hold(lambda: _no_teardown_before(pair, first_expiry), remaining.total_seconds())
        adv = _advertisement(pair)
        assert adv is not None and adv["status"]["phase"] == "Accepted" and not adv["metadata"].get("deletionTimestamp")
        assert datetime.now(UTC) < _parse(adv["spec"]["timeToLive"]), "the outage outlived the TTL: lengthen TTL"
        assert (await lifecycle.query(AdvertisementWorkflow.status)).teardown is None

        starting = datetime.now(UTC)
        start_cluster(provider, binaries=binaries, workdir=workdir)
        back = datetime.now(UTC)

        async def recovered() -> bool:
            _no_teardown_before(pair, first_expiry)
            return await _is(phase(), "Accepted")

        await eventually(recovered, timeout=PERIOD + PUSH_SLACK + 30, what="the peering recovered")
        await _recovered_within_a_cycle(temporal_client, peering.id, starting, back)
        assert "last error" not in await _details(peering)
        assert (await lifecycle.query(AdvertisementWorkflow.status)).teardown is None  # never torn down

        # 2. An outage that outlives the TTL: the consumer tears down once it has passed, not before.
        stop_cluster(provider.name, binaries=binaries, workdir=workdir)
        adv = _advertisement(pair)
        assert adv is not None
        expires = _parse(adv["spec"]["timeToLive"])

        def torn_down() -> bool:
            _no_teardown_before(pair, expires)  # fails the test at once, not retried
            return _teardown_began(_advertisement(pair)) is not None

        await eventually(torn_down, timeout=TTL + 30, interval=0.5, what="the teardown after the TTL")
        state = await asyncio.wait_for(lifecycle.result(), timeout=60)
        assert state.teardown == "Expired"
        assert min(state.deleted.values()) >= expires
        starting = datetime.now(UTC)
        start_cluster(provider, binaries=binaries, workdir=workdir)
        back = datetime.now(UTC)
        # The provider's next push puts a fresh Advertisement there; the consumer accepts it anew.
        await eventually(lambda: ((_advertisement(pair) or {}).get("status") or {}).get("phase") == "Accepted",
                         timeout=PERIOD + PUSH_SLACK + 60, what="a fresh Advertisement accepted")  # fmt: skip
        await eventually(lambda: _is(phase(), "Accepted"), timeout=60, what="the peering Accepted again")
        await _recovered_within_a_cycle(temporal_client, peering.id, starting, back)
    stuck = []
    for workflow_id in (peering.id, lifecycle.id):
        stuck += await failed_workflow_tasks(temporal_client, workflow_id)
    assert stuck == []


async def _recovered_within_a_cycle(client: Client, workflow_id: str, starting: datetime, back: datetime) -> None:
    """The first push that succeeded since the API server was being started came at most a cycle after it
    served again (`back`, when start_cluster saw it serve: a push may even beat that)."""
    pushed = await eventually(lambda: _first_push_after(client, workflow_id, starting),
                              timeout=PERIOD + PUSH_SLACK + 30, what="a push that succeeded since the API server is back")  # fmt: skip
    assert pushed - back <= timedelta(seconds=PERIOD + PUSH_SLACK), (
        f"the first push after recovery succeeded {pushed - back} after the API server was back: more than a "
        f"cycle ({PERIOD} s, + {PUSH_SLACK} s for the push itself); since it was being started:\n"
        + await _events_since(client, workflow_id, starting)
    )


async def _events_since(client: Client, workflow_id: str, moment: datetime) -> str:
    """The histories after `moment`, a line an event: what the assertion's reader needs to see why."""
    lines = []
    for history in await run_histories(client, workflow_id):
        lines.append(f"run {history.run_id}:")
        for event in history.events:
            at = event.event_time.ToDatetime(tzinfo=UTC)
            if at < moment:
                continue
            line = f"  {at:%H:%M:%S.%f} {EventType.Name(event.event_type).removeprefix('EVENT_TYPE_')}"
            if event.HasField("activity_task_started_event_attributes"):
                line += f" attempt {event.activity_task_started_event_attributes.attempt}"
            if event.HasField("activity_task_failed_event_attributes"):
                line += f": {event.activity_task_failed_event_attributes.failure.message[:200]}"
            if event.HasField("timer_started_event_attributes"):
                line += f" {event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()}"
            lines.append(line)
    return "\n".join(lines)


async def _is(value: Awaitable[object], expected: str) -> bool:
    return await value == expected
