"""Kubernetes quantities ("100m", "1.5Gi", "2e3") as exact decimals, and back.

Parsing is the Kubernetes client's own `parse_quantity`, run in a decimal context wide enough that no
value Kubernetes accepts is ever rounded; we add what it lets through and Kubernetes does not (floats,
NaN, infinities, spaces). Formatting picks the shortest exact canonical form. Used by `models.resources`
and by every pydantic field that carries a quantity.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from typing import Annotated, Any

from kubernetes.utils.quantity import parse_quantity as _client_parse_quantity
from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

# Kubernetes quantities hold at most 2^63 units of 10^-9 with exponents up to E (10^18) / Ei (2^60):
# 60 significant digits is far beyond any of them, so arithmetic below is exact.
_EXACT = decimal.Context(prec=60, rounding=decimal.ROUND_FLOOR, traps=[decimal.InvalidOperation])

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
_FRACTIONS = (("m", Decimal("0.001")), ("u", Decimal("0.000001")), ("n", Decimal("0.000000001")))
_NANO = Decimal("0.000000001")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | Decimal) -> Decimal:
    """The exact value of a quantity. Raises QuantityError with the offending text."""
    if isinstance(value, bool) or isinstance(value, float):
        # A float has already lost the exact value; Kubernetes serialises quantities as strings.
        raise QuantityError(f"{value!r} is not a quantity: write it as a string such as '1.5' or '1500m'")
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise QuantityError(f"{value} is not a finite quantity")
        return _bounded(value, str(value))
    if isinstance(value, int):
        return _bounded(Decimal(value), None)  # not str(value): past 4300 digits, that raises
    text = str(value)
    if not text or text != text.strip() or text.lower().lstrip("+-") in {"nan", "inf", "infinity", "snan"}:
        raise QuantityError(f"{text!r} is not a quantity")
    try:
        with decimal.localcontext(_EXACT):
            parsed: Decimal = _client_parse_quantity(text)
    except (ValueError, ArithmeticError) as e:
        raise QuantityError(f"{text!r} is not a quantity") from e
    if not parsed.is_finite():
        raise QuantityError(f"{text!r} is not a finite quantity")
    return _bounded(parsed, text)


# Kubernetes means quantities to stay within 2^63-1 (8Ei and its neighbours still parse there); far beyond
# it nothing is a real amount, and formatting 1e99999999 exactly takes half a minute of CPU: a foreign
# cluster's quantity must not cost that.
_MAX_MAGNITUDE = Decimal(10**30)


def _bounded(value: Decimal, text: str | None) -> Decimal:
    if value.copy_abs() > _MAX_MAGNITUDE:  # copy_abs: no context, which a huge exponent would overflow
        shown = repr(text) if text is not None and len(text) <= 32 else f"{value:.3E}"
        raise QuantityError(f"{shown} is beyond any real amount (more than 10^30)")
    return value


def format_quantity(value: Decimal | int) -> str:
    """The shortest exact canonical form: binary suffixes for multiples of 1024, decimal ones for
    multiples of 1000, m/u/n for fractions. Values finer than a nano are rounded up to one, as
    Kubernetes does."""
    value = Decimal(value)
    if value == 0:
        return "0"
    with decimal.localcontext(_EXACT):
        sign = "-" if value < 0 else ""
        magnitude = abs(value)
        if magnitude != magnitude.to_integral_value():
            nanos = (magnitude / _NANO).to_integral_value(rounding=decimal.ROUND_CEILING)
            magnitude = nanos * _NANO
            if magnitude != magnitude.to_integral_value():
                for suffix, unit in _FRACTIONS:
                    scaled = magnitude / unit
                    if scaled == scaled.to_integral_value():
                        return f"{sign}{int(scaled)}{suffix}"
        integer = int(magnitude)
        for suffix, factor in _BINARY:
            if integer % factor == 0:
                return f"{sign}{integer // factor}{suffix}"
        for suffix, factor in _DECIMAL:
            if integer % factor == 0:
                return f"{sign}{integer // factor}{suffix}"
        return f"{sign}{integer}"


def _validate(value: Any) -> Decimal:
    if not isinstance(value, (str, int, Decimal)) or isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity: expected a string such as '500m' or '2Gi'")
    return parse_quantity(value)


def _validate_non_negative(value: Any) -> Decimal:
    amount = _validate(value)
    if amount < 0:
        raise QuantityError(f"must not be negative, got {value}")
    return amount


# A quantity without a sign, as a ResourceList's amounts and prices are written (an offer of -2 cpu means nothing).
UNSIGNED_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# A pydantic field type: accepts any Kubernetes quantity form, holds the exact Decimal, writes the
# canonical string. Its JSON schema is the Kubernetes one (int-or-string), so CRDs generated from the
# models accept exactly what the API server's own quantity fields accept.
Quantity = Annotated[
    Decimal,
    BeforeValidator(_validate),
    PlainSerializer(format_quantity, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": True,
        }
    ),
]

# Quantity, refusing amounts below zero; its JSON schema refuses a sign (and, for integers, a negative).
NonNegativeQuantity = Annotated[
    Decimal,
    BeforeValidator(_validate_non_negative),
    PlainSerializer(format_quantity, return_type=str),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 0, "pattern": UNSIGNED_PATTERN,
                    "x-kubernetes-int-or-string": True}),
]  # fmt: skip
