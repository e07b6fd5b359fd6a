"""Generates deploy/crds/ from the pydantic models in models/api, the single source of truth.

`python -m deploy.crdgen` writes the CRDs; `python -m deploy.crdgen --check` fails when the committed
files differ from a fresh generation (tests/test_crds.py runs it). pydantic's JSON schema is turned into
a Kubernetes structural schema: $refs inlined, titles dropped, `anyOf [X, null]` made `nullable`,
quantities kept int-or-string, and the cross-field rules added as CEL validations with the same
messages the models raise."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

import yaml

from models.api import KINDS, Advertisement, ClusterConfig, PeeringRequest, SuperCluster
from models.api.advertisement import TTL_RULE as ADVERTISEMENT_TTL_RULE
from models.api.clusterconfig import GRACE_RULE
from models.api.clusterconfig import TTL_RULE as CONFIG_TTL_RULE
from models.api.common import KubernetesObject
from models.api.offloading import MAPPING_IMMUTABLE_RULE, NAME_RULE, SELECTED_NAME_RULE
from models.api.supercluster import DEFAULT_PRIORITY_RULE, SYSTEM_PRIORITY_RULE
from models.api.tenant import NAME_RULE as TENANT_NAME_RULE
from models.api.tenant import SECRET_RULE as TENANT_SECRET_RULE
from models.names import GROUP, TENANT_SECRETS_NAMESPACE, VERSION

CRD_DIR = Path(__file__).with_name("crds")

# Rules a schema cannot say, at the path (property names) where they apply.
VALIDATIONS: dict[str, dict[tuple[str, ...], list[dict[str, str]]]] = {
    "ClusterConfig": {
        ("spec", "outgoing"): [{"rule": "self.advertisementTimeToLiveSeconds > self.advertisementPeriodSeconds",
                                "message": CONFIG_TTL_RULE}],
        ("spec", "pool"): [{"rule": "self.unreachableGracePeriodSeconds >= self.probeIntervalSeconds",
                            "message": GRACE_RULE}],
    },
    "PeeringRequest": {
        ("spec", "clusterIdentity"): [{"rule": "self.clusterId == oldSelf.clusterId",
                                       "message": "clusterIdentity.clusterId is immutable"}],
    },
    "NamespaceOffloading": {
        (): [{"rule": "self.metadata.name == 'offloading'", "message": NAME_RULE}],
        ("spec",): [{"rule": "(self.namespaceMappingStrategy == 'SelectedName') == has(self.remoteNamespaceName)",
                     "message": SELECTED_NAME_RULE},
                    {"rule": "self.namespaceMappingStrategy == oldSelf.namespaceMappingStrategy && "
                             "(has(self.remoteNamespaceName) ? self.remoteNamespaceName : '') == "
                             "(has(oldSelf.remoteNamespaceName) ? oldSelf.remoteNamespaceName : '')",
                     "message": MAPPING_IMMUTABLE_RULE}],
    },
    "Tenant": {
        (): [{"rule": "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
              "message": TENANT_NAME_RULE}],
        ("spec",): [{"rule": f"self.kubeConfigRef.namespace == '{TENANT_SECRETS_NAMESPACE}'", "message": TENANT_SECRET_RULE}],
    },
    "SuperCluster": {
        ("spec", "priorityClasses"): [
            {"rule": "(!has(self.allowed) || self.allowed.all(n, !n.startsWith('system-'))) && "
                     "(!has(self.default) || !self.default.startsWith('system-'))", "message": SYSTEM_PRIORITY_RULE},
            {"rule": "!has(self.default) || (has(self.allowed) && self.default in self.allowed)",
             "message": DEFAULT_PRIORITY_RULE}],
    },
    "Advertisement": {
        ("spec",): [{"rule": "self.timeToLive > self.timestamp", "message": ADVERTISEMENT_TTL_RULE},
                    {"rule": "self.clusterId == oldSelf.clusterId", "message": "clusterId is immutable"}],
    },
}  # fmt: skip

PRINTER_COLUMNS: dict[str, list[dict[str, str]]] = {
    "ClusterConfig": [
        {"name": "Sharing", "type": "integer", "jsonPath": ".spec.outgoing.sharingPercentage"},
        {"name": "Policy", "type": "string", "jsonPath": ".spec.incoming.acceptPolicy"},
        {"name": "Max", "type": "integer", "jsonPath": ".spec.incoming.maxAcceptableAdvertisements"},
    ],
    "PeeringRequest": [
        {"name": "Cluster", "type": "string", "jsonPath": ".spec.clusterIdentity.clusterId"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Last Push", "type": "date", "jsonPath": ".status.lastPushTime"},
    ],
    "Advertisement": [
        {"name": "Cluster", "type": "string", "jsonPath": ".spec.clusterId"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "CPU", "type": "string", "jsonPath": ".spec.resourceQuota.hard.cpu"},
        {"name": "Memory", "type": "string", "jsonPath": ".spec.resourceQuota.hard.memory"},
        # A string, not a date: the API server shows a date column as the time since it (an age), and the
        # age of a time still to come, as every live Advertisement's timeToLive is, prints `<invalid>`.
        {"name": "Expires", "type": "string", "jsonPath": ".spec.timeToLive"},
    ],
    # The prober's verdict (models/pool/health.py): the reason tells Suspect (ProbeFailing, Ready still
    # True) from Unreachable; the allocatable is of the last good probe.
    "SuperCluster": [
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"},
        {"name": "CPU", "type": "string", "jsonPath": ".status.allocatable.cpu"},
        {"name": "Memory", "type": "string", "jsonPath": ".status.allocatable.memory"},
        {"name": "Failing Since", "type": "date", "jsonPath": ".status.failingSince"},
    ],
    "Tenant": [
        {"name": "Weight", "type": "integer", "jsonPath": ".spec.weight"},
        {"name": "Key", "type": "string", "jsonPath": ".status.key"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"},
    ],
    "NamespaceOffloading": [
        {"name": "Pods", "type": "string", "jsonPath": ".spec.podOffloadingStrategy"},
        {"name": "Mapping", "type": "string", "jsonPath": ".spec.namespaceMappingStrategy"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"},
    ],
    "RemoteNamespace": [
        {"name": "Consumer Namespace", "type": "string", "jsonPath": ".spec.consumerNamespace"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    ],
}
SHORT_NAMES = {"Advertisement": ["adv"], "PeeringRequest": ["pr"], "ClusterConfig": ["cc"], "SuperCluster": ["sc"], "Tenant": ["tn"],
               "NamespaceOffloading": ["nso"], "RemoteNamespace": ["rns"]}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """A pydantic JSON schema node as a Kubernetes structural schema node."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        out[key] = _structural(value, defs)
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and {"type": "null"} in any_of:
        rest = [option for option in any_of if option != {"type": "null"}]
        out.pop("anyOf")
        if len(rest) == 1:
            out = {**rest[0], **out}
        else:
            out["anyOf"] = rest
        out["nullable"] = True
        if out.get("default", "absent") is None:
            out.pop("default")
    if "properties" in out:
        out.pop("additionalProperties", None)  # unknown fields are pruned by the API server
        out.setdefault("type", "object")
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def _schema_of(kind: type[KubernetesObject], name: str) -> dict[str, Any]:
    raw = kind.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    properties = {key: _structural(raw["properties"][key], defs) for key in ("spec", "status") if key in raw["properties"]}
    root_rules: list[dict[str, str]] = []
    for path, rules in VALIDATIONS.get(name, {}).items():
        if not path:  # on the whole object (metadata.name)
            root_rules = rules
            continue
        target = properties
        for i, step in enumerate(path):
            target = target[step] if i == 0 else target["properties"][step]
        target["x-kubernetes-validations"] = rules
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **properties,
        },
    }
    if "spec" in raw.get("required", []):
        schema["required"] = ["spec"]
    if root_rules:
        schema["x-kubernetes-validations"] = root_rules
    return schema


