"""A queue that admits jobs (Kueue), behind the small interface the driver calls.

The driver (``reconcile/jobs.py``) asks every job's admission the same few things and
never branches on which it is: ``NoAdmission`` answers for a job that no queue manages
(it runs no queue code at all), ``reconcile/queueing.KueueAdmission`` for a job labelled
``kueue.x-k8s.io/queue-name`` of an operator run with ``--kueue``.
"""

from __future__ import annotations

from typing import Protocol

from tpu_operator.policies.plan import JobFacts, Plan


class Admission(Protocol):
    async def observe(self) -> None:
        """Read what deciding needs beyond the caches (before deciding)."""
        ...

    def holds(self, facts: JobFacts, plan: Plan) -> bool:
        """Whether the job waits for admission or was evicted (then it runs no pods, as
        if suspended, and the plan says why); an admitted job's pod template gets what the
        admission gives its pods (``plan.template``)."""
        ...

    def pools(self) -> list[str] | None:
        """The node pool of each slice, when the admission assigned them."""
        ...

    def gke_slices(self) -> list[str] | None:
        """The GKE Slice of each slice, when the admission formed them (Ironwood dynamic
        slicing through Kueue's slice admission check)."""
        ...

    def report(self, facts: JobFacts, plan: Plan) -> None:
        """Take note of what the queue must know of this decision (after deciding)."""
        ...

    async def act(self, plan: Plan) -> None:
        """Bring the queue in line with the committed status (after acting)."""
        ...


class NoAdmission:
    """A job no queue manages: never held, nothing to report."""

    async def observe(self) -> None:
        return None

    def holds(self, facts: JobFacts, plan: Plan) -> bool:
        return False

    def pools(self) -> list[str] | None:
        return None

    def gke_slices(self) -> list[str] | None:
        return None

    def report(self, facts: JobFacts, plan: Plan) -> None:
        return None

    async def act(self, plan: Plan) -> None:
        return None


NO_ADMISSION = NoAdmission()
