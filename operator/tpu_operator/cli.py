"""The ``tpu-operator`` command: run the operator, write the generated CRDs, dashboards and
reference docs, print the version."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, get_args

from tpu_operator import __version__
from tpu_operator.api.policy import Provisioning
from tpu_operator.runtime import lease
from tpu_operator.runtime.collector import DEFAULT_THRESHOLD
from tpu_operator.runtime.loops import LOOPS

if TYPE_CHECKING:
    from tpu_operator.runtime.leader import LeaseSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpu-operator",
        description="Kubernetes operator for JAX training on GKE TPU node pools.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator (until SIGTERM)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG)")
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    run.add_argument("--metrics-port", type=int, default=8000, help="Prometheus port (0: off)")
    run.add_argument("--health-port", type=int, default=8081, help="liveness port (0: off)")
    run.add_argument(
        "--bind-address",
        default="0.0.0.0",
        help="address of the metrics and health servers (default: every interface)",
    )
    run.add_argument(
        "--metrics-auth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve metrics over HTTPS only to scrapers whose bearer token the apiserver "
        "accepts (TokenReview) and who may get /metrics (SubjectAccessReview); "
        "--no-metrics-auth: plain HTTP to anyone, for local use",
    )
    run.add_argument(
        "--metrics-cert-dir",
        help="directory with the metrics server's tls.crt and tls.key (a kubernetes.io/tls "
        "Secret), read again when they change; default: a self-signed certificate made at "
        "start-up",
    )
    run.add_argument(
        "--api-concurrency",
        type=int,
        default=32,
        help="concurrent Kubernetes API requests (pod creation fan-out)",
    )
    run.add_argument("--job-workers", type=int, default=8, help="TPUJobs reconciled at once")
    run.add_argument("--slice-workers", type=int, default=16, help="TPUSlices reconciled at once")
    run.add_argument(
        "--sample-concurrency",
        type=int,
        default=64,
        help="concurrent reads of worker metrics endpoints (progress sampling)",
    )
    run.add_argument(
        "--progress-publish-seconds",
        type=float,
        default=30.0,
        help="at most one progress status write per running job per this many seconds",
    )
    run.add_argument(
        "--reconcile-min-interval",
        type=float,
        default=0.1,
        help="seconds between two event-triggered reconciles of one object (coalesces "
        "the pod events of large slices; 0 reconciles on every event)",
    )
    run.add_argument(
        "--reconcile-settle",
        type=float,
        default=1.0,
        help="seconds between two reconciles of one object asked for only by pods being "
        "scheduled, starting or becoming ready (a failure, a deletion, a spec change or "
        "the last pod of a gang becoming ready is not held back; a slice of an N-slice "
        "job waits N times as long, at most 10 s; 0 disables)",
    )
    run.add_argument(
        "--reconcile-deadline",
        type=float,
        default=120.0,
        help="seconds a reconcile may run; a longer one is cancelled, logged and retried "
        "with backoff (0 disables)",
    )
    run.add_argument(
        "--gc-threshold",
        type=int,
        default=DEFAULT_THRESHOLD,
        help="net allocations between two young-generation garbage collections "
        "(CPython's default is 700, which cost the operator about a fifth of its CPU while "
        "it created a large job; 0 keeps CPython's settings)",
    )
    run.add_argument(
        "--event-loop",
        choices=LOOPS,
        default=LOOPS[0],
        help="the event loop: uvloop (libuv; 0.8-0.9x the CPU per request of asyncio's "
        "own) or asyncio",
    )
    election = run.add_argument_group(
        "leader election",
        "with --leader-elect, replicas campaign for a coordination.k8s.io Lease and only "
        "the holder reconciles; the others keep their caches warm to take over",
    )
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="act only while holding the Lease (required with more than one replica)",
    )
    election.add_argument(
        "--leader-elect-namespace",
        help="namespace of the Lease (default: $POD_NAMESPACE, the pod's namespace, default)",
    )
    election.add_argument(
        "--leader-elect-lease-name", default="tpu-operator", help="name of the Lease"
    )
    election.add_argument(
        "--leader-elect-lease-duration",
        type=int,
        default=lease.LEASE_DURATION,
        help="seconds a standby waits after the Lease was last renewed before taking it",
    )
    election.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=lease.RENEW_DEADLINE,
        help="seconds the leader keeps acting without renewing the Lease",
    )
    election.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=lease.RETRY_PERIOD,
        help="seconds between two attempts to take or renew the Lease",
    )
    run.add_argument(
        "--kueue",
        action="store_true",
        help="admit TPUJobs labelled kueue.x-k8s.io/queue-name through Kueue (docs/tasks/kueue.md)",
    )
    run.add_argument(
        "--default-provisioning",
        choices=list(get_args(Provisioning)),
        default="ExistingPools",
        help="spec.placement.provisioning of the TPUJobs and TPUSlices that leave it unset: "
        "ExistingPools (wait for a free node pool) or Auto (let GKE create one: node "
        "auto-provisioning, Autopilot); docs/tasks/spot-and-reservations.md",
    )
    run.add_argument(
        "--spare-node-pool-selector",
        type=_spare_selector,
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="node labels of spare node pools held in reserve for every TPUJob: no job's "
        "first placement takes them; a slice a restart moves off a broken pool may "
        "(spec.placement.spares adds a job's own; docs/tasks/restarts.md)",
    )
    run.add_argument(
        "--control-key-file",
        default=os.environ.get("TPU_OPERATOR_CONTROL_KEY_FILE"),
        help="master key of the control channel to the workers' supervisors (in-place "
        "restarts; all replicas must share it); default: a random key per process",
    )
    run.add_argument(
        "--in-place-restarts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart gangs in place where the workers run tpu-worker's supervisor "
        "(docs/tasks/restarts.md); --no-in-place-restarts: always recreate the pods",
    )
    run.add_argument(
        "--control-network-policy",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="a NetworkPolicy guards the workers' control port in NAMESPACE (repeat for "
        "each; the chart's inPlaceRestarts.networkPolicy): jobs it cannot guard, with "
        "hostNetwork pods or in other namespaces, restart by recreating their pods",
    )
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    crds = sub.add_parser("crds", help="print the CRDs generated from the API models")
    crds.add_argument(
        "--write", action="store_true", help="write them to crds/ and the chart instead"
    )
    sub.add_parser(
        "dashboards",
        help="write the Grafana dashboards and the alert rules' worker metric names into the chart",
    ).add_argument(
        "--write",
        action="store_true",
        required=True,
        help="write charts/.../dashboards/*.json and charts/.../templates/_worker_metrics.tpl",
    )
    sub.add_parser(
        "docs", help="write the reference pages of the docs generated from the code"
    ).add_argument(
        "--write",
        action="store_true",
        required=True,
        help="write docs/reference/ (API fields, labels, metrics and alerts, flags, chart values)",
    )
    sub.add_parser("version", help="print the version")
    return parser


def _spare_selector(text: str) -> dict[str, str]:
    from tpu_operator.placement.pools import parse_selector

    try:
        return parse_selector(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def lease_settings(args: argparse.Namespace) -> LeaseSettings | None:
    """The leader election settings of ``run``'s arguments; None without --leader-elect."""
    if not args.leader_elect:
        return None
    from tpu_operator.runtime.leader import LeaseSettings, default_namespace

    return LeaseSettings(
        namespace=args.leader_elect_namespace or default_namespace(),
        name=args.leader_elect_lease_name,
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "dashboards":
        from tpu_operator import dashboards

        for path in dashboards.write():
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.command == "docs":
        from tpu_operator import docgen

        for path in docgen.write(parser):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.command == "crds":
        from tpu_operator import crdgen

        if args.write:
            for path in crdgen.write():
                print(f"wrote {path}", file=sys.stderr)
        else:
            sys.stdout.write(crdgen.render_all())
        return 0

    leader_election = lease_settings(args)
    if leader_election is not None and leader_election.problems():
        parser.error("; ".join(leader_election.problems()))
    if args.metrics_cert_dir:
        from tpu_operator.runtime.metrics_server import cert_dir_problem

        problem = cert_dir_problem(args.metrics_cert_dir)
        if problem:
            parser.error(problem)

    import kopf

    from tpu_operator.app import OperatorConfig
    from tpu_operator.controllers import run

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger("tpu_operator").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        # kopf logs every handled watch event at INFO; the operator's own log lines (and
        # its Kubernetes Events) say what happened.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    return run(
        OperatorConfig(
            kubeconfig=args.kubeconfig,
            namespaces=args.namespaces,
            api_concurrency=args.api_concurrency,
            job_workers=args.job_workers,
            slice_workers=args.slice_workers,
            metrics_port=args.metrics_port or None,
            health_port=args.health_port or None,
            sample_concurrency=args.sample_concurrency,
            progress_publish_seconds=args.progress_publish_seconds,
            reconcile_min_interval=args.reconcile_min_interval,
            reconcile_settle=args.reconcile_settle,
            reconcile_deadline=args.reconcile_deadline or None,
            gc_threshold=args.gc_threshold,
            event_loop=args.event_loop,
            leader_election=leader_election,
            bind_address=args.bind_address,
            metrics_auth=args.metrics_auth,
            metrics_cert_dir=args.metrics_cert_dir,
            kueue=args.kueue,
            default_provisioning=args.default_provisioning,
            spare_node_pool_selector=args.spare_node_pool_selector or {},
            in_place_restarts=args.in_place_restarts,
            control_key_file=args.control_key_file,
            control_network_policy=args.control_network_policy,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
