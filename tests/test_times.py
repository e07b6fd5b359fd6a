"""The time codec (models/times.py): what it writes is what Kubernetes writes, and what it reads from
another cluster never raises; and the clock (kube/clock.py) whose times it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from kube.clock import utcnow
from models.times import format_micro_time, format_rfc3339, parse_rfc3339

AT = datetime(2026, 11, 27, 1, 2, 3, 456789, tzinfo=UTC)


@pytest.mark.parametrize(("moment", "written"), [
    pytest.param(AT, "2026-11-27T01:02:03Z", id="a UTC time is written to the second with Z"),
    pytest.param(AT.astimezone(timezone(timedelta(hours=2))), "2026-11-27T01:02:03Z", id="another zone is written in UTC"),
    pytest.param(AT.replace(tzinfo=None), "2026-11-27T01:02:03Z", id="a time without a zone is taken as UTC"),
])  # fmt: skip
def test_format_rfc3339_writes_what_the_api_server_writes(moment: datetime, written: str) -> None:
    assert format_rfc3339(moment) == written


def test_format_micro_time_keeps_the_microseconds() -> None:
    assert format_micro_time(AT) == "2026-11-27T01:02:03.456789Z"


@pytest.mark.parametrize(("value", "parsed"), [
    pytest.param("2026-11-27T01:02:03Z", AT.replace(microsecond=0), id="the API server's Time"),
    pytest.param("2026-11-27T01:02:03.456789Z", AT, id="the API server's MicroTime"),
    pytest.param("2026-11-27T03:02:03.456789+02:00", AT, id="an offset"),
    pytest.param(AT.isoformat(), AT, id="Python's isoformat"),
    pytest.param(AT, AT, id="a datetime a model parsed already"),
    pytest.param("2026-11-27T01:02:03", None, id="no zone: cannot be compared with now"),
    pytest.param(AT.replace(tzinfo=None), None, id="a datetime without a zone"),
    pytest.param("", None, id="empty"),
    pytest.param("tomorrow", None, id="garbage"),
    pytest.param(1764205323, None, id="a number"),
    pytest.param(None, None, id="missing"),
    pytest.param({"time": "2026-11-27T01:02:03Z"}, None, id="a map"),
])  # fmt: skip
def test_parse_rfc3339_reads_any_writer_and_never_raises(value: object, parsed: datetime | None) -> None:
    assert parse_rfc3339(value) == parsed


@pytest.mark.parametrize("moment", [AT, AT.replace(microsecond=0)])
def test_what_the_codec_writes_it_reads_back(moment: datetime) -> None:
    assert parse_rfc3339(format_micro_time(moment)) == moment
    assert parse_rfc3339(format_rfc3339(moment)) == moment.replace(microsecond=0)


def test_the_clock_tells_aware_utc_that_the_codec_writes_unchanged() -> None:
    now = utcnow()
    assert now.tzinfo is UTC
    assert parse_rfc3339(format_micro_time(now)) == now
