"""The virtual kubelet's kubelet API (workers/kubelet_api.py) on real clusters, without the rest of the
virtual kubelet: a consumer with a Node that kwok does not manage, whose address is our server, and a pod
bound to it; a provider with the pod's copy on a kwok fake node (which serves the copy's logs, exec,
attach and port-forward: deploy/localenv/clusters.py FakePodFiles). kubectl runs against the consumer."""

from __future__ import annotations

import datetime
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s

from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import LocalCluster, cri_log_line
from deploy.localenv.env import EnvState
from models.virtual_kubelet import ORIGIN_UID
from tests.kube import client_certificate, create_namespace, create_node, create_pod, kubelet_get, wait_for
from tests.offload import own_clusters
from workers.kubelet_api import CopyRef, KubeletApi, KubeletServer

pytestmark = [pytest.mark.env, pytest.mark.vk, pytest.mark.reflection]

NODE = "virtual-test"
NAMESPACE = "default"
POD = "web"


@dataclass
class Setup:
    consumer: LocalCluster
    provider: LocalCluster
    api: KubeletApi

    def command(self, *args: str) -> list[str]:
        return [str(ensure_binaries().kubectl), "--kubeconfig", str(self.consumer.kubeconfig), "-n", NAMESPACE, *args]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), input=stdin, capture_output=True, text=True, timeout=timeout)

    @contextmanager
    def running(self, *args: str) -> Iterator[subprocess.Popen[str]]:
        """kubectl left running (logs -f, attach, port-forward), its stdout read as it comes; killed after."""
        process = subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            yield process
        finally:
            process.kill()
            process.wait()


def _run_copy(provider: LocalCluster, remote_namespace: str, pod: str = POD) -> None:
    """The pod's copy, Running on the kwok fake node of the provider (made by the first call)."""
    provider_api = provider.api_client()
    provider_core = k8s.CoreV1Api(provider_api)
    create_namespace(provider_api, remote_namespace)
    if not provider_core.list_node(field_selector="metadata.name=fake").items:
        create_node(provider_api, "fake", cpu="4", memory="8Gi")
    create_pod(provider_api, remote_namespace, pod, node_name="fake")
    wait_for(lambda: provider_core.read_namespaced_pod(pod, remote_namespace).status.phase
             == "Running", timeout=60, what="the copy to run")  # fmt: skip


def _bind_to_served_node(consumer: LocalCluster, provider: LocalCluster, remote_namespace: str, *, port: int,
                         node: str = NODE, pod: str = POD) -> str:  # fmt: skip
    """The consumer's `node`, whose kubelet is the server at `port`, and `pod` bound to it; its uid."""
    core = k8s.CoreV1Api(consumer.api_client())
    core.create_node(k8s.V1Node.model_validate({"metadata": {"name": node}}))
    now = datetime.datetime.now(datetime.UTC).isoformat()
    core.patch_node_status(node, {"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
    }})  # fmt: skip
    create_pod(consumer.api_client(), NAMESPACE, pod, node_name=node)
    uid = str(core.read_namespaced_pod(pod, NAMESPACE).metadata.uid)
    # What the virtual kubelet writes on a copy it makes: whose copy it is (the kubelet API checks it).
    k8s.CoreV1Api(provider.api_client()).patch_namespaced_pod(pod, remote_namespace, {"metadata": {"annotations": {
        ORIGIN_UID: uid}}})  # fmt: skip
    # What the virtual kubelet reports for a running copy (kubectl port-forward asks for a running pod).
    core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": {"phase": "Running"}})
    return uid


