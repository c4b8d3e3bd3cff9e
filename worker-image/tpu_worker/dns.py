"""Wait until a DNS name resolves: the coordinator's pod name appears once its pod has an IP.

The job's headless Service publishes not-ready addresses, so a worker can start before its
coordinator has an address; retrying here turns that race into a log line instead of a
failed rendezvous.
"""

from __future__ import annotations

import logging
import socket
import time

log = logging.getLogger(__name__)


class ResolveTimeout(TimeoutError):
    """The name did not resolve within the deadline."""


def resolve(host: str) -> list[str]:
    """Addresses of ``host`` (empty when it does not resolve yet)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def wait_for_name(
    host: str,
    timeout_s: float,
    *,
    what: str,
    interval_s: float = 0.5,
    max_interval_s: float = 5.0,
) -> list[str]:
    """Block until ``host`` resolves; return its addresses or raise ResolveTimeout.

    ``what`` says in the log why the name matters (e.g. "JAX coordinator (process 0)").
    Retries back off from ``interval_s`` to ``max_interval_s``.
    """
    deadline = time.monotonic() + timeout_s
    attempt = 0
    delay = interval_s
    while True:
        attempt += 1
        addresses = resolve(host)
        if addresses:
            if attempt > 1:
                log.info("%s %s resolved to %s after %d attempts", what, host, addresses, attempt)
            return addresses
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ResolveTimeout(f"{what} {host} did not resolve within {timeout_s:g}s")
        if attempt == 1 or attempt % 10 == 0:
            log.info(
                "waiting for DNS name %s of the %s to resolve (attempt %d, %.0fs left)",
                host,
                what,
                attempt,
                remaining,
            )
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, max_interval_s)
