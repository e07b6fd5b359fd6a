"""`tidepool pool add-tenant` and `remove-tenant`, run as a user runs them: arguments refused with the rule
before any cluster is called; on real clusters (a management cluster and a tenant control plane), a Tenant
registered whose Secret the pool's registry turns into a working client, renewed by a second run, and removed
once the super clusters' syncers (their finalizers, held and released here as a syncer does) let it go."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deploy.localenv.clusters import LocalCluster
from kube.objects import APPLY, apply_cluster_object, read_cluster_object
from kube.tenant_identity import TENANT_IDENTITY, tenant_secret_name
from kube.tenants import TenantRegistry
from models.api.tenant import MAX_WEIGHT, NAME_RULE
from models.names import API_VERSION, GROUP, TENANT_SECRETS_NAMESPACE, TENANTS, VERSION, tenant_finalizer, tenant_key
from tests.kube import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.tenants]
ROOT = Path(__file__).resolve().parents[1]


def _tidepool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workers.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin"})  # fmt: skip


@pytest.mark.parametrize(("args", "said"), [
    pytest.param(["add-tenant", "Blue", "--tenant-kubeconfig", "t.yaml"], f"NAME 'Blue': {NAME_RULE}", id="upper case"),
    pytest.param(["add-tenant", "a.b", "--tenant-kubeconfig", "t.yaml"], f"NAME 'a.b': {NAME_RULE}", id="a dot"),
    pytest.param(["add-tenant", "a" * 64, "--tenant-kubeconfig", "t.yaml"], NAME_RULE, id="64 long"),
    pytest.param(["remove-tenant", "x-"], NAME_RULE, id="removing a name no Tenant can have"),
    pytest.param(["add-tenant", "blue", "--tenant-kubeconfig", "t.yaml", "--weight", "0"],
                 f"--weight 0: spec.weight is a whole number from 1 to {MAX_WEIGHT}", id="weight 0"),
    pytest.param(["add-tenant", "blue", "--tenant-kubeconfig", "t.yaml", "--weight", "1001"],
                 "--weight 1001: spec.weight is a whole number from 1", id="weight past the maximum"),
    pytest.param(["add-tenant", "blue"], "the following arguments are required: --tenant-kubeconfig",
                 id="no tenant kubeconfig"),
    pytest.param(["remove-tenant", "blue", "--timeout", "soon"], "'soon' is not a duration", id="timeout"),
    pytest.param(["remove-tenant", "blue", "--timeout=-5m"], "'-5m' is not a duration", id="negative timeout"),
])  # fmt: skip
def test_bad_arguments_are_refused_with_the_argument_and_the_rule_before_any_cluster_is_called(
    args: list[str], said: str
) -> None:
    done = _tidepool("pool", *args, "--kubeconfig", "/nonexistent/management.yaml")
    assert (done.returncode, said in done.stderr) == (2, True), done.stderr


def test_an_unreadable_kubeconfig_is_named_by_its_flag() -> None:
    done = _tidepool("pool", "add-tenant", "blue", "--tenant-kubeconfig", "/nonexistent/t.yaml", "--kubeconfig",
                     "/nonexistent/m.yaml")  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith("tidepool pool add-tenant: --kubeconfig /nonexistent/m.yaml")


def _hold(management: k8s.ApiClient, tenant: str, *clusters: str) -> None:
    """What a super cluster's syncer does (workers/syncer.py _finalizer): its one finalizer, applied as its own
    field manager; an empty list releases it."""
    custom = k8s.CustomObjectsApi(management)
    for cluster in clusters:
        body = {"apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": tenant, "finalizers": [tenant_finalizer(cluster)]}}
        custom.patch_cluster_custom_object(GROUP, VERSION, TENANTS, tenant, body, field_manager=f"tidepool-syncer-{cluster}",
                                           _content_type=APPLY)  # fmt: skip


def _release(management: k8s.ApiClient, tenant: str, cluster: str) -> None:
    body = {"apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": tenant, "finalizers": []}}
    k8s.CustomObjectsApi(management).patch_cluster_custom_object(GROUP, VERSION, TENANTS, tenant, body,
                                                                 field_manager=f"tidepool-syncer-{cluster}",
                                                                 _content_type=APPLY)  # fmt: skip


def _secret(management: k8s.ApiClient, tenant: str) -> k8s.V1Secret | None:
    try:
        return k8s.CoreV1Api(management).read_namespaced_secret(tenant_secret_name(tenant), TENANT_SECRETS_NAMESPACE)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.mark.env
def test_add_tenant_registers_a_tenant_the_pool_reaches_and_a_second_run_renews_its_token_and_weight(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    management_cluster, tenant = make_cluster("mgmt"), make_cluster("tenant")
    management = management_cluster.api_client()
    added = _tidepool("pool", "add-tenant", "blue", "--tenant-kubeconfig", tenant.kubeconfig, "--weight", "3",
                      "--kubeconfig", management_cluster.kubeconfig)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"Tenant blue registered: key {tenant_key('blue')}, weight 3"), added.stdout
    assert f"Secret {TENANT_SECRETS_NAMESPACE}/{tenant_secret_name('blue')}" in added.stdout
    registry = TenantRegistry(management, name="test-tenant-admin", changed=lambda _: None).start()
    try:
        assert registry.wait_synced(30)
        first = wait_for(lambda: (c := registry.get("blue")) is not None and c.api is not None and c,
                         timeout=30, what="a client for Tenant blue")  # fmt: skip
        assert (first.weight, first.problem) == (3, None)
        assert "default" in {ns.metadata.name for ns in k8s.CoreV1Api(first.api).list_namespace().items}
        before = _secret(management, "blue")
        assert before is not None and before.metadata is not None

        again = _tidepool("pool", "add-tenant", "blue", "--tenant-kubeconfig", tenant.kubeconfig, "--weight", "5",
                          "--kubeconfig", management_cluster.kubeconfig)  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith("Tenant blue updated, token renewed: "), again.stdout
        after = _secret(management, "blue")
        assert after is not None and after.data is not None and before.data is not None
        assert after.data["kubeconfig"] != before.data["kubeconfig"]  # a new token
        renewed = wait_for(lambda: (c := registry.get("blue")) is not None and c.credentials != first.credentials
                           and c.api is not None and c, timeout=30, what="the renewed client")  # fmt: skip
        assert renewed.weight == 5
        # The client in use took the new token: whoever holds it keeps its informers, nothing lists again.
        assert renewed.api is first.api
        token = yaml.safe_load(base64.b64decode(after.data["kubeconfig"]))["users"][0]["user"]["token"]
        assert renewed.api.configuration.api_key["BearerToken"] == f"Bearer {token}"
        assert k8s.CoreV1Api(renewed.api).list_namespaced_pod("default").items == []
        # The kubeconfig holds a token of the minted identity, never the administrator's credentials.
        assert b"client-key" not in base64.b64decode(after.data["kubeconfig"])
    finally:
        registry.stop()
    # The API server holds Tenants to the same name rule the command says.
    with pytest.raises(ApiException) as refused:
        apply_cluster_object(management, TENANTS, {"apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": "a.b"},
                                                   "spec": {"kubeConfigRef": {"name": "x", "namespace": TENANT_SECRETS_NAMESPACE}}})  # fmt: skip
    assert refused.value.status == 422 and NAME_RULE in str(refused.value.body)


def _blue_added(make_cluster: Callable[[str], LocalCluster]) -> tuple[LocalCluster, LocalCluster]:
    """A management cluster and a tenant control plane of the test's own, the tenant added as `blue`."""
    management_cluster, tenant = make_cluster("mgmt"), make_cluster("tenant")
    added = _tidepool("pool", "add-tenant", "blue", "--tenant-kubeconfig", tenant.kubeconfig, "--kubeconfig",
                      management_cluster.kubeconfig)  # fmt: skip
    assert added.returncode == 0, added.stderr
    return management_cluster, tenant


