"""Kubernetes quantities, exact both ways: every form parses to its exact value; formatting picks the
shortest exact canonical form; garbage is refused with the offending text."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.quantities import QuantityError, format_quantity, parse_quantity

pytestmark = pytest.mark.api


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("1", Decimal(1), id="a plain integer"),
        pytest.param("100m", Decimal("0.1"), id="milli"),
        pytest.param("250u", Decimal("0.00025"), id="micro"),
        pytest.param("5n", Decimal("0.000000005"), id="nano"),
        pytest.param("1k", Decimal(1000), id="kilo"),
        pytest.param("2M", Decimal(2_000_000), id="mega"),
        pytest.param("3G", Decimal(3 * 10**9), id="giga"),
        pytest.param("1T", Decimal(10**12), id="tera"),
        pytest.param("1P", Decimal(10**15), id="peta"),
        pytest.param("1E", Decimal(10**18), id="exa"),
        pytest.param("1Ki", Decimal(1024), id="kibi"),
        pytest.param("1.5Gi", Decimal(3 * 2**29), id="fractional gibi"),
        pytest.param("8Ei", Decimal(8 * 2**60), id="eight exbi stays exact"),
        pytest.param("1e3", Decimal(1000), id="a decimal exponent"),
        pytest.param("1E3", Decimal(1000), id="an upper-case exponent is not exa"),
        pytest.param("1.5e-3", Decimal("0.0015"), id="a negative exponent"),
        pytest.param(".5", Decimal("0.5"), id="a leading dot"),
        pytest.param("+2", Decimal(2), id="a plus sign"),
        pytest.param("-2Mi", Decimal(-2 * 2**20), id="a minus sign"),
    ],
)
def test_every_quantity_form_parses_to_its_exact_value(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param(" 1", id="leading space"),
        pytest.param("1.5.5", id="two dots"),
        pytest.param("1Qi", id="unknown binary suffix"),
        pytest.param("1ki", id="lower-case binary suffix"),
        pytest.param("NaN", id="not a number"),
        pytest.param("inf", id="infinity"),
        pytest.param(1.5, id="a float has already lost the exact value"),
    ],
)
def test_garbage_is_refused_with_a_quantity_error(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(Decimal("0.1"), "100m", id="a tenth is 100m"),
        pytest.param(Decimal(2**30), "1Gi", id="a power of 1024 takes a binary suffix"),
        pytest.param(Decimal(3000), "3k", id="a multiple of 1000 takes a decimal suffix"),
        pytest.param(Decimal(1500), "1500", id="neither stays plain"),
        pytest.param(Decimal("0.0000000001"), "1n", id="finer than a nano rounds up to one"),
        pytest.param(Decimal(0), "0", id="zero"),
        pytest.param(Decimal(-1024), "-1Ki", id="negative"),
    ],
)
def test_formatting_is_the_shortest_exact_canonical_form(value: Decimal, text: str) -> None:
    assert format_quantity(value) == text


nanos = st.integers(min_value=-(2**62), max_value=2**62).map(lambda n: Decimal(n) * Decimal("0.000000001"))


@given(nanos)
def test_formatting_then_parsing_gives_back_the_exact_value(value: Decimal) -> None:
    assert parse_quantity(format_quantity(value)) == value


@given(nanos)
def test_formatting_is_stable(value: Decimal) -> None:
    text = format_quantity(value)
    assert format_quantity(parse_quantity(text)) == text


def test_a_quantity_beyond_any_real_amount_is_refused_at_once_not_formatted_for_half_a_minute() -> None:
    for text in ("1e99999999", "1e31", "-2e30"):
        with pytest.raises(QuantityError, match="beyond any real amount"):
            parse_quantity(text)
    assert parse_quantity("1e30") == Decimal(10**30)  # the bound itself is an amount
