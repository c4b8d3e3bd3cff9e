"""Standard Kubernetes conditions and timestamps (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from tpu_operator.timestamps import now as now
from tpu_operator.timestamps import parse as parse
from tpu_operator.timestamps import stamp as stamp


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    *,
    at: dt.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set; lastTransitionTime moves only when status does."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    result = []
    found = False
    for condition in conditions:
        if condition.get("type") != type_:
            result.append(condition)
            continue
        found = True
        transition = (
            condition.get("lastTransitionTime") if condition.get("status") == value else None
        )
        result.append(
            {
                "type": type_,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": transition or stamp(at),
                "observedGeneration": generation,
            }
        )
    if not found:
        result.append(
            {
                "type": type_,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp(at),
                "observedGeneration": generation,
            }
        )
    return result
