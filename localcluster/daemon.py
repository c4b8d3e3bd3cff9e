"""The process that runs a detached cluster: ``python -m localcluster.daemon``.

``Cluster.start(detach=True)`` (``python -m localcluster up``, ``make cluster-up``, the
demo) starts it in a session of its own and writes the start settings to its stdin. It
starts the components as their parent (without a death signal: they outlive it if it is
killed), records itself in ``state.json`` as the cluster's supervisor, and restarts every
component that exits (:mod:`localcluster.supervision`) until SIGTERM, which
``Cluster.stop`` (``down``) sends; it then stops the components in order and exits.

Until the cluster is ready its log lines go to the starting process through stderr, and a
failure is one line starting with :data:`localcluster.cluster.DAEMON_ERROR`; from then on
they go, with timestamps, to ``logs/supervisor.log``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TextIO

from localcluster import binaries
from localcluster.cluster import DAEMON_ERROR, Cluster, ClusterError
from localcluster.layout import Layout
from localcluster.pools import PoolError, pool_from_dict


class _Stamped:
    """A text stream that starts each line with the local time."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.line_start = True

    def write(self, text: str) -> int:
        out = []
        for part in text.splitlines(keepends=True):
            if self.line_start:
                out.append(dt.datetime.now().isoformat(timespec="milliseconds") + " ")
            out.append(part)
            self.line_start = part.endswith("\n")
        self.stream.write("".join(out))
        self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _log_to_file(path: Path) -> None:
    """Send stdout and stderr to ``path`` from now on (closes the pipe to the starter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a")  # noqa: SIM115 - for the life of the process
    sys.stderr.flush()
    for fd in (1, 2):
        os.dup2(handle.fileno(), fd)
    sys.stderr = _Stamped(handle)
    sys.stdout = sys.stderr


def main() -> int:
    spec = json.loads(sys.stdin.read())
    layout = Layout(Path(spec["directory"]))
    stop = threading.Event()
    starting = True

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if starting:  # Cluster.start stops what it started and re-raises
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    cluster: Cluster | None = None
    try:
        try:
            cluster = Cluster._start_here(
                layout,
                [pool_from_dict(item) for item in spec["pools"]],
                float(spec["node_monitor_grace_period"]),
                True,
                bool(spec["fresh"]),
                float(spec["timeout"]),
                spec["component_args"],
            )
        except (ClusterError, binaries.BuildError, PoolError) as error:
            message = str(error).replace("\n", "\\n")
            print(f"{DAEMON_ERROR}{message}", file=sys.stderr, flush=True)
            return 1
        starting = False
        _log_to_file(layout.log("supervisor"))
        binaries.log(f"supervising the cluster in {layout.root} (pid {os.getpid()})")
        cluster._supervise_here(stop)
    finally:
        starting = False
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
