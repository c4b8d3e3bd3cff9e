"""The headless Service that gives worker pods their stable DNS names."""

from __future__ import annotations

from typing import Any

from tpu_operator import contract
from tpu_operator.builders.pods import Owner
from tpu_operator.builders.wiring import Ports


def headless_service(
    *, name: str, namespace: str, selector: dict[str, str], owner: Owner, ports: Ports
) -> dict[str, Any]:
    """``<pod>.<name>`` resolves for every selected pod, ready or not.

    ``publishNotReadyAddresses`` makes DNS answer before readiness: workers look each
    other up while they start, long before any of them could report ready.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE, **selector},
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [
                {
                    "name": contract.PORT_NAME_COORDINATOR,
                    "port": ports.coordinator,
                    "targetPort": ports.coordinator,
                    "protocol": "TCP",
                },
                {
                    "name": contract.PORT_NAME_METRICS,
                    "port": ports.metrics,
                    "targetPort": ports.metrics,
                    "protocol": "TCP",
                },
            ],
        },
    }
