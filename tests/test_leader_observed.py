"""What a replica knows of the pool's leader without leading (kube/lease.py LeaderElection.led): the pass
leaves new pods to the placer only while some replica leads. Driven with the Lease as the API server would
answer it; the election against a real API server is tests/test_leader.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.lease import LeaderElection
from models.settings import LeaderSettings

pytestmark = [pytest.mark.scaleout]


class _Leases:
    """One Lease as its API server answers it; every write of this replica is refused (another wrote first)."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] = {}
        self.version = 1

    def set(self, **spec: Any) -> None:
        self.spec, self.version = spec, self.version + 1

    def read_namespaced_lease(self, name: str, namespace: str, **_options: Any) -> urllib3.HTTPResponse:
        body = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.version)}, "spec": self.spec}
        return urllib3.HTTPResponse(body=json.dumps(body).encode())

    def replace_namespaced_lease(self, *_args: Any, **_options: Any) -> None:
        raise ApiException(status=409, reason="Conflict")


def test_a_follower_knows_a_leader_while_its_record_changes_and_none_once_released_or_stale(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("kube.lease.time.monotonic", lambda: clock[0])
    election = LeaderElection(k8s.ApiClient(), lease="pool", namespace="tidepool-system", identity="two",
                              settings=LeaderSettings(), on_started_leading=lambda: None,
                              on_stopped_leading=lambda: None)  # fmt: skip
    leases = _Leases()
    election._coordination = leases  # type: ignore[assignment]
    assert not election.led()  # nothing read yet

    leases.set(holderIdentity="one", leaseDurationSeconds=15)
    assert election._try_acquire_or_renew() is False and election.led()
    clock[0] += 10
    leases.set(holderIdentity="one", leaseDurationSeconds=15)  # renewed
    election._try_acquire_or_renew()
    clock[0] += 14
    assert election.led()  # 14 s since the renewal was seen
    clock[0] += 2
    assert not election.led()  # its record has not changed for its duration: the leader may be dead

    leases.set(holderIdentity="one", leaseDurationSeconds=15)
    election._try_acquire_or_renew()
    assert election.led()
    leases.set(holderIdentity=None, leaseDurationSeconds=1)  # released by a leader that stopped
    assert election._try_acquire_or_renew() is None  # it tried to take it, and another replica wrote first
    assert not election.led()
