"""A tenant's virtual nodes (models/names.py tenant_node_name, models/pool/tenant_nodes.py): no two (super cluster,
node) pairs ever share a name, every name is a node name and a label value; what a virtual node shows of its
physical node; which nodes a tenant still uses, and when an unused one goes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from models.names import LABEL_SUPER_CLUSTER, TENANT_NODE_NAME_MAX, tenant_node_name
from models.pool.tenant_nodes import NODE_UNUSED_GRACE_SECONDS, nodes_in_use, tenant_node, to_delete

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Object names as the API server allows them (DNS subdomains: dots, '-' runs, lengths near every cut).
labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", fullmatch=True)
subdomains = st.lists(labels, min_size=1, max_size=5).map(".".join).filter(lambda name: len(name) <= 253)


@given(subdomains, subdomains)
def test_every_name_is_a_node_name_and_a_label_value(super_cluster: str, node: str) -> None:
    name = tenant_node_name(super_cluster, node)
    assert DNS_SUBDOMAIN.match(name) and LABEL_VALUE.match(name) and len(name) <= TENANT_NODE_NAME_MAX, name


@given(subdomains, subdomains, subdomains, subdomains)
def test_two_pairs_share_a_name_only_when_they_are_the_same_pair(s1: str, n1: str, s2: str, n2: str) -> None:
    assume((s1, n1) != (s2, n2))
    assert tenant_node_name(s1, n1) != tenant_node_name(s2, n2)


@pytest.mark.parametrize(("pair", "other"), [
    pytest.param(("a.b", "c"), ("a", "b.c"), id="a dot moved between the names"),
    pytest.param(("a", "x" * 61), ("a", "x" * 62), id="both near the cut"),
    pytest.param(("s" * 40, "n" * 40), ("s" * 40, "n" * 41), id="both cut"),
])  # fmt: skip
def test_pairs_that_print_alike_get_names_of_their_own(pair: tuple[str, str], other: tuple[str, str]) -> None:
    assert tenant_node_name(*pair) != tenant_node_name(*other)


def test_a_short_pair_reads_as_super_cluster_then_node() -> None:
    assert tenant_node_name("s1", "s1-node") == "s1.s1-node"


def _node(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": {"kwok": "x"}}, "status": status}


def test_a_virtual_node_shows_its_node_s_capacity_the_taint_and_the_kubelet_api() -> None:
    node = tenant_node(super_cluster="s1", node=_node(capacity={"cpu": "4", "memory": "8Gi", "pods": "110",
                                                                "ephemeral-storage": "1Ti"},
                                                      allocatable={"cpu": "3900m", "memory": "7Gi", "pods": "110"}),
                       address="127.0.0.1", kubelet_port=10250, heartbeat="now", transition="then")  # fmt: skip
    assert node["metadata"]["name"] == "s1.n1"
    assert node["metadata"]["labels"]["type"] == "virtual-kubelet"
    assert node["metadata"]["labels"][LABEL_SUPER_CLUSTER] == "s1"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "s1.n1"
    assert node["spec"]["taints"] == [{"key": LABEL_SUPER_CLUSTER, "value": "s1", "effect": "NoSchedule"}]
    assert node["status"]["capacity"] == {"cpu": "4", "memory": "8Gi", "pods": "110"}
    assert node["status"]["allocatable"] == {"cpu": "3900m", "memory": "7Gi", "pods": "110"}
    assert [(c["type"], c["status"]) for c in node["status"]["conditions"]] == [("Ready", "True")]
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
    assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}


def _pod(node: str | None) -> dict[str, Any]:
    return {"spec": {"nodeName": node} if node else {}}


def test_a_node_is_in_use_while_a_copy_runs_on_it_or_a_tenant_pod_is_bound_to_it() -> None:
    used = nodes_in_use(super_cluster="s1", copies=[_pod("n1"), _pod(None)],
                       tenant_pods=[_pod("s1.n2"), _pod("s2.n3"), _pod(None)],
                       tenant_nodes=["s1.n1", "s1.n2", "s1.n4"])  # fmt: skip
    assert used == {"s1.n1", "s1.n2"}  # s2.n3 is another super cluster's, s1.n4 unused


def test_an_unused_node_goes_only_after_the_grace() -> None:
    since = {"old": 100.0, "new": 100.0 + NODE_UNUSED_GRACE_SECONDS}
    assert to_delete(since, now=100.0 + NODE_UNUSED_GRACE_SECONDS) == ["old"]
    assert to_delete(since, now=100.0 + NODE_UNUSED_GRACE_SECONDS - 1) == []
