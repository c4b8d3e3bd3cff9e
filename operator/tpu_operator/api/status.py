"""Status fields shared by TPUJob and TPUSlice."""

from __future__ import annotations

from typing import Literal

from tpu_operator.api.common import ApiModel

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})


class ResolvedShape(ApiModel):
    """The slice shape as the catalog resolved it."""

    accelerator: str
    topology: str
    type: str
    """Short TPU type (TPU_ACCELERATOR_TYPE), e.g. v5p-128."""
    chips: int
    chips_per_host: int
    hosts: int
