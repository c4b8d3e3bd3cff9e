"""Timestamps as Kubernetes writes them: RFC 3339 in UTC with second precision (pure).

The one place that formats and parses the times the operator keeps in status
(conditions, ``runningSince``, ``lastFailure.time``, progress sample times).
"""

from __future__ import annotations

import datetime as dt


def now() -> dt.datetime:
    """The current time, timezone-aware in UTC."""
    return dt.datetime.now(dt.UTC)


def stamp(moment: dt.datetime) -> str:
    """RFC 3339 with second precision, as Kubernetes writes timestamps."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp_epoch(seconds: float) -> str:
    """``stamp`` of a Unix time (seconds since the epoch)."""
    return stamp(dt.datetime.fromtimestamp(seconds, dt.UTC))


def parse(value: str | None) -> dt.datetime | None:
    """A timestamp from status (``Z`` or an offset), or None for an empty value."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
