"""Names of tenant namespaces in a shared super cluster (models/names.py): no two (tenant, namespace) pairs
ever share a name, every name is a valid namespace name, and a Tenant's key is fixed in length."""

from __future__ import annotations

import re

from hypothesis import assume, given
from hypothesis import strategies as st

from models.names import TENANT_KEY_LENGTH, super_cluster_namespace, tenant_finalizer, tenant_key

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
