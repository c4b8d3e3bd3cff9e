"""The level-triggered work queue: coalescing, re-runs, delays, spacing and retries."""

from __future__ import annotations

import asyncio
import time

import pytest

from tpu_operator.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, hold: float = 0.0, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, float]] = []
        self.hold = hold
        self.fail_first = fail_first

    async def __call__(self, key: str) -> float | None:
        self.calls.append((key, time.monotonic()))
        if len(self.calls) <= self.fail_first:
            raise RuntimeError("injected")
        await asyncio.sleep(self.hold)
        return None


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_burst_for_one_key_is_one_reconcile_and_one_rerun_for_changes_during_it():
    async def scenario() -> list[str]:
        handler = Recorder(hold=0.1)
        queue: WorkQueue[str] = WorkQueue("t", handler, workers=4)
        queue.start()
        for _ in range(50):
            queue.add("a")
        await asyncio.sleep(0.02)  # "a" is being reconciled now
        for _ in range(50):
            queue.add("a")
        await asyncio.sleep(0.4)
        await queue.stop()
        return [k for k, _ in handler.calls]

    assert run(scenario()) == ["a", "a"]


def test_events_within_min_interval_wait_for_the_rest_of_it():
    async def scenario() -> list[float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, min_interval=0.5)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.05)
        # A burst right after the first reconcile, well within the interval even on a
        # loaded machine (a burst that outlasts it would rightly make a third reconcile).
        for _ in range(10):
            queue.add("a")
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.8)
        await queue.stop()
        return [t for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 2
    assert times[1] - times[0] >= 0.49


def test_per_key_spacing_holds_a_large_key_back_and_leaves_small_ones_at_the_minimum():
    async def scenario() -> dict[str, list[float]]:
        handler = Recorder()
        spacing = {"large": 0.4, "small": 0.0}
        queue: WorkQueue[str] = WorkQueue(
            "t", handler, min_interval=0.05, spacing=lambda key, _changes: spacing[key]
        )
        queue.start()
        for key in spacing:
            queue.add(key)
        await asyncio.sleep(0.02)
        for _ in range(20):  # a burst for both right after their first reconcile
            for key in spacing:
                queue.add(key)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.6)
        await queue.stop()
        return {k: [t for c, t in handler.calls if c == k] for k in spacing}

    times = run(scenario())
    assert len(times["large"]) == 2 and times["large"][1] - times["large"][0] >= 0.39
    # The small key keeps the minimum: the same burst reconciles it more often.
    assert len(times["small"]) > 2
    assert all(b - a >= 0.049 for a, b in zip(times["small"], times["small"][1:], strict=False))


