"""The operator's event loop: uvloop's (libuv) by default, asyncio's own on request.

Everything the operator does runs on one event loop: its watches read and decode events,
its API requests go out over aiohttp, the control channel opens a connection per request
to each supervisor, and every reconcile is a task. The loop's own work (polling sockets,
scheduling callbacks, the transports' reads and writes) is part of each of those, and
uvloop does it in C. Measured side by side (bench/HISTORY.md, 2026-12-07): a request on the
control channel costs the operator 0.80x the CPU it does on asyncio's loop, an API create
or delete 0.89-0.91x. kopf's own command line uses uvloop whenever it is installed; the
operator installs it with its image.

``--event-loop asyncio`` keeps asyncio's loop (to rule the loop out when a problem looks
like one, or to compare); where uvloop cannot be imported (a platform it has no build
for), the operator says so once and runs on asyncio's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

UVLOOP = "uvloop"
ASYNCIO = "asyncio"
LOOPS = (UVLOOP, ASYNCIO)
"""The choices of ``--event-loop``, the default first."""

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(kind: str) -> tuple[LoopFactory | None, str]:
    """How to make the event loop of ``kind`` (None: asyncio's default) and the name of
    the loop that will run (``asyncio`` where uvloop was asked for but is missing)."""
    if kind not in LOOPS:
        raise ValueError(f"event loop {kind!r}: choose one of {', '.join(LOOPS)}")
    if kind == ASYNCIO:
        return None, ASYNCIO
    try:
        import uvloop
    except ImportError as exc:
        log.warning(
            "event loop: uvloop cannot be imported (%s); running on asyncio's loop, "
            "which costs more CPU per request (install uvloop, or pass --event-loop asyncio "
            "to choose it)",
            exc,
        )
        return None, ASYNCIO
    factory: LoopFactory = uvloop.new_event_loop
    return factory, UVLOOP
