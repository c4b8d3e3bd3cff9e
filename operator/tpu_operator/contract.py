"""The pod contract: every name the operator writes into a worker pod and the worker reads.

The operator (pod builder) and the in-pod worker (``tpu_worker``) both import this module,
so a label, annotation, env var or port is spelled in exactly one place. Keep this module
free of heavy imports: it is loaded at start-up of every worker process.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "tpu-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
JOB_KIND: Final = "TPUJob"
JOB_PLURAL: Final = "tpujobs"
SLICE_KIND: Final = "TPUSlice"
SLICE_PLURAL: Final = "tpuslices"
CATEGORY: Final = "tpu"

# Labels on TPUSlices and worker pods. Values are always valid label values.
PREFIX: Final = f"{GROUP}/"
LABEL_JOB_NAME: Final = PREFIX + "job-name"
LABEL_SLICE_NAME: Final = PREFIX + "slice-name"
LABEL_SLICE_INDEX: Final = PREFIX + "slice-index"
LABEL_WORKER_INDEX: Final = PREFIX + "worker-index"
LABEL_RESTART_ATTEMPT: Final = PREFIX + "restart-attempt"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "tpu-operator"
# Kueue's queue label: copied from a TPUJob onto its TPUSlices unchanged (never onto pods).
LABEL_KUEUE_QUEUE: Final = "kueue.x-k8s.io/queue-name"
# On a worker pod whose container runs the supervisor (in-place gang restarts): its
# readiness says whether the training process runs, and the operator commands it over the
# control channel.
ANNOTATION_SUPERVISED: Final = PREFIX + "supervised"
# The Secret holding a job's control-channel key (mounted into its supervised pods).
LABEL_CONTROL_KEY: Final = PREFIX + "control-key"

# GKE node facts (node labels, extended resource, taint).
NODE_LABEL_ACCELERATOR: Final = "cloud.google.com/gke-tpu-accelerator"
NODE_LABEL_TOPOLOGY: Final = "cloud.google.com/gke-tpu-topology"
NODE_LABEL_TOPOLOGY_BLOCK: Final = "cloud.google.com/gce-topology-block"
"""The reservation block a node's VM is in (Kueue's topology level above Ironwood cubes)."""
NODE_LABEL_NODEPOOL: Final = "cloud.google.com/gke-nodepool"
NODE_LABEL_SPOT: Final = "cloud.google.com/gke-spot"
NODE_LABEL_RESERVATION: Final = "cloud.google.com/reservation-name"
NODE_LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
"""Kubernetes' own node label: one node's name, never a pool's (``views.pool_labels``)."""
NODE_LABEL_SLICE_POOL: Final = PREFIX + "slice-pool"
"""Node label (and taint key) of a node pool GKE created for one slice
(``placement/provisioning.py``)."""
CLAIM_PREFIX: Final = "auto:"
"""Prefix of a claim reference: a pool GKE is asked to create (``auto:<label value>``), as
``status.nodePools`` and a pod's pool key name it."""
TPU_RESOURCE: Final = "google.com/tpu"
# Ironwood dynamic slicing (``placement/dynamic.py``; sources in docs/tasks/dynamic-slicing.md).
NODE_LABEL_TPU_SLICE: Final = "cloud.google.com/gke-tpu-slice"
"""Set by GKE's slice controller on the nodes of an active Slice: the Slice's name."""
ANNOTATION_SLICE_TOPOLOGY: Final = "cloud.google.com/gke-tpu-slice-topology"
"""Pod annotation: the topology of the dynamic slice the pod runs in."""
PARTITION_LABEL_PREFIX: Final = "cloud.google.com/gke-tpu-partition-"
"""Node labels ``<prefix><shape>-id`` and ``<prefix><shape>-state`` (shape 4x4x4 for the
cube, or a sub-slice shape): the partition the node belongs to and its health."""
PARTITION_USABLE_STATES: Final = ("HEALTHY", "DEGRADED")
"""Partition states a slice may be formed of (GKE: UNHEALTHY, UNSET, INCOMPLETE may not)."""
SLICE_GROUP: Final = "accelerator.gke.io"
SLICE_API_VERSION: Final = "accelerator.gke.io/v1beta1"
SLICE_CRD_PLURAL: Final = "slices"
SLICE_READY_REASONS: Final = ("ACTIVE", "ACTIVE_DEGRADED")
ANNOTATION_SLICE_OWNER: Final = PREFIX + "slice-owner"
"""On a GKE Slice the operator made: ``<namespace>/<TPUSlice name>`` (a cluster-scoped
object cannot have a namespaced owner reference)."""
LABEL_SLICE_OWNER: Final = PREFIX + "slice-owner"
"""On a GKE Slice the operator made: a digest of ``<namespace>/<TPUSlice name>``, to list a
TPUSlice's Slices."""
LABEL_WORKLOAD_OWNER: Final = PREFIX + "workload-owner"
"""On a GKE Slice the operator formed for a Kueue Workload (the slice admission check): a
digest naming its TPUJob, to delete them once the job is gone."""


