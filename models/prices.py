"""Prices (issue 15, item 9): what a provider asks per unit of each resource it advertises
(ClusterConfig spec.outgoing.prices, carried in every Advertisement's spec.prices) and the most a consumer
pays (spec.incoming.maxPrices, enforced by models/admission.py).

A price list has the shape of a ResourceList: resource name to a non-negative decimal, in whatever
currency the federation agrees on (tidepool never converts one). The unit priced is the one people buy
by, not the one Kubernetes counts in (a price per byte would be below a quantity's precision): one CPU
core for cpu, one Gi (2^30 bytes) for memory, ephemeral-storage and hugepages-*, one unit for the rest
(a pod, a GPU). Provider and consumer use the same units, so a cap compares with a price as they stand.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import PlainSerializer, WithJsonSchema

from models.quantities import UNSIGNED_PATTERN
from models.resources import NonNegativeResources, Resources

# A Kubernetes quantity without a sign: the API server refuses a negative or garbage price itself.
PRICE_PATTERN = UNSIGNED_PATTERN
PRICES_DESCRIPTION = (
    "Price per unit of each resource, a non-negative decimal in the federation's currency: per CPU core for cpu, "
    "per Gi (2^30 bytes) for memory, ephemeral-storage and hugepages-*, per unit for the rest. "
    "Example: {cpu: '0.04', memory: '0.005', nvidia.com/gpu: '1.2'}."
)


def price_unit(resource: str) -> str:
    """The unit a price of `resource` is per, as messages say it."""
    if resource == "cpu":
        return "CPU"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return "Gi"
    return "unit"


def format_price(price: Decimal) -> str:
    """As people write prices: "0.04", not the quantity form "40m"."""
    return format(price.normalize(), "f")


def _plain_decimals(prices: Resources) -> dict[str, str]:
    return {name: format_price(prices[name]) for name in sorted(prices)}


# A field type for price lists: a Resources with no negative price (each reported at `<field>.<resource>`),
# written as plain decimals, whose CRD schema refuses a sign.
Prices = Annotated[
    NonNegativeResources,
    PlainSerializer(_plain_decimals, return_type=dict[str, str]),
    WithJsonSchema({
        "type": "object",
        "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 0,
                                 "pattern": PRICE_PATTERN, "x-kubernetes-int-or-string": True},
    }),
]  # fmt: skip
