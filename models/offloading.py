"""Namespace offloading's pure rules, shared by the consumer's controller, its virtual kubelets and the CLI:
which remote namespace a consumer namespace maps to in a provider, whether a provider is selected, the
selector's text form (`tidepool offload namespace --selector`), and the offloading controller's decisions
(workers/offloading.py): the namespace label, the Ready condition and each pass of a drain."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from models.api.conditions import ConditionValue, condition
from models.api.offloading import (
    LABEL_KEY,
    LABEL_VALUE,
    ClusterSelector,
    NamespaceOffloading,
    NamespaceOffloadingSpec,
    OffloadingCluster,
    SelectorRequirement,
)
from models.names import remote_namespace_default_name, virtual_node_name

VIRTUAL_NODE_PREFIX = virtual_node_name("")
Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


def remote_namespace_name(spec: NamespaceOffloadingSpec, *, consumer_cluster_id: str, namespace: str) -> str:
    """The namespace the consumer asks each selected provider for (the same name in every provider)."""
    match spec.namespace_mapping_strategy:
        case "EnforceSameName":
            return namespace
        case "SelectedName":
            assert spec.remote_namespace_name is not None  # the model refuses SelectedName without it
            return spec.remote_namespace_name
        case "DefaultName":
            return remote_namespace_default_name(consumer_cluster_id, namespace)


def selects(selector: ClusterSelector, labels: Mapping[str, str]) -> bool:
    """Whether a provider whose virtual node has `labels` is selected: a Kubernetes label selector's meaning."""
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present, value = requirement.key in labels, labels.get(requirement.key)
        match requirement.operator:
            case "In":
                ok = present and value in requirement.values
            case "NotIn":
                ok = not present or value not in requirement.values
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
        if not ok:
            return False
    return True


# The selector `tidepool offload namespace --selector` takes: a Kubernetes label selector's text form.
SELECTOR_SYNTAX = "k=v, k==v, k!=v, k in (a,b), k notin (a,b), k (exists) or !k (does not exist), joined by ','"
_SET = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)$")


def parse_selector(text: str) -> ClusterSelector:
    """`text` as a ClusterSelector; a ValueError names the part that is wrong and the rule it breaks."""
    labels: dict[str, str] = {}
    expressions: list[SelectorRequirement] = []
    requirement: tuple[Operator, list[str]]
    for number, part in enumerate(_parts(text), start=1):
        where = f"selector part {number} {part!r}"
        if not part:
            raise ValueError(f"{where}: empty (two commas, or a comma at an end); the syntax is {SELECTOR_SYNTAX}")
        if match := _SET.match(part):
            key, values = match["key"], [v.strip() for v in match["values"].split(",")]
            if not any(values):
                raise ValueError(f"{where}: '{match['op']}' needs at least one value in its parentheses")
            for value in values:
                check_label_value(where, value)
            requirement = ("In" if match["op"] == "in" else "NotIn", values)
        elif match := _EQUALITY.match(part):
            key, value = match["key"], match["value"].strip()
            check_label_value(where, value)
            if match["op"] != "!=":
                if labels.get(key, value) != value:
                    raise ValueError(f"{where}: label {key} is already required to be {labels[key]!r}")
                check_label_key(where, key)
                labels[key] = value
                continue
            requirement = ("NotIn", [value])
        elif re.fullmatch(r"!?\S+", part):
            key = part.removeprefix("!")
            requirement = ("DoesNotExist" if part.startswith("!") else "Exists", [])
        else:
            raise ValueError(f"{where}: not a requirement; the syntax is {SELECTOR_SYNTAX}")
        check_label_key(where, key)
        expressions.append(SelectorRequirement(key=key, operator=requirement[0], values=requirement[1]))
    return ClusterSelector(match_labels=labels, match_expressions=expressions)


