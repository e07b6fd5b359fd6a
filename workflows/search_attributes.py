"""The search attributes the workflows set, one key each (registered on the Temporal namespace from
models/names.py SEARCH_ATTRIBUTES: tests/test_search_attributes.py keeps the two in step)."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

HOME_CLUSTER = SearchAttributeKey.for_keyword("HomeCluster")  # the cluster whose worker runs the workflow
FOREIGN_CLUSTER = SearchAttributeKey.for_keyword("ForeignCluster")
PEERING_PHASE = SearchAttributeKey.for_keyword("PeeringPhase")
SHARING_PERCENTAGE = SearchAttributeKey.for_int("SharingPercentage")
PROVIDER_CLUSTER = SearchAttributeKey.for_keyword("ProviderCluster")
ADVERTISEMENT_PHASE = SearchAttributeKey.for_keyword("AdvertisementPhase")
SUPER_CLUSTERS = SearchAttributeKey.for_keyword_list("SuperClusters")

ALL = (HOME_CLUSTER, FOREIGN_CLUSTER, PEERING_PHASE, SHARING_PERCENTAGE, PROVIDER_CLUSTER, ADVERTISEMENT_PHASE,
       SUPER_CLUSTERS)  # fmt: skip
