"""Command line: ``python -m localcluster up|down|status|build|kubeconfig|kubectl|fault``
and ``faultproxy``.

``up`` starts a cluster detached (``--foreground`` holds it until Ctrl-C) in
``--dir`` (default ``.localcluster/default``); ``down`` stops it; ``fault`` injects
faults through the node agent; ``faultproxy`` runs the fault-injecting API proxy
(:mod:`localcluster.faultproxy`) in the foreground. Exit code 1 with one clear line on a
known error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from localcluster import binaries
from localcluster.agent.client import AgentError
from localcluster.agent.ipam import POD_ADDRESSES
from localcluster.agent.provisioner import Autoprovisioning
from localcluster.cluster import COMPONENTS, DEFAULT_DIR, Cluster, ClusterError
from localcluster.pools import PoolError, load_pools


def _up(args: argparse.Namespace) -> int:
    pools = load_pools(args.pools) if args.pools else None
    cluster = Cluster.start(
        args.dir,
        pools=pools,
        node_monitor_grace_period=args.node_monitor_grace_period,
        detach=not args.foreground,
        fresh=args.fresh,
        autoprovisioning=(
            Autoprovisioning(delay=args.autoprovisioning_delay, idle=args.autoprovisioning_idle)
            if args.autoprovisioning
            else None
        ),
        pod_addresses=args.pod_addresses,
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    if not args.foreground:
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("cluster running in the foreground; Ctrl-C stops it", file=sys.stderr)
    stop.wait()
    cluster.stop()
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        cluster = Cluster.attach(args.dir)
    except ClusterError as error:
        if "broken" not in str(error):
            print(f"localcluster: {error}", file=sys.stderr)
            return 0
        # Some components died: stop whatever is left through a fresh attach of the records.
        from localcluster.layout import Layout, read_state, recorded_processes

        layout = Layout(Path(args.dir).absolute())
        records = recorded_processes(read_state(layout))
        cluster = Cluster(layout.root, "", Path("kubectl"), True, _records=records)
    cluster.stop()
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = Cluster.attach(args.dir)
    report = cluster.status()
    report["agent"] = cluster.agent.status() if cluster.agent.ready() else None
    print(json.dumps(report, indent=2))
    return 0


def _build(args: argparse.Namespace) -> int:
    components = binaries.ALL_COMPONENTS if args.helm else binaries.CONTROL_PLANE
    if getattr(args, "kueue", False):
        components = (*components, binaries.KUEUE)
    if getattr(args, "chart_tools", False):
        components = (*components, *binaries.CHART_TOOLS)
    for name, path in binaries.ensure_all(components).items():
        print(f"{name}\t{path}")
    if getattr(args, "images", False):
        from localcluster import images, previous

        for spec in images.TESTED:
            print(images.report(images.ensure(spec)))
        # The version the upgrade test upgrades from (tests/e2e/test_upgrade.py).
        print(images.report(previous.operator_image()))
    return 0


def _kubeconfig(args: argparse.Namespace) -> int:
    print(Cluster.attach(args.dir).kubeconfig)
    return 0


def _kubectl(args: argparse.Namespace) -> int:
    result = Cluster.attach(args.dir).kubectl(*args.args, check=False, timeout=3600)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


def _fault(args: argparse.Namespace) -> int:
    if args.fault == "restart-apiserver":
        seconds = Cluster.attach(args.dir).restart_apiserver(args.down)
        print(f"kube-apiserver back after {seconds:.1f} s")
        return 0
    if args.fault == "kill-component":
        Cluster.attach(args.dir).kill_component(args.component)
        print(f"{args.component} killed; kept down until `fault start-component`")
        return 0
    if args.fault == "start-component":
        seconds = Cluster.attach(args.dir).start_component(args.component)
        print(f"{args.component} running again after {seconds:.1f} s")
        return 0
    agent = Cluster.attach(args.dir).agent
    if args.fault == "kill-pod":
        print(agent.kill_pod(args.namespace, args.name, args.exit_code, container=args.container))
    elif args.fault == "evict":
        agent.evict_pod(args.namespace, args.name, args.grace_period)
    elif args.fault == "partition":
        agent.partition_node(args.node)
    elif args.fault == "not-ready":
        agent.make_node_not_ready(args.node, args.message)
    elif args.fault == "heal":
        agent.heal_node(args.node)
    elif args.fault == "delete-node":
        agent.delete_node(args.node, graceful=args.graceful)
    return 0


def _faultproxy(args: argparse.Namespace) -> int:
    import random

    from localcluster import faultproxy

    upstream = args.upstream_kubeconfig or Cluster.attach(args.dir).kubeconfig
    output = args.kubeconfig or Path(args.dir) / "faultproxy.kubeconfig"
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    try:
        rates = faultproxy.rates_from(
            {kind: getattr(args, kind) for kind in faultproxy.FAULT_KINDS}, args.retry_after
        )
    except ValueError as error:
        print(f"localcluster: {error}", file=sys.stderr)
        return 1
    proxy = faultproxy.FaultProxy(upstream, output, seed=seed, rates=rates, port=args.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with proxy:
        print(f"export KUBECONFIG={output}")
        print(
            f"fault proxy on http://127.0.0.1:{proxy.port} (seed {seed}; {rates.describe()}); "
            f"stats at http://127.0.0.1:{proxy.port}{faultproxy.STATS_PATH}; Ctrl-C stops it",
            file=sys.stderr,
        )
        stop.wait()
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="cluster directory")
        return cmd

    up = command("up", "start a cluster (detached unless --foreground)")
    up.add_argument("--pools", type=Path, help="pool file (default: localcluster/pools.yaml)")
    up.add_argument("--foreground", action="store_true")
    up.add_argument("--fresh", action="store_true", help="wipe data of an earlier run")
    up.add_argument("--node-monitor-grace-period", type=float, default=20.0)
    up.add_argument(
        "--autoprovisioning",
        action="store_true",
        help="simulate GKE's cluster autoscaler and node auto-provisioning for TPU pods",
    )
    up.add_argument("--autoprovisioning-delay", type=float, default=5.0, metavar="SECONDS")
    up.add_argument("--autoprovisioning-idle", type=float, default=60.0, metavar="SECONDS")
    up.add_argument(
        "--pod-addresses",
        choices=sorted(POD_ADDRESSES),
        default="loopback",
        help="pod IPs: loopback 127.B.0.0/16 (Services get no endpoints), or routed "
        "100.B.0.0/16, made local by a route (needs CAP_NET_ADMIN; EndpointSlices as on GKE)",
    )
    up.set_defaults(run=_up)
    command("down", "stop the cluster").set_defaults(run=_down)
    command("status", "show components, nodes and pods").set_defaults(run=_status)
    command("kubeconfig", "print the admin kubeconfig path").set_defaults(run=_kubeconfig)
    kubectl = command("kubectl", "run kubectl against the cluster")
    kubectl.add_argument("args", nargs=argparse.REMAINDER)
    kubectl.set_defaults(run=_kubectl)
    build = sub.add_parser("build", help="build (or find) the binaries")
    build.add_argument("--helm", action="store_true", help="helm too")
    build.add_argument("--kueue", action="store_true", help="Kueue's manager too")
    build.add_argument(
        "--chart-tools",
        action="store_true",
        help="the chart's linters too: chart-testing's ct and pluto (tests/chart/)",
    )
    build.add_argument(
        "--images",
        action="store_true",
        help="the operator and worker images too (buildah; docs/contributing/images.md)",
    )
    build.set_defaults(run=_build)

    fault = command("fault", "inject a fault (through the node agent, or to the kube-apiserver)")
    fault_commands = fault.add_subparsers(dest="fault", required=True)

    def fault_command(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = fault_commands.add_parser(name, help=help_text)
        # Also accepted after the fault's own arguments.
        cmd.add_argument("--dir", type=Path, default=argparse.SUPPRESS, help="cluster directory")
        return cmd

    kill = fault_command("kill-pod", "SIGKILL a pod's processes, report an exit code")
    kill.add_argument("namespace")
    kill.add_argument("name")
    kill.add_argument("--exit-code", type=int, default=137)
    kill.add_argument("--container")
    restart = fault_command("restart-apiserver", "SIGKILL the kube-apiserver and start it again")
    restart.add_argument("--down", type=float, default=0.0, help="seconds to keep it down")
    for name, text in (
        ("kill-component", "SIGKILL a control-plane component and keep it down"),
        ("start-component", "start a component stopped with kill-component again"),
    ):
        fault_command(name, text).add_argument("component", choices=COMPONENTS)
    evict = fault_command("evict", "evict a pod (Eviction API)")
    evict.add_argument("namespace")
    evict.add_argument("name")
    evict.add_argument("--grace-period", type=int)
    for name, text in (
        ("partition", "stop a node's heartbeats (Ready=Unknown)"),
        ("not-ready", "make a node report Ready=False"),
        ("heal", "make a node Ready again"),
        ("delete-node", "delete a node and its processes (preemption)"),
    ):
        node_fault = fault_command(name, text)
        node_fault.add_argument("node")
        if name == "not-ready":
            node_fault.add_argument("--message")
        if name == "delete-node":
            node_fault.add_argument("--graceful", action="store_true")
    fault.set_defaults(run=_fault)

    proxy = command("faultproxy", "run a fault-injecting proxy in front of the kube-apiserver")
    proxy.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    proxy.add_argument("--seed", type=int, help="schedule seed (default: random, printed)")
    proxy.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig to write for clients of the proxy"
    )
    proxy.add_argument(
        "--upstream-kubeconfig", type=Path, help="credentials to forward with (default: admin)"
    )
    for kind, text in (
        ("throttle", "429 TooManyRequests with Retry-After"),
        ("internal", "500 InternalError"),
        ("unavailable", "503 ServiceUnavailable"),
        ("reset", "connection closed without an answer (watches: mid-stream)"),
        ("expire", "watches: an ERROR event with 410 Expired, then the end of the stream"),
    ):
        proxy.add_argument(
            f"--{kind}", type=float, default=0.0, metavar="RATE", help=f"share of requests: {text}"
        )
    proxy.add_argument("--retry-after", type=int, default=1, help="seconds, in each 429")
    proxy.set_defaults(run=_faultproxy)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ClusterError, binaries.BuildError, PoolError, AgentError) as error:
        print(f"localcluster: {error}", file=sys.stderr)
        return 1
