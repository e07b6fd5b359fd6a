"""`tidepool explain` (issue 20, part 1) end to end: a provider and a consumer with a worker each, an
offer the test shapes (a pod that counts, one of the consumer's own that does not, a percentage changed
in the ClusterConfig), and the stories each side tells from its own Temporal history, checked against
the decisions the test caused; then again once the peering is withdrawn and its objects are gone, with
`tidepool simulate peering` checked against hand-computed offers. The pool's story of a placed namespace,
its pod and a namespace that fits nowhere, and `tidepool simulate pool` of those passes under pack. `tidepool simulate admission` on a consumer's recorded passes,
checked against the decisions worked out by hand at other maxima. A consumer's pod that its provider cannot
schedule, explained by its copy's Events and the offer behind its virtual node."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import apply_cluster_object, list_cluster_objects, read_cluster_object
from models.explain import Story
from models.names import (
    ADVERTISEMENTS,
    GROUP,
    LABEL_CONSUMER,
    LABEL_OFFLOADED,
    LABEL_PROVIDER,
    PEERING_REQUESTS,
    PLACEMENT_STATUS_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    VERSION,
    advertisement_name,
    foreign_namespace,
)
from tests.faults import SecretValues, scan_history
from tests.kube import apply_cluster_config, create_namespace, create_node, create_pod, delete_quietly
from tests.offload import offloaded_namespace, peered, ready_node
from tests.pool import TENANT, running_pool
from tests.running import eventually, running_worker, worker_settings
from tests.test_consumer import advertisement
from workers.explain import explain_advertisement, explain_namespace, explain_peering
from workers.peer import cancel_peering, request_peering

pytestmark = [pytest.mark.env, pytest.mark.explain]

HALF = ["sharing percentage 50% (the ClusterConfig's)",
        "cpu: (8 − 2) × 50% = 3",
        "memory: (16Gi − 1Gi) × 50% = 7680Mi",
        "pods: (110 − 1) × 50% = 54 (rounded down from 54.5)",
        "not counted as used: the consumer's own offloaded pods, cpu 1, pods 1"]  # fmt: skip
QUARTER_CPU = "cpu: (8 − 2) × 25% = 1500m"


def _entries(story: Story) -> dict[str, list[str]]:
    """what → why of the first entry of each kind."""
    entries: dict[str, list[str]] = {}
    for entry in story.entries:
        entries.setdefault(entry.what, entry.why)
    return entries


async def _cli(localenv: EnvState, *args: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(await _cli_text(localenv, *args, "-o", "json"))
    return parsed


async def _cli_text(localenv: EnvState, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", *args, "--temporal-address", localenv.temporal_address,
        "--namespace", "default", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.timeout(300)
async def test_each_side_explains_its_decisions_from_history_even_after_the_objects_are_gone(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
) -> None:  # fmt: skip
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    provider_id, consumer_id = f"prov-{unique}", f"cons-{unique}"
    home, foreign = provider.api_client(), consumer.api_client()
    create_node(home, "big", cpu="8", memory="16Gi")
    create_namespace(home, "work")
    create_pod(home, "work", "app", node_name="big", requests={"cpu": "2", "memory": "1Gi"})
    create_namespace(home, foreign_namespace(consumer_id))  # the consumer's own pods run there
    create_pod(home, foreign_namespace(consumer_id), "own", node_name="big", requests={"cpu": "1"},
               labels={LABEL_OFFLOADED: "true", LABEL_CONSUMER: consumer_id})  # fmt: skip
    apply_cluster_config(home, outgoing={"sharingPercentage": 50})
    create_namespace(foreign, SYSTEM_NAMESPACE)
    apply_cluster_config(foreign, incoming={"maxAcceptableAdvertisements": 2})

    def advertisement() -> dict[str, Any]:
        return read_cluster_object(foreign, ADVERTISEMENTS, advertisement_name(provider_id)) or {}

    async with (running_worker(worker_settings(localenv, provider, provider_id)),
                running_worker(worker_settings(localenv, consumer, consumer_id))):  # fmt: skip
        request_peering(home, foreign, provider_id=provider_id, consumer_id=consumer_id)
        await eventually(lambda: (advertisement().get("status") or {}).get("phase") == "Accepted",
                         timeout=60, what="the Advertisement accepted")  # fmt: skip
        await asyncio.sleep(1)  # a second between the two offers, for --at
        half_time = datetime.now(UTC)
        apply_cluster_config(home, outgoing={"sharingPercentage": 25})
        await eventually(lambda: advertisement()["spec"]["resourceQuota"]["hard"]["cpu"] == "1500m",
                         timeout=30, what="the quarter offered")  # fmt: skip

        async def told(story: Callable[[], Awaitable[Story]], *whats: str) -> dict[str, list[str]] | None:
            """The story once it has every one of `whats`: the history records the push after the object is
            written, and the consumer's decision when the provider's watch sees it (after a backoff, if the
            consumer's API server refused a list: 429 under load)."""
            entries = _entries(await story())
            return entries if all(what in entries for what in whats) else None

        # The provider: each offer with its derivation, what changed it, and the consumer's decision.
        peering = await eventually(lambda: told(lambda: explain_peering(temporal_client, home=provider_id,
                                                                        foreign=consumer_id),
                                                "offered cpu 1500m, memory 3840Mi, pods 27",
                                                "the foreign cluster's decision: Accepted (WithinMaximum)"),
                                   timeout=60, what="the quarter's offer and the decision in the peering's history")  # fmt: skip
        assert peering["offered cpu 3, memory 7680Mi, pods 54"] == HALF
        assert "the ClusterConfig changed: push at once" in peering
        assert QUARTER_CPU in peering["offered cpu 1500m, memory 3840Mi, pods 27"]
        # As of a time between the two offers: only the first.
        earlier = await explain_peering(temporal_client, home=provider_id, foreign=consumer_id, at=half_time)
        assert earlier.at == half_time and "offered cpu 1500m, memory 3840Mi, pods 27" not in _entries(earlier)
        assert earlier.now[0] == "offer: cpu 3, memory 7680Mi, pods 54"

        # The consumer: the admission decision and its inputs, and the offer as the provider derived it.
        consuming = await eventually(lambda: told(lambda: explain_advertisement(temporal_client, home=consumer_id,
                                                                                provider=provider_id),
                                                  "offer seen: cpu 1500m, memory 3840Mi, pods 27"),
                                     what="the quarter's offer in the advertisement's history")  # fmt: skip
        assert consuming["admission: Accepted (WithinMaximum)"] == [
            "accepted as number 1 of at most 2 (maxAcceptableAdvertisements)",
            consuming["admission: Accepted (WithinMaximum)"][1]]  # fmt: skip
        assert consuming["admission: Accepted (WithinMaximum)"][1].startswith(
            "policy AutoAcceptMax, maxAcceptableAdvertisements 2; number 1 in arrival order (arrived ")
        assert consuming["offer seen: cpu 3, memory 7680Mi, pods 54"] == ["as the provider derived it:", *HALF[1:]]
        assert QUARTER_CPU in consuming["offer seen: cpu 1500m, memory 3840Mi, pods 27"]
        assert "step EnsureFinalizer" in consuming

        cancel_peering(home, consumer_id=consumer_id)
        await eventually(lambda: read_cluster_object(home, PEERING_REQUESTS, consumer_id) is None and not advertisement(),
                         timeout=90, what="the peering withdrawn on both sides")  # fmt: skip
        await asyncio.sleep(2)  # the consumer's run completes once the Advertisement is released

    # Nothing left in either cluster, no worker running: the stories still come from history, by the CLI.
    provided = await _cli(localenv, "explain", "peering", consumer_id, "--cluster-id", provider_id)
    assert provided["subject"] == f"peering with {consumer_id}" and provided["retention_days"] > 0
    assert provided["entries"][-1]["what"] == "peering withdrawn"
    consumed = await _cli(localenv, "explain", "advertisement", provider_id, "--cluster-id", consumer_id)
    whats = [e["what"] for e in consumed["entries"]]
    assert whats.index("admission: Accepted (WithinMaximum)") < whats.index("step MarkDeleting") < whats.index(
        "step ReleaseAdvertisement")
    assert whats[-1] == "lifecycle ended"

    # Every push replayed at 100%: (8 − 2) CPU, (16Gi − 1Gi), (110 − 1) pods, whatever it offered then.
    simulated = await _cli(localenv, "simulate", "peering", consumer_id, "--cluster-id", provider_id,
                           "--sharing-percentage", "100")  # fmt: skip
    assert {p["sharing_percentage"] for p in simulated["pushes"]} == {50, 25}
    assert all(p["would_offer"] == {"cpu": "6", "memory": "15Gi", "pods": "109"} for p in simulated["pushes"])
    assert simulated["differing"] == len(simulated["pushes"])


@pytest.mark.pool
async def test_the_pool_explains_where_a_namespaces_slices_and_its_pod_went_and_why_another_fits_nowhere(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    async with running_pool(localenv, make_cluster, unique) as pool:
        core, workflow_id = pool.core, f"pool-scheduler-{unique}"
        for name, cpu in (("shop", "6"), ("huge", "20")):  # 6 slices of 1 CPU / 2Gi; the pool holds 8 (4 + 4)
            core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": name, "annotations": {
                "pool.tidepool.io/slice": '{"cpu": "1", "memory": "2Gi"}'}}}))  # fmt: skip
            core.create_namespaced_resource_quota(name, k8s.V1ResourceQuota.model_validate(
                {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": cpu, "memory": f"{int(cpu) * 2}Gi"}}}))
        core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
            "containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}))  # fmt: skip
        chosen = await eventually(lambda: (core.read_namespaced_pod("web", "shop").metadata.annotations or {}).get(
            POD_CLUSTER_ANNOTATION), timeout=60, what="the pod's super cluster")  # fmt: skip
        placement = json.loads((core.read_namespace("shop").metadata.annotations or {})[PLACEMENTS_ANNOTATION])
        await eventually(lambda: (core.read_namespace("huge").metadata.annotations or {}).get(PLACEMENT_STATUS_ANNOTATION),
                         timeout=60, what="huge's placement status")  # fmt: skip

        shop = await explain_namespace(temporal_client, namespace="shop", workflow_id=workflow_id)
        placed = next(e for e in shop.entries if e.what.startswith("slices placed"))
        assert placed.what == "slices placed: " + ", ".join(f"{c} {n}" for c, n in sorted(placement.items()))
        assert placed.why[:2] == ["6 slices placed (spread)", "6 slices of cpu 1, memory 2Gi"]
        # The pod placer placed web, outside any history (a pass places only what the placer left waiting):
        # the namespace's story is its slices; `explain pod` (below) reads the pod's own word in the tenant.
        assert shop.now == [placed.what]

        huge = await explain_namespace(temporal_client, namespace="huge", workflow_id=workflow_id)
        refused = next(e for e in huge.entries if e.what == "not placed")
        assert refused.why[0].startswith("InsufficientCapacity: 20 slices do not fit in the pool")
        # Every cluster's own reason, as the filter gave it, and how each cluster stood in that pass.
        assert [w.split(":")[0] for w in refused.why if w.startswith(("s1:", "s2:"))] == ["s1", "s2"]
        assert all("InsufficientCapacity" in w for w in refused.why if w.startswith(("s1:", "s2:")))

        # `explain pod` tells the placer's placement from the pod and its Scheduled Event in its tenant's control
        # plane, found as `status` finds one: here, a state file that names this test's tenant.
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"kubeconfigs": {TENANT: str(pool.tenant.kubeconfig)}}))
        web = await _cli(localenv, "explain", "pod", "shop/web", "--workflow-id", workflow_id, "--state-file", str(state))
        # Among the entries, by time: the placer may place it before the pass that placed the slices is recorded.
        assert f"pod web → {chosen}" in [e["what"] for e in web["entries"]] and web["now"][-1] == f"pod web on {chosen}"
        assert web["subject"] == f"pod {TENANT}/shop/web"  # the one tenant whose records have shop: no --tenant needed
    # Another tenant's shop, asked by name: none of this tenant's records.
    other = await _cli(localenv, "explain", "namespace", "shop", "--tenant", "other", "--workflow-id", workflow_id)
    assert (other["subject"], other["now"]) == ("namespace other/shop", ["no placement recorded"])

    # `simulate pool`, hand-computed: s1 and s2 hold 4 slices each. Spread gave shop s1, s2, s1, s2, ... (the
    # most room left, ties by name): 3 and 3. Pack fills s1 first (least room, ties by name), then s2: 4 and 2.
    # huge fits under neither.
    assert placement == {"s1": 3, "s2": 3}
    pack = await _cli(localenv, "simulate", "pool", "--policy", "pack", "--workflow-id", workflow_id)
    rows = {n["namespace"]: n for n in pack["namespaces"]}
    assert (rows["shop"]["tenant"], rows["shop"]["then"], rows["shop"]["would"]) == (TENANT, "s1 3, s2 3", "s1 4, s2 2")
    assert rows["huge"]["then"] == rows["huge"]["would"] == "not placed"
    assert (pack["differing"], pack["placed_then"], pack["placed_would"], pack["not_replayable"]) == (1, 1, 1, 0)
    assert pack["quota_then"] == pack["quota_would"] == {"cpu": "6", "memory": "12Gi"}
    spread = await _cli(localenv, "simulate", "pool", "--policy", "spread", "--workflow-id", workflow_id)
    assert spread["differing"] == 0 and spread["passes"] == pack["passes"] > 0
    text = await _cli_text(localenv, "simulate", "pool", "--policy", "pack", "--workflow-id", workflow_id)
    print(text)  # docs/explain.md, "What if", shows it
    assert "1 of 2 namespaces would have been placed otherwise" in text
    # The passes' records hold names and quantities: none of the super clusters' credentials.
    secrets = SecretValues()
    for name, cluster in pool.supers.items():
        secrets.add_kubeconfig(f"super cluster {name}", cluster.kubeconfig.read_text())
    assert any("token" in label or "key" in label for label in secrets.values), "nothing read: the scan would prove nothing"
    history = await temporal_client.get_workflow_handle(workflow_id).fetch_history()
    assert scan_history(history.events, secrets) == []


