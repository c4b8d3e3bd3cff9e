"""The control channel's fan-out: one stop and one start to each of N supervisors, as an
in-place or mixed restart sends them, side by side, interleaved, in one run:

- ``uvloop``: the operator's client (``runtime/control.ControlChannel``: plain HTTP/1.1 on
  asyncio streams) on uvloop's event loop, as the operator runs by default
  (``runtime/loops.py``), sending as the operator does: ``control.fan_out``, as many
  workers as a job may have requests in flight;
- ``tasks``: the same, but a task per request, all made at once
  (``asyncio.gather``), as the operator sent them before ``fan_out``;
- ``channel``: the client on asyncio's own loop (``--event-loop asyncio``);
- ``aiohttp``: the channel with aiohttp's client for its transport (a connection per
  request, as the channel was before: ``AiohttpChannel``), on asyncio's loop.

Each variant's rounds run in an event loop of their own kind, made for them.

The supervisors are the benchmarks' stand-in (``standin_supervisor.StandIn``: the real
supervisor's protocol, HMAC-verified and signed answers) in a process of their own, each
listening on its own 127.9.x.y address, so the figures of the client process are the
client's alone: CPU seconds per request and wall time per round of N requests.

    .venv/bin/python bench/control_fanout.py --supervisors 4032 --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from harness import exact_loop, fmt, say, summary, table, write_results

from tpu_operator import supervision
from tpu_operator.runtime import control, loops

JOB_UID = "bench-job-uid"
MASTER = b"bench-control-fanout-master-key!"
VARIANTS = ("uvloop", "tasks", "channel", "aiohttp")
"""The operator's channel on uvloop (as the operator runs by default), the same with a
task per request, the channel on asyncio's loop, and the channel with aiohttp's client on
asyncio's loop (as it was before the channel had its own transport)."""


def address(i: int) -> str:
    return f"127.9.{i // 250}.{i % 250 + 1}"


# The supervisors' process ------------------------------------------------------------------


async def serve(count: int) -> None:
    from standin_supervisor import Process, StandIn

    stand_in = StandIn(None, MASTER)  # type: ignore[arg-type]  # no pod, no readiness write
    stand_in.register("job", JOB_UID)
    for i in range(count):
        proc = Process(
            namespace="bench",
            name=f"p{i}",
            uid=f"uid-{i}",
            ip=address(i),
            job="job",
            attempt=1,
            pod={},
        )
        proc.started[1] = time.monotonic()
        stand_in.procs[proc.uid] = proc
        await stand_in._listen(proc)
    if stand_in.errors:
        raise SystemExit(stand_in.errors[0])
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


# The client's side -------------------------------------------------------------------------


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class AiohttpChannel(control.ControlChannel):
    """The channel with aiohttp's client for its transport, as it was before: the same
    signing, shares of the channel, timeout and checks of the answer (``_parse``); the
    request through a session with a connection per request, no decompression, no
    redirect, the body read in chunks up to the cap."""

    def __init__(self, master_key: bytes) -> None:
        super().__init__(master_key)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            trust_env=False,
            auto_decompress=False,
        )

    async def close(self) -> None:
        await self.session.close()

    async def _request(
        self,
        job_uid: str,
        pod_uid: str,
        pod_ip: str | None,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
    ) -> control.ProcessState:
        assert pod_ip
        body = json.dumps(payload).encode() if payload is not None else b""
        url = f"http://{pod_ip}:{self.port}{path}"
        key = self.key_for(job_uid)
        async with self._slot(job_uid):
            nonce = supervision.new_nonce()
            headers = {
                "Authorization": supervision.sign(
                    key, method, path, body, pod=pod_uid, nonce=nonce
                ),
                "Content-Type": "application/json",
                "Accept-Encoding": "identity",
            }
            async with (
                asyncio.timeout(self.timeout),
                self.session.request(
                    method,
                    url,
                    data=body or None,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                ) as response,
            ):
                data = bytearray()
                async for chunk in response.content.iter_any():
                    data += chunk
                    if len(data) > self.max_answer_bytes:
                        raise control.ControlError("the answer passed the cap")
                answer = control.Answer(
                    response.status, response.headers.get(supervision.ANSWER_HEADER), bytes(data)
                )
        return self._parse(key, pod_uid, nonce, method, url, answer)


Send = Callable[[int, int], Awaitable[object]]


