"""Grafana dashboards: generated, committed, with stable uids and a datasource variable."""

from __future__ import annotations

import pytest

from tpu_operator import dashboards

pytestmark = pytest.mark.unit


def test_committed_dashboards_match_the_generator():
    for name, board in dashboards.dashboards().items():
        path = dashboards.OUTPUT_DIR / name
        assert path.exists(), f"{path} is missing; run `tpu-operator dashboards --write`"
        assert path.read_text() == dashboards.render(board), (
            f"{path} is stale; run `tpu-operator dashboards --write` and commit the result"
        )


@pytest.mark.parametrize("name", sorted(dashboards.dashboards()))
def test_dashboards_use_the_datasource_variable_and_unique_panels(name):
    board = dashboards.dashboards()[name]
    assert board["uid"] == name.removesuffix(".json")
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables[0] == "datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
