"""Small helpers the integration tests share: fake nodes, pods and namespaces on the real clusters."""

from __future__ import annotations

import base64
import datetime
import socket
import ssl
import warnings
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deploy.localenv.clusters import LocalCluster, fake_node, wait_for
from kube.objects import apply_cluster_object
from models.names import (
    API_VERSION,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    GROUP,
    NAMESPACE_OFFLOADING_NAME,
    NAMESPACE_OFFLOADINGS,
    VERSION,
)
from models.sharing import takes_foreign_pods

__all__ = ["apply_cluster_config", "create_namespace", "create_node", "create_pod", "create_runtime_class", "delete_quietly",
           "flattened_kubeconfig", "offload_namespace", "pod_spec", "wait_for", "wait_takes_foreign_pods"]


def apply_cluster_config(api: k8s.ApiClient, **spec: dict[str, Any]) -> None:
    """Server-side applies the cluster's ClusterConfig with these parts, e.g. outgoing={"sharingPercentage": 50}."""
    apply_cluster_object(api, CLUSTER_CONFIGS, {"apiVersion": API_VERSION, "kind": "ClusterConfig",
                                                "metadata": {"name": CLUSTER_CONFIG_NAME}, "spec": spec})  # fmt: skip


def create_node(api: k8s.ApiClient, name: str, *, cpu: str, memory: str, pods: str = "110",
                labels: dict[str, str] | None = None, pod_cidr: str | None = None) -> None:  # fmt: skip
    """A kwok node; its pods get IPs from `pod_cidr`, or from kwok's default block (see `fake_node`)."""
    body = fake_node(name, cpu=cpu, memory=memory, pods=pods, labels=labels, pod_cidr=pod_cidr)
    k8s.CoreV1Api(api).create_node(k8s.V1Node.model_validate(body))


def wait_takes_foreign_pods(api: k8s.ApiClient, name: str, *, timeout: float = 60) -> None:
    """Until the node is Ready and untainted: the API server's admission gives every new node the not-ready
    taint, and the node lifecycle controller takes it off once kwok reports the node Ready. What reads the
    nodes once (not from a watch) waits for that, as a pool's prober would see it on its next round."""

    def ready() -> bool:
        node = api.sanitize_for_serialization(k8s.CoreV1Api(api).read_node(name))
        conditions = (node.get("status") or {}).get("conditions") or []
        return takes_foreign_pods(node) and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, timeout=timeout, what=f"node {name} Ready and untainted")


def create_runtime_class(api: k8s.ApiClient, name: str, *, overhead: dict[str, str]) -> None:
    k8s.NodeV1Api(api).create_runtime_class(
        k8s.V1RuntimeClass.model_validate({"metadata": {"name": name}, "handler": name, "overhead": {"podFixed": overhead}})
    )


def create_namespace(api: k8s.ApiClient, name: str) -> None:
    try:
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": name}}))
    except ApiException as e:
        if e.status != 409:
            raise


def pod_spec(
    *,
    requests: dict[str, str] | None = None,
    init_requests: list[dict[str, str]] | None = None,
    node_name: str | None = None,
    runtime_class: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests or {}}}],
    }
    if init_requests:
        spec["initContainers"] = [
            {"name": f"init-{i}", "image": "busybox", "resources": {"requests": r}} for i, r in enumerate(init_requests)
        ]
    if node_name:
        spec["nodeName"] = node_name
    if runtime_class:
        spec["runtimeClassName"] = runtime_class  # admission copies the RuntimeClass's overhead into the pod
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    return spec


def create_pod(api: k8s.ApiClient, namespace: str, name: str, *, labels: dict[str, str] | None = None,
               **spec: Any) -> None:  # fmt: skip
    body = {"metadata": {"name": name, "labels": labels or {}}, "spec": pod_spec(**spec)}
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, k8s.V1Pod.model_validate(body))


def delete_quietly(call: Any, *args: Any, **kwargs: Any) -> None:
    """Deletes, treating 'already gone' as success (tests clean up after themselves)."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise


def flattened_kubeconfig(path: Path) -> str:
    """The kubeconfig with its certificate files embedded, as a Secret or a container gets it: kwok's
    refer to files on this machine that only their owner can read."""
    config = yaml.safe_load(path.read_text())
    sections = [c["cluster"] for c in config.get("clusters", [])] + [u["user"] for u in config.get("users", [])]
    for section in sections:
        for key in ("certificate-authority", "client-certificate", "client-key"):
            if key in section:
                section[f"{key}-data"] = base64.b64encode(Path(section.pop(key)).read_bytes()).decode()
    return str(yaml.safe_dump(config))


def offload_namespace(api: k8s.ApiClient, namespace: str, spec: dict[str, Any] | None = None) -> None:
    """`tidepool offload namespace NAMESPACE` as the cluster's admin: its NamespaceOffloading, created or updated."""
    body = {"apiVersion": API_VERSION, "kind": "NamespaceOffloading",
            "metadata": {"name": NAMESPACE_OFFLOADING_NAME, "namespace": namespace}, "spec": spec or {}}  # fmt: skip
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, NAMESPACE_OFFLOADINGS, NAMESPACE_OFFLOADING_NAME, body,
        field_manager="tidepool-test", force=True, _content_type="application/apply-patch+yaml")  # fmt: skip


def client_certificate(cluster: LocalCluster, directory: Path, *, user: str, group: str) -> tuple[Path, Path]:
    """A client certificate signed by the cluster's CA (kwokctl's, whose key is in the cluster's pki)."""
    pki = cluster.fake_pods.directory.parent / "pki"
    with warnings.catch_warnings():  # kwokctl's CA has serial number 0, which cryptography only warns of
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, group)])  # fmt: skip
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        # As Go's x509 writes it: a verifier trusting several CAs of one name (kwokctl's are all `kwok-ca`)
        # finds the issuer by it.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
            ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )  # fmt: skip
    cert_file, key_file = directory / "client.crt", directory / "client.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_file, key_file


def kubelet_get(endpoint: tuple[str, int], path: str, certificate: tuple[Path, Path] | None = None) -> bytes:
    """The status line a GET of a kubelet API gets with this client certificate (or none); ConnectionError when
    the TLS handshake refused the certificate (TLS 1.3 says so only at the first read)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    if certificate is not None:
        context.load_cert_chain(*certificate)
    with socket.create_connection(endpoint, timeout=10) as raw, context.wrap_socket(raw) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = tls.recv(1024)
    if not answer:
        raise ConnectionError("closed without an answer")
    return answer.split(b"\r\n", 1)[0]
