"""Reading a Prometheus endpoint as Prometheus does (the text format), for the tests of the workers' and
the virtual kubelet's metrics."""

from __future__ import annotations

import re
import urllib.request

Sample = tuple[str, dict[str, str], float]
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def _text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def naming_problems(port: int, *, service: str) -> list[str]:
    """Where the endpoint departs from Prometheus' naming and tidepool's labels: a counter whose name does not
    end in `_total`, a sample without `service` naming its process, or with the SDK's `service_name`."""
    text = _text(port)
    problems = [f"counter {name} does not end in _total"
                for name in re.findall(r"^# TYPE (\S+) counter$", text, re.MULTILINE) if not name.endswith("_total")]  # fmt: skip
    for name, labels, _ in _samples(text):
        if labels.get("service") != service or "service_name" in labels:
            problems.append(f"{name}{labels}: not service={service!r} alone")
    return problems


def scrape(port: int) -> list[Sample]:
    """The endpoint's samples as (name, labels, value), in the Prometheus text format."""
    return _samples(_text(port))


def _samples(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"] or ""))
            samples.append((match["name"], labels, float(match["value"])))
    return samples


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    found = [v for n, ls, v in samples if n == name and labels.items() <= ls.items()]
    assert len(found) <= 1, f"{name}{labels} is ambiguous: {found}"
    return found[0] if found else None


def scraped(port: int, name: str, **labels: str) -> list[Sample] | None:
    """All samples, once the series `name{labels}` is there."""
    samples = scrape(port)
    return samples if value(samples, name, **labels) is not None else None
