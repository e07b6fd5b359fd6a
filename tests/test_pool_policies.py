"""The pool's policies end to end on real clusters of the test's own (issue 16 items 4 and 5): grow, shrink,
edit and clear of a placement, a changed slice refused, `pack` from the ClusterConfig and from the
namespace's annotation, a mandatory placement on a stopped cluster that waits for it. What is asserted is
the placement and the namespace's copies in the super clusters; moving pods is tests/test_pool_failover.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes import client as k8s

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from models.names import (
    MANDATORY_ANNOTATION,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POLICY_ANNOTATION,
    SCHEDULED_ANNOTATION,
    SLICE_ANNOTATION,
    super_cluster_namespace,
)
from tests.pool import Pool, running_pool
from tests.running import eventually

pytestmark = [pytest.mark.env, pytest.mark.pool, pytest.mark.failover]
# A probe's request timeout is min(5 s, interval): 5 s keeps a slow answer on a loaded machine a success.
PROBE_SECONDS, GRACE_SECONDS = 5, 6
SLICE = '{"cpu": "1", "memory": "2Gi"}'  # each super cluster holds 4


@pytest.fixture
async def pool(localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str) -> AsyncIterator[Pool]:
    async with running_pool(localenv, make_cluster, unique, grace_seconds=GRACE_SECONDS,
                            probe_seconds=PROBE_SECONDS) as running:
        yield running


def _namespace(pool: Pool, name: str, *, slices: int, **annotations: str) -> None:
    pool.core.create_namespace(k8s.V1Namespace.model_validate(
        {"metadata": {"name": name, "annotations": {SLICE_ANNOTATION: SLICE, **annotations}}}))
    _quota(pool, name, slices=slices, create=True)


def _quota(pool: Pool, name: str, *, slices: int, create: bool = False) -> None:
    hard = {"cpu": str(slices), "memory": f"{2 * slices}Gi"}
    if create:
        pool.core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate(
            {"metadata": {"name": "quota"}, "spec": {"hard": hard}}))
    else:
        pool.core.patch_namespaced_resource_quota("quota", name, {"spec": {"hard": hard}})


def _annotations(pool: Pool, name: str) -> dict[str, str]:
    return pool.core.read_namespace(name).metadata.annotations or {}


def _placement(pool: Pool, name: str) -> dict[str, int]:
    placement: dict[str, int] = json.loads(_annotations(pool, name).get(PLACEMENTS_ANNOTATION) or "{}")
    return placement


def _reason(pool: Pool, name: str) -> str | None:
    status = _annotations(pool, name).get(PLACEMENT_STATUS_ANNOTATION)
    return json.loads(status)["reason"] if status else None


def _copies(pool: Pool, name: str, among: tuple[str, ...] | None = None) -> set[str]:
    """The super clusters (of `among`, else all) that hold the namespace's copy."""
    return {cluster for cluster, c in pool.supers.items() if among is None or cluster in among
            if super_cluster_namespace("t1", name) in {n.metadata.name for n in k8s.CoreV1Api(c.api_client()).list_namespace().items
                                if not n.metadata.deletion_timestamp}}  # fmt: skip


async def _settled(pool: Pool, name: str, slices: int) -> dict[str, int]:
    """The placement once it holds `slices` and every cluster of it holds the namespace's copy."""
    def placed() -> dict[str, int] | None:
        placement = _placement(pool, name)
        return placement if sum(placement.values()) == slices and set(placement) <= _copies(pool, name) else None

    placement: dict[str, int] = await eventually(placed, timeout=90, what=f"{name} placed as {slices} slices, copied")
    return placement


async def test_a_grown_quota_adds_slices_and_a_shrunk_one_gives_them_back(pool: Pool) -> None:
    _namespace(pool, "grow", slices=2)
    first = await _settled(pool, "grow", 2)
    _quota(pool, "grow", slices=6)
    grown = await _settled(pool, "grow", 6)
    assert all(grown[c] >= n for c, n in first.items())  # what was placed stays where it is
    _quota(pool, "grow", slices=1)
    shrunk = await _settled(pool, "grow", 1)
    assert sum(shrunk.values()) == 1 and set(shrunk) <= set(grown)


