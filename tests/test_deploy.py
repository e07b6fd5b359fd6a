"""The production manifests (deploy/base, deploy/overlays, deploy/components; deploy/pool): every overlay renders
with the kubectl we build and passes a server-side dry-run on a real API server; installed for real,
the worker's ServiceAccount can make the calls its activities make (some of them made as it) and no
more, and the foreign virtual kubelet's ClusterRole is the one activities/credentials.py hands out."""

from __future__ import annotations

import base64
import functools
import json
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities.credentials import (
    CLUSTER_ROLE,
    CREDENTIALS_BINDING,
    CREDENTIALS_CLUSTER_ROLE,
    CREDENTIALS_RULES,
    REMOTE_NAMESPACES_CLUSTER_ROLE,
    REMOTE_NAMESPACES_RULES,
    SERVICE_ACCOUNT,
    VIRTUAL_KUBELET_RULES,
    ensure_foreign_access,
    issue_kubeconfig,
    revoke_foreign_access,
    revoke_older_tokens,
)
from activities.remote_namespaces import ensure_remote_namespace
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster
from kube import identity, tenant_identity
from kube.clients import client_from_peer_kubeconfig_text
from kube.objects import apply_cluster_object, apply_core, read_cluster_object
from kube.tenant_identity import TENANT_IDENTITY, mint_tenant_identity, renew_tenant_token, revoke_tenant_identity
from models.enforcement import PODS_POLICY_NAME, QUOTA_NAME, SERVICES_POLICY_NAME, consumer_policies
from models.names import (
    API_VERSION,
    CONSUMER_ADVERTISEMENT_ANNOTATIONS,
    CONSUMER_KEEPALIVE_LEASE,
    GROUP,
    LABEL_CONSUMER,
    LABEL_MANAGED_BY,
    LABEL_NODE_TYPE,
    LABEL_OFFLOADING,
    MANAGED_BY,
    PROVIDER_ADVERTISEMENT_ANNOTATIONS,
    PROVIDER_IDENTITY_PREFIX,
    SUPER_CLUSTERS,
    SYSTEM_NAMESPACE,
    TENANT_SECRETS_NAMESPACE,
    VIRTUAL_NODE_TYPE,
    credentials_secret_name,
    provider_identity_name,
    service_account_subject,
)
from models.resources import Resources
from models.virtual_kubelet import virtual_kubelet_deployment
from tests.kube import create_namespace, create_node, create_pod, wait_for, wait_takes_foreign_pods
from workers.pool_health import HealthProber

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists())
WORKER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:tidepool-worker"
VIRTUAL_KUBELET = f"system:serviceaccount:{SYSTEM_NAMESPACE}:tidepool-virtual-kubelet"


@functools.cache
def kubectl_path() -> Path:
    return ensure_binaries().kubectl


def kubectl(*args: str, kubeconfig: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(kubectl_path()), *(["--kubeconfig", str(kubeconfig)] if kubeconfig else []), *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, check=False, timeout=120)


@functools.cache  # several tests read the same overlay: kustomize renders each once
def render(overlay: str) -> str:
    result = kubectl("kustomize", str(DEPLOY / "overlays" / overlay))
    assert result.returncode == 0, result.stderr
    return result.stdout


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.deploy
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_installs_every_crd_crdgen_writes(overlay: str) -> None:
    crds = {d["metadata"]["name"] for d in yaml.safe_load_all(render(overlay)) if d and d["kind"] == "CustomResourceDefinition"}
    assert crds == {p.stem for p in (DEPLOY / "crds").glob("*.yaml")}


@pytest.mark.deploy
def test_the_foreign_virtual_kubelet_cluster_role_is_what_the_worker_hands_out() -> None:
    roles = {d["metadata"]["name"]: d for d in documents(DEPLOY / "base" / "virtual-kubelet-rbac.yaml")
             if d["kind"] == "ClusterRole"}  # fmt: skip
    assert roles[CLUSTER_ROLE]["rules"] == VIRTUAL_KUBELET_RULES
    assert roles[REMOTE_NAMESPACES_CLUSTER_ROLE]["rules"] == REMOTE_NAMESPACES_RULES


@pytest.mark.deploy
def test_the_admission_policies_on_consumers_objects_are_what_the_worker_installs_where_missing() -> None:
    assert documents(DEPLOY / "base" / "consumer-scope.yaml") == consumer_policies()
    assert "consumer-scope.yaml" in documents(DEPLOY / "base" / "kustomization.yaml")[0]["resources"]
    # The worker looks for each of them by name at a push: its ClusterRole names them all.
    rules = [r for d in documents(DEPLOY / "base" / "rbac.yaml") if d["kind"] == "ClusterRole" for r in d["rules"]
             if "validatingadmissionpolicies" in r.get("resources", [])]  # fmt: skip
    assert [sorted(r["resourceNames"]) for r in rules] == [sorted(d["metadata"]["name"] for d in consumer_policies()
                                                                  if d["kind"] == "ValidatingAdmissionPolicy")]  # fmt: skip


@pytest.mark.deploy
@pytest.mark.steady
def test_the_credentials_cluster_role_the_worker_binds_itself_is_what_it_needs() -> None:
    roles = {d["metadata"]["name"]: d for d in documents(DEPLOY / "base" / "rbac.yaml") if d["kind"] == "ClusterRole"}
    assert roles[CREDENTIALS_CLUSTER_ROLE]["rules"] == CREDENTIALS_RULES