@pytest.mark.timeout(300)
async def test_simulate_admission_replays_the_recorded_passes_at_other_maxima(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str,
) -> None:  # fmt: skip
    consumer = make_cluster("cons")
    api, consumer_id = consumer.api_client(), f"cons-{unique}"
    create_namespace(api, SYSTEM_NAMESPACE)
    providers = [f"p{i}-{unique}" for i in range(4)]  # p3 is denied
    apply_cluster_config(api, incoming={"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 2,
                                        "deniedClusters": [providers[3]]})  # fmt: skip

    def phases() -> dict[str, str | None]:
        return {a["spec"]["clusterId"]: (a.get("status") or {}).get("reason") for a in list_cluster_objects(api, ADVERTISEMENTS)}

    async with running_worker(worker_settings(localenv, consumer, consumer_id)):
        for cpu, provider in enumerate(providers, start=1):  # one after the other: arrival order is creation order
            apply_cluster_object(api, ADVERTISEMENTS, advertisement(provider, cpu=str(cpu)))
            await eventually(lambda p=provider: phases().get(p) is not None, what=f"{provider} decided")
        assert [phases()[p] for p in providers] == ["WithinMaximum", "WithinMaximum", "MaxReached", "Denied"]
        delete_quietly(k8s.CustomObjectsApi(api).delete_cluster_custom_object, GROUP, VERSION, ADVERTISEMENTS,
                       advertisement_name(providers[0]))  # fmt: skip
        await eventually(lambda: providers[0] not in phases() and phases().get(providers[2]) == "WithinMaximum",
                         timeout=60, what="p0 gone and p2 accepted in its place")  # fmt: skip

    def outcomes(simulated: dict[str, Any]) -> dict[str, str]:
        return {a["provider"].split("-")[0]: a["would"] for a in simulated["advertisements"]}

    async def simulate(maximum: int) -> dict[str, Any]:
        return await _cli(localenv, "simulate", "admission", "--max", str(maximum), "--cluster-id", consumer_id)

    same = await simulate(2)  # what was recorded: every decision as it was made
    assert same["differing"] == 0 and same["not_replayable"] == 0 and same["passes"] >= 5
    assert (same["accepted_then"], same["accepted_would"]) == (2, 2)
    # One place: p0 alone, then p1 (first in arrival order) once p0 left; p2 never; p3 denied whatever the maximum.
    one = await simulate(1)
    assert outcomes(one) == {"p0": "Accepted (WithinMaximum)", "p1": "Accepted (WithinMaximum)",
                             "p2": "Refused (MaxReached)", "p3": "Refused (Denied)"}  # fmt: skip
    assert [a["provider"].split("-")[0] for a in one["advertisements"] if a["differs"]] == ["p1", "p2"]
    rows = {a["provider"].split("-")[0]: a for a in one["advertisements"]}
    assert rows["p0"]["left"] is not None and rows["p1"]["would_accepted_at"] >= rows["p0"]["left"]
    assert one["capacity_then"] == {"cpu": "5", "memory": "8Gi", "pods": "20"}  # p1 (2) and p2 (3)
    assert one["capacity_would"] == {"cpu": "2", "memory": "4Gi", "pods": "10"}  # p1 alone
    # Three places: p2 at its arrival instead of when p0 left.
    three = await simulate(3)
    assert [a["provider"].split("-")[0] for a in three["advertisements"] if a["differs"]] == ["p2"]
    assert {a["provider"].split("-")[0]: a["would_accepted_at"] is not None for a in three["advertisements"]} == \
        {"p0": True, "p1": True, "p2": True, "p3": False}  # fmt: skip
    text = await _cli_text(localenv, "simulate", "admission", "--max", "1", "--cluster-id", consumer_id)
    print(text)  # docs/explain.md, "What if", shows it
    assert "2 of 4 Advertisements would have been decided otherwise" in text
    assert "accepted at the last pass: 2 → 1; capacity cpu 5 → 2, memory 8Gi → 4Gi, pods 20 → 10" in text


