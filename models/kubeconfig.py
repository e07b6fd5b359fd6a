"""A kubeconfig another party wrote, reduced to what tidepool needs of it: data, never code.

The Kubernetes clients' own loader runs `users[].exec` plugins and `auth-provider`s, reads `tokenFile`,
certificate and key paths from the reader's disk, follows proxies and may skip TLS verification: a
kubeconfig is a program. The kubeconfigs that cross between clusters (the provider's in
`tidepool-kubeconfig-<provider>` on the consumer, mounted into the virtual kubelet; the consumer's in
`tidepool-peer-<consumer>` on the provider, named by a PeeringRequest; both minted by tidepool itself,
kube/identity.py: token_kubeconfig) are parsed here instead, into `PeerCredentials` (an https server, the
CA that signs it, an inline bearer token, the context's namespace), and nothing else of them is used.
kube/clients.py loads the YAML (bounded by MAX_KUBECONFIG_BYTES first, with no anchors or aliases) and
builds a client from these fields only. A cluster's own administrator kubeconfig keeps the full loader.

Rules, in the order they apply; the first broken one is raised as `InvalidKubeconfig` naming the field's
path (`users[0].user.exec`) and the rule, never the value (it may be a token):

1. the document is a mapping of apiVersion (v1), kind (Config), clusters, users, contexts,
   current-context and an empty `preferences`; any other field is refused;
2. exactly one cluster, one user and one context (a second is ambiguous: which one the client would use
   depends on the loader), each a mapping of `name` and its body; the context names them, and
   current-context, if set, names the context;
3. cluster: `server`, an https URL with a host (DNS name, IPv4 or [IPv6]), an optional port and path, no
   user info, query or fragment; `certificate-authority-data`, base64 of PEM certificates (nothing
   else), at most MAX_CA_BYTES. Refused by name: certificate-authority (a file of the reader's),
   insecure-skip-tls-verify, proxy-url, tls-server-name, disable-compression, extensions;
4. user: `token`, printable ASCII without whitespace, at most MAX_TOKEN_BYTES. Refused by name: exec,
   auth-provider, tokenFile, client-certificate(-data), client-key(-data), username, password, as,
   as-uid, as-groups, as-user-extra (impersonation), extensions;
5. context: `cluster`, `user`, and an optional `namespace` (a DNS label). Refused: extensions.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

# The whole text, checked before YAML parses it: tidepool's own are about 3 KiB (a CA and a token).
MAX_KUBECONFIG_BYTES = 64 * 1024
MAX_CA_BYTES = 32 * 1024  # decoded PEM: a few certificates
MAX_TOKEN_BYTES = 8 * 1024  # a ServiceAccount JWT is about 1 KiB
MAX_NAME_CHARS = 253

TOP_LEVEL = frozenset({"apiVersion", "kind", "clusters", "users", "contexts", "current-context", "preferences"})
CLUSTER_FIELDS = frozenset({"server", "certificate-authority-data"})
USER_FIELDS = frozenset({"token"})
CONTEXT_FIELDS = frozenset({"cluster", "user", "namespace"})
# Why each known field is refused: said in the error, so that whoever wrote it knows what to change.
REFUSED: dict[str, str] = {
    "exec": "runs a program on the reader's machine",
    "auth-provider": "runs the reader's auth plugins",
    "tokenFile": "reads a file of the reader's disk",
    "client-certificate": "reads a file of the reader's disk",
    "client-key": "reads a file of the reader's disk",
    "certificate-authority": "reads a file of the reader's disk",
    "client-certificate-data": "client certificates are not accepted: an inline token only",
    "client-key-data": "client certificates are not accepted: an inline token only",
    "username": "basic authentication is not accepted: an inline token only",
    "password": "basic authentication is not accepted: an inline token only",
    "as": "impersonation is not accepted",
    "as-uid": "impersonation is not accepted",
    "as-groups": "impersonation is not accepted",
    "as-user-extra": "impersonation is not accepted",
    "insecure-skip-tls-verify": "TLS must be verified against certificate-authority-data",
    "tls-server-name": "the server is checked under the name its URL gives",
    "proxy-url": "requests go straight to the server",
    "disable-compression": "not accepted",
    "extensions": "not accepted",
}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\d{{1,3}}(?:\.\d{{1,3}}){{3}}|\[[0-9A-Fa-f:.]+\])"
SERVER_PATTERN = re.compile(rf"https://{_HOST}(?::(?P<port>\d{{1,5}}))?(?:/[A-Za-z0-9._~/-]*)?")
_TOKEN = re.compile(r"[\x21-\x7e]+")
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_PEM = re.compile(r"(?:-----BEGIN CERTIFICATE-----\r?\n(?:[A-Za-z0-9+/=]{1,76}\r?\n)+-----END CERTIFICATE-----\s*)+")


class InvalidKubeconfig(ValueError):
    """A kubeconfig refused: `field` is the path of the offending field, `rule` what it breaks."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