@pytest.mark.deploy
def test_the_consumer_decisions_policy_is_installed_and_spares_only_the_provider_s_own_annotations() -> None:
    """deploy/base/consumer-decisions.yaml says in CEL what models/names.py says in Python: which annotations
    of an Advertisement are the provider's, and who the provider identities are."""
    assert "consumer-decisions.yaml" in yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["resources"]
    policy = next(d for d in documents(DEPLOY / "base" / "consumer-decisions.yaml") if d["kind"] == "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["providersOwn"] == "[" + ", ".join(f"'{a}'" for a in PROVIDER_ADVERTISEMENT_ANNOTATIONS) + "]"
    # The policy guards every tidepool.io/ annotation but the provider's: the consumer's are all among them.
    assert all(a.startswith(f"{GROUP}/") and a not in PROVIDER_ADVERTISEMENT_ANNOTATIONS
               for a in CONSUMER_ADVERTISEMENT_ANNOTATIONS)  # fmt: skip
    identities = service_account_subject(PROVIDER_IDENTITY_PREFIX)
    assert provider_identity_name("x").startswith(PROVIDER_IDENTITY_PREFIX)
    assert [c["expression"] for c in policy["spec"]["matchConditions"]] == [
        f"request.userInfo.username.startsWith('{identities}')"]  # fmt: skip


@pytest.mark.deploy
def test_the_provider_secrets_policy_is_installed_beside_the_decisions_and_matches_the_same_identities() -> None:
    """The consumer's policy on the provider identities' Secrets (no service-account token) is in the file the
    local environment and deploy/base install, and matches whom the decisions policy matches."""
    policies = {d["metadata"]["name"]: d for d in documents(DEPLOY / "base" / "consumer-decisions.yaml")
                if d["kind"] == "ValidatingAdmissionPolicy"}  # fmt: skip
    bindings = {d["spec"]["policyName"] for d in documents(DEPLOY / "base" / "consumer-decisions.yaml")
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    assert set(policies) == bindings == {"tidepool-consumer-decisions", "tidepool-provider-secrets"}
    secrets = policies["tidepool-provider-secrets"]["spec"]
    assert secrets["matchConditions"] == policies["tidepool-consumer-decisions"]["spec"]["matchConditions"]
    assert [(r["resources"], r["operations"]) for r in secrets["matchConstraints"]["resourceRules"]] == [
        (["secrets"], ["CREATE", "UPDATE"])]  # fmt: skip


@pytest.mark.env  # the kubectl we build renders the manifests
@pytest.mark.deploy
def test_the_worker_runs_the_cluster_worker_from_the_image_and_reads_its_settings_from_the_config_map() -> None:
    rendered = list(yaml.safe_load_all(render("self-hosted")))
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "workers.cluster"]
    assert container["image"] == "ghcr.io/tidepool/tidepool:0.1.0"
    config = next(d for d in rendered if d["kind"] == "ConfigMap")
    assert container["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    # The virtual kubelets the worker creates run the same image.
    assert config["data"]["TIDEPOOL_VIRTUAL_KUBELET_IMAGE"] == container["image"]
    _two_replicas_each_named_in_the_lease_and_one_evicted_at_a_time(rendered, "tidepool-worker")


def _two_replicas_each_named_in_the_lease_and_one_evicted_at_a_time(rendered: list[dict[str, Any]], name: str) -> None:
    deployment = next(d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    assert deployment["spec"]["replicas"] == 2
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TIDEPOOL_LEADER_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    budget = next(d for d in rendered if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == name)
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.env
@pytest.mark.deploy
@pytest.mark.parametrize(
    ("overlay", "files"),
    [
        pytest.param("temporal-cloud-api-key", {"TIDEPOOL_TEMPORAL_API_KEY_FILE": "tidepool-temporal-api-key"},
                     id="an API key from its Secret"),
        pytest.param("temporal-cloud-mtls", {"TIDEPOOL_TEMPORAL_TLS_CERT_FILE": "tidepool-temporal-tls",
                                             "TIDEPOOL_TEMPORAL_TLS_KEY_FILE": "tidepool-temporal-tls"},
                     id="a client certificate and key from their Secret"),
    ],
)  # fmt: skip
def test_temporal_credentials_are_files_mounted_from_secrets(overlay: str, files: dict[str, str]) -> None:
    deployment = next(d for d in yaml.safe_load_all(render(overlay)) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}  # not the pod's own name
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for variable, secret in files.items():
        directory = str(Path(env[variable]).parent)
        assert secrets[mounts[directory]] == secret, f"{variable} is not read from Secret {secret}"
    # No credential in the ConfigMap, none inlined in the manifests.
    assert not [d for d in yaml.safe_load_all(render(overlay)) if d["kind"] == "Secret"]


@pytest.mark.env
@pytest.mark.deploy
def test_every_overlay_passes_a_server_side_dry_run_and_the_worker_may_do_what_it_does_and_no_more(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    cluster = make_cluster("deploy")  # CRDs installed for real, so that the CRs and RBAC on them validate
    kubeconfig = cluster.kubeconfig
    assert kubectl("get", "namespace", SYSTEM_NAMESPACE, kubeconfig=kubeconfig).returncode == 0  # made with the CRDs
    for overlay in OVERLAYS:
        dry = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", kubeconfig=kubeconfig,
                      stdin=render(overlay))  # fmt: skip
        assert dry.returncode == 0, f"{overlay}: {dry.stderr}"
    real = kubectl("apply", "--server-side", "-f", "-", kubeconfig=kubeconfig, stdin=render("self-hosted"))
    assert real.returncode == 0, real.stderr

    # Pod Security "restricted" holds the namespace: the worker's pod and a virtual kubelet's are admitted (a dry
    # run: no kubelet here), a pod that may escalate is not.
    core = k8s.CoreV1Api(cluster.api_client())
    # The virtual kubelets' ServiceAccount, which the worker makes with the first one (and the token test below uses).
    admin = k8s.CoreV1Api(cluster.api_client())
    admin.create_namespaced_service_account(SYSTEM_NAMESPACE, k8s.V1ServiceAccount.model_validate({"metadata": {"name": SERVICE_ACCOUNT}}))
    worker = next(d for d in yaml.safe_load_all(render("self-hosted")) if d and d["kind"] == "Deployment")
    virtual_kubelet = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                                 kubeconfig_secret="k")  # fmt: skip
    for deployment in (worker, virtual_kubelet):
        template = deployment["spec"]["template"]
        core.create_namespaced_pod(SYSTEM_NAMESPACE, k8s.V1Pod.model_validate(
            {"metadata": {"name": deployment["metadata"]["name"]}, "spec": template["spec"]}), dry_run="All")  # fmt: skip
    escalating = {**virtual_kubelet["spec"]["template"]["spec"], "securityContext": {}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(SYSTEM_NAMESPACE, k8s.V1Pod.model_validate(
            {"metadata": {"name": "escalating"}, "spec": escalating}), dry_run="All")  # fmt: skip
    assert refused.value.status == 403 and 'violates PodSecurity "restricted' in json.loads(refused.value.body or "{}")["message"]

    def can(who: str, *args: str) -> bool:
        result = kubectl("auth", "can-i", f"--as={who}", *args, kubeconfig=kubeconfig)
        assert result.stdout.strip() in ("yes", "no"), result.stderr
        return result.stdout.strip() == "yes"

    foreign = "tidepool-foreign-somewhere"
    worker_may = [
        ("watch", "peeringrequests.tidepool.io"), ("patch", "peeringrequests.tidepool.io", "--subresource=status"),
        ("list", "clusterconfigs.tidepool.io"), ("patch", "advertisements.tidepool.io", "--subresource=status"),
        ("delete", "advertisements.tidepool.io"), ("watch", "nodes"), ("delete", "nodes"), ("list", "pods", "-A"),
        ("delete", "namespaces"), ("get", "secrets", "-n", SYSTEM_NAMESPACE), ("patch", "secrets", "-n", SYSTEM_NAMESPACE),
        ("delete", "secrets", "-n", SYSTEM_NAMESPACE),  # a provider's credentials, after a forced unpeer (policy: by name)
        ("patch", "deployments.apps", "-n", SYSTEM_NAMESPACE), ("delete", "deployments.apps", "-n", SYSTEM_NAMESPACE),
        ("create", f"serviceaccounts/{SERVICE_ACCOUNT}", "--subresource=token", "-n", foreign),
        ("bind", f"clusterroles/{CLUSTER_ROLE}"), ("create", "events", "-n", "default"),
        ("patch", "namespaces"), ("bind", f"clusterroles/{CREDENTIALS_CLUSTER_ROLE}"),
        *[("get", f"{kind}.admissionregistration.k8s.io/{name}") for name in (SERVICES_POLICY_NAME, PODS_POLICY_NAME)
          for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")],
        ("create", f"rolebindings/{CREDENTIALS_BINDING}", "-n", foreign),
        # The offloading controller (workers/offloading.py): NamespaceOffloadings, the namespace label, the drain.
        ("watch", "namespaceoffloadings.tidepool.io", "-A"), ("patch", "namespaceoffloadings.tidepool.io", "-n", "shop"),
        ("patch", "namespaceoffloadings.tidepool.io", "--subresource=status", "-n", "shop"), ("watch", "namespaces"),
        ("delete", "pods", "-n", "shop"),
        *[(verb, "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE) for verb in ("get", "create", "update")],
        # The RemoteNamespace controller (workers/remote_namespaces.py) and the offer split.
        ("watch", "remotenamespaces.tidepool.io", "-A"), ("patch", "remotenamespaces.tidepool.io", "-n", foreign),
        ("patch", "remotenamespaces.tidepool.io", "--subresource=status", "-n", foreign),
        ("delete", "remotenamespaces.tidepool.io", "-n", foreign), ("get", "namespaces"), ("watch", "namespaces"),
        ("watch", "resourcequotas", "-A"), ("bind", f"clusterroles/{REMOTE_NAMESPACES_CLUSTER_ROLE}"),
    ]  # fmt: skip
    worker_may_not = [
        ("update", "leases.coordination.k8s.io", "-n", "kube-system"), ("delete", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE),
        ("get", "secrets", "-A"), ("get", "secrets", "-n", "kube-system"), ("list", "secrets", "-n", SYSTEM_NAMESPACE),
        ("create", "pods", "-n", "kube-system"), ("create", "deployments.apps", "-n", "kube-system"),
        ("create", "serviceaccounts/default", "--subresource=token", "-n", "kube-system"),
        ("bind", "clusterroles/cluster-admin"), ("escalate", "roles", "-n", foreign), ("create", "roles", "-n", foreign),
        ("create", "clusterroles"), ("patch", f"clusterroles/{CLUSTER_ROLE}"),
        ("patch", "rolebindings/admin", "-n", foreign), ("delete", "peeringrequests.tidepool.io"),
        # Secrets in a foreign namespace only through the binding it makes there itself (below).
        ("create", "secrets", "-n", foreign), ("delete", "secrets", "-n", foreign), ("list", "secrets", "-n", foreign),
        ("patch", f"clusterroles/{CREDENTIALS_CLUSTER_ROLE}"),
        # The quota and LimitRange of a foreign namespace only through that binding too.
        ("patch", "resourcequotas", "-n", foreign), ("create", "limitranges", "-n", foreign),
        ("patch", f"validatingadmissionpolicies.admissionregistration.k8s.io/{SERVICES_POLICY_NAME}"),
        ("create", "namespaceoffloadings.tidepool.io", "-n", "shop"), ("delete", "namespaceoffloadings.tidepool.io", "-n", "shop"),
        ("delete", f"validatingadmissionpolicybindings.admissionregistration.k8s.io/{SERVICES_POLICY_NAME}"),
    ]  # fmt: skip
    assert [a for a in worker_may if not can(WORKER, *a)] == []
    assert [a for a in worker_may_not if can(WORKER, *a)] == []
    virtual_kubelet_may = [("create", "nodes"), ("patch", "nodes", "--subresource=status"), ("watch", "nodes"),
                           ("patch", "pods", "--subresource=status", "-n", "shop"), ("get", "secrets", "-n", "shop"),
                           ("create", "leases.coordination.k8s.io", "-n", "kube-node-lease"), ("get", "pods", "-n", "shop"),
                           ("watch", "configmaps", "-A"), ("watch", "services", "-A"), ("create", "events", "-n", "shop"),
                           ("patch", "events", "-n", "shop"), ("create", "subjectaccessreviews.authorization.k8s.io"),
                           ("get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"),
                           # namespace offloading: which namespaces to reflect, and its own status entry
                           ("watch", "namespaceoffloadings.tidepool.io", "-A"),
                           ("patch", "namespaceoffloadings.tidepool.io", "--subresource=status", "-n", "shop")]  # fmt: skip
    virtual_kubelet_may_not = [("delete", "nodes"), ("list", "secrets", "-A"), ("watch", "secrets", "-n", "shop"),
                               ("create", "pods", "-n", "shop"), ("create", "services", "-n", "shop"),
                               ("patch", "advertisements.tidepool.io", "--subresource=status"),
                               ("patch", "namespaceoffloadings.tidepool.io", "-n", "shop"),
                               ("delete", "namespaceoffloadings.tidepool.io", "-n", "shop")]  # fmt: skip
    assert [a for a in virtual_kubelet_may if not can(VIRTUAL_KUBELET, *a)] == []
    assert [a for a in virtual_kubelet_may_not if can(VIRTUAL_KUBELET, *a)] == []

    # The provider's grant, made for real as the worker: server-side applies that create, a binding of
    # the ClusterRole (which the worker holds none of), a token.
    as_worker = cluster.api_client()
    as_worker.set_default_header("Impersonate-User", WORKER)
    calls = ThreadPoolExecutor(2)
    namespace, held = ensure_foreign_access(as_worker, "somewhere", offered=Resources(cpu="1", pods="10"),
                                            pod_security="baseline", calls=calls)  # fmt: skip
    assert (namespace, held) == (foreign, None)
    quota = k8s.CoreV1Api(cluster.api_client()).read_namespaced_resource_quota(QUOTA_NAME, foreign)
    assert (quota.spec.hard or {}).get("requests.cpu") == "1" and (quota.spec.hard or {}).get("pods") == "10"
    # Three generations: the worker binds itself the credentials role there, creates the anchor Secrets
    # the tokens are bound to, lists them and deletes the one before the previous.
    for generation in (1, 2, 3):
        issued = issue_kubeconfig(as_worker, namespace=namespace, generation=generation, lifetime_seconds=600,
                                  server=None)  # fmt: skip
        assert "token" in issued.text
    assert revoke_older_tokens(as_worker, namespace, current=3, calls=calls) == [1]
    assert can(WORKER, "create", "secrets", "-n", foreign) and can(WORKER, "delete", "secrets", "-n", foreign)
    assert not can(WORKER, "create", "secrets", "-n", "elsewhere") and not can(WORKER, "list", "secrets", "-A")
    # Through the same binding, the copies of a consumer whose keepalive lapsed, and that keepalive alone.
    after_a_silent_consumer = [("deletecollection", "pods"), ("delete", "pods"), ("deletecollection", "configmaps"),
                               ("deletecollection", "secrets"), ("list", "services"), ("delete", "services"),
                               ("get", f"leases.coordination.k8s.io/{CONSUMER_KEEPALIVE_LEASE}"),
                               ("delete", f"leases.coordination.k8s.io/{CONSUMER_KEEPALIVE_LEASE}"),
                               ("patch", "resourcequotas"), ("create", "limitranges")]  # fmt: skip
    assert [a for a in after_a_silent_consumer if not can(WORKER, *a, "-n", foreign)] == []
    # ...but deleting one pod: the consumer's offloading controller deletes, anywhere, the pods on virtual nodes of a
    # namespace it drains (workers/offloading.py), and the worker may delete namespaces already.
    assert [a for a in after_a_silent_consumer if can(WORKER, *a, "-n", "elsewhere")] == [("delete", "pods")]
    assert not can(WORKER, "delete", "leases.coordination.k8s.io/other", "-n", foreign)
    assert not can(WORKER, "delete", "configmaps", "-n", foreign) and not can(WORKER, "create", "pods", "-n", foreign)
    with pytest.raises(ApiException) as refused:  # the same client is the worker, not the admin
        k8s.CoreV1Api(as_worker).list_namespaced_secret("kube-system")
    assert refused.value.status == 403
    binding = k8s.RbacAuthorizationV1Api(cluster.api_client()).read_namespaced_role_binding(SERVICE_ACCOUNT, foreign)
    assert (binding.role_ref.kind, binding.role_ref.name) == ("ClusterRole", CLUSTER_ROLE)
    # What the foreign virtual kubelet may do through it: its copies, their Events, logs and exec, there only.
    foreign_vk = f"system:serviceaccount:{foreign}:{SERVICE_ACCOUNT}"
    foreign_vk_may = [("create", "pods"), ("watch", "events"), ("create", "services"), ("get", "pods/log"),
                      ("create", "leases.coordination.k8s.io"),
                      ("patch", f"leases.coordination.k8s.io/{CONSUMER_KEEPALIVE_LEASE}"),
                      *[(verb, f"pods/{sub}") for sub in ("exec", "attach", "portforward") for verb in ("get", "create")]]
    assert [a for a in foreign_vk_may if not can(foreign_vk, *a, "-n", foreign)] == []
    assert [a for a in foreign_vk_may if can(foreign_vk, *a, "-n", "elsewhere")] == []
    assert not can(foreign_vk, "patch", "leases.coordination.k8s.io/other", "-n", foreign)
    # ...and nothing it does not use: no pod updates or status, no Events of its own there, no quota.
    foreign_vk_may_not = [("update", "pods"), ("patch", "pods", "--subresource=status"), ("create", "events"), ("patch", "services"),
                          ("deletecollection", "services"), ("patch", "resourcequotas"), ("delete", "limitranges")]
    assert [a for a in foreign_vk_may_not if can(foreign_vk, *a, "-n", foreign)] == []
    # Its requests for namespaces of its own: asked, followed and given up in its control namespace alone; never
    # answered (status) nor changed by it.
    asks = [(verb, "remotenamespaces.tidepool.io") for verb in ("create", "get", "list", "watch", "delete")]
    assert [a for a in asks if not can(foreign_vk, *a, "-n", foreign)] == []
    assert [a for a in asks if can(foreign_vk, *a, "-n", "elsewhere")] == []
    answers = [("patch", "remotenamespaces.tidepool.io", "--subresource=status"), ("update", "remotenamespaces.tidepool.io"),
               ("patch", "remotenamespaces.tidepool.io"), ("deletecollection", "remotenamespaces.tidepool.io")]
    assert [a for a in answers if can(foreign_vk, *a, "-n", foreign)] == []

    # What RBAC allows cluster-wide, the admission policy narrows to tidepool's own objects.
    admin.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "victim"}}))
    create_node(cluster.api_client(), "physical", cpu="1", memory="1Gi")
    create_node(cluster.api_client(), "tidepool-somewhere", cpu="1", memory="1Gi",
                labels={LABEL_NODE_TYPE: VIRTUAL_NODE_TYPE})  # fmt: skip
    for secret in ("temporal-credentials", "tidepool-peer-somewhere"):
        admin.create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({"metadata": {"name": secret}}))
    worker = k8s.CoreV1Api(as_worker)

    def policy_in_force() -> bool:  # a new policy takes effect within seconds; a dry run asks without harm
        try:
            worker.delete_namespace("victim", dry_run="All")
        except ApiException as e:
            return bool(e.status == 403)  # the client leaves `status` untyped
        return False

    wait_for(policy_in_force, timeout=30, what="the admission policy in force")
    refusals: dict[str, Callable[[], object]] = {
        "namespace": lambda: worker.delete_namespace("victim"),
        "node": lambda: worker.delete_node("physical"),
        "cordon": lambda: worker.patch_node("physical", {"spec": {"unschedulable": True}}),
        "token": lambda: worker.create_namespaced_service_account_token(SERVICE_ACCOUNT, SYSTEM_NAMESPACE,
                                                                       k8s.AuthenticationV1TokenRequest.model_validate({"spec": {"expirationSeconds": 600}})),
        # RBAC lets it bind the credentials role by name anywhere; the policy keeps that to foreign namespaces.
        "secrets elsewhere": lambda: apply_core(as_worker, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": CREDENTIALS_BINDING, "namespace": "victim"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CREDENTIALS_CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": "tidepool-worker", "namespace": SYSTEM_NAMESPACE}]}),
        # RBAC lets it patch the Secrets of tidepool-system; the policy keeps that to the peering kubeconfigs.
        "temporal credentials": lambda: worker.patch_namespaced_secret("temporal-credentials", SYSTEM_NAMESPACE,
                                                                       {"metadata": {"labels": {"x": "y"}}}),
        # RBAC lets it delete them too; the policy keeps that to the peering kubeconfigs and a provider's credentials.
        "temporal credentials deleted": lambda: worker.delete_namespaced_secret("temporal-credentials", SYSTEM_NAMESPACE),
        "a peering kubeconfig deleted": lambda: worker.delete_namespaced_secret("tidepool-peer-somewhere", SYSTEM_NAMESPACE),
        # A namespace for a consumer is any name but a reserved one, and only one it labels as made for one.
        "an unlabelled namespace": lambda: worker.create_namespace(k8s.V1Namespace.model_validate(
            {"metadata": {"name": "unlabelled"}})),
        "a reserved namespace": lambda: worker.create_namespace(k8s.V1Namespace.model_validate(
            {"metadata": {"name": "kube-made", "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: "somewhere"}}})),
        "labels put on a namespace not made": lambda: worker.patch_namespace("victim", {"metadata": {"labels": {
            LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: "somewhere"}}}),
        # Of a namespace it did not make, the offloading label alone.
        "another label beside the offloading one": lambda: worker.patch_namespace("victim", {"metadata": {"labels": {
            LABEL_OFFLOADING: "LocalAndRemote", "team": "mine"}}}),
        "the offloading label of a reserved namespace": lambda: worker.patch_namespace("kube-public", {"metadata": {
            "labels": {LABEL_OFFLOADING: "LocalAndRemote"}}}),
    }  # fmt: skip
    for what, call in refusals.items():
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403 and "tidepool worker" in str(refused.value.body), what
    for value in ("LocalAndRemote", None):  # a namespace offloaded, then no longer (workers/offloading.py)
        worker.patch_namespace("victim", {"metadata": {"labels": {LABEL_OFFLOADING: value}}})
    worker.patch_namespaced_secret("tidepool-peer-somewhere", SYSTEM_NAMESPACE,  # a renewed peering kubeconfig
                                   {"metadata": {"labels": {"renewed": "yes"}}})  # fmt: skip
    admin.create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate(
        {"metadata": {"name": credentials_secret_name("somewhere")}}))  # fmt: skip
    worker.delete_namespaced_secret(credentials_secret_name("somewhere"), SYSTEM_NAMESPACE)  # after a forced unpeer
    worker.delete_node("tidepool-somewhere")  # a virtual node: the consumer's teardown
    # A namespace made for the consumer's RemoteNamespace, as the controller makes it, with its share of the offer.
    ensure_remote_namespace(as_worker, consumer="somewhere", name="made-for-somewhere", consumer_namespace="shop",
                            level="baseline")  # fmt: skip
    shares = {ns: (admin.read_namespaced_resource_quota(QUOTA_NAME, ns).spec.hard or {}).get("pods") for ns in (foreign, "made-for-somewhere")}
    assert shares == {foreign: "5", "made-for-somewhere": "5"}
    revoke_foreign_access(as_worker, "somewhere")  # its own namespaces: the provider's withdrawal
    assert admin.read_namespace("made-for-somewhere").metadata.deletion_timestamp is not None
    assert admin.read_namespace("victim").status.phase == "Active"


POOL = f"system:serviceaccount:{SYSTEM_NAMESPACE}:tidepool-pool"
SYNCER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:tidepool-syncer"
# In a tenant control plane: the identity `tidepool pool add-tenant` mints (deploy/pool/tenant).
TENANT_POOL = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{TENANT_IDENTITY}"


@functools.cache
def render_pool(part: str) -> str:
    result = kubectl("kustomize", str(DEPLOY / "pool" / part))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.deploy
@pytest.mark.pool
def test_the_tenant_identity_manifest_is_what_add_tenant_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[dict[str, Any]] = []

    def record(_: k8s.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
        applied.append(body)
        return body

    monkeypatch.setattr(identity, "apply_core", record)
    monkeypatch.setattr(tenant_identity, "request_token", lambda *_: "token")
    monkeypatch.setattr(tenant_identity, "token_kubeconfig", lambda *_, **__: "kubeconfig")
    tenant_identity.mint_tenant_identity(k8s.ApiClient())
    assert applied == documents(DEPLOY / "pool" / "tenant" / "rbac.yaml")


@pytest.mark.env
@pytest.mark.deploy
@pytest.mark.pool
def test_the_pool_worker_and_each_syncer_run_from_the_image_in_the_management_cluster() -> None:
    rendered = list(yaml.safe_load_all(render_pool("management")))
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in rendered if d["kind"] == "Deployment"}
    worker, syncer = deployments["tidepool-pool"], deployments["tidepool-syncer-s1"]
    assert worker["containers"][0]["command"] == ["python", "-m", "workers.pool"]
    assert worker["serviceAccountName"] == "tidepool-pool" and syncer["serviceAccountName"] == "tidepool-syncer"
    config = next(d for d in rendered if d["kind"] == "ConfigMap")
    assert worker["containers"][0]["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    assert "TIDEPOOL_CLUSTER_KUBECONFIG" not in config["data"]  # in-cluster
    container = syncer["containers"][0]
    # Every tenant, from the management cluster it runs in (no --management-kubeconfig: in-cluster).
    assert container["command"] == ["python", "-m", "workers.syncer", "--cluster=s1",
                                    "--super-kubeconfig=/etc/tidepool/super/kubeconfig",
                                    "--kubelet-address=$(POD_IP)", "--kubelet-port=10250"]  # fmt: skip
    # Its kubelet API, for every tenant, at the pod's own IP (the downward API) on the port it declares.
    assert container["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert container["ports"] == [{"name": "kubelet", "containerPort": 10250}]
    assert {c["image"] for c in (worker["containers"][0], container)} == {"ghcr.io/tidepool/tidepool:0.1.0"}
    # The super cluster's kubeconfig is the Secret its SuperCluster names, mounted where the syncer reads it.
    kubeconfig = next(a.split("=", 1)[1] for a in container["command"] if a.startswith("--super-kubeconfig="))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in syncer["volumes"] if "secret" in v}
    assert [secrets[name] for name, path in mounts.items() if str(Path(kubeconfig).parent) == path] == ["super-s1"]
    assert not [d for d in rendered if d["kind"] == "Secret"]
    assert {d["metadata"]["name"] for d in rendered if d["kind"] == "Namespace"} == {SYSTEM_NAMESPACE, TENANT_SECRETS_NAMESPACE}
    _two_replicas_each_named_in_the_lease_and_one_evicted_at_a_time(rendered, "tidepool-pool")


def _can(cluster: LocalCluster, who: str, *args: str) -> bool:
    result = kubectl("auth", "can-i", f"--as={who}", *args, kubeconfig=cluster.kubeconfig)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def _answered_otherwise(cluster: LocalCluster, who: str, checks: list[tuple[str, ...]], *, allowed: bool) -> list[tuple[str, ...]]:
    return [c for c in checks if _can(cluster, who, *c) != allowed]


@pytest.mark.env
@pytest.mark.deploy
@pytest.mark.pool
def test_the_pool_manifests_apply_and_the_pool_worker_and_syncer_may_do_what_they_do_and_no_more(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    management, tenant, super_cluster = make_cluster("pool-mgmt"), make_cluster("pool-tenant"), make_cluster("pool-super")
    for cluster, part in ((management, "management"), (tenant, "tenant"), (super_cluster, "super-cluster")):
        applied = kubectl("apply", "--server-side", "-f", "-", kubeconfig=cluster.kubeconfig, stdin=render_pool(part))
        assert applied.returncode == 0, f"{part}: {applied.stderr}"

    ns, tenants = ("-n", "shop"), ("-n", TENANT_SECRETS_NAMESPACE)
    pool_may = [
        ("list", "superclusters.tidepool.io"), ("watch", "superclusters.tidepool.io"),
        ("patch", "superclusters.tidepool.io", "--subresource=status"), ("get", "clusterconfigs.tidepool.io"),
        ("watch", "clusterconfigs.tidepool.io"), ("get", "secrets", "-n", SYSTEM_NAMESPACE),
        ("get", "tenants.tidepool.io"), ("list", "tenants.tidepool.io"), ("watch", "tenants.tidepool.io"),
        ("patch", "tenants.tidepool.io", "--subresource=status"),
        ("list", "secrets", *tenants), ("watch", "secrets", *tenants), ("patch", "secrets", *tenants),
        *[(verb, "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE) for verb in ("get", "create", "update")],
    ]  # fmt: skip
    # In the management cluster the pool worker touches no tenant namespace: tenants are reached with their identities.
    pool_may_not = [
        ("update", "leases.coordination.k8s.io", "-n", "kube-system"), ("delete", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE),
        ("patch", "superclusters.tidepool.io"), ("create", "superclusters.tidepool.io"),
        ("patch", "clusterconfigs.tidepool.io"), ("list", "secrets", "-n", SYSTEM_NAMESPACE),
        ("get", "secrets", *ns), ("get", "secrets", "-n", "kube-system"), ("create", "secrets", *tenants),
        ("delete", "secrets", *tenants), ("patch", "tenants.tidepool.io"), ("create", "tenants.tidepool.io"),
        ("delete", "tenants.tidepool.io"), ("list", "pods", "-A"), ("patch", "namespaces"), ("list", "namespaces"),
        ("create", "events", *ns), ("create", "pods", *ns), ("delete", "namespaces"), ("patch", "nodes"),
    ]  # fmt: skip
    assert _answered_otherwise(management, POOL, pool_may, allowed=True) == []
    assert _answered_otherwise(management, POOL, pool_may_not, allowed=False) == []
    syncer_in_management_may = [("list", "tenants.tidepool.io"), ("watch", "tenants.tidepool.io"),
                                ("patch", "tenants.tidepool.io"), ("list", "secrets", *tenants),
                                ("watch", "secrets", *tenants), ("get", "superclusters.tidepool.io"),
                                ("list", "superclusters.tidepool.io"), ("watch", "superclusters.tidepool.io")]  # fmt: skip
    syncer_in_management_may_not = [
        ("create", "tenants.tidepool.io"), ("delete", "tenants.tidepool.io"),
        ("patch", "tenants.tidepool.io", "--subresource=status"), ("get", "secrets", "-n", SYSTEM_NAMESPACE),
        ("list", "secrets", "-A"), ("patch", "secrets", *tenants), ("create", "secrets", *tenants),
        ("patch", "superclusters.tidepool.io"), ("patch", "superclusters.tidepool.io", "--subresource=status"),
        ("list", "pods", "-A"), ("list", "namespaces"), ("create", "events", *ns),
    ]  # fmt: skip
    assert _answered_otherwise(management, SYNCER, syncer_in_management_may, allowed=True) == []
    assert _answered_otherwise(management, SYNCER, syncer_in_management_may_not, allowed=False) == []
    # In the tenant: the scheduler's and the syncers' calls there, as the one identity add-tenant mints.
    in_tenant_may = [
        ("list", "namespaces"), ("watch", "namespaces"), ("patch", "namespaces"), ("get", "namespaces"),
        ("list", "resourcequotas", "-A"), ("list", "pods", "-A"), ("get", "pods", *ns), ("patch", "pods", *ns),
        ("delete", "pods", *ns), ("patch", "pods", "--subresource=status", *ns),
        ("patch", "services", "--subresource=status", *ns), ("patch", "persistentvolumeclaims", "--subresource=status", *ns),
        ("create", "persistentvolumes"), ("patch", "persistentvolumes"), ("delete", "persistentvolumes"),
        ("watch", "persistentvolumes"),
        ("create", "events", *ns), ("patch", "events", *ns),
        ("create", f"serviceaccounts/{TENANT_IDENTITY}", "--subresource=token", "-n", SYSTEM_NAMESPACE),
        # Its virtual nodes (workers/tenant_nodes.py): kept, heartbeaten, pods bound to them, callers reviewed.
        *[(verb, "nodes") for verb in ("create", "get", "list", "watch", "patch", "delete")],
        ("patch", "nodes", "--subresource=status"), ("create", "pods", "--subresource=binding", *ns),
        ("create", "leases.coordination.k8s.io", "-n", "kube-node-lease"),
        ("patch", "leases.coordination.k8s.io", "-n", "kube-node-lease"),
        ("get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"),
        ("create", "subjectaccessreviews.authorization.k8s.io"),
        *[("watch", kind, "-A") for kind in (
            "configmaps", "secrets", "services", "serviceaccounts", "resourcequotas", "limitranges",
            "persistentvolumeclaims", "endpoints", "endpointslices.discovery.k8s.io", "ingresses.networking.k8s.io",
            "networkpolicies.networking.k8s.io")],
    ]  # fmt: skip
    in_tenant_may_not = [
        ("create", "pods", *ns), ("create", "namespaces"), ("delete", "namespaces"), ("create", "configmaps", *ns),
        ("create", "secrets", *ns), ("patch", "secrets", *ns), ("delete", "services", *ns),
        ("get", "nodes", "--subresource=proxy"), ("create", "leases.coordination.k8s.io", *ns),
        ("patch", "resourcequotas", *ns), ("patch", "services", *ns), ("create", "clusterroles"),
        ("create", "clusterrolebindings"), ("escalate", "clusterroles"), ("bind", "clusterroles"),
        ("create", "serviceaccounts/default", "--subresource=token", "-n", SYSTEM_NAMESPACE),
        ("create", f"serviceaccounts/{TENANT_IDENTITY}", "--subresource=token", *ns),
        ("list", "superclusters.tidepool.io"),
    ]  # fmt: skip
    assert _answered_otherwise(tenant, TENANT_POOL, in_tenant_may, allowed=True) == []
    assert _answered_otherwise(tenant, TENANT_POOL, in_tenant_may_not, allowed=False) == []
    copies = ("configmaps", "secrets", "services", "serviceaccounts", "resourcequotas", "limitranges",
              "persistentvolumeclaims", "endpoints", "endpointslices.discovery.k8s.io", "ingresses.networking.k8s.io",
              "networkpolicies.networking.k8s.io")  # fmt: skip
    syncer_in_super_may = [
        ("create", "namespaces"), ("get", "namespaces"), ("patch", "namespaces"), ("delete", "namespaces"),
        ("watch", "namespaces"), ("create", "pods", *ns), ("delete", "pods", *ns), ("watch", "pods", "-A"),
        ("watch", "events", "-A"), ("list", "nodes"), ("watch", "nodes"), *[("watch", kind, "-A") for kind in copies],
        ("list", "servicecidrs.networking.k8s.io"), ("watch", "servicecidrs.networking.k8s.io"),
        ("get", "pods", "--subresource=log", *ns), ("create", "pods", "--subresource=exec", *ns),
        ("create", "pods", "--subresource=portforward", *ns),
        *[(verb, kind, *ns) for kind in copies for verb in ("get", "list", "watch", "create", "patch", "delete")],
    ]  # fmt: skip
    syncer_in_super_may_not = [
        ("patch", "pods", *ns), ("patch", "nodes"), ("delete", "nodes"), ("create", "persistentvolumes"),
        ("create", "servicecidrs.networking.k8s.io"),
        ("create", "clusterroles"), ("create", "rolebindings", *ns), ("create", "deployments.apps", *ns),
    ]  # fmt: skip
    assert _answered_otherwise(super_cluster, SYNCER, syncer_in_super_may, allowed=True) == []
    assert _answered_otherwise(super_cluster, SYNCER, syncer_in_super_may_not, allowed=False) == []

    # The prober, run for real as the pool worker: reads the ClusterConfig, lists the SuperClusters, reads
    # the kubeconfig Secret one names and writes its health on its status.
    admin = management.api_client()
    k8s.CoreV1Api(admin).create_namespaced_secret(SYSTEM_NAMESPACE, k8s.V1Secret.model_validate({
        "metadata": {"name": "super-s1"},
        "data": {"kubeconfig": base64.b64encode(super_cluster.kubeconfig.read_bytes()).decode()}}))  # fmt: skip
    create_node(super_cluster.api_client(), "s1-node", cpu="4", memory="8Gi")
    wait_takes_foreign_pods(super_cluster.api_client(), "s1-node")  # the prober below probes once
    apply_cluster_object(admin, SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster",
        "metadata": {"name": "s1"}, "spec": {"kubeConfigRef": {"name": "super-s1", "namespace": SYSTEM_NAMESPACE}}})  # fmt: skip
    as_pool = management.api_client()
    as_pool.set_default_header("Impersonate-User", POOL)
    HealthProber(as_pool).probe_round()
    status = (read_cluster_object(admin, SUPER_CLUSTERS, "s1") or {}).get("status") or {}
    assert [c["reason"] for c in status.get("conditions") or [] if c["type"] == "Ready"] == ["ProbeSucceeded"]


@pytest.mark.env
@pytest.mark.deploy
@pytest.mark.pool
@pytest.mark.tenants
def test_the_token_add_tenant_mints_reads_and_reports_in_the_tenant_and_cannot_create_or_escalate(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    tenant = make_cluster("pool-tenant")
    admin = tenant.api_client()
    create_namespace(admin, "shop")
    create_pod(admin, "shop", "web")
    identity = client_from_peer_kubeconfig_text(mint_tenant_identity(admin, lifetime_seconds=600))
    core, rbac = k8s.CoreV1Api(identity), k8s.RbacAuthorizationV1Api(identity)
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items if p.metadata] == ["web"]
    core.patch_namespaced_pod_status("web", "shop", {"status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no super cluster"}]}})  # fmt: skip
    core.list_namespaced_secret("shop")  # the syncers copy Secrets down
    refusals: dict[str, Callable[[], object]] = {
        "a pod created": lambda: core.create_namespaced_pod("shop", k8s.V1Pod.model_validate(
            {"metadata": {"name": "mine"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})),
        "a namespace deleted": lambda: core.delete_namespace("shop"),
        "a Secret created": lambda: core.create_namespaced_secret("shop", k8s.V1Secret.model_validate({"metadata": {"name": "s"}})),
        "a Secret patched": lambda: core.patch_namespaced_secret("default-token", "shop", {"metadata": {"labels": {"x": "y"}}}),
        "cluster-admin bound": lambda: rbac.create_cluster_role_binding(k8s.V1ClusterRoleBinding.model_validate({
            "metadata": {"name": "mine"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                      "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": TENANT_IDENTITY, "namespace": SYSTEM_NAMESPACE}]})),
        "its own role widened": lambda: rbac.patch_cluster_role(TENANT_IDENTITY, {"rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        "another's token": lambda: core.create_namespaced_service_account_token("default", SYSTEM_NAMESPACE,
            k8s.AuthenticationV1TokenRequest.model_validate({"spec": {"expirationSeconds": 600}})),
    }  # fmt: skip
    for what, call in refusals.items():
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403, what
    # Its own next token, asked for with the current one, works; once revoked, no token of it does.
    renewed = client_from_peer_kubeconfig_text(renew_tenant_token(identity, lifetime_seconds=600))
    assert k8s.CoreV1Api(renewed).list_namespace().items
    revoke_tenant_identity(admin)

    def identity_refused() -> bool:
        try:
            k8s.CoreV1Api(renewed).list_namespace()
        except ApiException as e:
            return e.status in (401, 403)
        return False

    wait_for(identity_refused, timeout=10, what="the revoked identity refused")
