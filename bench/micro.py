"""What the in-process micro-benchmarks share: the best mean time of a call, and the
command line and table of one row per size (``job_assess.py``, ``sampler_round.py``,
``metadata_list.py``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def best_us(
    call: Callable[[int], object],
    number: int,
    repeat: int,
    before: Callable[[int], object] | None = None,
) -> float:
    """Microseconds per call of ``call(turn)``: the best over ``repeat`` rounds of the mean
    of ``number`` calls. ``before(turn)``, if given, runs ahead of each call, untimed."""
    best = float("inf")
    for _ in range(repeat):
        spent = 0.0
        for turn in range(number):
            if before is not None:
                before(turn)
            started = time.perf_counter()
            call(turn)
            spent += time.perf_counter() - started
        best = min(best, spent / number)
    return best * 1e6


def table(
    doc: str,
    header: list[str],
    measure: Callable[[int, int, int], str],
    *,
    sizes: list[int],
    number: int,
    repeat: int = 5,
    setup: Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace], None]] | None = None,
) -> None:
    """Parse ``--sizes``, ``--number`` and ``--repeat`` (and what ``setup`` adds; the
    callable it returns gets the parsed arguments first), then print a Markdown table:
    ``header`` and ``measure(size, number, repeat)``, a row per size."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=sizes)
    parser.add_argument("--number", type=int, default=number)
    parser.add_argument("--repeat", type=int, default=repeat)
    configure = setup(parser) if setup is not None else None
    args = parser.parse_args()
    if configure is not None:
        configure(args)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for size in args.sizes:
        print(measure(size, args.number, args.repeat), flush=True)
