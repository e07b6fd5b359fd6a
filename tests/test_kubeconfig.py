"""A kubeconfig another party wrote is data: reduced to server, CA, token and namespace, everything else
refused with the field named (models/kubeconfig.py), and the YAML bounded and plain before it is
parsed (kube/clients.py: parse_peer_kubeconfig). No cluster needed."""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from kube.clients import parse_peer_kubeconfig, peer_configuration
from kube.identity import token_kubeconfig
from models.kubeconfig import MAX_KUBECONFIG_BYTES, InvalidKubeconfig, peer_credentials

pytestmark = [pytest.mark.api]

PEM = b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2Vy\n-----END CERTIFICATE-----\n"
CA = base64.b64encode(PEM).decode()
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"


def _good() -> dict[str, Any]:
    """What kube/identity.py: token_kubeconfig writes."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "cluster",
        "clusters": [{"name": "cluster", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority-data": CA}}],
        "users": [{"name": "me", "user": {"token": TOKEN}}],
        "contexts": [{"name": "cluster", "context": {"cluster": "cluster", "user": "me", "namespace": "tidepool-system"}}],
    }  # fmt: skip


def _with(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    document = copy.deepcopy(_good())
    change(document)
    return document


def _set(where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda d: where(d).__setitem__(key, value)


def _cluster_of(d: dict[str, Any]) -> dict[str, Any]:
    return d["clusters"][0]["cluster"]  # type: ignore[no-any-return]


def _user_of(d: dict[str, Any]) -> dict[str, Any]:
    return d["users"][0]["user"]  # type: ignore[no-any-return]


def _context_of(d: dict[str, Any]) -> dict[str, Any]:
    return d["contexts"][0]["context"]  # type: ignore[no-any-return]


EXEC = {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh", "args": ["-c", "touch /tmp/x"]}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        pytest.param(_with(_set(_user_of, "exec", EXEC)), "users[0].user.exec", id="an exec plugin would run a program"),
        pytest.param(_with(_set(_user_of, "auth-provider", {"name": "gcp"})), "users[0].user.auth-provider",
                     id="an auth provider would run the reader's plugin"),
        pytest.param(_with(_set(_user_of, "tokenFile", "/var/run/secrets/token")), "users[0].user.tokenFile",
                     id="a tokenFile would read the reader's disk"),
        pytest.param(_with(_set(_user_of, "client-certificate", "/etc/x.crt")), "users[0].user.client-certificate",
                     id="a client certificate file"),
        pytest.param(_with(_set(_user_of, "client-key", "/etc/x.key")), "users[0].user.client-key", id="a client key file"),
        pytest.param(_with(_set(_user_of, "client-certificate-data", CA)), "users[0].user.client-certificate-data",
                     id="client certificate data"),
        pytest.param(_with(_set(_user_of, "client-key-data", CA)), "users[0].user.client-key-data", id="client key data"),
        pytest.param(_with(_set(_user_of, "username", "admin")), "users[0].user.username", id="basic auth user name"),
        pytest.param(_with(_set(_user_of, "password", "x")), "users[0].user.password", id="basic auth password"),
        pytest.param(_with(_set(_user_of, "as", "system:admin")), "users[0].user.as", id="impersonation"),
        pytest.param(_with(_set(_user_of, "as-groups", ["system:masters"])), "users[0].user.as-groups",
                     id="impersonated groups"),
        pytest.param(_with(_set(_user_of, "as-user-extra", {"a": ["b"]})), "users[0].user.as-user-extra",
                     id="impersonated extras"),
        pytest.param(_with(_set(_user_of, "as-uid", "1")), "users[0].user.as-uid", id="impersonated uid"),
        pytest.param(_with(_set(_user_of, "color", "blue")), "users[0].user.color", id="an unknown user field"),
        pytest.param(_with(_set(_cluster_of, "insecure-skip-tls-verify", True)), "clusters[0].cluster.insecure-skip-tls-verify",
                     id="TLS verification skipped"),
        pytest.param(_with(_set(_cluster_of, "proxy-url", "http://10.0.0.9:3128")), "clusters[0].cluster.proxy-url",
                     id="a proxy"),
        pytest.param(_with(_set(_cluster_of, "certificate-authority", "/etc/ca.crt")),
                     "clusters[0].cluster.certificate-authority", id="a CA file of the reader's"),
        pytest.param(_with(_set(_cluster_of, "tls-server-name", "kubernetes")), "clusters[0].cluster.tls-server-name",
                     id="another TLS server name"),
        pytest.param(_with(_set(_cluster_of, "extensions", [])), "clusters[0].cluster.extensions", id="cluster extensions"),
        pytest.param(_with(_set(_context_of, "extensions", [])), "contexts[0].context.extensions", id="context extensions"),
        pytest.param(_with(lambda d: d.__setitem__("users", [*d["users"], {"name": "b", "user": {"token": "t"}}])),
                     "users[1]", id="a second user is ambiguous"),
        pytest.param(_with(lambda d: d.__setitem__("contexts", [*d["contexts"], copy.deepcopy(d["contexts"][0])])),
                     "contexts[1]", id="a second context is ambiguous"),
        pytest.param(_with(lambda d: d.__setitem__("clusters", [*d["clusters"], copy.deepcopy(d["clusters"][0])])),
                     "clusters[1]", id="a second cluster is ambiguous"),
        pytest.param(_with(lambda d: d.__setitem__("current-context", "other")), "current-context",
                     id="a current context that is not the one context"),
        pytest.param(_with(_set(_context_of, "user", "someone")), "contexts[0].context.user",
                     id="a context naming another user"),
        pytest.param(_with(_set(_context_of, "cluster", "elsewhere")), "contexts[0].context.cluster",
                     id="a context naming another cluster"),
        pytest.param(_with(_set(_context_of, "namespace", "Not A Namespace")), "contexts[0].context.namespace",
                     id="a namespace that is not a DNS label"),
        pytest.param(_with(lambda d: d.__setitem__("preferences", {"colors": True})), "preferences",
                     id="preferences that say something"),
        pytest.param(_with(lambda d: d.__setitem__("kind", "Secret")), "kind", id="not a Config"),
        pytest.param(_with(lambda d: d.__setitem__("apiVersion", "v2")), "apiVersion", id="another apiVersion"),
        pytest.param(_with(lambda d: d.__setitem__("users", [])), "users", id="no user"),
        pytest.param(_with(lambda d: d.__setitem__("unknown", 1)), "unknown", id="an unknown top-level field"),
        pytest.param(_with(lambda d: d["clusters"][0].__setitem__("extra", 1)), "clusters[0].extra",
                     id="an unknown field beside a cluster's name"),
        pytest.param(["not", "a", "mapping"], "kubeconfig", id="not a mapping"),
        pytest.param(_with(_set(_cluster_of, "server", "http://10.0.0.1:6443")), "clusters[0].cluster.server",
                     id="plain http"),
        pytest.param(_with(_set(_cluster_of, "server", "https://user:pw@10.0.0.1")), "clusters[0].cluster.server",
                     id="user info in the server URL"),
        pytest.param(_with(_set(_cluster_of, "server", "https://10.0.0.1/?x=1")), "clusters[0].cluster.server",
                     id="a query in the server URL"),
        pytest.param(_with(_set(_cluster_of, "server", "https://10.0.0.1#f")), "clusters[0].cluster.server",
                     id="a fragment in the server URL"),
        pytest.param(_with(_set(_cluster_of, "server", "https://")), "clusters[0].cluster.server", id="no host"),
        pytest.param(_with(_set(_cluster_of, "server", "https://10.0.0.1:99999")), "clusters[0].cluster.server",
                     id="a port out of range"),
        pytest.param(_with(_set(_cluster_of, "server", "unix:///var/run/x.sock")), "clusters[0].cluster.server",
                     id="a socket of the reader's"),
        pytest.param(_with(lambda d: _cluster_of(d).pop("certificate-authority-data")),
                     "clusters[0].cluster.certificate-authority-data", id="no CA"),
        pytest.param(_with(_set(_cluster_of, "certificate-authority-data", "not base64!")),
                     "clusters[0].cluster.certificate-authority-data", id="a CA that is not base64"),
        pytest.param(_with(_set(_cluster_of, "certificate-authority-data", base64.b64encode(b"hello").decode())),
                     "clusters[0].cluster.certificate-authority-data", id="a CA that is not PEM"),
        pytest.param(_with(_set(_cluster_of, "certificate-authority-data",
                                base64.b64encode(PEM + b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").decode())),
                     "clusters[0].cluster.certificate-authority-data", id="a CA with something else than certificates"),
        pytest.param(_with(_set(_cluster_of, "certificate-authority-data", base64.b64encode(PEM * 800).decode())),
                     "clusters[0].cluster.certificate-authority-data", id="a CA too large"),
        pytest.param(_with(lambda d: _user_of(d).pop("token")), "users[0].user.token", id="no token"),
        pytest.param(_with(_set(_user_of, "token", "two words")), "users[0].user.token", id="a token with a space"),
        pytest.param(_with(_set(_user_of, "token", "a\nb")), "users[0].user.token", id="a token with a newline"),
        pytest.param(_with(_set(_user_of, "token", "x" * 9000)), "users[0].user.token", id="a token too large"),
        pytest.param(_with(_set(_user_of, "token", 12)), "users[0].user.token", id="a token that is not a string"),
    ],
)  # fmt: skip
def test_a_kubeconfig_with_anything_but_server_ca_token_and_namespace_is_refused_naming_the_field(
    document: object, field: str
) -> None:
    with pytest.raises(InvalidKubeconfig) as refused:
        peer_credentials(document)
    assert refused.value.field == field
    assert TOKEN not in str(refused.value)  # a rule, never a value


@pytest.mark.parametrize(
    ("document", "server", "namespace"),
    [
        pytest.param(_good(), "https://10.0.0.1:6443", "tidepool-system", id="what tidepool writes"),
        pytest.param(_with(lambda d: _context_of(d).pop("namespace")), "https://10.0.0.1:6443", None,
                     id="no namespace"),
        pytest.param(_with(lambda d: d.pop("current-context")), "https://10.0.0.1:6443", "tidepool-system",
                     id="no current context: the one context"),
        pytest.param(_with(lambda d: d.__setitem__("preferences", {})), "https://10.0.0.1:6443", "tidepool-system",
                     id="empty preferences, as kubectl writes"),
        pytest.param(_with(_set(_cluster_of, "server", "https://api.example.com/k8s/")), "https://api.example.com/k8s",
                     "tidepool-system", id="a DNS name and a path"),
        pytest.param(_with(_set(_cluster_of, "server", "https://[fd00::1]:443")), "https://[fd00::1]:443",
                     "tidepool-system", id="an IPv6 address"),
    ],
)  # fmt: skip
def test_a_kubeconfig_of_server_ca_and_token_is_reduced_to_them(
    document: dict[str, Any], server: str, namespace: str | None
) -> None:
    credentials = peer_credentials(document)
    assert (credentials.server, credentials.certificate_authority, credentials.token, credentials.namespace) == (
        server, PEM, TOKEN, namespace)  # fmt: skip
    assert TOKEN not in repr(credentials)


_ANCHORS = yaml.safe_dump(_good()) + "x: &a [1, 2]\ny: *a\n"
_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


@pytest.mark.parametrize(
    ("text", "field", "rule"),
    [
        pytest.param("x" * (MAX_KUBECONFIG_BYTES + 1), "kubeconfig", "larger than", id="too large, before parsing"),
        pytest.param(_LAUGHS, "kubeconfig", "anchors", id="a billion laughs is refused before it expands"),
        pytest.param(_ANCHORS, "kubeconfig", "anchors", id="anchors and aliases"),
        pytest.param("clusters: [ {", "kubeconfig", "not YAML", id="not YAML"),
        pytest.param("!!python/object/apply:os.system ['touch /tmp/x']", "kubeconfig", "tags", id="a YAML tag"),
        pytest.param(yaml.safe_dump(_with(_set(_user_of, "exec", EXEC))), "users[0].user.exec", "runs a program",
                     id="an exec plugin in the text"),
    ],
)  # fmt: skip
def test_the_text_is_bounded_and_plain_yaml_before_it_is_read(text: str, field: str, rule: str) -> None:
    with pytest.raises(InvalidKubeconfig) as refused:
        parse_peer_kubeconfig(text)
    assert refused.value.field == field and rule in refused.value.rule


def test_a_client_from_peer_credentials_verifies_tls_with_the_given_ca_and_sends_the_token_only() -> None:
    configuration = peer_configuration(peer_credentials(_good()))
    assert configuration.host == "https://10.0.0.1:6443" and configuration.verify_ssl
    assert configuration.ssl_ca_cert is not None and Path(configuration.ssl_ca_cert).read_bytes() == PEM
    assert configuration.auth_settings()["BearerToken"]["value"] == f"Bearer {TOKEN}"
    assert (configuration.proxy, configuration.cert_file, configuration.key_file, configuration.tls_server_name) == (
        None, None, None, None)  # fmt: skip


def test_what_tidepool_writes_passes_and_a_client_without_a_ca_mints_nothing(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(PEM)
    written = token_kubeconfig(k8s.Configuration(host="https://10.0.0.1:6443", ssl_ca_cert=str(ca)), server=None,
                               token=TOKEN, user="me", namespace="tidepool-system")  # fmt: skip
    assert parse_peer_kubeconfig(written).certificate_authority == PEM
    insecure = k8s.Configuration(host="https://10.0.0.1:6443")
    insecure.verify_ssl = False
    with pytest.raises(ApplicationError) as refused:
        token_kubeconfig(insecure, server=None, token=TOKEN, user="me", namespace="tidepool-system")
    assert refused.value.type == "NoCertificateAuthority" and refused.value.non_retryable