@pytest.mark.env
def test_remove_tenant_waits_for_every_super_cluster_to_let_it_go_then_deletes_its_secret_and_identity(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    management_cluster, tenant = _blue_added(make_cluster)
    management = management_cluster.api_client()
    _hold(management, "blue", "s1", "s2")
    removing = subprocess.Popen([sys.executable, "-m", "workers.cli", "pool", "remove-tenant", "blue", "--wait",
                                 "--timeout", "2m", "--tenant-kubeconfig", str(tenant.kubeconfig),
                                 "--kubeconfig", str(management_cluster.kubeconfig)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    try:
        assert removing.stdout is not None
        assert removing.stdout.readline().startswith("Tenant blue deleted")
        assert removing.stdout.readline().strip() == "held by: s1, s2"
        _release(management, "blue", "s2")
        assert removing.stdout.readline().strip() == "held by: s1"
        time.sleep(1)  # still held: the command goes on waiting
        assert removing.poll() is None and _secret(management, "blue") is not None
        _release(management, "blue", "s1")
        out, err = removing.communicate(timeout=60)
    finally:
        removing.kill()
    assert removing.returncode == 0, err
    assert out.startswith("Tenant blue removed: nothing of it is left in the pool; "
                          f"Secret {TENANT_SECRETS_NAMESPACE}/{tenant_secret_name('blue')} deleted, "
                          f"identity {TENANT_IDENTITY} revoked"), out  # fmt: skip
    assert read_cluster_object(management, TENANTS, "blue") is None and _secret(management, "blue") is None
    with pytest.raises(ApiException) as gone:
        k8s.RbacAuthorizationV1Api(tenant.api_client()).read_cluster_role_binding(TENANT_IDENTITY)
    assert gone.value.status == 404
    # Again: nothing to remove, and it says so.
    again = _tidepool("pool", "remove-tenant", "blue", "--kubeconfig", management_cluster.kubeconfig)
    assert again.returncode == 0 and again.stdout.startswith("Tenant blue is not registered"), again.stdout


@pytest.mark.env
def test_remove_tenant_times_out_naming_the_super_clusters_that_still_hold_it_and_keeps_its_secret(
    make_cluster: Callable[[str], LocalCluster],
) -> None:
    management_cluster, tenant = _blue_added(make_cluster)
    management = management_cluster.api_client()
    _hold(management, "blue", "s1")
    started = time.monotonic()
    done = _tidepool("pool", "remove-tenant", "blue", "--wait", "--timeout", "3s", "--kubeconfig",
                     management_cluster.kubeconfig)  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert done.stderr.strip() == ("tidepool pool remove-tenant: Tenant blue still held after 3 s by: s1; its Secret "
                                   "and identity are kept until it is gone"), done.stderr  # fmt: skip
    assert _secret(management, "blue") is not None
    # Without --wait: deleted, said to be held, the Secret kept; and adding it back is refused while it goes.
    again = _tidepool("pool", "remove-tenant", "blue", "--kubeconfig", management_cluster.kubeconfig)
    assert again.returncode == 0 and "held by: s1\nits Secret is kept until it is gone" in again.stdout, again.stdout
    refused = _tidepool("pool", "add-tenant", "blue", "--tenant-kubeconfig", tenant.kubeconfig, "--kubeconfig",
                        management_cluster.kubeconfig)  # fmt: skip
    assert refused.returncode == 1 and "Tenant blue is being removed" in refused.stderr, refused.stderr
    _release(management, "blue", "s1")
