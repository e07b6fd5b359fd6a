"""The provider's rules for a consumer's RemoteNamespace, as data (models/remote_namespaces.py): which names are
refused and why, what a made namespace carries; and the offer split over one consumer's namespaces
(models/enforcement.split_offer)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from models.enforcement import offer_annotation, offer_of, quota_hard, split_offer
from models.names import LABEL_CONSUMER, LABEL_CONSUMER_NAMESPACE, LABEL_MANAGED_BY, MANAGED_BY
from models.quantities import parse_quantity
from models.remote_namespaces import namespace_labels, owned_by, pod_security_level, refusal
from models.resources import Resources
from models.sharing import offloaded_by

pytestmark = [pytest.mark.offloading]

MINE = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER: "b"}


@pytest.mark.parametrize(
    ("name", "exists", "labels", "reason", "words"),
    [
        pytest.param("kube-system", True, {}, "NameReserved", "reserved", id="a Kubernetes namespace"),
        pytest.param("default", True, {}, "NameReserved", "reserved", id="default"),
        pytest.param("tidepool-x", False, None, "NameReserved", "tidepool-", id="tidepool's prefix, even free"),
        pytest.param("kube-anything", False, None, "NameReserved", "kube-", id="kube's prefix"),
        pytest.param("shop", True, {}, "NameTaken", "not made for b", id="the provider's own namespace"),
        pytest.param("shop", True, {**MINE, LABEL_CONSUMER: "c"}, "NameTaken", "not made for b",
                     id="another consumer's namespace"),
        pytest.param("shop", True, {LABEL_CONSUMER: "b"}, "NameTaken", "not made for b",
                     id="labelled by someone other than tidepool"),
        pytest.param("a.b", False, None, "NameInvalid", "DNS label", id="a dot: not a namespace name"),
        pytest.param("x" * 64, False, None, "NameInvalid", "63", id="too long"),
    ],
)  # fmt: skip
def test_a_name_the_consumer_may_not_have_is_refused_with_the_rule(
    name: str, exists: bool, labels: dict[str, str] | None, reason: str, words: str
) -> None:
    refused = refusal(name, consumer="b", existing_labels=labels, exists=exists)
    assert refused is not None and refused.reason == reason
    assert repr(name) in refused.message and words in refused.message


@pytest.mark.parametrize(
    ("exists", "labels"),
    [pytest.param(False, None, id="free"), pytest.param(True, {**MINE, "other": "x"}, id="already the consumer's")],
)
def test_a_free_name_or_one_made_for_the_same_consumer_is_granted(exists: bool, labels: dict[str, str] | None) -> None:
    assert refusal("shop", consumer="b", existing_labels=labels, exists=exists) is None


def test_a_made_namespace_says_whose_it_is_and_enforces_pod_security() -> None:
    labels = namespace_labels(consumer="b", consumer_namespace="shop", level="restricted")
    assert owned_by(labels, "b") and not owned_by(labels, "c")
    assert labels[LABEL_CONSUMER_NAMESPACE] == "shop"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert pod_security_level(labels) == "restricted"
    assert pod_security_level({}) is None and pod_security_level({"pod-security.kubernetes.io/enforce": "x"}) is None


OFFER = quota_hard(Resources(cpu="4", memory="8Gi", pods="10"))


@pytest.mark.parametrize(
    "used",
    [
        pytest.param({"ctl": {}}, id="the control namespace alone holds the whole offer"),
        pytest.param({"ctl": {}, "a": {}, "b": {}}, id="three empty namespaces"),
        pytest.param({"ctl": {"pods": "1", "requests.cpu": "100m"}, "a": {"pods": "3", "requests.cpu": "3"},
                      "b": {}}, id="uneven usage"),
        pytest.param({"ctl": {}, "a": {"pods": "7", "requests.cpu": "3500m"}, "b": {"pods": "3"}},
                     id="the pods all used"),
        pytest.param({f"n{i}": {"requests.memory": "1"} for i in range(7)}, id="a remainder of bytes"),
    ],
)  # fmt: skip
def test_the_split_never_exceeds_the_offer_and_never_goes_below_a_namespace_s_use(used: dict[str, dict[str, str]]) -> None:
    split = split_offer(OFFER, used)
    assert set(split) == set(used)
    for key, total in OFFER.items():
        hards = [parse_quantity(split[ns][key]) for ns in used]
        assert sum(hards, Decimal(0)) <= parse_quantity(total), key
        for ns in used:
            assert parse_quantity(split[ns][key]) >= parse_quantity(used[ns].get(key, "0")), (ns, key)
    # what is free is handed out (less than one unit per namespace kept back)
    assert parse_quantity(OFFER["pods"]) - sum(parse_quantity(split[ns]["pods"]) for ns in used) < len(used)
    assert split[sorted(used)[0]]["services.nodeports"] == "0"


def test_the_free_part_is_split_evenly_and_the_same_wherever_it_is_computed() -> None:
    split = split_offer({"requests.cpu": "2", "pods": "3"}, {"b": {}, "a": {"requests.cpu": "500m", "pods": "1"}, "c": {}})
    assert split == {"a": {"requests.cpu": "1", "pods": "2"}, "b": {"requests.cpu": "500m", "pods": "1"},
                     "c": {"requests.cpu": "500m", "pods": "0"}}  # fmt: skip


def test_an_offer_below_what_runs_keeps_each_namespace_at_its_use() -> None:
    assert split_offer({"requests.cpu": "1"}, {"a": {"requests.cpu": "2"}, "b": {}}) == {
        "a": {"requests.cpu": "2"}, "b": {"requests.cpu": "0"}}  # fmt: skip


def test_the_offer_recorded_for_the_split_reads_back_and_a_bad_record_is_none() -> None:
    offered = Resources(cpu="1", pods="5")
    assert offer_of(offer_annotation(quota_hard(offered))) == quota_hard(offered)
    assert offer_of({}) is None and offer_of({"tidepool.io/offer": "{"}) is None
    assert offer_of({"tidepool.io/offer": '{"pods": 5}'}) is None


@pytest.mark.parametrize(
    ("namespace", "consumer"),
    [
        pytest.param("tidepool-foreign-b", "b", id="the control namespace"),
        pytest.param("shop-b", "b", id="a namespace made for b's RemoteNamespace"),
        pytest.param("shop", None, id="the provider's own namespace"),
    ],
)
def test_a_pod_in_a_namespace_made_for_a_consumer_is_that_consumer_s(namespace: str, consumer: str | None) -> None:
    """The offer to b leaves b's own pods out, wherever the provider made their namespace for b."""
    pod = {"metadata": {"namespace": namespace, "labels": {LABEL_CONSUMER: "c"}}}  # what a pod says is not read
    assert offloaded_by(pod, {"shop-b": "b"}) == consumer
