"""kube/clients.py: the clients made from kubeconfig Secrets share one TLS context per set of certificates
(a worker holds one such client per foreign cluster, and urllib3 would make a context per connection)."""

from __future__ import annotations

import base64
from pathlib import Path

import certifi
import pytest
import yaml
from kubernetes import client as k8s

from kube.clients import client_from_kubeconfig_text

pytestmark = pytest.mark.provider

# Any certificate parses as a CA here: nothing connects.
CA = Path(certifi.where()).read_text().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"


def _kubeconfig(ca: str, *, insecure: bool = False) -> str:
    cluster: dict[str, object] = {"server": "https://127.0.0.1:6443"}
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    else:
        cluster["certificate-authority-data"] = base64.b64encode(ca.encode()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    })  # fmt: skip


def _tls(api: k8s.ApiClient) -> object:
    return api.rest_client.pool_manager.connection_pool_kw.get("ssl_context")


def test_clients_of_the_same_certificates_share_a_context_and_others_do_not() -> None:
    one, same = client_from_kubeconfig_text(_kubeconfig(CA)), client_from_kubeconfig_text(_kubeconfig(CA))
    other = client_from_kubeconfig_text(_kubeconfig("# another cluster's\n" + CA))
    assert _tls(one) is not None and _tls(one) is _tls(same)
    assert _tls(other) is not None and _tls(other) is not _tls(one)
    # urllib3 would load the files into a context of each connection's own: they are in the shared one instead.
    assert "ca_certs" not in one.rest_client.pool_manager.connection_pool_kw


def test_a_client_that_verifies_nothing_is_left_as_the_kubernetes_client_made_it() -> None:
    insecure = client_from_kubeconfig_text(_kubeconfig(CA, insecure=True))
    assert _tls(insecure) is None