def partition_id_label(shape: str) -> str:
    return f"{PARTITION_LABEL_PREFIX}{shape}-id"


def partition_state_label(shape: str) -> str:
    return f"{PARTITION_LABEL_PREFIX}{shape}-state"


# GKE's capacity modes (``placement/capacity.py``; sources in docs/tasks/capacity.md).
NODE_LABEL_FLEX_START: Final = "cloud.google.com/gke-flex-start"
"""Node label (and optional taint key) of flex-start VMs; pods select it ``"true"``."""
NODE_LABEL_QUEUED: Final = "cloud.google.com/gke-queued"
"""Node label and taint key of the nodes of a queued-provisioning node pool."""
NODE_LABEL_MAX_RUN_DURATION: Final = "cloud.google.com/gke-max-run-duration-seconds"
"""Node selector of a flex-start pod: the longest its VMs may run, in seconds."""
NODE_ANNOTATION_TERMINATION: Final = "node.gke.io/machine-termination-datetime"
"""Node annotation: when GKE takes a VM of limited run duration back (RFC 3339)."""
ANNOTATION_CONSUME_PROVISIONING_REQUEST: Final = "autoscaling.x-k8s.io/consume-provisioning-request"
ANNOTATION_PROVISIONING_CLASS: Final = "autoscaling.x-k8s.io/provisioning-class-name"
PROVISIONING_CLASS_QUEUED: Final = "queued-provisioning.gke.io"
TPU_TAINT_KEY: Final = "google.com/tpu"
TPU_TAINT_VALUE: Final = "present"
TPU_TAINT_EFFECT: Final = "NoSchedule"

# The container that runs JAX and receives the TPU chips and the contract env.
WORKER_CONTAINER: Final = "worker"
PORT_NAME_COORDINATOR: Final = "coordinator"
PORT_NAME_METRICS: Final = "metrics"