@dataclass(frozen=True)
class PeerCredentials:
    """All that is used of a kubeconfig another party wrote."""

    server: str
    certificate_authority: bytes = field(repr=False)  # PEM
    token: str = field(repr=False)
    namespace: str | None = None


def peer_credentials(document: Any) -> PeerCredentials:
    """The credentials of a loaded kubeconfig document, or InvalidKubeconfig (rules in the module docstring)."""
    top = _mapping(document, "kubeconfig")
    _known(top, "", TOP_LEVEL)
    if top.get("apiVersion", "v1") != "v1":
        raise InvalidKubeconfig("apiVersion", "must be v1")
    if top.get("kind", "Config") != "Config":
        raise InvalidKubeconfig("kind", "must be Config")
    if top.get("preferences") not in (None, {}):
        raise InvalidKubeconfig("preferences", "must be empty")
    cluster_name, cluster = _only(top, "clusters", "cluster", CLUSTER_FIELDS)
    user_name, user = _only(top, "users", "user", USER_FIELDS)
    context_name, context = _only(top, "contexts", "context", CONTEXT_FIELDS)
    current = top.get("current-context")
    if current is not None and current != context_name:
        raise InvalidKubeconfig("current-context", "must name the one context")
    if context.get("cluster") != cluster_name:
        raise InvalidKubeconfig("contexts[0].context.cluster", "must name the one cluster")
    if context.get("user") != user_name:
        raise InvalidKubeconfig("contexts[0].context.user", "must name the one user")
    namespace = context.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and _NAMESPACE.fullmatch(namespace)):
        raise InvalidKubeconfig("contexts[0].context.namespace", "must be a namespace name (a DNS label)")
    return PeerCredentials(
        server=_server(cluster.get("server")),
        certificate_authority=_certificate_authority(cluster.get("certificate-authority-data")),
        token=_token(user.get("token")),
        namespace=namespace,
    )


def _mapping(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidKubeconfig(path, "must be a mapping")
    return value


def _known(obj: dict[str, Any], path: str, allowed: frozenset[str]) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            raise InvalidKubeconfig(where, f"refused: {REFUSED.get(key, 'not a field tidepool accepts')}")


def _only(top: dict[str, Any], plural: str, singular: str, fields: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """The one named entry of a list (clusters, users, contexts) and its body, checked field by field."""
    entries = top.get(plural)
    if not isinstance(entries, list) or not entries:
        raise InvalidKubeconfig(plural, "must be a list of one entry")
    if len(entries) > 1:
        raise InvalidKubeconfig(f"{plural}[1]", f"one {singular} only: a second is ambiguous")
    entry = _mapping(entries[0], f"{plural}[0]")
    _known(entry, f"{plural}[0]", frozenset({"name", singular}))
    name = entry.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise InvalidKubeconfig(f"{plural}[0].name", f"must be a string of 1 to {MAX_NAME_CHARS} characters")
    body = _mapping(entry.get(singular), f"{plural}[0].{singular}")
    _known(body, f"{plural}[0].{singular}", fields)
    return name, body


def _server(value: Any) -> str:
    path = "clusters[0].cluster.server"
    if not isinstance(value, str) or len(value) > 2048:
        raise InvalidKubeconfig(path, "must be an https URL")
    match = SERVER_PATTERN.fullmatch(value)
    if match is None:
        raise InvalidKubeconfig(path, "must be an https URL with a host, an optional port and path, and no user "
                                      "info, query or fragment")  # fmt: skip
    if match["port"] is not None and not 0 < int(match["port"]) < 65536:
        raise InvalidKubeconfig(path, "port out of range")
    return value.rstrip("/")


def _certificate_authority(value: Any) -> bytes:
    path = "clusters[0].cluster.certificate-authority-data"
    if value is None:
        raise InvalidKubeconfig(path, "required: the CA that signs the server's certificate")
    if not isinstance(value, str) or len(value) > MAX_CA_BYTES * 4 // 3 + 4:
        raise InvalidKubeconfig(path, f"must be base64 of at most {MAX_CA_BYTES} bytes")
    try:
        pem = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKubeconfig(path, "must be base64") from None
    try:
        text = pem.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidKubeconfig(path, "must be PEM certificates") from None
    if len(pem) > MAX_CA_BYTES or not _PEM.fullmatch(text.lstrip()):
        raise InvalidKubeconfig(path, f"must be PEM certificates, at most {MAX_CA_BYTES} bytes, and nothing else")
    return pem


def _token(value: Any) -> str:
    path = "users[0].user.token"
    if not isinstance(value, str) or not value:
        raise InvalidKubeconfig(path, "required: an inline bearer token")
    if len(value) > MAX_TOKEN_BYTES or not _TOKEN.fullmatch(value):
        raise InvalidKubeconfig(path, f"must be printable ASCII without whitespace, at most {MAX_TOKEN_BYTES} bytes")
    return value