def test_a_key_spaced_by_changes_waits_for_enough_events_or_an_urgent_one():
    """The queue tells ``spacing`` how many events asked for a key since its last
    reconcile began, or None after an urgent one; this spacing holds the key back for
    1 s until 5 events came, and for 0.05 s once they did."""
    told: list[int | None] = []

    def spacing(_key: str, changes: int | None) -> float:
        told.append(changes)
        return 0.05 if changes is None or changes >= 5 else 1.0

    async def scenario() -> list[float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, spacing=spacing)
        queue.start()
        queue.add("a")  # first reconcile: nothing to space from
        await asyncio.sleep(0.1)
        for _ in range(3):  # too few changes: held back for the long spacing
            queue.add("a")
        await asyncio.sleep(0.3)
        assert len(handler.calls) == 1
        for _ in range(2):  # the fifth change: it runs after the short spacing
            queue.add("a")
        await asyncio.sleep(0.3)
        assert len(handler.calls) == 2
        queue.add("a", urgent=True)  # one urgent event is enough
        await asyncio.sleep(0.3)
        await queue.stop()
        return [t for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 3
    assert 0.3 < times[1] - times[0] < 0.6
    assert times[2] - times[1] < 0.45
    # Counted from the last reconcile's start; the urgent event is told as None.
    assert told[:6] == [1, 2, 3, 4, 5, None], told


@pytest.mark.parametrize("interrupt", ["none", "plain", "urgent"])
def test_routine_events_settle_together_unless_another_event_comes(interrupt):
    """Only routine events since the last reconcile: the key waits ``settle`` after it.
    Any other event (a plain one: a spec change; an urgent one) waits only for the
    minimum, and takes the routine ones with it."""

    async def scenario() -> list[float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, min_interval=0.05, settle=0.6)
        queue.start()
        queue.add("a", routine=True)  # a quiet key reacts at once, routine or not
        await asyncio.sleep(0.1)
        for _ in range(10):  # pods starting, one event every 20 ms
            queue.add("a", routine=True)
            await asyncio.sleep(0.02)
        assert len(handler.calls) == 1, "held back: only routine events came"
        if interrupt != "none":
            queue.add("a", urgent=interrupt == "urgent")
        await asyncio.sleep(0.7)
        await queue.stop()
        return [t for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 2, "every routine event is reconciled by one more reconcile"
    if interrupt == "none":
        assert times[1] - times[0] >= 0.59
    else:
        assert times[1] - times[0] < 0.55


def test_each_key_settles_as_long_as_settle_of_says():
    """``settle_of`` sets the settle time per key (a slice of a multislice job waits
    longer); a key it gives the default to settles as before."""

    async def scenario() -> dict[str, list[float]]:
        handler = Recorder()
        waits = {"long": 0.6, "short": 0.15}
        queue: WorkQueue[str] = WorkQueue(
            "t", handler, min_interval=0.05, settle=0.15, settle_of=waits.__getitem__
        )
        queue.start()
        for key in waits:
            queue.add(key, routine=True)  # quiet keys react at once
        await asyncio.sleep(0.05)
        for key in waits:
            queue.add(key, routine=True)
        await asyncio.sleep(0.9)
        await queue.stop()
        times: dict[str, list[float]] = {key: [] for key in waits}
        for key, at in handler.calls:
            times[key].append(at)
        return times

    times = run(scenario())
    assert [len(t) for t in times.values()] == [2, 2]
    assert times["long"][1] - times["long"][0] >= 0.59
    assert 0.14 <= times["short"][1] - times["short"][0] < 0.5


def test_a_quiet_key_reacts_at_once_and_other_keys_are_not_spaced():
    async def scenario() -> tuple[list[str], float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, min_interval=5.0)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.05)
        added = time.monotonic()
        queue.add("b")
        await asyncio.sleep(0.05)
        await queue.stop()
        return [k for k, _ in handler.calls], handler.calls[-1][1] - added

    keys, latency = run(scenario())
    assert keys == ["a", "b"]
    assert latency < 0.05


@pytest.mark.parametrize(
    ("asks", "order"),
    [
        # (key, urgent) in the order added while the one worker is busy with "busy".
        ([("a", False), ("b", False), ("c", False)], ["a", "b", "c"]),
        ([("a", False), ("b", False), ("c", True)], ["c", "a", "b"]),
        # Due already, "b" moves ahead when an urgent event for it comes.
        ([("a", False), ("b", False), ("c", False), ("b", True)], ["b", "a", "c"]),
        ([("a", True), ("b", False), ("c", True)], ["a", "c", "b"]),
    ],
    ids=["in order", "urgent first", "moved ahead", "urgent in order"],
)
def test_due_keys_run_in_order_but_those_an_urgent_event_asked_for_go_first(asks, order):
    async def scenario() -> list[str]:
        handler = Recorder(hold=0.05)
        queue: WorkQueue[str] = WorkQueue("t", handler, workers=1)
        queue.start()
        queue.add("busy")
        await asyncio.sleep(0.02)  # the only worker holds "busy"
        for key, urgent in asks:
            queue.add(key, urgent=urgent)
        await asyncio.sleep(0.4)
        await queue.stop()
        return [k for k, _ in handler.calls]

    assert run(scenario()) == ["busy", *order]


def test_an_event_at_once_waits_for_no_spacing_and_only_once():
    async def scenario() -> list[float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, spacing=lambda _key, _changes: 0.5)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.05)
        queue.add("a", urgent=True)  # an urgent event still waits for the spacing
        await asyncio.sleep(0.1)
        assert len(handler.calls) == 1
        queue.add("a", at_once=True)  # this one does not
        await asyncio.sleep(0.05)
        assert len(handler.calls) == 2
        queue.add("a", urgent=True)  # and the next waits again, from that reconcile
        await asyncio.sleep(0.8)
        await queue.stop()
        return [t - handler.calls[0][1] for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 3
    assert times[1] < 0.45, "the event at once waited for the spacing"
    assert times[2] - times[1] >= 0.49


def test_a_failed_reconcile_is_retried_with_backoff():
    async def scenario() -> list[float]:
        handler = Recorder(fail_first=2)
        queue: WorkQueue[str] = WorkQueue("t", handler, base_retry=0.1)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.6)
        await queue.stop()
        return [t for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 3
    assert times[1] - times[0] >= 0.09 and times[2] - times[1] >= 0.19


def test_a_requested_wake_survives_a_sooner_reconcile_and_a_spaced_one_does_not():
    async def scenario() -> list[float]:
        handler = Recorder()
        queue: WorkQueue[str] = WorkQueue("t", handler, min_interval=0.05, settle=0.3)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.1)
        queue.add("a", routine=True)  # spaced: would run 0.3 s after the first reconcile
        # Asked for (a deadline): the earlier spaced wake now stands for it too, and the
        # reconcile it makes asks again for whatever time is left (level-triggered).
        queue.add("a", after=0.5)
        queue.add("a", urgent=True)  # runs now, taking the routine event with it
        await asyncio.sleep(0.8)
        await queue.stop()
        return [t - handler.calls[0][1] for _, t in handler.calls]

    times = run(scenario())
    assert len(times) == 3, "the urgent reconcile did not drop the wake asked for"
    assert times[1] < 0.25 and times[2] >= 0.28


