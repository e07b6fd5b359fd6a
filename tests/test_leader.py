"""Leader election among a worker's replicas (kube/lease.py), on a real API server: one leads at a time,
a graceful stop hands over within a retry period, a replica that dies without a word is replaced once
its lease duration has passed, and a restarted replica with its old identity takes its Lease back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from kube.lease import LeaderElection
from models.names import SYSTEM_NAMESPACE
from models.settings import LeaderSettings
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.scaleout]

FAST = LeaderSettings(lease_duration_seconds=4, renew_deadline_seconds=3, retry_period_seconds=0.5)


class Replica:
    """One elector and a log of when it led: started and stopped times, and whether two led at once."""

    def __init__(self, api: k8s.ApiClient, lease: str, identity: str, leaders: set[str], overlaps: list[str]) -> None:
        self.identity, self.started, self.stopped = identity, 0, 0
        self._leaders, self._overlaps, self._lock = leaders, overlaps, threading.Lock()
        self.election = LeaderElection(api, lease=lease, namespace=SYSTEM_NAMESPACE, identity=identity, settings=FAST,
                                       on_started_leading=self._start, on_stopped_leading=self._stop)  # fmt: skip

    def _start(self) -> None:
        self.started += 1
        if self._leaders:
            self._overlaps.append(f"{self.identity} started while {sorted(self._leaders)} led")
        self._leaders.add(self.identity)

    def _stop(self) -> None:
        self.stopped += 1
        self._leaders.discard(self.identity)

    def die(self) -> None:
        """As kill -9 would: no callback, no release; the thread is left to stop quietly."""
        self.election._on_stopped = lambda: None
        self.election._release = lambda: None  # type: ignore[method-assign]  # a dead process releases nothing
        self._leaders.discard(self.identity)
        self.election.stop()


class Election:
    """Replicas of one worker on one Lease of a cluster of their own, and what they saw."""

    def __init__(self, api: k8s.ApiClient, lease: str) -> None:
        self.api, self.lease = api, lease
        self.leaders: set[str] = set()
        self.overlaps: list[str] = []

    def replica(self, identity: str) -> Replica:
        return Replica(self.api, self.lease, identity, self.leaders, self.overlaps)


def _holder(api: k8s.ApiClient, lease: str) -> str | None:
    holder: str | None = k8s.CoordinationV1Api(api).read_namespaced_lease(lease, SYSTEM_NAMESPACE).spec.holder_identity
    return holder


async def test_one_replica_leads_and_the_other_takes_over_when_it_stops_or_dies(
    make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    election = Election(make_cluster("leases").api_client(), f"tidepool-worker-{unique}")
    api, lease = election.api, election.lease
    one, two = election.replica("one"), election.replica("two")
    one.election.start()
    assert await eventually(lambda: one.election.is_leader(), timeout=10, what="the first replica leads")
    two.election.start()
    await asyncio.sleep(FAST.lease_duration_seconds * 2)  # two renewals' worth of chances for the second to cut in
    assert (one.election.is_leader(), two.election.is_leader(), _holder(api, lease)) == (True, False, "one")
    assert (one.election.led(), two.election.led()) == (True, True)  # each knows a replica leads: the pass waits

    # A graceful stop releases the Lease: the other leads within a retry period or two, not a lease duration.
    stopped_at = time.monotonic()
    one.election.stop()
    assert one.stopped == 1 and not one.election.is_leader()
    await eventually(lambda: two.election.is_leader(), timeout=10, what="the second replica leads")
    handover = time.monotonic() - stopped_at
    assert handover < FAST.lease_duration_seconds, f"a released Lease was waited out: {handover:.1f} s"
    assert _holder(api, lease) == "two"

    # A replica that dies holding the Lease is replaced once the lease duration has passed, not before.
    three = election.replica("three")
    three.election.start()
    died_at = time.monotonic()
    two.die()
    await eventually(lambda: three.election.is_leader(), timeout=FAST.lease_duration_seconds + 10,
                     what="the third replica leads")  # fmt: skip
    waited = time.monotonic() - died_at
    assert waited >= FAST.lease_duration_seconds - FAST.retry_period_seconds, f"took a live Lease after {waited:.1f} s"

    # The dead replica restarted under its identity (a pod's container) is a candidate like any other.
    lease_object = k8s.CoordinationV1Api(api).read_namespaced_lease(lease, SYSTEM_NAMESPACE)
    assert lease_object.spec.lease_transitions == 2  # one → two → three
    three.election.stop()
    assert election.overlaps == [] and election.leaders == set()


async def test_a_restarted_replica_takes_its_own_lease_back_at_once(
    make_cluster: Callable[[str], LocalCluster], unique: str
) -> None:
    election = Election(make_cluster("leases-restart").api_client(), f"tidepool-worker-{unique}")
    before = election.replica("pod-0")
    before.election.start()
    assert await eventually(lambda: before.election.is_leader(), timeout=10, what="pod-0 leads")
    before.die()
    after = election.replica("pod-0")
    restarted_at = time.monotonic()
    after.election.start()
    await eventually(lambda: after.election.is_leader(), timeout=10, what="pod-0 leads again")
    assert time.monotonic() - restarted_at < FAST.lease_duration_seconds / 2
    after.election.stop()
    assert _holder(election.api, election.lease) is None  # released
    assert election.overlaps == []
