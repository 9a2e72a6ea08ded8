"""Reading a Prometheus scrape in tests, with ``prometheus_client.parser``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by name and label set."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(text: str, selector: str) -> float:
    """The value of ``selector`` (``name`` or ``name{label="value",...}``, labels in any
    order) in a scrape; fails when it is missing."""
    (wanted,) = [s for f in text_string_to_metric_families(selector + " 0\n") for s in f.samples]
    key = (wanted.name, frozenset(wanted.labels.items()))
    found = samples(text)
    assert key in found, f"{selector} not in the scrape"
    return found[key]


def families(text: str) -> dict[str, str]:
    """Each metric family's type by name."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}
