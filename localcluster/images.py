"""The product's images: built from their Dockerfiles and run, without a Docker daemon.

- **Build**: buildah (Debian's package) builds ``Dockerfile`` and ``worker-image/Dockerfile``
  as they are, with chroot isolation and vfs storage, into a container store of the build
  cache (``~/.cache/tpu-operator/containers``). Each image is tagged with a digest of its
  inputs (the Dockerfile, the build context it copies, its build arguments and the base
  image), so it is built once per change and reused.
- **Base image**: where ``python:3.11-slim-bookworm`` cannot be pulled (no container
  registry is reachable from the machines this project is tested on), a stand-in is made
  from Debian's own packages with mmdebstrap: the same Debian release, its Python of the
  same minor version, tagged in the base's place. docs/contributing/images.md says how it differs.
- **Run**: podman with runc, on the host's network, with the image's filesystem as a
  read-only root (``--rootfs`` on the image's top layer: no per-container copy, which vfs
  would make of the whole image) and the image's own user, environment, working directory
  and entry point.

``pod_run_arguments`` makes that the command of a pod's container, so the local cluster's
node agent (which runs commands, not images) runs the image: the e2e tier and the demo run
the operator that way. ``operator_venv`` is the benchmarks' path (the operator as a process
of their own): a virtualenv installed by the same script and lock file as the image.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster import binaries

REPO = Path(__file__).resolve().parent.parent
# What the Dockerfiles copy into an image (and the demo's virtualenv is built from).
SOURCES = (
    "pyproject.toml",
    "README.md",
    "requirements",
    "operator",
    "worker-image",
    "scripts/install-package.sh",
)
SKIPPED_PARTS = ("__pycache__",)

# Debian's packages for building and running images (`ensure_tools`).
TOOLS = {"buildah": "buildah", "podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
# Python minor version of each Debian release's python3 (the stand-in's only choice).
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
DEBIAN_MIRRORS = (
    "deb http://deb.debian.org/debian {suite} main",
    "deb http://deb.debian.org/debian {suite}-updates main",
    "deb http://deb.debian.org/debian-security {suite}-security main",
)
# The upstream python image's environment and command, which the stand-in sets alike.
STANDIN_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
LABEL_INPUTS = "dev.tpu-operator.inputs"
LABEL_STANDIN = "dev.tpu-operator.stand-in"
# Images of one name kept in the store (older ones are removed after a build).
KEEP_IMAGES = 3


class ImageError(RuntimeError):
    """An image could not be built or run; the message says which and where to look."""


@dataclass(frozen=True)
class ImageSpec:
    """One image of the product: its Dockerfile and build arguments."""

    name: str
    dockerfile: str
    build_args: tuple[tuple[str, str], ...] = ()

    def tag(self, digest: str) -> str:
        return f"localhost/{self.name}:{digest}"


OPERATOR = ImageSpec("tpu-operator", "Dockerfile")
# The worker image as released: JAX with libtpu (requirements/worker.txt).
WORKER = ImageSpec("tpu-worker", "worker-image/Dockerfile")
# The same Dockerfile with JAX for CPU (requirements/worker-cpu.txt).
WORKER_CPU = ImageSpec("tpu-worker-cpu", "worker-image/Dockerfile", (("LOCK", "worker-cpu"),))
# The worker image the tests build and run.
TESTED_WORKER = WORKER
# What `python -m localcluster build --images` (the test command) builds.
TESTED = (OPERATOR, TESTED_WORKER)


@dataclass(frozen=True)
class DerivedSpec:
    """A user's image built FROM one of the product's images, from a directory of its own
    (its Dockerfile takes the base image's reference as a build argument)."""

    name: str
    context: str  # the build context under the repository, holding the Dockerfile
    base: ImageSpec
    base_arg: str

    def tag(self, digest: str) -> str:
        return f"localhost/{self.name}:{digest}"


# examples/own-code: a training package added to the worker image, run by `tpu-worker run -m`.
OWN_CODE = DerivedSpec("tpu-own-code", "examples/own-code", TESTED_WORKER, "WORKER_IMAGE")


# --- pure parts: inputs, base images, run arguments ---------------------------------------


def sources_digest(repo: Path = REPO, extra: Sequence[str] = ()) -> str:
    """A digest of the files the images are built from (paths and contents)."""
    digest = hashlib.sha256()
    for root in (*SOURCES, *extra):
        top = repo / root
        paths = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in paths:
            relative = path.relative_to(repo)
            if not path.is_file() or any(
                part in SKIPPED_PARTS or part.endswith(".egg-info") for part in relative.parts
            ):
                continue
            digest.update(str(relative).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def image_digest(spec: ImageSpec, base_id: str, repo: Path = REPO) -> str:
    """The key of one built image: its build context, Dockerfile, arguments and base."""
    digest = hashlib.sha256()
    digest.update(sources_digest(repo, extra=(spec.dockerfile, ".dockerignore")).encode())
    digest.update(json.dumps([spec.dockerfile, spec.build_args, base_id]).encode())
    return digest.hexdigest()[:12]


def derived_digest(spec: DerivedSpec, base_id: str, repo: Path = REPO) -> str:
    """The key of a derived image: its build context (the Dockerfile in it) and its base."""
    digest = hashlib.sha256()
    top = repo / spec.context
    for path in sorted(top.rglob("*")):
        relative = path.relative_to(top)
        if path.is_file() and not any(part in SKIPPED_PARTS for part in relative.parts):
            digest.update(str(relative).encode() + b"\0" + path.read_bytes())
    digest.update(json.dumps([spec.base_arg, base_id]).encode())
    return digest.hexdigest()[:12]


def base_images(dockerfile_text: str, build_args: Mapping[str, str] | None = None) -> list[str]:
    """The external images a Dockerfile's stages start from (not its own earlier stages).

    ``FROM ${NAME}`` takes the value of a global ``ARG NAME=default`` (one before the first
    ``FROM``), or of ``build_args`` where they set it, as a build does."""
    arguments: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    for line in dockerfile_text.splitlines():
        declared = re.match(r"^\s*ARG\s+(\w+)(?:=(\S*))?\s*$", line, re.I)
        if declared and not stages and not bases:
            name, default = declared.group(1), declared.group(2)
            arguments[name] = (build_args or {}).get(name, default or "")
            continue
        match = re.match(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if not match:
            continue
        image = _expand(match.group(1), arguments)
        alias = match.group(2)
        if image.lower() not in stages and image not in bases:
            bases.append(image)
        if alias:
            stages.add(alias.lower())
    return bases


def _expand(word: str, arguments: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in arguments:
            raise ImageError(f"FROM {word}: ${name} is not a global ARG of the Dockerfile")
        return arguments[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def qualified(image: str) -> str:
    """A short Docker Hub name as a container store records it."""
    name = image.split("@", 1)[0]
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{name}"
    return name


@dataclass(frozen=True)
class StandIn:
    """How to make a local stand-in for an official ``python:X.Y-slim-<debian>`` image."""

    image: str  # fully qualified, as tagged in the store
    suite: str
    python: str

    @property
    def packages(self) -> tuple[str, ...]:
        # python3-venv: ensurepip, which the upstream image's Python has built in;
        # python-is-python3: `python`, as upstream; ca-certificates, netbase, tzdata: as
        # debian:<suite>-slim + the python image's own apt-get install.
        return (
            "python3",
            "python3-venv",
            "python-is-python3",
            "ca-certificates",
            "netbase",
            "tzdata",
        )

    def mmdebstrap_args(self, output: Path) -> list[str]:
        return [
            "--quiet",
            "--variant=minbase",
            f"--include={','.join(self.packages)}",
            # As the -slim images: no documentation or translations.
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--aptopt=Acquire::Retries 3",
            self.suite,
            str(output),
            *(mirror.format(suite=self.suite) for mirror in DEBIAN_MIRRORS),
        ]

    def digest(self) -> str:
        recipe = [self.image, self.suite, self.python, self.mmdebstrap_args(Path("-"))]
        recipe.append(list(STANDIN_CHANGES))
        return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


def stand_in(image: str) -> StandIn:
    """The stand-in for a base image, or an error saying why none can be made."""
    full = qualified(image)
    match = re.fullmatch(r"docker\.io/library/python:(\d+\.\d+)(?:\.\d+)?-slim-([a-z]+)", full)
    if not match:
        raise ImageError(
            f"base image {image} cannot be pulled here and has no local stand-in: only "
            "python:<major.minor>-slim-<debian release> images are made from Debian's packages"
        )
    python, suite = match.groups()
    if DEBIAN_PYTHON.get(suite) != python:
        known = ", ".join(f"{s}: {p}" for s, p in DEBIAN_PYTHON.items())
        raise ImageError(
            f"base image {image}: Debian {suite} does not ship Python {python} ({known}), so "
            "no stand-in with the same Python can be made from Debian's packages"
        )
    return StandIn(full, suite, python)


@dataclass(frozen=True)
class ImageConfig:
    """What a container runtime takes from an image to start it (``podman image inspect``)."""

    reference: str
    image_id: str
    rootfs: Path  # the image's top layer, the whole filesystem with vfs
    user: str
    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    workdir: str
    size: int
    layers: int
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_inspect(cls, reference: str, inspect: Mapping[str, Any], rootfs: Path) -> ImageConfig:
        config = inspect.get("Config") or {}
        return cls(
            reference=reference,
            image_id=inspect["Id"],
            rootfs=rootfs,
            user=config.get("User") or "",
            env=tuple(config.get("Env") or ()),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            workdir=config.get("WorkingDir") or "/",
            size=int(inspect.get("Size") or 0),
            layers=len((inspect.get("RootFS") or {}).get("Layers") or ()),
            labels=dict(config.get("Labels") or {}),
        )

    @property
    def runs_as_root(self) -> bool:
        user = self.user.split(":", 1)[0]
        return user in ("", "0", "root")


@dataclass(frozen=True)
class Bind:
    source: str
    target: str
    read_only: bool = False

    def argument(self) -> str:
        return f"--volume={self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def ulimits() -> list[str]:
    """Resource limits a container may have here: no higher than this process's own.

    podman asks for more by default (1048576 open files, 4194304 processes), which runc
    cannot set without CAP_SYS_RESOURCE; conmon itself runs with at most 32768 processes.
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return [f"--ulimit=nofile={nofile}:{nofile}", f"--ulimit=nproc={nproc}:{nproc}"]


def run_arguments(
    image: ImageConfig,
    args: Sequence[str] | None = None,
    *,
    binds: Sequence[Bind] = (),
    env: Mapping[str, str] | None = None,
    env_from_host: Sequence[str] = (),
    tmpfs: Sequence[str] = (),
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    user: str | None = None,
    entrypoint: Sequence[str] | None = None,
) -> list[str]:
    """``podman run`` arguments that start ``image`` as a container runtime would.

    The image's filesystem is the container's read-only root; its user, environment,
    working directory and entry point apply, ``args`` replace its command (as
    ``docker run IMAGE ARGS...``). The container shares the host's network and UTS
    namespaces (a local cluster's pod is a process group on this machine: its pod IP is
    one of the machine's addresses, its hostname the pod's). ``env_from_host`` names
    variables whose values podman copies from its own environment; ``entrypoint``
    replaces the image's (as ``--entrypoint``).
    """
    argv = [
        "run",
        "--rm",
        "--read-only",
        "--network=host",
        "--uts=host",
        f"--user={user or image.user or '0:0'}",
        f"--workdir={image.workdir}",
        *ulimits(),
    ]
    if name:
        argv += [f"--name={name}", "--replace"]
    for key, value in sorted((labels or {}).items()):
        argv.append(f"--label={key}={value}")
    argv += [f"--env={item}" for item in image.env]
    argv += [f"--env={key}={value}" for key, value in (env or {}).items()]
    argv += [f"--env={key}" for key in env_from_host]
    argv += [f"--tmpfs={path}" for path in tmpfs]
    argv += [bind.argument() for bind in binds]
    argv += ["--rootfs", str(image.rootfs)]
    argv += [*(image.entrypoint if entrypoint is None else entrypoint)]
    argv += [*(image.cmd if args is None else args)]
    return argv


# Where admission mounts a pod's ServiceAccount token (the kube-api-access volume).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Env the local node agent gives every container for in-cluster clients.
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
# Label of the containers a local cluster's pods started (value: the cluster's directory).
LABEL_CLUSTER = "dev.tpu-operator.cluster"


def pod_run_arguments(
    image: ImageConfig, container: Mapping[str, Any], cluster_dir: Path
) -> list[str]:
    """``podman run`` arguments that run ``image`` for one container of a pod template.

    The local node agent runs a container's command as a process on this machine, in the
    pod's mount namespace (its volumes and ServiceAccount token mounted at their paths)
    with the pod's env. Made that command, these arguments run the image the way a kubelet
    would: the container's volume mounts and the token passed into it, the container's
    env (by name: the agent resolves the values) and the in-cluster client env, the
    image's user and entry point; the pod template's ``args`` follow. ``$(POD_NAME)``, which
    the agent expands when the container declares it, names the container.
    """
    binds = [
        Bind(m["mountPath"], m["mountPath"], bool(m.get("readOnly")))
        for m in container.get("volumeMounts") or ()
    ]
    binds.append(Bind(SERVICE_ACCOUNT_DIR, SERVICE_ACCOUNT_DIR, read_only=True))
    env_names = [e["name"] for e in container.get("env") or ()]
    name = f"{container['name']}-$(POD_NAME)" if "POD_NAME" in env_names else None
    return run_arguments(
        image,
        [],
        binds=binds,
        env_from_host=[*env_names, *IN_CLUSTER_ENV],
        # One container per pod, replaced if a restarted container finds its predecessor.
        name=name,
        labels={LABEL_CLUSTER: str(cluster_dir)},
    )


# --- the container store and its tools ----------------------------------------------------


def store_root() -> Path:
    return binaries.cache_root() / "containers"


def run_root() -> Path:
    """Runtime state of the store (tmpfs /run, keyed by the store so two never share it)."""
    key = hashlib.sha256(str(store_root()).encode()).hexdigest()[:8]
    return Path("/run/tpu-operator") / f"containers-{key}"


def storage_flags() -> list[str]:
    return [
        "--root",
        str(store_root() / "storage"),
        "--runroot",
        str(run_root()),
        "--storage-driver",
        "vfs",
    ]


def podman_command() -> list[str]:
    """podman with this project's store, runc, cgroupfs, and no events journal."""
    return [
        shutil.which("podman") or "podman",
        *storage_flags(),
        "--runtime=runc",
        "--cgroup-manager=cgroupfs",
        "--events-backend=none",
        f"--tmpdir={run_root() / 'libpod'}",
    ]


def buildah_command() -> list[str]:
    return [shutil.which("buildah") or "buildah", *storage_flags()]


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def ensure_tools() -> None:
    """buildah, podman, runc and mmdebstrap from Debian's packages, installed if missing."""
    missing = missing_tools()
    if not missing:
        return
    packages = [TOOLS[tool] for tool in missing]
    if os.geteuid() != 0:
        raise ImageError(
            f"{', '.join(missing)} not installed and this user cannot install packages; "
            f"install them (Debian/Ubuntu: apt-get install {' '.join(packages)}) and run again"
        )
    log(f"installing {', '.join(packages)} from Debian's packages")
    started = time.monotonic()
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Another apt run on the machine (a parallel setup step) may hold the lock a while.
    wait = ["-o", "DPkg::Lock::Timeout=300"]
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(
            command, capture_output=True, text=True, env=environment, check=False
        )
        if result.returncode != 0:
            raise ImageError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    log(f"installed {', '.join(packages)} in {time.monotonic() - started:.0f} s")


def log(message: str) -> None:
    binaries.log(f"images: {message}")


@contextmanager
def store_lock() -> Iterator[None]:
    """One build into the store at a time, across processes."""
    root = store_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another process is building images; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: Sequence[str], what: str, log_name: str, timeout: float = 1800) -> str:
    logs = binaries.cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"image-{log_name}.log"
    with open(log_path, "w") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        result = subprocess.run(
            list(command), stdout=handle, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    if result.returncode != 0:
        tail = log_path.read_text().splitlines()[-30:]
        raise ImageError(
            f"{what} failed (exit {result.returncode}); log: {log_path}\n" + "\n".join(tail)
        )
    return log_path.read_text()


def podman(
    *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*podman_command(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise ImageError(f"podman {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


def inspect(reference: str) -> dict[str, Any] | None:
    result = podman("image", "inspect", reference, check=False)
    if result.returncode != 0:
        return None
    (document,) = json.loads(result.stdout)
    return document


def image_config(reference: str) -> ImageConfig:
    document = inspect(reference)
    if document is None:
        raise ImageError(f"no image {reference} in {store_root()}")
    rootfs = Path(podman("image", "mount", reference).stdout.strip())
    return ImageConfig.from_inspect(reference, document, rootfs)


# --- building -----------------------------------------------------------------------------


def ensure_base(image: str) -> str:
    """The base image in the store (a stand-in made from Debian's packages); its ID."""
    recipe = stand_in(image)
    existing = inspect(recipe.image)
    labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
    if existing is not None and labels.get(LABEL_STANDIN) == recipe.digest():
        return str(existing["Id"])
    with store_lock():
        existing = inspect(recipe.image)
        labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
        if existing is not None and labels.get(LABEL_STANDIN) == recipe.digest():
            return str(existing["Id"])
        log(
            f"making a stand-in for {image} from Debian {recipe.suite}'s packages "
            f"(Python {recipe.python}) with mmdebstrap"
        )
        started = time.monotonic()
        work = store_root() / "stand-in"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        tarball = work / "rootfs.tar"
        _run(
            ["mmdebstrap", *recipe.mmdebstrap_args(tarball)],
            f"mmdebstrap {recipe.suite}",
            "stand-in",
        )
        changes = [*STANDIN_CHANGES, f"LABEL {LABEL_STANDIN}={recipe.digest()}"]
        _run(
            [
                *podman_command(),
                "import",
                *(f"--change={change}" for change in changes),
                "--message",
                f"stand-in for {image}: Debian {recipe.suite} (mmdebstrap), Python {recipe.python}",
                str(tarball),
                recipe.image,
            ],
            f"podman import of the {image} stand-in",
            "stand-in-import",
        )
        shutil.rmtree(work, ignore_errors=True)
        document = inspect(recipe.image)
        assert document is not None
        log(f"stand-in for {image} made in {time.monotonic() - started:.0f} s")
        return str(document["Id"])


def ensure(spec: ImageSpec, repo: Path = REPO) -> ImageConfig:
    """The image of ``spec`` built from this checkout's Dockerfile, or the cached one."""
    ensure_tools()
    bases = base_images((repo / spec.dockerfile).read_text(), dict(spec.build_args))
    base_key = ",".join(ensure_base(base) for base in bases)
    digest = image_digest(spec, base_key, repo)
    tag = spec.tag(digest)
    if inspect(tag) is None:
        with store_lock():
            if inspect(tag) is None:
                _build(spec.name, tag, digest, repo / spec.dockerfile, repo, spec.build_args)
    return image_config(tag)


def ensure_derived(spec: DerivedSpec, repo: Path = REPO) -> ImageConfig:
    """The image of ``spec`` built FROM this checkout's build of its base, or the cached one."""
    base = ensure(spec.base, repo)
    digest = derived_digest(spec, base.image_id, repo)
    tag = spec.tag(digest)
    if inspect(tag) is None:
        with store_lock():
            if inspect(tag) is None:
                context = repo / spec.context
                arguments = ((spec.base_arg, base.reference),)
                _build(spec.name, tag, digest, context / "Dockerfile", context, arguments)
    return image_config(tag)


def _build(
    name: str,
    tag: str,
    digest: str,
    dockerfile: Path,
    context: Path,
    build_args: Sequence[tuple[str, str]],
) -> None:
    log(f"building {tag} from {dockerfile} with buildah (chroot isolation, vfs storage)")
    started = time.monotonic()
    command = [
        *buildah_command(),
        "build",
        "--isolation=chroot",
        "--pull=never",
        f"--file={dockerfile}",
        f"--tag={tag}",
        f"--label={LABEL_INPUTS}={digest}",
        *(f"--build-arg={key}={value}" for key, value in build_args),
        *build_trust_mounts(),
        str(context),
    ]
    _run(command, f"buildah build of {name}", f"build-{name}")
    config = image_config(tag)
    log(
        f"built {tag} in {time.monotonic() - started:.0f} s: "
        f"{config.size / 1e6:.0f} MB, {config.layers} layers"
    )
    _prune(name)


def build_trust_mounts() -> list[str]:
    """This machine's CA bundle for the build's RUN steps, and pip told to use it.

    A build behind a TLS-inspecting proxy (as on this project's test machines) reaches PyPI
    only with the proxy's CA, which the machine trusts and the base image does not; pip in
    a virtualenv takes its own bundle unless told. Both are mounted for the RUN steps only:
    nothing of either is committed into the image.
    """
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        return []
    pip_conf = store_root() / "build-pip.conf"
    pip_conf.write_text(f"[global]\ncert = {bundle}\n")
    return [f"--volume={bundle}:{bundle}:ro", f"--volume={pip_conf}:/etc/pip.conf:ro"]


def _prune(name: str) -> None:
    """Keep the newest KEEP_IMAGES images of a name; the store would grow with every change."""
    result = podman("images", "--format=json", f"--filter=reference=localhost/{name}", check=False)
    if result.returncode != 0 or not result.stdout.strip():
        return
    images = sorted(json.loads(result.stdout), key=lambda i: i.get("Created", 0), reverse=True)
    for old in images[KEEP_IMAGES:]:
        podman("rmi", "--force", old["Id"], check=False)


def remove_cluster_containers(cluster_dir: Path) -> list[str]:
    """Remove the containers a local cluster's pods left (``pod_run_arguments``).

    A pod's container stops with its podman on SIGTERM; one whose podman was killed
    (SIGKILL after the grace period, a crashed agent) runs on. Their IDs are returned.
    """
    listed = podman(
        "ps", "--all", "--quiet", f"--filter=label={LABEL_CLUSTER}={cluster_dir}", check=False
    )
    removed = listed.stdout.split()
    if removed:
        podman("rm", "--force", *removed, check=False)
    return removed


def report(config: ImageConfig) -> str:
    """One line on an image: reference, size, layers, user."""
    return (
        f"{config.reference}\t{config.size / 1e6:.0f} MB\t{config.layers} layers\t"
        f"user {config.user or 'root'}"
    )


# --- the operator as a virtualenv (demo, benchmarks) --------------------------------------


def operator_venv(repo: Path = REPO) -> Path:
    """A virtualenv with the operator installed as its image installs it; built if missing."""
    venv = binaries.cache_root() / "venvs" / f"operator-{sources_digest(repo)}"
    if (venv / "bin" / "tpu-operator").exists():
        return venv
    binaries.log(f"installing the operator as its image does into {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(
        ["sh", str(repo / "scripts" / "install-package.sh"), "operator", str(venv), str(repo)],
        check=True,
        timeout=900,
    )
    return venv