@pytest.fixture(scope="module")
def setup(localenv: EnvState) -> Iterator[Setup]:
    """One consumer and provider for the module's tests: none changes what another reads (the logs a test
    appends to are put back)."""
    with own_clusters(localenv) as (make, suffix):
        consumer, provider = make("kcons"), make("kprov")
        remote_namespace = f"remote-{suffix}"
        _run_copy(provider, remote_namespace)
        # The copy is in its namespace's remote namespace, under the pod's own name (the virtual kubelet knows where).
        api = KubeletApi(host="127.0.0.1", port=0, provider=provider.api_client(), consumer=consumer.api_client(),
                         node_name=NODE, locate=_in(remote_namespace)).start()  # fmt: skip
        _bind_to_served_node(consumer, provider, remote_namespace, port=api.port)
        try:
            yield Setup(consumer=consumer, provider=provider, api=api)
        finally:
            api.stop()


def test_kubectl_logs_of_a_pod_on_the_virtual_node_are_the_copy_s(setup: Setup) -> None:
    done = setup.kubectl("logs", POD)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"fake pod of cluster {setup.provider.name} started\n"
    previous = setup.kubectl("logs", POD, "--previous")
    assert previous.stdout == f"fake pod of cluster {setup.provider.name}, previous run\n", previous.stderr


def test_kubectl_logs_follow_shows_lines_as_they_are_written(setup: Setup) -> None:
    logs = setup.provider.fake_pods.logs
    written = logs.read_bytes()
    try:
        with setup.running("logs", "-f", POD) as follower:
            assert follower.stdout is not None
            assert follower.stdout.readline() == f"fake pod of cluster {setup.provider.name} started\n"
            with open(logs, "a") as log:
                log.write(cri_log_line("a line written later"))
            assert follower.stdout.readline() == "a line written later\n"
    finally:
        logs.write_bytes(written)  # the module's other tests read the logs whole