async def round_of(
    count: int, send: Send, attempt: int, tasks: bool = False
) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and errors of one request to each supervisor, sent as
    the operator sends them (``control.fan_out``) or with a task each (``tasks``)."""
    started, used = time.monotonic(), cpu()
    results: list[object]
    if tasks:
        results = await asyncio.gather(
            *(send(i, attempt) for i in range(count)), return_exceptions=True
        )
    else:
        results = await control.fan_out(range(count), lambda i: send(i, attempt))
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        say(f"  {len(errors)} errors, the first: {errors[0]!r}")
    return time.monotonic() - started, cpu() - used, len(errors)


def channel_of(variant: str) -> control.ControlChannel:
    return AiohttpChannel(MASTER) if variant == "aiohttp" else control.ControlChannel(MASTER)


def loop_of(variant: str) -> loops.LoopFactory | None:
    """The event loop a variant's rounds run on, chosen as the operator chooses its own
    (``loops.loop_factory``; None: asyncio's)."""
    return exact_loop(loops.UVLOOP if variant in ("uvloop", "tasks") else loops.ASYNCIO)


async def rep_of(variant: str, count: int, attempt: int) -> tuple[float, float, float, float]:
    """One round of stops and one of starts to every supervisor, on a channel made in the
    running loop: wall and CPU seconds of each."""
    channel = channel_of(variant)
    try:
        tasks = variant == "tasks"
        stop_s, stop_cpu, stop_errors = await round_of(
            count,
            lambda i, a: channel.stop(JOB_UID, f"uid-{i}", address(i), a, 25.0),
            attempt,
            tasks,
        )
        start_s, start_cpu, start_errors = await round_of(
            count,
            lambda i, a: channel.start(JOB_UID, f"uid-{i}", address(i), a, {}),
            attempt + 1,
            tasks,
        )
    finally:
        await channel.close()
    if stop_errors or start_errors:
        raise SystemExit(f"{variant}: requests failed; see above")
    return stop_s, stop_cpu, start_s, start_cpu


def measure(count: int, reps: int) -> dict[str, object]:
    """Every variant once per repetition, in turn (the order reversed every other time),
    each in an event loop of its own kind."""
    figures: dict[str, dict[str, list[float]]] = {
        v: {"stop_s": [], "start_s": [], "cpu_ms": []} for v in VARIANTS
    }
    attempt = 1
    for rep in range(reps):
        for variant in VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS)):
            with asyncio.Runner(loop_factory=loop_of(variant)) as runner:
                stop_s, stop_cpu, start_s, start_cpu = runner.run(rep_of(variant, count, attempt))
            attempt += 1
            figures[variant]["stop_s"].append(stop_s)
            figures[variant]["start_s"].append(start_s)
            figures[variant]["cpu_ms"].append((stop_cpu + start_cpu) * 1000 / (2 * count))
            say(
                f"rep {rep + 1} {variant}: stops {stop_s:.2f} s, starts {start_s:.2f} s, "
                f"{figures[variant]['cpu_ms'][-1]:.3f} ms CPU per request"
            )
    return {v: {k: summary(values) for k, values in f.items()} for v, f in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--supervisors", type=int, default=4032)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    say(f"starting {args.supervisors} stand-in supervisors in a process of their own")
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(args.supervisors)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the stand-in supervisors did not start")
        results = measure(args.supervisors, args.reps)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    rows = []
    for key, what in (
        ("cpu_ms", "client CPU per request (ms)"),
        ("stop_s", "stops (s)"),
        ("start_s", "starts (s)"),
    ):
        median = {v: results[v][key]["median"] for v in VARIANTS}  # type: ignore[index]
        rows.append(
            [
                what,
                *(fmt(median[v], 3) for v in VARIANTS),
                fmt(median["uvloop"] / median["tasks"], 2),
                fmt(median["uvloop"] / median["channel"], 2),
                fmt(median["channel"] / median["aiohttp"], 2),
            ]
        )
    print(
        table(
            [
                "figure (median)",
                *VARIANTS,
                "uvloop / tasks",
                "uvloop / channel",
                "channel / aiohttp",
            ],
            rows,
        )
    )
    write_results(
        "control_fanout", {"supervisors": args.supervisors, "reps": args.reps, "results": results}
    )


if __name__ == "__main__":
    main()
