"""ResourceList arithmetic with exact quantities: add, subtract, scale by a percentage, clamp at zero
per resource, compare. Used by the sharing computation, admission checks, slicing and placement.

A `Resources` is an immutable mapping from resource name ("cpu", "memory", "pods", ...) to an exact
Decimal. A resource absent from a list counts as zero in arithmetic.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any

from pydantic import TypeAdapter
from pydantic_core import core_schema

from models.quantities import _EXACT, NonNegativeQuantity, Quantity, QuantityError, format_quantity, parse_quantity

# The unit a share is rounded down to: Kubernetes schedules CPU in thousandths of a core; bytes are
# shared in whole mebibytes (an advertised 27487790694 helps nobody); hugepages in whole pages of their
# size, the only amounts a pod can request (`hugepages-2Mi: 253Mi` fits no pod); everything else in
# whole units.
_MILLI = Decimal("0.001")
_MEBI = Decimal(2**20)
_HUGEPAGES_PREFIX = "hugepages-"


@lru_cache(maxsize=64)
def _share_unit(name: str) -> Decimal:
    if name == "cpu":
        return _MILLI
    if name in ("memory", "ephemeral-storage"):
        return _MEBI
    if name.startswith(_HUGEPAGES_PREFIX):
        try:
            page = parse_quantity(name.removeprefix(_HUGEPAGES_PREFIX))
        except QuantityError:
            return _MEBI  # the API server admits no such name on a node; whole mebibytes as before
        return page if page > 0 else _MEBI
    return Decimal(1)


class Resources(Mapping[str, Decimal]):
    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str | int | Decimal] | None = None, /, **kwargs: str | int | Decimal):
        merged = {**(items or {}), **kwargs}
        self._items: dict[str, Decimal] = {name: parse_quantity(value) for name, value in merged.items()}

    # Mapping protocol -------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Decimal:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get_or_zero(self, name: str) -> Decimal:
        return self._items.get(name, Decimal(0))

    def __repr__(self) -> str:
        return f"Resources({self.to_kubernetes()!r})"

    def __eq__(self, other: object) -> bool:
        """Equal when every resource is equal, an absent one counting as zero."""
        if not isinstance(other, Mapping):
            return NotImplemented
        other_resources = other if isinstance(other, Resources) else Resources(other)
        names = set(self) | set(other_resources)
        return all(self.get_or_zero(n) == other_resources.get_or_zero(n) for n in names)

    def __hash__(self) -> int:
        return hash(frozenset((n, v) for n, v in self._items.items() if v != 0))

    # Arithmetic ---------------------------------------------------------------------------------------
    def __add__(self, other: Mapping[str, Decimal]) -> Resources:
        with decimal.localcontext(_EXACT):
            names = list(self) + [n for n in other if n not in self._items]
            return Resources({n: self.get_or_zero(n) + Decimal(other.get(n, 0)) for n in names})

    def __sub__(self, other: Mapping[str, Decimal]) -> Resources:
        with decimal.localcontext(_EXACT):
            names = list(self) + [n for n in other if n not in self._items]
            return Resources({n: self.get_or_zero(n) - Decimal(other.get(n, 0)) for n in names})

    def clamp_at_zero(self) -> Resources:
        """Negative amounts become zero, each resource on its own."""
        return Resources({n: max(v, Decimal(0)) for n, v in self._items.items()})

    def scale(self, percent: int | Decimal) -> Resources:
        """`percent`% of every resource, rounded down to the resource's unit (1m of CPU, 1Mi of memory
        and ephemeral storage, one page of hugepages, one pod or extended resource), so that a provider
        never advertises more than it has nor an amount no pod can request."""
        with decimal.localcontext(_EXACT):
            factor = Decimal(percent) / 100
            scaled: dict[str, Decimal] = {}
            for name, value in self._items.items():
                unit = _share_unit(name)
                scaled[name] = ((value * factor) / unit).to_integral_value(decimal.ROUND_FLOOR) * unit
            return Resources(scaled)

    def only(self, names: Iterable[str]) -> Resources:
        wanted = set(names)
        return Resources({n: v for n, v in self._items.items() if n in wanted})

    # Comparison ---------------------------------------------------------------------------------------
    def fits_in(self, capacity: Mapping[str, Decimal]) -> bool:
        """Every resource here is at most the capacity's (absent capacity counts as zero)."""
        return not self.shortfall(capacity)

    def shortfall(self, capacity: Mapping[str, Decimal]) -> Resources:
        """What is missing from `capacity` to hold this, per resource; empty when it fits."""
        with decimal.localcontext(_EXACT):
            return Resources(
                {n: v - Decimal(capacity.get(n, 0)) for n, v in self._items.items() if v > Decimal(capacity.get(n, 0))}
            )

    # Conversion ----------------------------------------------------------------------------------------
    def to_kubernetes(self) -> dict[str, str]:
        """The ResourceList as the API server writes it: canonical quantity strings, sorted by name."""
        return {n: format_quantity(self._items[n]) for n in sorted(self._items)}

    @classmethod
    def total(cls, lists: Iterable[Mapping[str, Decimal]]) -> Resources:
        result = cls()
        for item in lists:
            result = result + item
        return result

    # pydantic integration: a field of type Resources validates a ResourceList and serialises it back.
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return _resources_schema(handler, Quantity)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": TypeAdapter(Quantity).json_schema()}


def _resources_schema(handler: Any, quantity: Any) -> core_schema.CoreSchema:
    """A ResourceList whose amounts are of the field type `quantity`, validated into a Resources."""
    quantity_map = handler.generate_schema(dict[str, quantity])
    # A Resources passes through as its dict, so that a bad quantity is reported at `<field>.<resource>`.
    as_dict = core_schema.no_info_before_validator_function(
        lambda value: dict(value) if isinstance(value, Resources) else value, quantity_map
    )
    return core_schema.no_info_after_validator_function(
        Resources,
        as_dict,
        serialization=core_schema.plain_serializer_function_ser_schema(
            lambda value: value.to_kubernetes(), return_schema=core_schema.dict_schema()
        ),
    )


@dataclass(frozen=True)
class _Amounts:
    """An annotation on a Resources field: its amounts are of the field type `quantity` instead of Quantity."""

    quantity: Any

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return _resources_schema(handler, self.quantity)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": TypeAdapter(self.quantity).json_schema()}


# A ResourceList with no amount below zero (an offer, a price list): each negative one is reported at
# `<field>.<resource>`, and the CRD generated from it refuses a sign.
NonNegativeResources = Annotated[Resources, _Amounts(NonNegativeQuantity)]