def test_kubectl_exec_runs_in_the_copy_and_returns_output_and_exit_status(setup: Setup) -> None:
    done = setup.kubectl("exec", POD, "--", "sh", "-c", "echo out $TIDEPOOL_FAKE_POD_CLUSTER; echo err >&2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"out {setup.provider.name}\n"
    assert done.stderr == "err\n"
    failed = setup.kubectl("exec", POD, "--", "sh", "-c", "exit 3")
    assert failed.returncode != 0
    assert "exit status 3" in failed.stderr  # kwok reports a command's failure as an error with its status


def test_kubectl_exec_with_stdin_passes_input(setup: Setup) -> None:
    # A command that ends on its own: kwok's exec never closes a command's input (kubectl exec -i straight
    # to a fake pod waits forever for `cat` too), so the end of input cannot be shown against it.
    done = setup.kubectl("exec", "-i", POD, "--", "sh", "-c", 'read line; echo "got $line"', stdin="hello\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "got hello\n"


def test_kubectl_attach_shows_what_the_container_writes(setup: Setup) -> None:
    with setup.running("attach", POD) as attached:
        assert attached.stdout is not None
        time.sleep(3)  # kwok shows only lines written after the attach has started
        with open(setup.provider.fake_pods.attach_logs, "a") as log:
            log.write(cri_log_line("written while attached"))
        assert attached.stdout.readline() == "written while attached\n"


def test_kubectl_port_forward_reaches_the_copy_s_port(setup: Setup) -> None:
    local = _free_port()
    with setup.running("port-forward", f"pod/{POD}", f"{local}:8080") as forwarder:
        assert forwarder.stdout is not None
        first = forwarder.stdout.readline()
        assert "Forwarding from" in first, forwarder.stderr.read() if forwarder.poll() is not None else first
        for text in (b"first connection\n", b"second connection\n"):
            with socket.create_connection(("127.0.0.1", local), timeout=20) as connection:
                connection.sendall(text)  # every port of a fake pod echoes
                received = b""
                while len(received) < len(text):
                    chunk = connection.recv(1024)
                    assert chunk, f"connection closed after {received!r}"
                    received += chunk
                assert received == text


def test_a_caller_without_a_client_certificate_is_refused(setup: Setup) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        kubelet_get(("127.0.0.1", setup.api.port), f"/containerLogs/{NAMESPACE}/{POD}/main")


def test_a_caller_without_nodes_proxy_permission_is_forbidden(setup: Setup, tmp_path: Path) -> None:
    nobody = client_certificate(setup.consumer, tmp_path, user="nobody-in-particular", group="no-rbac")
    assert kubelet_get(("127.0.0.1", setup.api.port), f"/containerLogs/{NAMESPACE}/{POD}/main", nobody) == \
        b"HTTP/1.1 403 Forbidden"  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _in(remote_namespace: str) -> Callable[[str, str], list[CopyRef]]:
    return lambda _namespace, pod: [CopyRef(remote_namespace, pod)]


def test_one_server_serves_each_consumer_its_own_pods_by_the_ca_that_issued_the_caller(
    setup: Setup, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path
) -> None:
    """A syncer's one port for every tenant (workers/tenant_nodes.py): two consumers, each with a pod of the
    same name on a node whose kubelet is one server; each consumer's API server reaches its own copy, and a
    caller is the consumer whose client CA issued its certificate, whatever the path names."""
    consumers, node, pod = [setup.consumer, make_cluster("kcons2")], "virtual-shared", "shared"
    server = KubeletServer(host="127.0.0.1", port=0, name="shared").start()
    apis, uids = [], []
    try:
        for index, consumer in enumerate(consumers):
            remote_namespace = f"shared-{index}-{unique}"
            _run_copy(setup.provider, remote_namespace, pod)
            api = KubeletApi(host="127.0.0.1", port=0, provider=setup.provider.api_client(),
                             consumer=consumer.api_client(), node_name=node, locate=_in(remote_namespace))  # fmt: skip
            server.add(consumer.name, api)
            apis.append(api)
            uids.append(_bind_to_served_node(consumer, setup.provider, remote_namespace, port=server.port, node=node,
                                             pod=pod))  # fmt: skip
        for consumer in consumers:
            done = subprocess.run([str(ensure_binaries().kubectl), "--kubeconfig", str(consumer.kubeconfig), "-n",
                                   NAMESPACE, "logs", pod], capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout == f"fake pod of cluster {setup.provider.name} started\n"

        # The pod's uid in the path (as the API server sends it for exec, attach and port-forward): the first
        # consumer's admin reaches its pod (400: a GET that is no SPDY upgrade), the second's finds no such pod.
        endpoint = ("127.0.0.1", server.port)
        admins = []
        for consumer in consumers:
            (tmp_path / consumer.name).mkdir()
            admins.append(client_certificate(consumer, tmp_path / consumer.name, user="admin", group="system:masters"))
        first_pod = f"/portForward/{NAMESPACE}/{pod}/{uids[0]}"
        assert kubelet_get(endpoint, first_pod, admins[0]) == b"HTTP/1.1 400 Bad Request"
        assert kubelet_get(endpoint, first_pod, admins[1]) == b"HTTP/1.1 404 Not Found"

        # A consumer that lists the first one's CA as its own: the first one's callers are now issued by two
        # consumers' CAs, and refused, rather than served as either; the second one's are not affected.
        copied = KubeletApi(host="127.0.0.1", port=0, provider=setup.provider.api_client(),
                            consumer=consumers[0].api_client(), node_name=node, locate=_in("elsewhere"))  # fmt: skip
        server.add("copied", copied)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            kubelet_get(endpoint, first_pod, admins[0])
        assert kubelet_get(endpoint, f"/portForward/{NAMESPACE}/{pod}/{uids[1]}", admins[1]) == b"HTTP/1.1 400 Bad Request"
        server.remove("copied", copied)
        assert kubelet_get(endpoint, first_pod, admins[0]) == b"HTTP/1.1 400 Bad Request"
        # A consumer removed: its callers are refused at the handshake.
        server.remove(consumers[0].name, apis[0])
        with pytest.raises((ssl.SSLError, ConnectionError)):
            kubelet_get(endpoint, first_pod, admins[0])
    finally:
        server.stop()
