"""Leader election's default timings, in a module of their own so that the command line
reads them without importing the election and its API client (``runtime/leader.py``)."""

from __future__ import annotations

LEASE_DURATION = 12
"""Default seconds a standby waits, after it last saw the Lease renewed, before taking it.

Shorter than controller-runtime's 15 s (with a renew deadline of 8 s against its 10 s):
a lost leader is replaced in about 13.5 s instead of 17 s, while a deposed leader still
has 4 s (lease duration minus renew deadline) to notice before another one acts, and
each reconcile checks the fence first (docs/operations/high-availability.md, "Failover,
measured")."""
RENEW_DEADLINE = 8.0
"""Default seconds the leader keeps acting without a successful renewal."""
RETRY_PERIOD = 2.0
"""Default seconds between two attempts to take or renew the Lease (controller-runtime's)."""
