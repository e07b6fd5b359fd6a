"""The pydantic models: the defaults pinned, bad values refused with the camelCase path of the field."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from models.api import KINDS, Advertisement, ClusterConfig, PeeringRequest, SuperCluster
from models.api.advertisement import offered_advertisement, read_advertisement
from models.api.common import KubernetesObject
from models.api.reading import MAX_SENTENCE, read_leniently
from models.api.supercluster import DEFAULT_PRIORITY_RULE, SYSTEM_PRIORITY_RULE
from models.resources import Resources

pytestmark = pytest.mark.api


def advertisement(**spec: Any) -> dict[str, Any]:
    base = {
        "clusterId": "provider-a", "resourceQuota": {"hard": {"cpu": "2", "memory": "4Gi"}},
        "network": {"podCIDR": "10.1.0.0/16"}, "kubeConfigRef": {"name": "creds", "namespace": "tidepool-system"},
        "timestamp": "2026-01-01T00:00:00Z", "timeToLive": "2026-01-01T00:30:00Z",
    }  # fmt: skip
    return {"metadata": {"name": "advertisement-provider-a"}, "spec": {**base, **spec}}


def test_an_empty_cluster_config_takes_every_default() -> None:
    assert ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {}}).to_kubernetes()["spec"] == {
        "outgoing": {"sharingPercentage": 30, "enableBroadcaster": True, "advertisementPeriodSeconds": 600,
                     "advertisementTimeToLiveSeconds": 1800, "capacityChangeThresholdPercent": 10,
                     "earlyPushMinIntervalSeconds": 300, "podSecurityLevel": "baseline"},
        "incoming": {"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 5, "allowedClusters": [],
                     "deniedClusters": [], "podCIDRWaitTimeoutSeconds": 300},
        "keepalive": {"thresholdFailures": 3, "retrySeconds": 20},
        "pool": {"policy": "spread", "probeIntervalSeconds": 10, "unreachableGracePeriodSeconds": 60,
                 "headroomPercent": 0},
    }  # fmt: skip


def super_cluster(**spec: Any) -> dict[str, Any]:
    return {"spec": {"kubeConfigRef": {"name": "s1", "namespace": "tidepool-system"}, **spec}}


INVALID = [
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"sharingPercentage": 101}}}, "spec.outgoing.sharingPercentage",
                 id="sharing above 100"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"sharingPercentage": -1}}}, "spec.outgoing.sharingPercentage",
                 id="sharing below 0"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"earlyPushMinIntervalSeconds": 9}}},
                 "spec.outgoing.earlyPushMinIntervalSeconds", id="early pushes less than ten seconds apart"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"acceptPolicy": "AcceptAll"}}}, "spec.incoming.acceptPolicy",
                 id="an unknown accept policy"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"podSecurityLevel": "none"}}}, "spec.outgoing.podSecurityLevel",
                 id="an unknown pod security level"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"maxAcceptableAdvertisements": 1000001}}},
                 "spec.incoming.maxAcceptableAdvertisements", id="a maximum above a million"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"advertisementPeriodSeconds": 600,
                                                       "advertisementTimeToLiveSeconds": 600}}},
                 "spec.outgoing", id="a time to live not longer than the period"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"sharingPercent": 50}}}, "spec.outgoing.sharingPercent",
                 id="an unknown field"),
    pytest.param(PeeringRequest, {"spec": {"clusterIdentity": {"clusterId": "Bad_ID"},
                                           "kubeConfigRef": {"name": "s", "namespace": "n"}}},
                 "spec.clusterIdentity.clusterId", id="a cluster id that is not a DNS label"),
    pytest.param(PeeringRequest, {"spec": {"clusterIdentity": {"clusterId": "b"}}}, "spec.kubeConfigRef",
                 id="a request without credentials"),
    pytest.param(Advertisement, advertisement(resourceQuota={"hard": {"cpu": "two"}}), "spec.resourceQuota.hard.cpu",
                 id="a quantity that is not one"),
    pytest.param(Advertisement, advertisement(resourceQuota={"hard": {"cpu": "-2"}}), "spec.resourceQuota.hard.cpu",
                 id="a negative amount offered"),
    pytest.param(Advertisement, advertisement(timeToLive="2025-12-31T23:00:00Z"), "spec",
                 id="a time to live before the timestamp"),
    pytest.param(Advertisement, advertisement(network={"podCIDR": "not-a-cidr"}), "spec.network.podCIDR",
                 id="a PodCIDR that is not a CIDR"),
    pytest.param(SuperCluster, {"spec": {"headroom": {"cpu": "1"}}}, "spec.kubeConfigRef",
                 id="a super cluster without a kubeconfig"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"prices": {"cpu": "cheap"}}}}, "spec.outgoing.prices.cpu",
                 id="a price that is no number"),
    pytest.param(ClusterConfig, {"spec": {"outgoing": {"prices": {"cpu": "-0.5"}}}}, "spec.outgoing.prices",
                 id="a negative price"),
    pytest.param(ClusterConfig, {"spec": {"incoming": {"maxPrices": {"memory": -1}}}}, "spec.incoming.maxPrices",
                 id="a negative cap"),
    pytest.param(Advertisement, advertisement(prices={"cpu": 0.5}), "spec.prices.cpu", id="a float price"),
    pytest.param(SuperCluster, super_cluster(podSecurity="privileged"), "spec.podSecurity",
                 id="a super cluster whose tenants may run privileged pods"),
    pytest.param(SuperCluster, super_cluster(priorityClasses={"allowed": ["system-node-critical"]}),
                 "spec.priorityClasses", id="a system priority class allowed to tenants"),
    pytest.param(SuperCluster, super_cluster(priorityClasses={"allowed": ["batch"], "default": "system-x"}),
                 "spec.priorityClasses", id="a system priority class as the tenants' default"),
    pytest.param(SuperCluster, super_cluster(priorityClasses={"allowed": ["batch"], "default": "web"}),
                 "spec.priorityClasses", id="a default priority class the tenants are not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "obj", "field"), INVALID)
def test_a_bad_value_is_refused_with_the_path_of_its_field(kind: Any, obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        kind.from_kubernetes({"metadata": {"name": "x"}, **obj})
    paths = {".".join(str(p) for p in e["loc"]) for e in error.value.errors()}
    assert any(p == field or p.startswith(field + ".") or field.startswith(p) for p in paths), paths


def test_a_super_cluster_that_sets_nothing_is_baseline_with_no_tenant_priority_class() -> None:
    spec = SuperCluster.from_kubernetes({"metadata": {"name": "s1"}, **super_cluster()}).spec
    assert (spec.pod_security, spec.priority_classes.allowed, spec.priority_classes.default) == ("baseline", [], None)


@pytest.mark.parametrize(
    ("classes", "rule"),
    [
        pytest.param({"allowed": ["system-cluster-critical"]}, SYSTEM_PRIORITY_RULE, id="system allowed"),
        pytest.param({"allowed": ["batch"], "default": "web"}, DEFAULT_PRIORITY_RULE, id="default not allowed"),
    ],
)  # fmt: skip
def test_a_super_cluster_priority_class_refused_names_its_rule(classes: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(rule)):
        SuperCluster.from_kubernetes({"metadata": {"name": "s1"}, **super_cluster(priorityClasses=classes)})


def test_an_advertisement_round_trips_through_its_kubernetes_form() -> None:
    obj = Advertisement.from_kubernetes(advertisement())
    again = Advertisement.from_kubernetes(obj.to_kubernetes())
    assert again == obj
    assert again.to_kubernetes()["spec"]["resourceQuota"] == {"hard": {"cpu": "2", "memory": "4Gi"}}


def test_prices_are_written_as_plain_decimals_whatever_form_they_were_given_in() -> None:
    config = ClusterConfig.from_kubernetes({"metadata": {"name": "tidepool"}, "spec": {
        "outgoing": {"prices": {"cpu": "40m", "memory": "0.0050", "nvidia.com/gpu": 2}},
        "incoming": {"maxPrices": {"cpu": "1e-1"}}}})  # fmt: skip
    spec = config.to_kubernetes()["spec"]
    assert spec["outgoing"]["prices"] == {"cpu": "0.04", "memory": "0.005", "nvidia.com/gpu": "2"}
    assert spec["incoming"]["maxPrices"] == {"cpu": "0.1"}
    assert Advertisement.from_kubernetes(advertisement(prices=spec["outgoing"]["prices"])).spec.prices == {
        "cpu": Decimal("0.04"), "memory": Decimal("0.005"), "nvidia.com/gpu": Decimal(2)}  # fmt: skip


# Namespace offloading: the mapping and the selector (models/offloading.py).
def test_default_remote_names_never_meet_and_fit_a_label() -> None:
    from models.names import remote_namespace_default_name

    assert remote_namespace_default_name("a", "b-c") != remote_namespace_default_name("a-b", "c")
    long = remote_namespace_default_name("c" * 63, "n" * 63)
    assert len(long) <= 63 and long == long.strip("-")


def test_selected_name_is_required_only_with_its_strategy() -> None:
    import pytest
    from pydantic import ValidationError

    from models.api.offloading import SELECTED_NAME_RULE, NamespaceOffloadingSpec
    from models.offloading import remote_namespace_name

    with pytest.raises(ValidationError, match=SELECTED_NAME_RULE):
        NamespaceOffloadingSpec.model_validate({"namespaceMappingStrategy": "SelectedName"})
    with pytest.raises(ValidationError, match=SELECTED_NAME_RULE):
        NamespaceOffloadingSpec.model_validate({"remoteNamespaceName": "x"})
    chosen = NamespaceOffloadingSpec.model_validate({"namespaceMappingStrategy": "SelectedName", "remoteNamespaceName": "x"})
    assert remote_namespace_name(chosen, consumer_cluster_id="a", namespace="team") == "x"
    same = NamespaceOffloadingSpec(namespace_mapping_strategy="EnforceSameName")
    assert remote_namespace_name(same, consumer_cluster_id="a", namespace="team") == "team"
    default = remote_namespace_name(NamespaceOffloadingSpec(), consumer_cluster_id="a", namespace="team")
    assert default.startswith("a-team-") and default != "team"


def test_cluster_selector_means_what_a_label_selector_means() -> None:
    from models.api.offloading import ClusterSelector
    from models.offloading import selects

    labels = {"tidepool.io/provider": "b", "region": "eu"}
    assert selects(ClusterSelector(), labels)
    assert selects(ClusterSelector.model_validate({"matchLabels": {"region": "eu"}}), labels)
    assert not selects(ClusterSelector.model_validate({"matchLabels": {"region": "us"}}), labels)
    expressions = [{"key": "tidepool.io/provider", "operator": "In", "values": ["b", "c"]},
                   {"key": "gpu", "operator": "DoesNotExist"}]  # fmt: skip
    assert selects(ClusterSelector.model_validate({"matchExpressions": expressions}), labels)
    assert not selects(ClusterSelector.model_validate({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}), labels)
    assert not selects(ClusterSelector.model_validate(
        {"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu"]}]}), labels)


PUSHED_AT = datetime(2026, 11, 27, 2, 0, tzinfo=UTC)


@pytest.mark.parametrize("prices", [
    pytest.param(None, id="without prices"),
    pytest.param(Resources({"cpu": "0.5", "memory": "0.001"}), id="with prices"),
])  # fmt: skip
def test_the_pushed_advertisement_is_the_json_the_push_wrote_as_a_dict(prices: Resources | None) -> None:
    """The push built its Advertisement as a dict literal before 0.1.x: the typed model applies the same JSON,
    so that server-side apply claims the same fields."""
    pushed = offered_advertisement(
        provider_id="provider-a", offered=Resources({"cpu": "2", "memory": "4Gi"}), pod_cidr="10.1.0.0/16",
        prices=prices, timestamp=PUSHED_AT, time_to_live=PUSHED_AT + timedelta(minutes=30),
        annotations={"tidepool.io/spare-capacity": '{"cpu": "3"}'})  # fmt: skip
    assert pushed.to_apply() == {
        "apiVersion": "tidepool.io/v1alpha1", "kind": "Advertisement",
        "metadata": {"name": "advertisement-provider-a",
                     "labels": {"app.kubernetes.io/managed-by": "tidepool", "tidepool.io/provider": "provider-a"},
                     "annotations": {"tidepool.io/spare-capacity": '{"cpu": "3"}'}},
        "spec": {
            "clusterId": "provider-a",
            "resourceQuota": {"hard": {"cpu": "2", "memory": "4Gi"}},
            "network": {"podCIDR": "10.1.0.0/16"},
            "kubeConfigRef": {"name": "tidepool-kubeconfig-provider-a", "namespace": "tidepool-system"},
            "timestamp": "2026-11-27T02:00:00Z",
            "timeToLive": "2026-11-27T02:30:00Z",
            **({"prices": {"cpu": "0.5", "memory": "0.001"}} if prices else {}),
        },
    }  # fmt: skip
    assert Advertisement.from_kubernetes(pushed.to_apply()) == pushed


def test_a_push_that_no_consumer_could_accept_is_refused_before_it_leaves() -> None:
    with pytest.raises(ValidationError, match="timeToLive must be later than timestamp"):
        offered_advertisement(provider_id="provider-a", offered=Resources({"cpu": "1"}), pod_cidr="10.1.0.0/16",
                              prices=None, timestamp=PUSHED_AT, time_to_live=PUSHED_AT, annotations={})  # fmt: skip


# Lenient reading (models/api/reading.py): what another cluster wrote, through the same models.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@st.composite
def written(draw: st.DrawFn) -> Any:
    """Anything, or a valid Advertisement with some of its parts, at any depth, replaced by anything."""
    if draw(st.booleans()):
        return draw(json_values)
    obj: Any = advertisement()
    for path in draw(st.lists(st.sampled_from([("metadata",), ("spec",), ("spec", "network"), ("spec", "prices"),
                                               ("spec", "resourceQuota", "hard"), ("spec", "kubeConfigRef", "name"),
                                               ("spec", "timeToLive"), ("spec", "clusterId")]), max_size=3)):  # fmt: skip
        parent = obj
        for key in path[:-1]:
            parent = parent[key] if isinstance(parent.get(key), dict) else {}
        parent[path[-1]] = draw(json_values)
    return obj


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), raw=written())
def test_reading_anything_leniently_never_raises_and_each_problem_names_where(kind: type[KubernetesObject],
                                                                             raw: Any) -> None:  # fmt: skip
    reading = read_leniently(kind, raw)
    assert (reading.model is None) == bool(reading.problems)
    for problem in reading.problems:
        assert problem.sentence.startswith(".".join(problem.path) or f"the {kind.KIND}"), problem
        assert len(problem.sentence) <= MAX_SENTENCE


@pytest.mark.parametrize(("spec", "sentence"), [
    pytest.param({"clusterId": None}, "spec.clusterId is missing", id="a null is no value"),
    pytest.param({"clusterId": "Bad_Id"}, "spec.clusterId 'Bad_Id' must be a DNS-1123 label", id="a pattern, said"),
    pytest.param({"clusterId": 7}, "spec.clusterId must be a string, got int", id="a wrong type"),
    pytest.param({"network": ["x"]}, "spec.network must be an object, got list", id="no object"),
    pytest.param({"resourceQuota": {"hard": {"cpu": "-2"}}}, "spec.resourceQuota.hard.cpu must not be negative, got -2",
                 id="a validator's own rule"),
    pytest.param({"network": {"podCIDR": "127.0.0.0/8"}}, "spec.network.podCIDR 127.0.0.0/8 overlaps 127.0.0.0/8",
                 id="a validator's sentence that names its field"),
    pytest.param({"timeToLive": "2025-12-31T23:00:00Z"}, "spec: timeToLive must be later than timestamp",
                 id="a rule across fields"),
    pytest.param({"timeToLive": 1767225600}, "spec.timeToLive must be an RFC 3339 time with a zone, got int",
                 id="seconds are no time"),
    pytest.param({"shape": "round"}, "spec.shape is not a known field", id="an unknown field"),
])  # fmt: skip
def test_a_lenient_reading_says_each_problem_with_its_field_and_rule(spec: dict[str, Any], sentence: str) -> None:
    reading = read_advertisement({**advertisement(**spec), "status": "not read"})
    assert reading.model is None and any(s.startswith(sentence) for s in reading.sentences), reading.sentences


def test_a_lenient_reading_reads_only_the_names_the_api_writes() -> None:
    raw = advertisement()
    raw["spec"]["cluster_id"] = raw["spec"].pop("clusterId")
    assert "spec.clusterId is missing" in read_advertisement(raw).sentences
    assert read_advertisement(advertisement()).model == Advertisement.from_kubernetes(advertisement())
