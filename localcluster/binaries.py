"""Find or build the control-plane binaries (etcd, kube-apiserver, ...) from Go modules.

The versions are pinned once, in the wrapper modules under ``localcluster/gobuild/``: the
``k8s.io/kubernetes`` requirement of ``gobuild/kubernetes/go.mod`` and the etcd server
requirement of ``gobuild/etcd/go.mod`` (their committed ``go.sum`` files pin the hashes).
Binaries go to a versioned cache directory outside the repository and are reused; a file
lock keeps two runs from building at once. ``KUBEBUILDER_ASSETS`` (the envtest layout, a
folder holding ``etcd``, ``kube-apiserver``, ``kubectl`` ...) is honoured for whichever
binaries it holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

GOBUILD_DIR = Path(__file__).resolve().parent / "gobuild"


class BuildError(RuntimeError):
    """A component could not be found or built; the message says which and where to look."""


@dataclass(frozen=True)
class Component:
    """One Go wrapper module and the commands it builds."""

    name: str
    module_dir: Path
    pinned_module: str
    commands: dict[str, str]  # binary name -> Go package path
    data: tuple[str, ...] = ()
    """Files of the pinned module (paths inside it) copied beside the binaries."""

    @property
    def version(self) -> str:
        return pinned_version(self.module_dir / "go.mod", self.pinned_module)

    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        if self.name == "kubernetes":
            major, minor = self.version.lstrip("v").split(".")[:2]
            for key, value in {
                "gitVersion": self.version,
                "gitMajor": major,
                "gitMinor": minor,
                "gitTreeState": "clean",
                "buildDate": "1970-01-01T00:00:00Z",
            }.items():
                flags.append(f"-X k8s.io/component-base/version.{key}={value}")
        elif self.name == "helm":
            # Variables set by helm's own Makefile (LDFLAGS in helm.sh/helm/v3 v3.21.4).
            flags.append(f"-X helm.sh/helm/v3/internal/version.version={self.version}")
            flags.append("-X helm.sh/helm/v3/internal/version.gitTreeState=clean")
            # The Kubernetes version `helm template` and `helm lint` assume without a cluster:
            # helm's Makefile derives it from the client-go it is built with (v0.N -> 1.N).
            client_go = pinned_version(self.module_dir / "go.mod", "k8s.io/client-go")
            minor = client_go.lstrip("v").split(".")[1]
            for package in ("pkg/chartutil", "pkg/lint/rules"):
                flags.append(f"-X helm.sh/helm/v3/{package}.k8sVersionMajor=1")
                flags.append(f"-X helm.sh/helm/v3/{package}.k8sVersionMinor={minor}")
        elif self.name == "actionlint":
            # The variable actionlint's release builds set (.goreleaser.yaml, ldflags).
            flags.append(f"-X github.com/rhysd/actionlint.version={self.version}")
        elif self.name == "kueue":
            # The variable set by Kueue's own Makefile (LD_FLAGS, version_pkg).
            flags.append(f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={self.version}")
        elif self.name == "chart-testing":
            # The variable set by chart-testing's release build (.goreleaser.yml).
            flags.append(f"-X github.com/helm/chart-testing/v3/ct/cmd.Version={self.version}")
        elif self.name == "pluto":
            # The variable set by pluto's Makefile.
            flags.append(f"-X main.version={self.version}")
        return " ".join(flags)


KUBERNETES = Component(
    name="kubernetes",
    module_dir=GOBUILD_DIR / "kubernetes",
    pinned_module="k8s.io/kubernetes",
    commands={
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    },
)
ETCD = Component(
    name="etcd",
    module_dir=GOBUILD_DIR / "etcd",
    pinned_module="go.etcd.io/etcd/server/v3",
    commands={"etcd": "."},
)
HELM = Component(
    name="helm",
    module_dir=GOBUILD_DIR / "helm",
    pinned_module="helm.sh/helm/v3",
    commands={"helm": "helm.sh/helm/v3/cmd/helm"},
)
ACTIONLINT = Component(
    name="actionlint",
    module_dir=GOBUILD_DIR / "actionlint",
    pinned_module="github.com/rhysd/actionlint",
    commands={"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
)
"""The GitHub Actions workflow linter, built when the test of ``.github/workflows/`` runs
(``tests/release/test_workflows.py``)."""
KUEUE = Component(
    name="kueue",
    module_dir=GOBUILD_DIR / "kueue",
    pinned_module="sigs.k8s.io/kueue",
    commands={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
)
"""Kueue's manager (controllers and webhooks in one process), built only when a test or
command asks for Kueue (``localcluster/kueue.py``)."""
CHART_TESTING = Component(
    name="chart-testing",
    module_dir=GOBUILD_DIR / "chart-testing",
    pinned_module="github.com/helm/chart-testing/v3",
    commands={"ct": "github.com/helm/chart-testing/v3/ct"},
    # ct's own Chart.yaml schema (yamale) and yamllint configuration, of the same release.
    data=("etc/chart_schema.yaml", "etc/lintconf.yaml"),
)
PLUTO = Component(
    name="pluto",
    module_dir=GOBUILD_DIR / "pluto",
    pinned_module="github.com/fairwindsops/pluto/v5",
    commands={"pluto": "github.com/fairwindsops/pluto/v5/cmd/pluto"},
)
CHART_TOOLS = (CHART_TESTING, PLUTO)
"""The chart's linters (tests/chart/): chart-testing's ct and pluto."""
CONTROL_PLANE = (ETCD, KUBERNETES)
ALL_COMPONENTS = (ETCD, KUBERNETES, HELM)


def pinned_version(go_mod: Path, module: str) -> str:
    """The version ``go_mod`` requires of ``module`` (the one place a version is pinned)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if not match:
        raise BuildError(f"{go_mod} does not require {module}; cannot tell which version to build")
    return match.group(1)