async def test_a_users_edit_stays_mandatory_and_a_clear_reschedules(pool: Pool) -> None:
    _namespace(pool, "edit", slices=2)
    assert await _settled(pool, "edit", 2) == {"s1": 1, "s2": 1}  # spread
    pool.core.patch_namespace("edit", {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: '{"s2": 2}'}}})
    await eventually(lambda: _annotations(pool, "edit").get(MANDATORY_ANNOTATION), timeout=60,
                     what="the edit honoured")  # fmt: skip
    annotations = _annotations(pool, "edit")
    assert (annotations[PLACEMENTS_ANNOTATION], annotations[SCHEDULED_ANNOTATION], annotations[MANDATORY_ANNOTATION]) == (
        '{"s2": 2}', '{"s2": 2}', '{"s2": 2}')  # fmt: skip
    assert "s2" in _copies(pool, "edit")

    _quota(pool, "edit", slices=3)  # a new pass keeps the user's entries and schedules the rest
    grown = await _settled(pool, "edit", 3)
    assert grown["s2"] >= 2 and _annotations(pool, "edit")[MANDATORY_ANNOTATION] == '{"s2": 2}'

    pool.core.patch_namespace("edit", {"metadata": {"annotations": {PLACEMENTS_ANNOTATION: None}}})
    await eventually(lambda: MANDATORY_ANNOTATION not in _annotations(pool, "edit"), timeout=60,
                     what="the clear rescheduled")  # fmt: skip
    assert sum((await _settled(pool, "edit", 3)).values()) == 3


async def test_a_slice_changed_after_placement_is_refused_and_the_placement_stays(pool: Pool) -> None:
    _namespace(pool, "resized", slices=2)
    placed = await _settled(pool, "resized", 2)
    pool.core.patch_namespace("resized", {"metadata": {"annotations": {SLICE_ANNOTATION: '{"cpu": "500m", "memory": "1Gi"}'}}})
    await eventually(lambda: _reason(pool, "resized") != "Scheduled", timeout=60, what="the change judged")
    assert _reason(pool, "resized") == "InvalidSlice"
    assert "clear the placement to reschedule" in json.loads(_annotations(pool, "resized")[PLACEMENT_STATUS_ANNOTATION])[
        "message"]  # fmt: skip
    assert _placement(pool, "resized") == placed and set(placed) <= _copies(pool, "resized")


async def test_pack_from_the_clusterconfig_ends_on_one_cluster(pool: Pool) -> None:
    pool.configure(policy="pack")  # read by the next pass, which the namespace below signals
    _namespace(pool, "packed", slices=3)
    placement = await _settled(pool, "packed", 3)
    assert len(placement) == 1 and _copies(pool, "packed") == set(placement)


async def test_pack_from_the_namespace_annotation_ends_on_one_cluster_and_an_invalid_policy_is_refused(pool: Pool) -> None:
    _namespace(pool, "spread", slices=2)
    assert await _settled(pool, "spread", 2) == {"s1": 1, "s2": 1}  # the pool's default
    _namespace(pool, "packed", slices=2, **{POLICY_ANNOTATION: "pack"})
    placement = await _settled(pool, "packed", 2)
    assert len(placement) == 1 and _copies(pool, "packed") == set(placement)

    _namespace(pool, "bad", slices=1, **{POLICY_ANNOTATION: "binpack"})
    await eventually(lambda: _reason(pool, "bad"), timeout=60, what="the bad policy judged")
    status = json.loads(_annotations(pool, "bad")[PLACEMENT_STATUS_ANNOTATION])
    assert status["reason"] == "InvalidPolicy" and POLICY_ANNOTATION in status["message"]
    assert _placement(pool, "bad") == {} and _copies(pool, "bad") == set()


async def test_a_mandatory_placement_on_a_stopped_cluster_waits_for_it_with_its_reason(pool: Pool) -> None:
    _namespace(pool, "pinned", slices=2, **{PLACEMENTS_ANNOTATION: '{"s2": 2}'})
    await eventually(lambda: _annotations(pool, "pinned").get(MANDATORY_ANNOTATION), timeout=60,
                     what="the placement honoured")  # fmt: skip
    assert await _settled(pool, "pinned", 2) == {"s2": 2}
    pool.stop_cluster(pool.supers["s2"])
    try:
        await eventually(lambda: _reason(pool, "pinned") != "Scheduled", timeout=GRACE_SECONDS + 90,
                         what="the namespace judged once s2 is unreachable")  # fmt: skip
        status = json.loads(_annotations(pool, "pinned")[PLACEMENT_STATUS_ANNOTATION])
        assert (status["reason"], status["clusters"]["s2"].split(":")[0]) == ("WaitingForCluster", "Unreachable")
        assert _placement(pool, "pinned") == {"s2": 2}  # not moved
        assert _copies(pool, "pinned", among=("s1",)) == set()  # s2 is stopped: only s1 can be asked
        events = pool.core.list_namespaced_event("default", field_selector="involvedObject.name=pinned,"
                                                 "reason=WaitingForCluster").items  # fmt: skip
        assert events and events[0].type == "Warning"
    finally:
        pool.start_cluster(pool.supers["s2"])
    await eventually(lambda: _reason(pool, "pinned") == "Scheduled", timeout=90, what="s2 back: placed again")
    assert _placement(pool, "pinned") == {"s2": 2}
