"""Garbage-collector and allocator settings for the operator process.

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

The C allocator (glibc's malloc, as in the operator image) keeps what it freed for reuse.
Two things make that memory the operator's resident size for good unless it is handed
back: every thread that allocates gets an arena of its own (up to 8 per core), and the
API client decodes responses in a pool of threads; and a list of thousands of pods or
nodes is decoded page by page into trees of objects that are freed a moment later. So the
arenas are limited to ``ARENAS`` and ``trim`` returns the free pages (``malloc_trim``)
after each complete listing and, while the operator works, every ``TRIM_SECONDS``: with
1,000 TPUJobs starting, glibc held 35-37 MiB of freed memory (the API threads' request
and response buffers) next to 27 MiB in use. Measured with 200 TPUJobs (2,048
pods and nodes, ``bench/load.py``): bench/HISTORY.md, entries 7543ce0 and b569128.
Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging

log = logging.getLogger(__name__)
ARENAS = 2
"""malloc arenas (glibc's default: 8 per core); the event loop and its API threads take
turns holding the GIL, so more arenas buy no speed here, only unreturned memory."""
_M_ARENA_MAX = -8
"""glibc's mallopt parameter number for the arena limit (malloc.h)."""
TRIM_SECONDS = 30.0
"""How often the free pages go back while anything is decoded. A trim walks the heap's
free chunks (milliseconds to tens of milliseconds), so it runs in a thread, and not at
all while nothing happens."""
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


def _libc() -> ctypes.CDLL | None:
    """glibc, if this process runs on it (mallopt and malloc_trim are glibc's). The
    process's own symbols include its C library's, so nothing is searched for on disk."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()


def limit_arenas(arenas: int = ARENAS) -> None:
    """Cap glibc's malloc arenas (for threads started from now on)."""
    if _LIBC is not None and not _LIBC.mallopt(_M_ARENA_MAX, arenas):
        log.debug("mallopt(M_ARENA_MAX, %d) was refused", arenas)


def trim() -> None:
    """Return the allocator's free pages to the system (after a large listing)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


async def trim_off_loop() -> None:
    """``trim`` in a thread: a trim walks the heap's free chunks, which takes up to tens of
    milliseconds after a large listing, and the event loop must not wait for it."""
    await asyncio.to_thread(trim)
