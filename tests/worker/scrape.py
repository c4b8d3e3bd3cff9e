"""Scrape a worker's /metrics and index the samples (test helper)."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

STEP_LINE = re.compile(r"step (\d+) loss (\S+) \[(\S+)\]")


@dataclass(frozen=True)
class Scrape:
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    types: dict[str, str]

    def value(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        if key not in self.samples:
            known = sorted({n for n, _ in self.samples})
            raise KeyError(f"no sample {name}{labels}; have {known}")
        return self.samples[key]

    def with_name(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def scrape(url: str, timeout_s: float = 30.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(samples, types)


def losses(log: str) -> dict[int, str]:
    """Step -> loss as float.hex() from a demo log (bit-exact)."""
    return {int(m.group(1)): m.group(3) for m in STEP_LINE.finditer(log)}