def test_a_reconcile_past_its_deadline_is_cancelled_logged_and_retried(caplog):
    """A handler stuck on something that never answers: cancelled at the deadline (the
    worker is free for other keys at once), logged with what to look at, and retried with
    the failure backoff; a key that finishes in time is untouched."""

    async def scenario() -> tuple[list[str], list[str], int]:
        calls: list[str] = []
        cancelled: list[str] = []
        observed: list[bool] = []
        done = asyncio.Event()

        async def handler(key: str) -> float | None:
            calls.append(key)
            if calls.count("stuck") == 3 and "other" in calls:
                done.set()
            if key == "stuck" and calls.count("stuck") < 3:
                try:
                    await asyncio.Event().wait()  # never answers
                except asyncio.CancelledError:
                    cancelled.append(key)
                    raise
            return None

        queue: WorkQueue[str] = WorkQueue(
            "TPUJob",
            handler,
            workers=1,
            base_retry=0.01,
            deadline=0.2,
            observer=lambda _name, _seconds, ok: observed.append(ok),
        )
        queue.start()
        queue.add("stuck")
        queue.add("other")
        await done.wait()
        await asyncio.sleep(0.05)
        await queue.stop()
        return calls, cancelled, observed.count(False)

    with caplog.at_level("WARNING", logger="tpu_operator.runtime.workqueue"):
        calls, cancelled, failures = run(scenario())
    assert calls[:2] == ["stuck", "other"]  # one worker: freed by the cancel
    assert calls.count("stuck") == 3 and cancelled == ["stuck", "stuck"]
    assert failures == 2
    lines = [r.getMessage() for r in caplog.records if "deadline" in r.getMessage()]
    assert len(lines) == 2
    assert "TPUJob stuck: the reconcile passed its deadline of 0.2 s and was cancelled" in lines[0]
    assert "--reconcile-deadline" in lines[0]


def test_a_timeout_inside_a_reconcile_is_an_ordinary_failure(caplog):
    async def scenario() -> None:
        async def handler(key: str) -> float | None:
            raise TimeoutError("the handler's own timeout")

        queue: WorkQueue[str] = WorkQueue("t", handler, deadline=60, base_retry=5)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.1)
        await queue.stop()

    with caplog.at_level("WARNING", logger="tpu_operator.runtime.workqueue"):
        run(scenario())
    assert not [r for r in caplog.records if "deadline" in r.getMessage()]
    assert any("reconciling a failed" in r.getMessage() for r in caplog.records)