# Env vars GKE's TPU tooling and libtpu read (GKE injects the first two only for Indexed Jobs).
ENV_TPU_WORKER_ID: Final = "TPU_WORKER_ID"
ENV_TPU_WORKER_HOSTNAMES: Final = "TPU_WORKER_HOSTNAMES"
ENV_TPU_SKIP_MDS_QUERY: Final = "TPU_SKIP_MDS_QUERY"
ENV_TPU_ACCELERATOR_TYPE: Final = "TPU_ACCELERATOR_TYPE"
ENV_TPU_TOPOLOGY: Final = "TPU_TOPOLOGY"
# Ironwood (TPU7x) only: ``host:port`` of every worker of the slice, ordered by worker id,
# and the port this worker's libtpu listens on. JAX >= 0.8.1 prefers TPU_PROCESS_ADDRESSES
# to TPU_WORKER_HOSTNAMES (jax/_src/clusters/cloud_tpu_cluster.py); GKE, LWS and the
# KubeRay TPU webhook set both on tpu7x pods. See docs/reference/pod-contract.md for the sources.
ENV_TPU_PROCESS_ADDRESSES: Final = "TPU_PROCESS_ADDRESSES"
ENV_TPU_PROCESS_PORT: Final = "TPU_PROCESS_PORT"
# Multislice (Megascale) wiring, set only when numSlices > 1.
ENV_MEGASCALE_NUM_SLICES: Final = "MEGASCALE_NUM_SLICES"
ENV_MEGASCALE_SLICE_ID: Final = "MEGASCALE_SLICE_ID"
ENV_MEGASCALE_COORDINATOR_ADDRESS: Final = "MEGASCALE_COORDINATOR_ADDRESS"
ENV_MEGASCALE_PORT: Final = "MEGASCALE_PORT"
# JAX reads the coordinator address; process id and count are this project's names and
# are what the worker passes to jax.distributed.initialize off TPU.
ENV_JAX_COORDINATOR_ADDRESS: Final = "JAX_COORDINATOR_ADDRESS"
ENV_PROCESS_ID: Final = "TPU_OPERATOR_PROCESS_ID"
ENV_NUM_PROCESSES: Final = "TPU_OPERATOR_NUM_PROCESSES"
# This project's identity and wiring variables.
ENV_JOB_NAME: Final = "TPU_OPERATOR_JOB_NAME"
ENV_SLICE_INDEX: Final = "TPU_OPERATOR_SLICE_INDEX"
ENV_NUM_SLICES: Final = "TPU_OPERATOR_NUM_SLICES"
ENV_HOSTS_PER_SLICE: Final = "TPU_OPERATOR_HOSTS_PER_SLICE"
ENV_CHIPS_PER_HOST: Final = "TPU_OPERATOR_CHIPS_PER_HOST"
ENV_RESTART_ATTEMPT: Final = "TPU_OPERATOR_RESTART_ATTEMPT"
ENV_METRICS_PORT: Final = "TPU_OPERATOR_METRICS_PORT"
ENV_COORDINATOR_PORT: Final = "TPU_OPERATOR_COORDINATOR_PORT"
# Filled by the downward API.
ENV_POD_NAME: Final = "TPU_OPERATOR_POD_NAME"
ENV_POD_NAMESPACE: Final = "TPU_OPERATOR_POD_NAMESPACE"
ENV_POD_IP: Final = "TPU_OPERATOR_POD_IP"
ENV_NODE_NAME: Final = "TPU_OPERATOR_NODE_NAME"

# Env names that identify one pod. A template shared by every pod cannot know them, so the
# API rejects a template that sets them; every other contract name may be overridden.
IDENTITY_ENV: Final = (
    ENV_TPU_WORKER_ID,
    ENV_TPU_WORKER_HOSTNAMES,
    ENV_TPU_PROCESS_ADDRESSES,
    ENV_MEGASCALE_SLICE_ID,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_PROCESS_ID,
    ENV_NUM_PROCESSES,
    ENV_SLICE_INDEX,
    ENV_NUM_SLICES,
    ENV_RESTART_ATTEMPT,
)

# Ports. JAX >= 0.8.1 uses 8482 for its coordinator on TPU (0.8.0 and older used 8476).
# libtpu and GKE own the RESERVED_PORTS: 8431-8438 libtpu's runtime metrics, 8471 and 8476
# libtpu's inter-host ports, 2112 GKE's TPU device plugin; the worker metrics port must
# stay clear of them and of the contract's own defaults (pods may use hostNetwork).
DEFAULT_COORDINATOR_PORT: Final = 8482
DEFAULT_MEGASCALE_PORT: Final = 8080
DEFAULT_METRICS_PORT: Final = 9431
# TPU_PROCESS_PORT on Ironwood: 8471, libtpu's inter-host port on a multi-host slice (GKE's
# and xpk's TPU samples declare it, "Default port using which TPU VMs communicate"), and
# what GKE's webhook gives JobSet pods: the KubeRay TPU webhook copies it "for exact parity
# with JobSet" (ai-on-gke/kuberay-tpu-webhook main.go tpuProcessPortBase, commit eb7de5a).
# 8476 (LWS's TpuProcessDefaultPort, kubernetes-sigs/lws pkg/utils/accelerators/tpu.go) is
# the base of the per-process ports when one VM runs several libtpu processes (PyTorch/XLA's
# configure_tpu_topology(base_port=8476)); one process per VM here, so 8471. Both are in
# LIBTPU_PORTS. Distinct from the coordinator, Megascale and metrics ports.
DEFAULT_TPU_PROCESS_PORT: Final = 8471
LIBTPU_PORTS: Final = frozenset({*range(8431, 8439), 8471, 8476})
RESERVED_PORTS: Final = frozenset(
    {
        *LIBTPU_PORTS,
        DEFAULT_TPU_PROCESS_PORT,
        DEFAULT_MEGASCALE_PORT,
        DEFAULT_COORDINATOR_PORT,
        2112,
    }
)

