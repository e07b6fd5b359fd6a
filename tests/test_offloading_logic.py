"""Namespace offloading's consumer-side decisions, without clusters (models/offloading.py): the selector's text
form, the namespace label, the Ready condition and each pass of a drain; and `tidepool offload`'s argument
errors, said before any cluster is called."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from models.api.offloading import ClusterSelector, NamespaceOffloading, OffloadingCluster, SelectorRequirement
from models.offloading import (
    NAMES_SHOWN,
    drain,
    namespace_label,
    on_virtual_node,
    parse_selector,
    ready_condition,
    selected_providers,
    selector_text,
)

pytestmark = pytest.mark.offloading


def _req(key: str, operator: str, *values: str) -> SelectorRequirement:
    return SelectorRequirement.model_validate({"key": key, "operator": operator, "values": list(values)})


@pytest.mark.parametrize(("text", "labels", "expressions"), [
    pytest.param("", {}, [], id="empty-selects-all"),
    pytest.param("k=v,k2 in (a,b),!k3", {"k": "v"}, [_req("k2", "In", "a", "b"), _req("k3", "DoesNotExist")],
                 id="the-brief-s-example"),
    pytest.param("tidepool.io/provider==p1", {"tidepool.io/provider": "p1"}, [], id="double-equals"),
    pytest.param(" zone notin ( a , b ) , gpu ", {}, [_req("zone", "NotIn", "a", "b"), _req("gpu", "Exists")],
                 id="spaces-and-exists"),
    pytest.param("tier!=cheap", {}, [_req("tier", "NotIn", "cheap")], id="not-equal"),
    pytest.param("k=", {"k": ""}, [], id="empty-value"),
])  # fmt: skip
def test_a_selector_parses_as_kubernetes_reads_it(text: str, labels: dict[str, str],
                                                  expressions: list[SelectorRequirement]) -> None:  # fmt: skip
    selector = parse_selector(text)
    assert (selector.match_labels, selector.match_expressions) == (labels, expressions)
    assert parse_selector(selector_text(selector)) == selector  # what `tidepool status` shows reads back the same


@pytest.mark.parametrize(("text", "said"), [
    pytest.param("k=v,,x", "selector part 2 '': empty", id="empty-part"),
    pytest.param("k=v,", "selector part 2 '': empty", id="trailing-comma"),
    pytest.param("k in ()", "selector part 1 'k in ()': 'in' needs at least one value", id="empty-set"),
    pytest.param("K_/x=1", "selector part 1 'K_/x=1': 'K_/x' is not a label key", id="bad-prefix"),
    pytest.param("k=v w", "selector part 1 'k=v w': 'v w' is not a label value", id="space-in-value"),
    pytest.param("a=1,a=2", "selector part 2 'a=2': label a is already required to be '1'", id="contradiction"),
    pytest.param("k in (a,b", "selector part 1 'k in (a,b': not a requirement", id="unclosed"),
    pytest.param(f"k={'v' * 64}", f"selector part 1 'k={'v' * 64}': '{'v' * 64}' is not a label value (at most 63",
                 id="value-too-long"),
])  # fmt: skip
def test_a_wrong_selector_names_the_part_and_the_rule(text: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        parse_selector(text)


def _offloading(strategy: str = "Remote", *, deleting: bool = False) -> NamespaceOffloading:
    meta = {"name": "offloading", "namespace": "team"}
    if deleting:
        meta["deletionTimestamp"] = datetime.now(UTC).isoformat()
    return NamespaceOffloading.from_kubernetes({"metadata": meta, "spec": {"podOffloadingStrategy": strategy}})


@pytest.mark.parametrize(("offloading", "label"), [
    pytest.param(None, None, id="gone"),
    pytest.param(_offloading("Remote"), "Remote", id="remote"),
    pytest.param(_offloading("Local"), "Local", id="local"),
    pytest.param(_offloading("LocalAndRemote", deleting=True), None, id="draining-first-drops-the-label"),
])  # fmt: skip
def test_the_namespace_label_mirrors_the_strategy_until_the_drain_begins(offloading: NamespaceOffloading | None,
                                                                        label: str | None) -> None:  # fmt: skip
    assert namespace_label(offloading) == label


def test_virtual_nodes_are_known_by_name_and_selected_by_their_labels() -> None:
    assert (on_virtual_node("tidepool-a"), on_virtual_node("node-1"), on_virtual_node(None)) == (True, False, False)
    nodes = {"a": {"tidepool.io/provider": "a", "zone": "eu"}, "b": {"tidepool.io/provider": "b"}}
    assert selected_providers(parse_selector("zone=eu"), nodes) == ["a"]
    assert selected_providers(ClusterSelector(), nodes) == ["a", "b"]
    assert selected_providers(parse_selector("!zone"), nodes) == ["b"]


def _entry(cluster: str, phase: str, message: str = "") -> OffloadingCluster:
    return OffloadingCluster.model_validate({"clusterId": cluster, "remoteNamespace": f"r-{cluster}", "phase": phase,
                                             "message": message})  # fmt: skip


@pytest.mark.parametrize(("entries", "selected", "ready", "reason", "said"), [
    pytest.param([], [], False, "NoClusterSelected", "no virtual node's labels match", id="none-selected"),
    pytest.param([], ["a"], False, "RemoteNamespacesPending", "a (not reported yet)", id="not-reported"),
    pytest.param([_entry("a", "Ready"), _entry("b", "Pending")], ["a", "b"], False, "RemoteNamespacesPending",
                 "b (r-b: Pending)", id="one-pending"),
    pytest.param([_entry("a", "Ready"), _entry("b", "Refused", "namespace r-b exists and is not yours")], ["a", "b"],
                 False, "RemoteNamespaceRefused", "cluster b refused namespace r-b: namespace r-b exists and is not yours",
                 id="refused-names-cluster-namespace-and-message"),
    pytest.param([_entry("a", "Ready"), _entry("c", "Refused")], ["a"], True, "RemoteNamespacesReady", "a (r-a)",
                 id="an-unselected-provider-s-entry-is-not-read"),
])  # fmt: skip
def test_ready_says_which_selected_provider_is_not_ready_and_why(entries: list[OffloadingCluster], selected: list[str],
                                                                ready: bool, reason: str, said: str) -> None:  # fmt: skip
    value = ready_condition(entries, selected)
    assert (value.type, value.status, value.reason) == ("Ready", ready, reason)
    assert said in value.message


def test_a_drain_deletes_the_pods_not_yet_terminating_and_ends_only_when_nothing_is_left() -> None:
    step = drain(pods={"web-1": False, "web-2": True}, clusters=[_entry("a", "Deleting")])
    assert (step.delete, step.done) == (["web-1"], False)
    assert step.blocked is not None and step.blocked.reason == "DrainBlocked"
    assert "2 pod(s) to leave the virtual nodes: web-1, web-2" in step.blocked.message
    assert "the remote namespace to be deleted in a (r-a: Deleting)" in step.blocked.message
    only_entries = drain(pods={}, clusters=[_entry("a", "Deleting", "pods terminating")])
    assert not only_entries.done and only_entries.blocked is not None
    assert "pod(s)" not in only_entries.blocked.message
    assert "a (r-a: Deleting, pods terminating)" in only_entries.blocked.message
    assert drain(pods={}, clusters=[]) == drain(pods={}, clusters=[]) and drain(pods={}, clusters=[]).done


def test_a_blocked_drain_lists_a_bounded_number_of_names() -> None:
    step = drain(pods={f"p{i:03}": True for i in range(100)}, clusters=[])
    assert step.delete == [] and step.blocked is not None
    assert step.blocked.message.endswith(f"and {100 - NAMES_SHOWN} more")


def _tidepool(*args: str) -> subprocess.CompletedProcess[str]:
    # A kubeconfig nothing can read: a command that got past its arguments would fail on it, not reach a cluster.
    return subprocess.run([sys.executable, "-m", "workers.cli", *args, "--kubeconfig", "/nonexistent/k.yaml"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip


@pytest.mark.parametrize(("args", "said"), [
    pytest.param(["offload", "namespace", "Team"], "offload namespace: NS 'Team' is not a namespace name", id="ns"),
    pytest.param(["offload", "namespace", "team", "--selector", "a=1,,b"], "argument --selector: selector part 2 '': "
                 "empty", id="selector"),
    pytest.param(["offload", "namespace", "team", "--pod-strategy", "Anywhere"], "argument --pod-strategy: invalid "
                 "choice: 'Anywhere'", id="strategy"),
    pytest.param(["offload", "namespace", "team", "--namespace-mapping", "Same"], "--namespace-mapping 'Same' is not "
                 "one of DefaultName, EnforceSameName, SelectedName", id="mapping"),
    pytest.param(["offload", "namespace", "team", "--namespace-mapping", "SelectedName"], "--remote-namespace NAME (or "
                 "--namespace-mapping SelectedName=NAME) is required with SelectedName, and only with it", id="no-name"),
    pytest.param(["offload", "namespace", "team", "--remote-namespace", "x"], "is required with SelectedName, and "
                 "only with it", id="name-without-selectedname"),
    pytest.param(["offload", "namespace", "team", "--namespace-mapping", "SelectedName=Bad"], "remote namespace 'Bad' "
                 "is not a namespace name", id="bad-name"),
    pytest.param(["offload", "namespace", "kube-x", "--namespace-mapping", "EnforceSameName"], "remote namespace "
                 "'kube-x' is reserved in every provider", id="reserved-same-name"),
    pytest.param(["unoffload", "namespace", "a_b"], "unoffload namespace: NS 'a_b' is not a namespace name", id="un"),
])  # fmt: skip
def test_offload_arguments_name_the_argument_and_the_rule(args: list[str], said: str) -> None:
    done = _tidepool(*args)
    assert (done.returncode, said in done.stderr) == (2, True), done.stderr


def test_an_unreadable_kubeconfig_is_said_after_the_arguments_pass() -> None:
    done = _tidepool("offload", "namespace", "team", "--selector", "tidepool.io/provider in (a,b)")
    assert done.returncode == 1 and done.stderr.startswith("tidepool offload: --kubeconfig /nonexistent/k.yaml"), done.stderr