def crd_for(kind: type[KubernetesObject]) -> dict[str, Any]:
    name, plural = kind.KIND, kind.PLURAL
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": kind.SCOPE,
            "names": {"kind": name, "listKind": f"{name}List", "plural": plural, "singular": name.lower(),
                      "shortNames": SHORT_NAMES[name]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [*PRINTER_COLUMNS[name],
                                             {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                "schema": {"openAPIV3Schema": _schema_of(kind, name)},
            }],
        },
    }  # fmt: skip


def render() -> dict[Path, str]:
    header = "# Generated from models/api by `python -m deploy.crdgen`; do not edit.\n"
    return {
        CRD_DIR / f"{kind.PLURAL}.{GROUP}.yaml": header + yaml.safe_dump(crd_for(kind), sort_keys=False, width=120)
        for kind in KINDS
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.crdgen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed CRDs differ from the models")
    args = parser.parse_args(argv)
    rendered = render()
    if args.check:
        drift: list[str] = []
        for path, text in rendered.items():
            current = path.read_text() if path.exists() else ""
            if current != text:
                drift += difflib.unified_diff(current.splitlines(), text.splitlines(), str(path), "generated", lineterm="")
        stale = set(CRD_DIR.glob("*.yaml")) - set(rendered)
        drift += [f"{path}: not generated from any model" for path in stale]
        if drift:
            print("\n".join(drift))
            print("deploy/crds differs from models/api: run `python -m deploy.crdgen`", file=sys.stderr)
            return 1
        return 0
    CRD_DIR.mkdir(exist_ok=True)
    for path, text in rendered.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Advertisement", "ClusterConfig", "PeeringRequest", "SuperCluster", "crd_for", "render"]
