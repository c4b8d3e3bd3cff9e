"""A real local Kubernetes control plane with simulated GKE TPU node pools.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules at
one pinned version (:mod:`localcluster.binaries`), a node agent that plays kubelet for
simulated GKE TPU and CPU nodes (:mod:`localcluster.agent`), and a launcher that runs them
as a library (:class:`Cluster`) or a CLI (``python -m localcluster``). See
``docs/contributing/localcluster.md``.
"""

from localcluster.agent.client import AgentClient, AgentError
from localcluster.agent.provisioner import Autoprovisioning
from localcluster.binaries import BuildError
from localcluster.cluster import Cluster, ClusterError
from localcluster.pools import Pool, Simulate, default_pools, load_pools

__all__ = [
    "AgentClient",
    "AgentError",
    "Autoprovisioning",
    "BuildError",
    "Cluster",
    "ClusterError",
    "Pool",
    "Simulate",
    "default_pools",
    "load_pools",
]
