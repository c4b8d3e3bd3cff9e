"""The operator's event loop (``runtime/loops.py``): uvloop unless asked otherwise, and
asyncio's own, said in the log, where uvloop cannot be imported."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from tpu_operator import cli
from tpu_operator.runtime import loops

pytestmark = pytest.mark.unit


def test_uvloop_is_the_default_and_makes_uvloops_loop():
    import uvloop

    assert cli._parser().parse_args(["run"]).event_loop == loops.UVLOOP
    factory, kind = loops.loop_factory(loops.UVLOOP)
    assert kind == loops.UVLOOP and factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


def test_asyncio_on_request_keeps_asyncios_default_loop():
    assert cli._parser().parse_args(["run", "--event-loop", "asyncio"]).event_loop == "asyncio"
    assert loops.loop_factory(loops.ASYNCIO) == (None, loops.ASYNCIO)


def test_without_uvloop_the_operator_says_so_and_runs_on_asyncios_loop(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the import fails, as where not built
    with caplog.at_level(logging.WARNING, logger=loops.__name__):
        assert loops.loop_factory(loops.UVLOOP) == (None, loops.ASYNCIO)
    (record,) = caplog.records
    assert "uvloop cannot be imported" in record.getMessage()
    assert "--event-loop asyncio" in record.getMessage()


@pytest.mark.parametrize("argument", ["trio", ""])
def test_an_unknown_loop_is_refused_with_the_choices(argument, capsys):
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--event-loop", argument])
    assert "uvloop" in capsys.readouterr().err
    with pytest.raises(ValueError, match="choose one of uvloop, asyncio"):
        loops.loop_factory(argument)
