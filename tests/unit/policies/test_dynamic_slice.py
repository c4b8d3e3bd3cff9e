"""A slice's GKE Slices on dynamic slicing (``policies/dynamic_slice.py``): the one its pods
select, what they wait for, and what is formed or deleted (after the status is written)."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_operator.placement.dynamic import Choice, SliceState
from tpu_operator.policies.dynamic_slice import (
    RECHECK_SECONDS,
    DynamicFacts,
    DynamicPlan,
    decide,
    needs_choice,
)

pytestmark = pytest.mark.unit

NAME, OLD = "s-a2", "s-a1"
READY = SliceState(ready=True, failed=False, reason="ACTIVE", message="")
FORMING = SliceState(ready=False, failed=False, reason="CREATING", message="")
FAILED = SliceState(ready=False, failed=True, reason="FAILED", message="cube c1 unhealthy")
CUBES = Choice(("c0", "c1"))
TROUBLE = "dynamic slicing: {} (is the slice controller enabled?)"


def facts(**fields: Any) -> DynamicFacts:
    base: dict[str, Any] = {"name": NAME, "mine": {}, "release": False, "forming": True}
    return DynamicFacts(**{**base, **fields})


@pytest.mark.parametrize(
    ("given", "choose", "plan"),
    [
        pytest.param(
            facts(choice=CUBES),
            True,
            DynamicPlan(
                waiting_for=f"waiting for GKE's slice controller to form Slice {NAME} of c0, c1",
                form=("c0", "c1"),
                recheck=RECHECK_SECONDS,
            ),
            id="no Slice yet: formed of the free partitions, after the write",
        ),
        pytest.param(
            facts(mine={OLD: READY}, choice=Choice(None, "2 free cubes of 4")),
            True,
            DynamicPlan(
                waiting_for="waiting for capacity to form a dynamic slice: 2 free cubes of 4",
                delete=(OLD,),
                recheck=RECHECK_SECONDS,
            ),
            id="no free partitions: the last attempt's Slice goes, nothing is formed",
        ),
        pytest.param(
            facts(mine={NAME: FORMING}),
            False,
            DynamicPlan(
                waiting_for=f"waiting for GKE's slice controller to form Slice {NAME} (CREATING)",
                recheck=RECHECK_SECONDS,
            ),
            id="forming: waited for",
        ),
        pytest.param(
            facts(mine={NAME: READY, OLD: READY}),
            False,
            DynamicPlan(gke_slice=NAME, delete=(OLD,)),
            id="ready: the pods select it",
        ),
        pytest.param(
            facts(mine={NAME: FAILED}),
            False,
            DynamicPlan(
                waiting_for=f"GKE could not form Slice {NAME} (FAILED: cube c1 unhealthy); "
                "forming it again",
                delete=(NAME,),
                recheck=RECHECK_SECONDS,
            ),
            id="GKE could not form it: deleted, to be formed again",
        ),
        pytest.param(
            facts(mine={NAME: READY, OLD: READY}, release=True, forming=False),
            False,
            DynamicPlan(delete=(NAME, OLD)),
            id="released: every Slice goes",
        ),
        pytest.param(
            facts(mine={NAME: READY}, forming=False),
            False,
            DynamicPlan(),
            id="not forming: the attempt's Slice is kept",
        ),
        pytest.param(
            facts(unread="the server could not find the requested resource"),
            True,
            DynamicPlan(
                waiting_for=TROUBLE.format("the server could not find the requested resource"),
                recheck=RECHECK_SECONDS,
            ),
            id="the Slices cannot be read: nothing is done",
        ),
        pytest.param(
            facts(choice=CUBES, refused="slices is forbidden"),
            True,
            DynamicPlan(
                waiting_for=TROUBLE.format("slices is forbidden"),
                form=("c0", "c1"),
                recheck=RECHECK_SECONDS,
                refused="slices is forbidden",
            ),
            id="the last try was refused: said, and tried again",
        ),
        pytest.param(
            facts(mine={NAME: READY, OLD: READY}, refused="slices is forbidden"),
            False,
            DynamicPlan(
                waiting_for=TROUBLE.format("slices is forbidden"),
                delete=(OLD,),
                recheck=RECHECK_SECONDS,
                refused="slices is forbidden",
            ),
            id="a refused delete holds the pods back until it goes through",
        ),
    ],
)
def test_the_dynamic_slice_plan(given: DynamicFacts, choose: bool, plan: DynamicPlan):
    assert needs_choice(given) == choose
    assert decide(given) == plan


ADMITTED = "ns-wl-workers-0"


@pytest.mark.parametrize(
    ("given", "plan"),
    [
        pytest.param(
            facts(name=ADMITTED, given=True),
            DynamicPlan(
                waiting_for=f"waiting for Slice {ADMITTED}, which Kueue's slice admission "
                "check forms",
                recheck=RECHECK_SECONDS,
            ),
            id="not there yet: waited for, never formed here",
        ),
        pytest.param(
            facts(name=ADMITTED, given=True, mine={ADMITTED: FORMING}),
            DynamicPlan(
                waiting_for=f"waiting for GKE's slice controller to form Slice {ADMITTED} "
                "(CREATING)",
                recheck=RECHECK_SECONDS,
            ),
            id="forming: waited for",
        ),
        pytest.param(
            facts(name=ADMITTED, given=True, mine={ADMITTED: READY}),
            DynamicPlan(gke_slice=ADMITTED),
            id="ready: the pods select it",
        ),
        pytest.param(
            facts(name=ADMITTED, given=True, mine={ADMITTED: FAILED}),
            DynamicPlan(
                waiting_for=f"GKE could not form Slice {ADMITTED} (FAILED: cube c1 unhealthy); "
                "Kueue places the job again",
                recheck=RECHECK_SECONDS,
            ),
            id="failed: not deleted here (the check goes Retry)",
        ),
        pytest.param(
            facts(name=ADMITTED, given=True, mine={ADMITTED: READY}, release=True, forming=False),
            DynamicPlan(),
            id="released: the check deletes it, not the slice",
        ),
    ],
)
def test_a_slice_admitted_through_kueue_s_slice_check_waits_for_its_slice(
    given: DynamicFacts, plan: DynamicPlan
):
    assert not needs_choice(given)
    assert decide(given) == plan