def cache_root() -> Path:
    """Where built binaries live: $TPU_OPERATOR_CACHE, else $XDG_CACHE_HOME/tpu-operator."""
    if env := os.environ.get("TPU_OPERATOR_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-operator"


def component_dir(component: Component) -> Path:
    """Versioned cache directory; the go.sum hash makes a re-pinned dependency a new entry."""
    digest = hashlib.sha256(" ".join([component.ldflags(), *component.data]).encode())
    for name in ("go.mod", "go.sum", "main.go"):
        path = component.module_dir / name
        if path.exists():
            digest.update(path.read_bytes())
    return cache_root() / "bin" / f"{component.name}-{component.version}-{digest.hexdigest()[:10]}"


@contextmanager
def build_lock() -> Iterator[None]:
    """Serialize builds across processes (two test runs must not build into one folder)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another process is building binaries; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log(message: str) -> None:
    print(f"[localcluster] {message}", file=sys.stderr, flush=True)


def from_assets(binary: str) -> Path | None:
    """A binary from $KUBEBUILDER_ASSETS (envtest layout), if it is there."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    path = Path(assets) / binary
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure(component: Component) -> dict[str, Path]:
    """Paths of every binary of ``component``, building the missing ones (cached)."""
    found = {name: from_assets(name) for name in component.commands}
    missing = [name for name, path in found.items() if path is None]
    if not missing:
        return {name: path for name, path in found.items() if path is not None}
    target = component_dir(component)
    if not all((target / name).is_file() for name in missing):
        with build_lock():
            if not all((target / name).is_file() for name in missing):
                _build(component, target)
    return {name: found[name] or target / name for name in component.commands}


def ensure_all(components: tuple[Component, ...] = CONTROL_PLANE) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    for component in components:
        paths.update(ensure(component))
    return paths


def _build(component: Component, target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"building {component.name} {component.version} needs the Go toolchain, and `go` "
            "is not on PATH. Install Go (https://go.dev/doc/install) or point "
            "KUBEBUILDER_ASSETS at a folder with prebuilt binaries."
        )
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"build-{component.name}-{component.version}.log"
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names = ", ".join(component.commands)
    log(
        f"building {names} ({component.name} {component.version}) from Go modules into "
        f"{target}; a first build takes minutes (log: {log_file})"
    )
    env = {
        **os.environ,
        # go.sum in the wrapper module pins every hash; the checksum database is not
        # reachable from every build machine, so it is not consulted.
        "GOSUMDB": "off",
        "GOFLAGS": "-mod=mod -buildvcs=false",
        "CGO_ENABLED": "0",
    }
    command = [go, "build", "-trimpath", "-ldflags", component.ldflags(), "-o"]
    if component.commands == {next(iter(component.commands)): "."}:
        command += [str(staging / next(iter(component.commands))), "."]
    else:
        command += [str(staging) + "/", *component.commands.values()]
    started = time.monotonic()
    with open(log_file, "w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        proc = subprocess.Popen(
            command, cwd=component.module_dir, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        while True:
            try:
                code = proc.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                log(f"  still building {component.name} ({time.monotonic() - started:.0f} s)")
    if code != 0:
        tail = log_file.read_text().splitlines()[-15:]
        raise BuildError(
            f"building {component.name} {component.version} failed (exit {code}); "
            f"full log: {log_file}\n" + "\n".join(tail)
        )
    for name in component.data:
        shutil.copy2(_module_path(go, component, env) / name, staging / Path(name).name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    log(f"built {names} in {time.monotonic() - started:.0f} s")


def _module_path(go: str, component: Component, env: dict[str, str]) -> Path:
    """Where the Go module cache holds the pinned module (after a build, it is there)."""
    result = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", component.pinned_module],
        cwd=component.module_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise BuildError(
            f"cannot find {component.pinned_module} {component.version} in the Go module "
            f"cache: {result.stderr.strip()}"
        )
    return Path(result.stdout.strip())
