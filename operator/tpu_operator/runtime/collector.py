"""Garbage-collector settings for the operator process.

The operator keeps large caches (a view of every worker pod and TPU node) and decodes a
steady stream of watch events, each a tree of hundreds of dicts and lists. CPython's
cyclic collector starts a young-generation pass every 700 net container allocations, so
decoding one pod event can start a pass, and every pass walks all young objects still
alive. Profiled while a 1,024-host job was created (``bench/pod_creation.py --profile``
with ``BENCH_PROFILE_FLAGS=--native``), collection took about a fifth of the operator's
CPU. Raising the first threshold makes the passes rare; freezing what exists at start
(imported modules, handler registries) keeps it out of every later full pass.

Reference counting still frees every object without cycles at once; only cyclic garbage
(exception tracebacks, some asyncio futures) waits longer, a bounded amount: one pass per
``threshold`` allocations.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)
DEFAULT_THRESHOLD = 50_000
"""Net container allocations between two young-generation passes (CPython's: 700)."""


def tune(threshold: int) -> None:
    """Collect rarely (``threshold`` > 0) and freeze what exists now; 0 keeps CPython's
    defaults."""
    if threshold <= 0:
        return
    _, middle, oldest = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, middle, oldest)
    log.debug(
        "garbage collection: thresholds %s, %d objects frozen",
        gc.get_threshold(),
        gc.get_freeze_count(),
    )
