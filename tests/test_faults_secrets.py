"""No token or kubeconfig content in any workflow history, memo or search attribute.

A full run (peer, accept, offload a pod, change the percentage by signal and by update, tear down) with
both workers as separate processes in their own Temporal namespaces, then every run of every workflow in
every namespace of the environment is scanned for the actual credentials read from the clusters'
Secrets and for generic markers. The scanner is checked first on synthetic histories with a planted
secret, so that a scan that finds nothing means something."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from temporalio.api.common.v1 import Memo, Payloads, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    HistoryEvent,
    UpsertWorkflowSearchAttributesEventAttributes,
    WorkflowExecutionSignaledEventAttributes,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.api.sdk.v1 import UserMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState, temporal_namespace
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    advertisement_name,
    credentials_secret_name,
    peering_workflow_id,
)
from models.peering import WithdrawResult
from tests.faults import (
    GENERIC_MARKERS,
    Pair,
    SecretValues,
    WorkerProcess,
    convergence_problems,
    new_pair,
    scan_history,
    scan_namespace,
    scan_runs,
)
from tests.running import eventually
from workers.network import NetworkModule
from workers.peer import cancel_peering, request_peering, request_secret_name
from workflows.peering import PeeringWorkflow

pytestmark = pytest.mark.faults

PLANTED_TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InBsYW50ZWQifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXBsYW50ZWQ"
PLANTED_KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters:
- name: planted
  cluster: {{server: "https://127.0.0.1:6443"}}
users:
- name: planted
  user:
    token: {PLANTED_TOKEN}
"""


def _payloads(value: Any) -> Payloads:
    return Payloads(payloads=[pydantic_data_converter.payload_converter.to_payload(value)])


def _event(kind: str, value: Any) -> HistoryEvent:
    """One history event carrying `value` where a careless workflow could put it."""
    payload = pydantic_data_converter.payload_converter.to_payload(value)
    if kind == "workflow input":
        return HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                            workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
                                input=_payloads(value)))  # fmt: skip
    if kind == "memo":
        return HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                            workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
                                memo=Memo(fields={"note": payload})))  # fmt: skip
    if kind == "signal":
        return HistoryEvent(event_id=5, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
                            workflow_execution_signaled_event_attributes=WorkflowExecutionSignaledEventAttributes(
                                signal_name="set", input=_payloads(value)))  # fmt: skip
    if kind == "activity result":
        return HistoryEvent(event_id=7, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                            activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
                                result=_payloads(value)))  # fmt: skip
    if kind == "search attribute":
        return HistoryEvent(event_id=9, event_type=EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
                            upsert_workflow_search_attributes_event_attributes=UpsertWorkflowSearchAttributesEventAttributes(
                                search_attributes=SearchAttributes(indexed_fields={"Note": payload})))  # fmt: skip
    assert kind == "summary"
    return HistoryEvent(event_id=11, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                        user_metadata=UserMetadata(summary=payload))  # fmt: skip


PLACES = ["workflow input", "memo", "signal", "activity result", "search attribute", "summary"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("planted", [
    pytest.param({"kubeconfig": PLANTED_KUBECONFIG}, id="a kubeconfig in a model"),
    pytest.param(PLANTED_TOKEN, id="a bare token"),
    pytest.param({"data": base64.b64encode(PLANTED_KUBECONFIG.encode()).decode()}, id="a Secret's data, base64"),
])  # fmt: skip
def test_the_scanner_finds_a_secret_planted_in_a_synthetic_history(place: str, planted: Any) -> None:
    secrets = SecretValues()
    secrets.add_kubeconfig("planted", PLANTED_KUBECONFIG)
    clean = [_event(place, {"foreign_cluster_id": "cluster-b", "kube_config_ref": {"name": "s"}})]
    assert scan_history(clean, secrets) == []
    found = scan_history([_event(place, planted)], secrets)
    assert found, f"the scanner missed a secret planted in the {place}"


def test_the_scanner_knows_a_token_it_was_never_told_of_by_its_shape() -> None:
    found = scan_history([_event("signal", f"Bearer {PLANTED_TOKEN}")], SecretValues())
    assert found == ["event 5 (EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED): marker JWT"]


class _OneWorkflow:
    """A client's view of one workflow's runs: each run's history (its first event says which run it continued),
    the latest run, and the runs visibility lists so far."""

    def __init__(self, histories: dict[str, list[HistoryEvent]], *, latest: str, listed: list[str]) -> None:
        self.histories, self.latest, self.listed = histories, latest, listed

    async def list_workflows(self, query: str) -> AsyncIterator[Any]:
        for run_id in self.listed:
            yield SimpleNamespace(run_id=run_id)

    def get_workflow_handle(self, workflow_id: str, *, run_id: str | None = None) -> Any:
        events = self.histories[run_id or self.latest]

        async def describe() -> Any:
            return SimpleNamespace(run_id=self.latest)

        async def fetch_history_events() -> AsyncIterator[HistoryEvent]:
            for event in events:
                yield event

        async def fetch_history() -> WorkflowHistory:
            return WorkflowHistory(workflow_id, events)

        return SimpleNamespace(describe=describe, fetch_history_events=fetch_history_events, fetch_history=fetch_history)


def _started(continued_from: str = "") -> HistoryEvent:
    return HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                        workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
                            continued_execution_run_id=continued_from))  # fmt: skip


@pytest.mark.parametrize("listed", [pytest.param(["r1", "r2", "r3"], id="every run listed"),
                                    pytest.param(["r2"], id="visibility behind: only one run listed yet")])  # fmt: skip
