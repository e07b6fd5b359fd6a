"""What a provider enforces in a consumer's namespace, as data (models/enforcement.py): the quota an offer
becomes, the Pod Security labels, and how a refused copy's 403 is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from models.credentials import anchors_to_revoke
from models.enforcement import (
    MAX_REFUSAL_MESSAGE,
    PODS_POLICY_NAME,
    SECRETS_POLICY_NAME,
    SERVICE_ACCOUNT_TOKEN_TYPE,
    Refusal,
    consumer_policies,
    object_count,
    pod_security_labels,
    quota_hard,
    refusal,
)
from models.resources import Resources


@pytest.mark.parametrize(
    ("offered", "hard", "count"),
    [
        pytest.param({"cpu": "2", "memory": "4Gi", "pods": "55"},
                     {"requests.cpu": "2", "requests.memory": "4Gi", "pods": "55"}, "130", id="cpu memory and pods"),
        pytest.param({"cpu": "1500m", "ephemeral-storage": "10Gi", "hugepages-2Mi": "4Mi", "nvidia.com/gpu": "1"},
                     {"requests.cpu": "1500m", "requests.ephemeral-storage": "10Gi", "requests.hugepages-2Mi": "4Mi",
                      "requests.nvidia.com/gpu": "1"}, "20", id="storage hugepages and an extended resource as requests"),
        pytest.param({"cpu": "0", "attachable-volumes-aws-ebs": "39"}, {"requests.cpu": "0"}, "20",
                     id="a zero kept and a resource with no quota key left out"),
    ],
)  # fmt: skip
def test_the_quota_is_the_offer_as_requests_with_object_counts_and_no_node_port_or_load_balancer(
    offered: dict[str, str], hard: dict[str, str], count: str
) -> None:
    counts = {"count/secrets": count, "count/configmaps": count, "services": count}
    assert quota_hard(Resources(offered)) == {**hard, **counts, "services.nodeports": "0",
                                              "services.loadbalancers": "0"}  # fmt: skip


def test_the_object_counts_grow_with_the_offered_pods_and_leave_room_for_the_providers_token_anchors() -> None:
    """Each pod may use a Secret and a ConfigMap of its own, and the provider's live anchors (the current and
    the previous generation: those before are revoked) count among the Secrets even at no pods."""
    live_anchors = 2
    assert max(anchors_to_revoke(current=5)) == 3  # 4 and 5 live
    assert object_count(Resources({"cpu": "1"})) >= live_anchors + 1
    assert object_count(Resources({"pods": "10"})) - live_anchors >= 10
    assert object_count(Resources({"pods": "11"})) > object_count(Resources({"pods": "10"}))


def _policy(name: str) -> dict[str, Any]:
    return next(d for d in consumer_policies() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


def test_the_pods_policy_holds_at_update_too_and_the_node_name_at_creation_only() -> None:
    """An update may add tolerations; a scheduled pod has a node name."""
    spec = _policy(PODS_POLICY_NAME)["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
    by_field = {v["message"].split()[0]: v["expression"] for v in spec["validations"]}
    assert by_field["spec.nodeName"].startswith("request.operation != 'CREATE' || ")
    assert not any("request.operation" in e for f, e in by_field.items() if f != "spec.nodeName")


def test_the_secrets_policy_refuses_service_account_tokens_made_or_changed_by_the_consumer() -> None:
    spec = _policy(SECRETS_POLICY_NAME)["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    assert [(r["resources"], r["operations"]) for r in rules] == [(["secrets"], ["CREATE", "UPDATE"])]
    assert [v["message"].split()[0] for v in spec["validations"]] == ["type", "metadata.annotations"]
    assert SERVICE_ACCOUNT_TOKEN_TYPE in spec["validations"][0]["expression"]
    bindings = [d["spec"]["policyName"] for d in consumer_policies() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert SECRETS_POLICY_NAME in bindings


def test_pod_security_enforces_warns_and_audits_at_one_level_against_the_latest_rules() -> None:
    assert pod_security_labels("restricted") == {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/warn-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/audit-version": "latest",
    }  # fmt: skip


def _status(message: str) -> str:
    return json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403, "message": message})


PSA = ('pods "team-root" is forbidden: violates PodSecurity "baseline:latest": privileged (container "x" must not set '
       'securityContext.privileged=true), host namespaces (hostNetwork=true, hostPID=true)')  # fmt: skip
QUOTA = ('pods "team-big" is forbidden: exceeded quota: tidepool-offer, requested: requests.cpu=3, used: '
         'requests.cpu=0, limited: requests.cpu=2')  # fmt: skip
RBAC = 'pods is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods" in API group ""'


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(403, _status(PSA), Refusal(by="PodSecurity", message=PSA.split("is forbidden: ", 1)[1]),
                     id="pod security: final, the rule without the copy's name"),
        pytest.param(403, _status(QUOTA), Refusal(by="ResourceQuota", message=QUOTA.split("is forbidden: ", 1)[1]),
                     id="quota: may pass later"),
        pytest.param(403, _status(RBAC), None, id="RBAC: the credentials, not the pod"),
        pytest.param(409, _status(PSA), None, id="not a 403"),
        pytest.param(403, "<html>", None, id="not a Status"),
        pytest.param(403, None, None, id="no body"),
    ],
)  # fmt: skip
def test_a_refused_copy_names_the_providers_rule(status: int, body: str | None, expected: Refusal | None) -> None:
    assert refusal(status, body) == expected


def test_only_a_quota_refusal_is_tried_again() -> None:
    assert [Refusal(by=by, message="m").final for by in ("PodSecurity", "AdmissionPolicy", "ResourceQuota")] == [
        True, True, False]  # fmt: skip


def test_what_the_provider_says_is_bounded_and_printable() -> None:
    said = refusal(403, _status('violates PodSecurity "baseline:latest": ' + "\x1b[31mx\n" * 500))
    assert said is not None and len(said.message) == MAX_REFUSAL_MESSAGE and said.message.isprintable()