@pytest.mark.timeout(300)
async def test_a_consumer_pod_pending_in_the_provider_is_explained_by_its_copys_events_and_the_offer_behind_its_node(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path,
) -> None:  # fmt: skip
    async with peered(localenv, make_cluster, unique, consumer_pod_cidr="10.0.0.0/16", consumer_nodes=("local",),
                      log_dir=tmp_path) as peering:  # fmt: skip
        core, remote = k8s.CoreV1Api(peering.consumer.api_client()), k8s.CoreV1Api(peering.provider.api_client())
        await eventually(lambda: ready_node(core, peering.node), timeout=90, what="the virtual node Ready")
        await offloaded_namespace(peering, "shop")
        remote.patch_node("big", {"spec": {"unschedulable": True}})  # the provider cannot run the copy
        core.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "stuck"}, "spec": {
            "containers": [{"name": "main", "image": "busybox"}], "nodeSelector": {LABEL_PROVIDER: peering.provider_id},
            "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}]}}))  # fmt: skip
        create_pod(peering.consumer.api_client(), "shop", "home", node_name="local", requests={"cpu": "1"})
        await eventually(lambda: any(e.reason == "FailedScheduling" for e in core.list_namespaced_event(
            "shop", field_selector="involvedObject.name=stuck").items), timeout=60, what="the copy's FailedScheduling")  # fmt: skip

        async def explain(pod: str) -> dict[str, Any]:
            return await _cli(localenv, "explain", "pod", f"shop/{pod}", "--kubeconfig", str(peering.consumer.kubeconfig),
                              "--cluster-id", peering.consumer_id)  # fmt: skip

        story = await explain("stuck")
        whats = [e["what"] for e in story["entries"]]
        adv = f"Advertisement from {peering.provider_id}: "
        accepted = whats.index(f"{adv}admission: Accepted (WithinMaximum)")
        offer = next(i for i, w in enumerate(whats) if w.startswith(f"{adv}offer seen: cpu 4, "))
        scheduled = next(i for i, w in enumerate(whats) if w == "Normal Scheduled")  # the consumer's scheduler
        failed = whats.index(f"Warning FailedScheduling (its copy in {peering.provider_id})")
        # Events carry whole seconds (the reflected one) or microseconds (the scheduler's): within a second
        # their order is not told.
        assert max(offer, accepted) < whats.index("pod created") < min(scheduled, failed), whats
        assert "unschedulable" in story["entries"][failed]["why"][0]
        assert peering.node in story["entries"][scheduled]["why"][0]
        assert story["entries"][offer]["why"][0] == "as the provider derived it:"
        assert story["now"][:3] == ["phase Pending", f"on virtual node {peering.node}: runs in provider {peering.provider_id}",
                                    "the provider's Events on its copy above say why it is not running there"]  # fmt: skip
        assert story["now"][3] == "its Advertisement: decision: Accepted (WithinMaximum)"
        assert story["now"][4].startswith("its Advertisement: offer: cpu 4, ")

        home = await explain("home")  # one of the consumer's own nodes: nothing offloaded, no Advertisement
        assert home["now"][1] == "on node local, one of this cluster's own: not offloaded"
        assert not any(e["what"].startswith("Advertisement from") for e in home["entries"])
        text = await _cli_text(localenv, "explain", "pod", "shop/stuck", "--kubeconfig", str(peering.consumer.kubeconfig),
                               "--cluster-id", peering.consumer_id)  # fmt: skip
        print(text)  # docs/explain.md, "Why is it so", shows it
        assert f"Warning FailedScheduling (its copy in {peering.provider_id})" in text
