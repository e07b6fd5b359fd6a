"""Names of tenant namespaces in a shared super cluster (models/names.py): no two (tenant, namespace) pairs
ever share a name, every name is a valid namespace name, and a Tenant's key is fixed in length. And what of a
namespace's placement the pool takes from the tenant, which writes its annotations (models/pool/tenancy.py)."""

from __future__ import annotations

import re

from hypothesis import assume, given
from hypothesis import strategies as st

from models.api.tenant import NamespacePlacement
from models.names import (
    DRAINING_ANNOTATION,
    MANDATORY_ANNOTATION,
    PLACED_SLICE_ANNOTATION,
    PLACEMENTS_ANNOTATION,
    SCHEDULED_ANNOTATION,
    TENANT_KEY_LENGTH,
    super_cluster_namespace,
    tenant_finalizer,
    tenant_key,
)
from models.pool.moves import draining_of, scheduled_of
from models.pool.namespaces import held_slice, placement_of
from models.pool.tenancy import recorded_held, recorded_placement, recorded_placements, trusted_annotations
from models.resources import Resources

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Names as the API server allows them: DNS labels up to 63, with '-' runs and lengths near the cut.
names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", fullmatch=True)


def test_the_prefix_is_not_the_tenant_s_name_so_a_moved_dash_does_not_collide() -> None:
    assert super_cluster_namespace("a", "b-c") != super_cluster_namespace("a-b", "c")
    assert super_cluster_namespace("team", "web").startswith(f"{tenant_key('team')}-")


@given(names, names)
def test_every_name_is_a_namespace_name_with_the_tenant_key_first(tenant: str, namespace: str) -> None:
    name = super_cluster_namespace(tenant, namespace)
    assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert len(tenant_key(tenant)) == TENANT_KEY_LENGTH and name[:TENANT_KEY_LENGTH] == tenant_key(tenant)


@given(names, names, names, names)
def test_two_pairs_share_a_name_only_when_they_are_the_same_pair(t1: str, n1: str, t2: str, n2: str) -> None:
    assume((t1, n1) != (t2, n2))
    assume(t1 == t2 or tenant_key(t1) != tenant_key(t2))  # colliding keys are refused at registration
    assert super_cluster_namespace(t1, n1) != super_cluster_namespace(t2, n2)


def test_a_long_name_cut_with_a_digest_never_meets_a_plain_one_of_the_same_tenant() -> None:
    """A tenant cannot make one of its namespaces take another's name: a plain name is at most 62 long,
    a cut one exactly 63, whatever the tenant writes."""
    long = "x" * 60
    cut = super_cluster_namespace("a", long)
    assert len(cut) == 63
    forged = cut[TENANT_KEY_LENGTH + 1:]  # the namespace that would print as the cut name, if plain
    assert super_cluster_namespace("a", forged) != cut
    assert len({super_cluster_namespace("a", "x" * n) for n in range(40, 64)}) == 24


def test_a_finalizer_per_super_cluster_is_a_qualified_name() -> None:
    for cluster in ("a", "s" * 63, "s" * 200):
        prefix, name = tenant_finalizer(cluster).split("/")
        assert prefix == "syncer.pool.tidepool.io" and len(name) <= 63 and DNS_LABEL.match(name)


@given(names, names, names)
def test_one_tenant_s_namespaces_never_share_a_name(tenant: str, n1: str, n2: str) -> None:
    assume(n1 != n2)
    assert super_cluster_namespace(tenant, n1) != super_cluster_namespace(tenant, n2)


FORGED = {PLACEMENTS_ANNOTATION: '{"a": 50}', SCHEDULED_ANNOTATION: '{"a": 50}', DRAINING_ANNOTATION: '{"b": 9}',
          PLACED_SLICE_ANNOTATION: '{"cpu": "64", "memory": "256Gi"}', MANDATORY_ANNOTATION: '{"a": 50}', "team": "red"}


def test_without_a_record_nothing_the_tenant_wrote_of_a_placement_is_taken() -> None:
    """A tenant writing the scheduler's annotations itself gets no copy anywhere (the syncers), and to the pass
    its `scheduled` placement is no placement at all: the pass places it as any new namespace, by capacity."""
    assert trusted_annotations(FORGED, None, edits=False) == {"team": "red"}
    assert trusted_annotations(FORGED, None, edits=True) == {"team": "red"}  # placements == scheduled: not a request
    edited = {**FORGED, PLACEMENTS_ANNOTATION: '{"a": 2}'}
    assert trusted_annotations(edited, None, edits=True) == {PLACEMENTS_ANNOTATION: '{"a": 2}', "team": "red"}


def test_with_a_record_what_the_pool_owns_is_the_record_s() -> None:
    record = NamespacePlacement(placement={"a": 1, "b": 1}, draining={"c": 1}, slice=Resources(cpu="1", memory="2Gi"))
    synced = trusted_annotations(FORGED, record, edits=False)
    assert placement_of(synced) == {"a": 1, "b": 1} and scheduled_of(synced) == {"a": 1, "b": 1}
    assert draining_of(synced) == {"c": 1} and held_slice(synced) == Resources(cpu="1", memory="2Gi")
    assert MANDATORY_ANNOTATION not in synced
    weighed = trusted_annotations(FORGED, record, edits=True)
    assert placement_of(weighed) == {"a": 50}  # the tenant's request, which the pass weighs against capacity
    assert scheduled_of(weighed) == {"a": 1, "b": 1}


def test_a_record_that_does_not_read_is_left_out_and_the_others_stand() -> None:
    good = {"placement": {"s1": 2}, "slice": {"cpu": "1", "memory": "2Gi"}}
    tenant = {"status": {"placements": {"shop": good, "old": {"placement": "s1"}, "bad": None},
                         "held": {"s1": {"cpu": "2"}, "s3": "lots"}}}
    assert set(recorded_placements(tenant)) == {"shop"}
    assert recorded_placements(tenant)["shop"].placement == {"s1": 2}
    assert recorded_placement(tenant, "shop") == recorded_placements(tenant)["shop"]
    assert recorded_placement(tenant, "old") is None and recorded_placement(tenant, "missing") is None
    assert recorded_held(tenant) == {"s1": Resources({"cpu": 2})}
    for nothing in (None, {}, {"status": None}, {"status": {"placements": ["shop"], "held": "all"}}):
        assert recorded_placements(nothing) == {} and recorded_held(nothing) == {}