def _parts(text: str) -> list[str]:
    """Split on the commas outside parentheses."""
    if not text.strip():
        return []
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def check_label_key(where: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not re.fullmatch(LABEL_KEY, key) or len(name) > 63 or len(prefix) > 253:
        raise ValueError(f"{where}: {key!r} is not a label key (an optional DNS subdomain prefix and '/', then a name "
                         "of at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)")


def check_label_value(where: str, value: str) -> None:
    if not re.fullmatch(LABEL_VALUE, value) or len(value) > 63:
        raise ValueError(f"{where}: {value!r} is not a label value (at most 63 letters, digits, '-', '_' or '.', "
                         "beginning and ending with a letter or digit)")


def selector_text(selector: ClusterSelector) -> str:
    """The selector as `parse_selector` reads it (what `tidepool status` shows); '' selects every provider."""
    parts = [f"{k}={v}" for k, v in selector.match_labels.items()]
    for r in selector.match_expressions:
        match r.operator:
            case "In" | "NotIn":
                parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
            case "Exists":
                parts.append(r.key)
            case "DoesNotExist":
                parts.append(f"!{r.key}")
    return ",".join(parts)


# The offloading controller's decisions (workers/offloading.py reads the objects, these decide, it writes).
def on_virtual_node(node_name: str | None) -> bool:
    """Whether a pod's node is a virtual node: by its name (models.names.virtual_node_name), as the consumer's
    admission policy judges it (deploy/base/consumer-offloading.yaml)."""
    return bool(node_name) and str(node_name).startswith(VIRTUAL_NODE_PREFIX)


def namespace_label(offloading: NamespaceOffloading | None) -> str | None:
    """The value of the namespace's LABEL_OFFLOADING: the pod strategy while the namespace is offloaded; none
    once its NamespaceOffloading is gone or being deleted (first thing of a drain: no new pod binds)."""
    if offloading is None or offloading.metadata.deletion_timestamp is not None:
        return None
    return offloading.spec.pod_offloading_strategy


def selected_providers(selector: ClusterSelector, nodes: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The providers (by their virtual nodes' labels, keyed by provider id) the selector selects, sorted."""
    return sorted(provider for provider, labels in nodes.items() if selects(selector, labels))


def ready_condition(clusters: list[OffloadingCluster], selected: list[str]) -> ConditionValue:
    """Ready of a NamespaceOffloading that is not being deleted, from its selected providers and the entries
    their virtual kubelets wrote (an entry of a provider no longer selected is being cleaned by it: not read)."""
    if not selected:
        return condition("Ready", False, "NoClusterSelected",
                         "no virtual node's labels match the clusterSelector: no provider runs this namespace's pods")
    entries = {c.cluster_id: c for c in clusters}
    refused = [entries[p] for p in selected if p in entries and entries[p].phase == "Refused"]
    if refused:
        return condition("Ready", False, "RemoteNamespaceRefused", "; ".join(
            f"cluster {c.cluster_id} refused namespace {c.remote_namespace}: {c.message or 'no reason given'}"
            for c in refused))  # fmt: skip
    pending = [p for p in selected if p not in entries or entries[p].phase != "Ready"]
    if pending:
        return condition("Ready", False, "RemoteNamespacesPending", "waiting for the remote namespace of " + ", ".join(
            f"{p} ({entries[p].remote_namespace}: {entries[p].phase})" if p in entries else f"{p} (not reported yet)"
            for p in pending))  # fmt: skip
    return condition("Ready", True, "RemoteNamespacesReady", "remote namespace Ready in " + ", ".join(
        f"{p} ({entries[p].remote_namespace})" for p in selected))  # fmt: skip


# How many names a message lists before it counts the rest.
NAMES_SHOWN = 5


@dataclass(frozen=True)
class Drain:
    """One pass of an unoffload: the pods to delete now, and whether the finalizer may go (else why not)."""

    delete: list[str]
    done: bool
    blocked: ConditionValue | None


def drain(*, pods: Mapping[str, bool], clusters: list[OffloadingCluster]) -> Drain:
    """`pods`: the namespace's pods on virtual nodes, by name, True for those already terminating. Every one
    not terminating is deleted (gracefully: its controller recreates it at home, where the admission policy
    now keeps it); the finalizer goes once none is left and every virtual kubelet removed its entry (its
    remote namespace is gone)."""
    delete = sorted(name for name, terminating in pods.items() if not terminating)
    if not pods and not clusters:
        return Drain(delete=[], done=True, blocked=None)
    waits = []
    if pods:
        waits.append(f"{len(pods)} pod(s) to leave the virtual nodes: {_names(sorted(pods))}")
    if clusters:
        waits.append("the remote namespace to be deleted in " + _names(
            [f"{c.cluster_id} ({c.remote_namespace}: {c.phase}{', ' + c.message if c.message else ''})"
             for c in sorted(clusters, key=lambda c: c.cluster_id)]))  # fmt: skip
    return Drain(delete=delete, done=False, blocked=condition("Ready", False, "DrainBlocked",
                                                              "unoffloading waits for " + "; and for ".join(waits)))


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")