# Exit code the worker uses for "retry me": watchdog stall, SIGTERM (preemption,
# maintenance). EX_TEMPFAIL from sysexits.h. The default failure policy restarts on it.
EXIT_RETRYABLE: Final = 75
# Exit code for a rendezvous that did not complete within its timeout.
EXIT_RENDEZVOUS_FAILED: Final = 76
# SIGABRT (128 + 6): JAX's coordination service aborted the process because another
# process of the job stopped heartbeating.
EXIT_ABORTED_BY_JAX: Final = 134


def claim_ref(value: str) -> str:
    """The claim reference of a slice-pool label value (``placement/provisioning.py``)."""
    return CLAIM_PREFIX + value


def pod_name(slice_name: str, worker_index: int) -> str:
    """Name (and hostname) of worker ``worker_index`` of a slice."""
    return f"{slice_name}-{worker_index}"


def slice_name(job_name: str, slice_index: int) -> str:
    """Name of slice ``slice_index`` of a TPUJob."""
    return f"{job_name}-{slice_index}"


def pod_dns_name(pod: str, service: str) -> str:
    """The stable DNS name of a worker pod behind the job's headless Service."""
    return f"{pod}.{service}"


def global_process_id(slice_index: int, hosts_per_slice: int, worker_index: int) -> int:
    """JAX process id of a worker: slice id * hosts per slice + worker id."""
    return slice_index * hosts_per_slice + worker_index


# Worker
# Settings of the in-pod worker (``tpu_worker``). The operator does not have to set any of
# them (each has a default); a TPUJob template may. Each one also has a ``tpu-worker`` flag.
ENV_WORKER_INIT_TIMEOUT: Final = "TPU_WORKER_INIT_TIMEOUT_SECONDS"
ENV_WORKER_HEARTBEAT_TIMEOUT: Final = "TPU_WORKER_HEARTBEAT_TIMEOUT_SECONDS"
ENV_WORKER_WATCHDOG_K: Final = "TPU_WORKER_WATCHDOG_K"
ENV_WORKER_WATCHDOG_FLOOR: Final = "TPU_WORKER_WATCHDOG_FLOOR_SECONDS"
ENV_WORKER_TERMINATION_GRACE: Final = "TPU_WORKER_TERMINATION_GRACE_SECONDS"
ENV_WORKER_METRICS_LINGER: Final = "TPU_WORKER_METRICS_LINGER_SECONDS"
ENV_WORKER_CPU_PEAK_FLOPS: Final = "TPU_WORKER_CPU_PEAK_FLOPS_PER_DEVICE"
ENV_WORKER_CLUSTER_MODE: Final = "TPU_WORKER_CLUSTER_MODE"
# Test hooks of the built-in demo (``tpu-worker demo``): fault injection for tests of the
# worker and the operator. A list of processes is comma-separated global process ids;
# unset means every process.
ENV_DEMO_HANG_AT_STEP: Final = "TPU_WORKER_DEMO_HANG_AT_STEP"
ENV_DEMO_HANG_PROCESSES: Final = "TPU_WORKER_DEMO_HANG_PROCESSES"
ENV_DEMO_STEP_SLEEP: Final = "TPU_WORKER_DEMO_STEP_SLEEP_SECONDS"
ENV_DEMO_SLOW_PROCESSES: Final = "TPU_WORKER_DEMO_SLOW_PROCESSES"
ENV_DEMO_SLOW_SECONDS: Final = "TPU_WORKER_DEMO_SLOW_SECONDS"
ENV_DEMO_EXIT_AT_STEP: Final = "TPU_WORKER_DEMO_EXIT_AT_STEP"
ENV_DEMO_EXIT_CODE: Final = "TPU_WORKER_DEMO_EXIT_CODE"
ENV_DEMO_EXIT_PROCESSES: Final = "TPU_WORKER_DEMO_EXIT_PROCESSES"
# Comma-separated attempts in which the hang and exit hooks fire (unset: every attempt).
ENV_DEMO_FAULT_ATTEMPTS: Final = "TPU_WORKER_DEMO_FAULT_ATTEMPTS"
# Exit code for a pod env that breaks the contract or a worker setting that is invalid
# (EX_CONFIG from sysexits.h): a restart cannot fix it.
EXIT_CONFIG_ERROR: Final = 78