async def test_every_run_of_a_workflow_is_scanned_not_only_the_latest(listed: list[str]) -> None:
    secrets = SecretValues()
    secrets.add_kubeconfig("planted", PLANTED_KUBECONFIG)
    # The first run read the credentials (an activity's result), then continued as new twice.
    runs = _OneWorkflow({"r1": [_started(), _event("activity result", {"kubeconfig": PLANTED_KUBECONFIG})],
                         "r2": [_started("r1")], "r3": [_started("r2")]}, latest="r3", listed=listed)  # fmt: skip
    client = cast(Client, runs)
    assert scan_history((await client.get_workflow_handle("w").fetch_history()).events, secrets) == []  # the latest
    scanned, found = await scan_runs(client, "w", secrets)
    assert scanned == 3
    assert found and all(f.startswith("w/r1 event 7") for f in found), found


def _credentials(pair: Pair) -> str | None:
    """The kubeconfig the provider wrote on the consumer (it renews the token on every push)."""
    secret = k8s.CoreV1Api(pair.consumer.api_client()).read_namespaced_secret(
        credentials_secret_name(pair.provider_id), SYSTEM_NAMESPACE)  # fmt: skip
    return base64.b64decode((secret.data or {})["kubeconfig"]).decode()


def _advertised_cpu(pair: Pair) -> str | None:
    obj = read_cluster_object(pair.consumer.api_client(), ADVERTISEMENTS, advertisement_name(pair.provider_id))
    return None if obj is None else obj["spec"]["resourceQuota"]["hard"].get("cpu")


@pytest.mark.env
@pytest.mark.timeout(300)
async def test_after_a_full_run_no_history_memo_or_search_attribute_holds_credentials(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], temporal_client: Client, unique: str,
    tmp_path: Path,
) -> None:
    pair = new_pair(make_cluster, unique)
    provider, consumer = pair.provider.api_client(), pair.consumer.api_client()
    # Each worker in its own Temporal namespace, as in production.
    namespaces = {"provider": temporal_namespace("a"), "consumer": temporal_namespace("b")}
    assert set(namespaces.values()) <= set(localenv.temporal_namespaces)
    workers = [
        WorkerProcess(cluster=pair.provider, cluster_id=pair.provider_id, temporal_address=localenv.temporal_address,
                      namespace=namespaces["provider"], pod_cidr="10.1.0.0/16", log=tmp_path / "provider.log"),
        WorkerProcess(cluster=pair.consumer, cluster_id=pair.consumer_id, temporal_address=localenv.temporal_address,
                      namespace=namespaces["consumer"], pod_cidr="10.2.0.0/16", log=tmp_path / "consumer.log"),
    ]  # fmt: skip
    provider_client = await Client.connect(localenv.temporal_address, namespace=namespaces["provider"],
                                           data_converter=pydantic_data_converter)  # fmt: skip
    secrets = SecretValues()
    network = NetworkModule(consumer, local_pod_cidr="10.2.0.0/16").start()
    try:
        for worker in workers:
            worker.start()
        with DeploymentRunner(pair.consumer.kubeconfig, log_dir=tmp_path):
            request_peering(provider, consumer, provider_id=pair.provider_id, consumer_id=pair.consumer_id)
            request = k8s.CoreV1Api(provider).read_namespaced_secret(request_secret_name(pair.consumer_id), SYSTEM_NAMESPACE)
            secrets.add_kubeconfig("consumer (PeeringRequest Secret)", base64.b64decode((request.data or {})["kubeconfig"]).decode())
            await eventually(lambda: not convergence_problems(pair, peered=True), timeout=120, what="accepted")
            secrets.add_kubeconfig("provider credentials, first push", await eventually(lambda: _credentials(pair)))

            k8s.CoreV1Api(consumer).create_namespaced_pod("app", k8s.V1Pod.model_validate({"metadata": {"name": "job"}, "spec": {
                "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
                "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
                "nodeSelector": {LABEL_PROVIDER: pair.provider_id}}}))  # fmt: skip
            await eventually(lambda: k8s.CoreV1Api(consumer).read_namespaced_pod("job", "app").status.phase == "Running",
                             timeout=60, what="the offloaded pod Running")  # fmt: skip

            handle: WorkflowHandle[PeeringWorkflow, WithdrawResult] = provider_client.get_workflow_handle_for(
                PeeringWorkflow.run, peering_workflow_id(pair.provider_id, pair.consumer_id))
            await handle.signal(PeeringWorkflow.set_sharing_percentage, 25)
            await eventually(lambda: _advertised_cpu(pair) == "2", timeout=60, what="25% advertised")
            secrets.add_kubeconfig("provider credentials, after the signal", _credentials(pair) or "")
            await handle.execute_update(PeeringWorkflow.update_sharing_percentage, 75)
            secrets.add_kubeconfig("provider credentials, after the update", _credentials(pair) or "")

            cancel_peering(provider, consumer_id=pair.consumer_id)
            await eventually(lambda: not convergence_problems(pair, peered=False), timeout=150, what="torn down")
    finally:
        for worker in workers:
            worker.stop()
        network.stop()
    # The worker's own credentials must not leak either.
    secrets.add_kubeconfig("provider's own", pair.provider.kubeconfig.read_text())
    assert any("token" in label for label in secrets.values), "no token was read: the scan would prove nothing"

    scanned = 0
    findings: list[str] = []
    for namespace in localenv.temporal_namespaces:
        client = await Client.connect(localenv.temporal_address, namespace=namespace, data_converter=pydantic_data_converter)
        runs, found = await scan_namespace(client, secrets)
        scanned, findings = scanned + runs, findings + found
    print(f"scanned {scanned} workflow runs in {len(localenv.temporal_namespaces)} namespaces for "
          f"{len(secrets.values)} secret values and {len(GENERIC_MARKERS)} markers")  # fmt: skip
    assert scanned >= 3  # at least this run's peering, admission and advertisement workflows
    assert findings == []

