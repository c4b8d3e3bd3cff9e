"""Node pools that GKE creates for one slice: the slice's pool label and its references.

With ``placement.provisioning: Auto`` a multi-host slice that finds no free matching node
pool asks GKE for one, by GKE's documented workload-separation mechanism: its pods select
a node label whose value belongs to this slice alone (``tpu-operator.dev/slice-pool:
<value>``) and tolerate a ``NoSchedule`` taint of the same key and value. Node
auto-provisioning (Standard) and Autopilot then create a node pool carrying that label and
taint, for a multi-host TPU slice the whole pool at once, sized by the topology node
selector; no other slice's pods can select or tolerate it. Sources:
https://cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning
("Workload separation", "Deleting auto-provisioned node pools"),
https://cloud.google.com/kubernetes-engine/docs/how-to/workload-separation,
https://cloud.google.com/kubernetes-engine/docs/how-to/tpus-autopilot.

Until the pool's nodes appear, the slice's entry in ``status.nodePools`` is a *claim
reference*, ``auto:<value>``, which is never a GKE node pool name (those have no colon).
The same reference is the pool key of the pods' index (``PodView.pool``), so the holding
rule of ``reconcile/pools.py`` applies to claims unchanged.
"""

from __future__ import annotations

import hashlib
from typing import Final

from tpu_operator import contract

SLICE_POOL_LABEL: Final = contract.NODE_LABEL_SLICE_POOL
"""Node label (and taint key) of a node pool GKE created for one slice."""
CLAIM_PREFIX: Final = contract.CLAIM_PREFIX
_NAME_CHARS: Final = 40
claim_ref = contract.claim_ref


def claim_value(name: str, uid: str, index: int | None = None) -> str:
    """The slice-pool label value of slice ``index`` of a job (or of a standalone slice).

    Unique per object instance (the UID's hash) and per slice, readable (the name comes
    first) and a valid label value of at most 54 characters.
    """
    digest = hashlib.sha256(f"{uid}/{index}".encode()).hexdigest()[:8]
    stem = name[:_NAME_CHARS].rstrip("-.")
    return f"{stem}-{index}-{digest}" if index is not None else f"{stem}-{digest}"


def claim_of(ref: str | None) -> str | None:
    """The label value of a claim reference, or None for a node pool name (or None)."""
    if ref and ref.startswith(CLAIM_PREFIX):
        return ref[len(CLAIM_PREFIX) :]
    return None


def is_claim(ref: str | None) -> bool:
    return claim_of(ref) is not None