# In-place restarts: the supervisor and its control channel
# When ENV_CONTROL_PORT is set, ``tpu-worker`` runs as a supervisor: it serves the control
# channel (``tpu_operator.supervision``) on the pod IP and this port and runs the training
# command as a child process, which it stops and starts again on the operator's command.
ENV_CONTROL_PORT: Final = "TPU_OPERATOR_CONTROL_PORT"
DEFAULT_CONTROL_PORT: Final = 9432
PORT_NAME_CONTROL: Final = "control"
# The job's control key, mounted from a Secret (never passed in env).
CONTROL_KEY_DIR: Final = "/var/run/tpu-operator/control"
CONTROL_KEY_FILE: Final = "key"
CONTROL_VOLUME: Final = "tpu-operator-control"
# Path of the key file, instead of CONTROL_KEY_DIR/CONTROL_KEY_FILE.
ENV_CONTROL_KEY_FILE: Final = "TPU_OPERATOR_CONTROL_KEY_FILE"
# The id of the key the operator gave the pod (``supervision.key_id``, in the pod spec):
# the supervisor uses a mounted key only if its id matches, so a key Secret the operator
# did not make is never used.
ENV_CONTROL_KEY_ID: Final = "TPU_OPERATOR_CONTROL_KEY_ID"
# The pod's UID (downward API): every control request is signed for one pod.
ENV_POD_UID: Final = "TPU_OPERATOR_POD_UID"
# "true" in a pod created while its job restarts in place (a slice a mixed restart
# recreates): the supervisor starts no training process until the operator's start
# command, which comes once every worker of the attempt is ready for it.
ENV_AWAIT_START: Final = "TPU_OPERATOR_AWAIT_START"
# The env names that place a process in its job's world: they change when an attempt
# runs on other slices (fewer or more of them, slices renumbered, another coordinator)
# while a pod stays. The Megascale names exist only in a multislice world (UNSET_ENV).
WORLD_ENV: Final = (
    ENV_JAX_COORDINATOR_ADDRESS,
    ENV_PROCESS_ID,
    ENV_NUM_PROCESSES,
    ENV_SLICE_INDEX,
    ENV_NUM_SLICES,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_SLICE_ID,
    ENV_MEGASCALE_COORDINATOR_ADDRESS,
    ENV_MEGASCALE_PORT,
)
# The only env names a start command may set for the next training process: the attempt
# and the world it runs in. Anything else (LD_PRELOAD, PYTHONPATH, ...) is refused.
START_ENV: Final = (ENV_RESTART_ATTEMPT, *WORLD_ENV)
# The names a start command may unset (an empty value): a single-slice world has none of
# the Megascale variables.
UNSET_ENV: Final = (
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_SLICE_ID,
    ENV_MEGASCALE_COORDINATOR_ADDRESS,
    ENV_MEGASCALE_PORT,
)
# Seconds a supervisor whose training process failed waits for a start command before it
# exits with that process's exit code (the pod fails; the operator recreates the pods).
ENV_SUPERVISOR_WAIT: Final = "TPU_WORKER_SUPERVISOR_WAIT_SECONDS"
DEFAULT_SUPERVISOR_WAIT_S: Final = 300.0
# Set by the supervisor in its child's env: the child runs the training, never supervises.
ENV_SUPERVISED_CHILD: Final = "TPU_WORKER_SUPERVISED"
