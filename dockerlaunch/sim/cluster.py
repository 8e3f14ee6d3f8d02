"""Simulated cluster: N "hosts" on one machine, each a container running sshd and its own dockerd.

What kind is to Kubernetes: rehearse a multi-host launch for real (paramiko, known_hosts, docker
run --network host on each node, cross-node TCP) without GPU hosts. Works with no registry: the
base image is a local Debian image if there is one, else a pull, else debootstrap + docker import.
Everything it creates carries the label `dockerlaunch.sim=<cluster>` so `down` finds it all.
With `slurm=True` (`sim up --slurm`) the nodes come from a Slurm layer on the node image and run a real
Slurm (munged everywhere, slurmctld on node1, slurmd on every node), for rehearsing sbatch/srun launches.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import ipaddress
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from dockerlaunch.engine import cache_root as engine_cache_root
from dockerlaunch.engine import engine
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.images.index import file_sha256
from dockerlaunch.job.spec import NOFILE

SIM_LABEL = "dockerlaunch.sim"
NODE_LABEL = "dockerlaunch.sim.node"
ENGINE_LABEL = "dockerlaunch.sim.engine"  # the engine kind a node runs (ENGINES)
SLURM_LABEL = "dockerlaunch.sim.slurm"  # on the nodes of a `--slurm` cluster: "slurmctld,slurmd" or "slurmd"
# Light clusters (`sim up --light`): ROLE_LABEL is "engine" on an engine container and "light" on a light host;
# SERVED_BY_LABEL on a light host names the engine container whose dockerd it uses; ENGINE_INDEX_LABEL is k.
ROLE_LABEL = "dockerlaunch.sim.role"
SERVED_BY_LABEL = "dockerlaunch.sim.served-by"
ENGINE_INDEX_LABEL = "dockerlaunch.sim.engine-index"
BASE_TAG = "dockerlaunch/debian:bookworm"


@dataclass(frozen=True)
class EngineKind:
    """A Docker engine users run, as one Debian suite packages it (measured 2026-11-23, testbed.md)."""

    name: str
    suite: str  # the Debian suite whose docker.io the node image installs
    major: int  # docker.io's major version in that suite: a node image with another one is refused
    containerd_store: bool = False  # dockerd's "containerd-snapshotter" feature: images in containerd's store

    @property
    def base_tag(self) -> str:
        return f"dockerlaunch/debian:{self.suite}"

    @property
    def base_candidates(self) -> tuple[str, ...]:
        numbers = {"bookworm": ("debian:12",), "trixie": ("debian:13",)}.get(self.suite, ())
        return (f"debian:{self.suite}-slim", f"debian:{self.suite}", *numbers, self.base_tag)


# Debian 12 (bookworm): 20.10.24; Debian 13 (trixie): 26.1.5 + containerd 1.7; the development suite (sid):
# 28.5.2 + containerd 2.1 + runc 1.3. 28-containerd: the image store Docker 29 makes the default.
ENGINES = {
    "20.10": EngineKind("20.10", "bookworm", 20),
    "26": EngineKind("26", "trixie", 26),
    "28": EngineKind("28", "sid", 28),
    "28-containerd": EngineKind("28-containerd", "sid", 28, containerd_store=True),
}
DEFAULT_ENGINE = "20.10"
CONTAINERD_STORE_DAEMON_JSON = b'{"features": {"containerd-snapshotter": true}}\n'


def parse_engines(spec: str | None, nodes: int | None) -> list[EngineKind]:
    """Pure: `--engines 20.10,26,28` (one per node) or one kind for all -> the kind of each node."""
    names = [x.strip() for x in (spec or DEFAULT_ENGINE).split(",")]
    bad = [x for x in names if x not in ENGINES]
    if bad:
        raise SimError(f"engine {bad[0]!r}: use one of {', '.join(ENGINES)} (e.g. --engines 20.10,26,28,28-containerd)")
    if len(names) == 1 and nodes is not None:
        names = names * nodes
    elif nodes is not None and len(names) != nodes:
        raise SimError(f"--engines names {len(names)} engine(s) for {nodes} node(s): give one per node, "
                       "or leave --nodes out")
    return [ENGINES[x] for x in names]
DEFAULT_SUBNET = "172.30.0.0/24"
DEFAULT_LIGHT_SUBNET = "172.28.0.0/22"  # 1022 addresses: room for 512 light hosts and their engines
DEFAULT_NAME = "dlsim"
FIRST_HOST_OFFSET = 11  # node1 = .11, node2 = .12, ...
MAX_NODES = 64  # regular nodes: each runs a dockerd
MAX_LIGHT_NODES = 512  # light hosts: sshd only
MAX_LIGHT_ENGINES = 64
LIGHT_HOSTS_PER_ENGINE = 32  # the default engine count: one per 32 light hosts, at most LIGHT_DEFAULT_ENGINES_MAX
LIGHT_DEFAULT_ENGINES_MAX = 8
LIGHT_POOL = 16  # light hosts created, started and waited for this many at a time
LIGHT_SOCK_DIR = "/run/dlengine"  # where an engine's socket volume is mounted, in the engine and its hosts
# Every capability except SYS_RESOURCE: --privileged fails on VMs whose bounding set lacks it (testbed.md).
NODE_CAPS = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
    "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE "
    "AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ"
).split()
SEED_DIR_IN_NODE = "/var/cache/dockerlaunch-seed"
NODE_SHM = "2g"
# One volume mounted into every node: the cluster's shared storage (what NFS or Lustre is on real hosts), for
# models, datasets and checkpoints that every rank must see.
SHARED_DIR = "/shared"
SLURM_CONF = "/etc/slurm/slurm.conf"
MUNGE_KEY = "/etc/munge/munge.key"
SLURM_READY_TIMEOUT = 60.0


class SimError(DockerlaunchError):
    pass


_LOG = logging.getLogger(__name__)  # the CLI shows it (cli/main.py); library use and tests stay quiet


def _log(msg: str) -> None:
    _LOG.info("[sim] %s", msg)


def state_root() -> Path:
    return Path(os.environ.get("DOCKERLAUNCH_STATE_DIR", "~/.local/share/dockerlaunch")).expanduser() / "sim"


def cache_root() -> Path:
    """The simulator's own cache (seed tars, the demo wheelhouse)."""
    return engine_cache_root() / "sim"


@dataclass(frozen=True)
class SimNode:
    index: int  # 1-based
    name: str  # container name
    ip: str
    volume: str  # its /var/lib/docker ("" for a light host: it runs no dockerd)
    served_by: str | None = None  # a light host: the engine container whose dockerd it uses
    advertise_addr: str | None = None  # a light host: its engine's IP (job containers live in the engine's netns)


@dataclass(frozen=True)
class SimEngine:
    """An engine container of a light cluster: a node image running dockerd (no host of the config), shared by
    the light hosts it serves through its socket volume."""

    index: int  # 1-based
    name: str  # container name: {cluster}-engine{k}
    ip: str
    volume: str  # its /var/lib/docker
    sock_volume: str  # its dockerd socket, mounted at LIGHT_SOCK_DIR in it and in its hosts
    hosts: tuple[int, ...]  # the indexes of the light hosts it serves


_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,39}$")


def check_name(cluster: str) -> str:
    """A cluster name becomes container, network and volume names and a folder under the state dir."""
    if not _NAME.match(cluster or "") or ".." in cluster:
        raise SimError(f"--name {cluster!r}: use letters, digits, '_', '.', '-' (start with a letter or digit, "
                       "at most 40)")
    return cluster


def node_layout(cluster: str, nodes: int, subnet: str) -> list[SimNode]:
    """Pure: names and fixed IPs of the nodes."""
    check_name(cluster)
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    if nodes < 1:
        raise SimError("--nodes must be at least 1")
    if FIRST_HOST_OFFSET - 1 + nodes > len(hosts):
        raise SimError(f"subnet {subnet} is too small for {nodes} nodes")
    return [
        SimNode(
            index=i,
            name=f"{cluster}-node{i}",
            ip=str(hosts[FIRST_HOST_OFFSET - 2 + i]),
            volume=f"{cluster}-node{i}-docker",
        )
        for i in range(1, nodes + 1)
    ]


def default_light_engines(nodes: int) -> int:
    """Pure: one engine per LIGHT_HOSTS_PER_ENGINE light hosts, at least 1, at most LIGHT_DEFAULT_ENGINES_MAX."""
    return max(1, min(LIGHT_DEFAULT_ENGINES_MAX, -(-nodes // LIGHT_HOSTS_PER_ENGINE)))


def light_layout(cluster: str, nodes: int, subnet: str, engines: int | None = None
                 ) -> tuple[list[SimNode], list[SimEngine]]:
    """Pure: a light cluster's hosts and engines. Host i has the address a regular node i would (.11 for host 1);
    the engines take the addresses right after the last host; host i is served by engine ((i-1) % E) + 1."""
    check_name(cluster)
    if nodes < 1:
        raise SimError("--nodes must be at least 1")
    if nodes > MAX_LIGHT_NODES:
        raise SimError(f"--nodes {nodes}: a light cluster has at most {MAX_LIGHT_NODES} hosts")
    count = default_light_engines(nodes) if engines is None else engines
    if not 1 <= count <= min(nodes, MAX_LIGHT_ENGINES):
        raise SimError(f"--light-engines {count}: give 1 to {min(nodes, MAX_LIGHT_ENGINES)} for {nodes} light "
                       "host(s) (at most one engine per host)")
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as e:
        raise SimError(f"--subnet {subnet!r}: {e}") from None
    addresses = list(net.hosts())
    need = FIRST_HOST_OFFSET - 1 + nodes + count
    if need > len(addresses):
        raise SimError(f"subnet {subnet} is too small for {nodes} light hosts and {count} engine(s): they need "
                       f"{need} addresses (host 1 is the {FIRST_HOST_OFFSET}th), it has {len(addresses)}; "
                       f"give a larger one, e.g. --subnet {DEFAULT_LIGHT_SUBNET}")
    engine_list = [
        SimEngine(
            index=k,
            name=f"{cluster}-engine{k}",
            ip=str(addresses[FIRST_HOST_OFFSET - 2 + nodes + k]),
            volume=f"{cluster}-engine{k}-docker",
            sock_volume=f"{cluster}-engine{k}-sock",
            hosts=tuple(range(k, nodes + 1, count)),
        )
        for k in range(1, count + 1)
    ]
    hosts = []
    for i in range(1, nodes + 1):
        served = engine_list[(i - 1) % count]
        hosts.append(SimNode(index=i, name=f"{cluster}-node{i}", ip=str(addresses[FIRST_HOST_OFFSET - 2 + i]),
                             volume="", served_by=served.name, advertise_addr=served.ip))
    return hosts, engine_list


def network_name(cluster: str) -> str:
    return f"{cluster}-net"


# ---------------------------------------------------------------- keys


def _new_ed25519() -> tuple[bytes, str]:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _add_bytes(
    tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int = 0, uid: int = 0, gid: int = 0
) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, mtime, uid, gid
    tar.addfile(info, io.BytesIO(data))


def _tar_of(files: dict[str, tuple[bytes, int] | tuple[bytes, int, int, int]]) -> bytes:
    """A tar for put_archive: name -> (data, mode) or (data, mode, uid, gid); docker keeps the numeric owner."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode, *owner) in files.items():
            _add_bytes(tar, name, data, mode, int(time.time()), *owner)
    return buf.getvalue()


def _asset(name: str) -> bytes:
    return resources.files("dockerlaunch.sim.assets").joinpath(name).read_bytes()


def _image_exists(client, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(client, requested: str | None = None, kind: EngineKind | None = None) -> str:
    """A Debian image of the kind's suite (bookworm by default): the requested one, a local one, a pulled one,
    or one made by debootstrap (cached as an image, so the next `sim up` does not debootstrap again)."""
    kind = kind or ENGINES[DEFAULT_ENGINE]
    if requested:
        if _image_exists(client, requested):
            return requested
        try:
            client.images.pull(requested)
            return requested
        except Exception as e:
            raise SimError(f"base image {requested} is not local and cannot be pulled ({str(e)[:120]})") from None
    for ref in kind.base_candidates:
        if _image_exists(client, ref):
            return ref
    try:
        _log(f"pulling {kind.base_candidates[0]}")
        client.images.pull(kind.base_candidates[0])
        return kind.base_candidates[0]
    except Exception:
        _log(f"no registry reachable; making a Debian {kind.suite} base image with debootstrap")
    return debootstrap_base(client, kind.base_tag, kind.suite)


def debootstrap_base(client, tag: str = BASE_TAG, suite: str = "bookworm") -> str:
    from dockerlaunch.errors import DockerlaunchError
    from dockerlaunch.images.base import debootstrap_rootfs

    with tempfile.TemporaryDirectory(prefix="dockerlaunch-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        t0 = time.monotonic()
        try:
            debootstrap_rootfs(suite, root)
        except DockerlaunchError as e:
            raise SimError(f"no Debian {suite} base image and no registry: {e}") from None
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        try:
            client.api.import_image_from_stream(tar.stdout, repository=tag.split(":")[0], tag=tag.split(":")[1])
        finally:
            tar.stdout.close()
            tar.wait()
        _log(f"base image {tag} made by debootstrap in {time.monotonic() - t0:.0f}s")
    return tag


def _build(
    client, dockerfile: str, base: str, repo: str, extra: tuple[str, ...] = (),
    disk: dict[str, Path] | None = None, buildargs: dict[str, str] | None = None,
) -> str:
    """Build a sim image once; its tag hashes every input, so a changed asset or wheel rebuilds.

    `extra` are package assets; `disk` maps context names to local files (e.g. wheels/x.whl).
    """
    base_id = client.images.get(base).id
    files = {dockerfile: _asset(dockerfile), **{n: _asset(n) for n in extra}}
    disk = disk or {}
    digest = hashlib.sha256(base_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    for name in sorted(disk):
        st = disk[name].stat()
        digest.update(f"{name}\0{st.st_size}\0{file_sha256(disk[name])}".encode())
    for k, v in sorted((buildargs or {}).items()):
        digest.update(f"{k}={v}".encode())
    tag = f"{repo}:{digest.hexdigest()[:12]}"
    if _image_exists(client, tag):
        return tag
    _log(f"building {tag} from {base}")
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, data in files.items():
                _add_bytes(tar, name, data, 0o755 if name.endswith(".sh") else 0o644)
            for name, path in disk.items():
                tar.add(str(path), arcname=name)
        context.seek(0)
        try:
            stream = client.api.build(
                fileobj=context, custom_context=True, dockerfile=dockerfile, tag=tag,
                buildargs={"BASE": base, **(buildargs or {})}, network_mode="host", rm=True, forcerm=True,
                decode=True,
            )
            last: list[str] = []
            for chunk in stream:
                if "error" in chunk:
                    raise SimError(f"building {repo} failed: {chunk['error'].strip()} ({' | '.join(last[-3:])})")
                if chunk.get("stream", "").strip():
                    last.append(chunk["stream"].strip())
        except SimError:
            raise
        except Exception as e:
            raise SimError(f"building {repo} failed: {str(e)[:200]}") from None
    return tag


DEMO_TORCH = "2.13.0"
DEMO_PYTHON = "3.11"  # Debian bookworm's python3
DEMO_NUMPY = "numpy>=1.26,<3"  # torch warns at import without it
DEMO_PYSPY = "py-spy>=0.4,<0.5"  # `dockerlaunch dump` uses the image's own where there is one


def fetch_demo_wheels(dest: Path | None = None) -> Path:
    """torch (CPU) and its dependencies as wheels for the image's Python, via this machine's pip."""
    dest = dest or cache_root() / "wheelhouse-demo"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
        "--python-version", DEMO_PYTHON, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
        "--platform", "any", "-d", str(dest), f"torch=={DEMO_TORCH}", DEMO_NUMPY, DEMO_PYSPY,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errs = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
        raise SimError(f"downloading torch=={DEMO_TORCH} wheels failed: {' '.join(errs)[:300]}")
    return dest


def build_demo_image(base: str | None = None, wheelhouse: Path | None = None) -> str:
    """The demo job image (torch CPU, py-spy + all_reduce script), built with no network for pip."""
    client = engine()
    base_ref = ensure_base_image(client, base)
    wheels = wheelhouse or fetch_demo_wheels()
    disk = {f"wheels/{p.name}": p for p in sorted(Path(wheels).glob("*.whl"))}
    if not any(name.startswith("wheels/torch-") for name in disk):
        raise SimError(f"no torch wheel in {wheels}")
    return _build(client, "demo.Dockerfile", base_ref, "dockerlaunch/demo-torch", ("allreduce.py",), disk,
                  {"TORCH_VERSION": DEMO_TORCH, "NUMPY": DEMO_NUMPY, "PYSPY": DEMO_PYSPY})


def ensure_images(client, base: str | None = None, kinds: list[EngineKind] | None = None
                  ) -> tuple[dict[str, str], str]:
    """The node image of each engine kind (`base` is the bookworm base, for 20.10 nodes) and the tools image.
    Each suite's base and node image are made concurrently (debootstrap and apt wait on the network)."""
    kinds = kinds or [ENGINES[DEFAULT_ENGINE]]
    bookworm = ensure_base_image(client, base)
    suites = {k.suite: k for k in kinds}

    def node_image(kind: EngineKind) -> str:
        base_ref = bookworm if kind.suite == "bookworm" else ensure_base_image(client, None, kind)
        return _build(client, "node.Dockerfile", base_ref, "dockerlaunch/sim-node", ("entrypoint.sh", "sshd.conf"),
                      buildargs={"DOCKER_MAJOR": str(kind.major)})

    with cf.ThreadPoolExecutor(max_workers=len(suites)) as pool:
        by_suite = dict(zip(suites, pool.map(node_image, suites.values())))
    tools = _build(client, "tools.Dockerfile", bookworm, "dockerlaunch/sim-tools")
    return {k.name: by_suite[k.suite] for k in kinds}, tools


def ensure_slurm_image(client, node_image: str) -> str:
    """The node image plus Slurm (slurmctld, slurmd, client commands) and munge; built only for `--slurm`."""
    return _build(client, "slurm.Dockerfile", node_image, "dockerlaunch/sim-slurm", ("slurm-start.sh",))


def _seed_tarball(client, image: str) -> Path:
    """`docker save` of the image, cached on disk once, bind-mounted read-only into every node."""
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / (image.replace("/", "_").replace(":", "_") + ".tar")
    if not path.exists():
        tmp = path.with_suffix(".part")
        with open(tmp, "wb") as f:
            # named=image: the tag asked for (named=True would take the image's first tag, another one where
            # two tags share an image ID, and the node would lack this one)
            for chunk in client.images.get(image).save(named=image):
                f.write(chunk)
        tmp.rename(path)
    return path


# ---------------------------------------------------------------- lifecycle


def _cluster_containers(client, cluster: str | None = None, sparse: bool = False):
    """The cluster's containers (every cluster's with None); `sparse`: ids and names only, without one inspect
    per container."""
    label = SIM_LABEL if cluster is None else f"{SIM_LABEL}={cluster}"
    return client.containers.list(all=True, filters={"label": label}, sparse=sparse)


def up(
    nodes: int | None = None,
    cluster: str = DEFAULT_NAME,
    subnet: str | None = None,
    config_out: str | None = None,
    base_image: str | None = None,
    egress_rate: str | None = None,
    seed_images: tuple[str, ...] = (),
    ready_timeout: float = 90.0,
    slurm: bool = False,
    slurm_timeout: float = SLURM_READY_TIMEOUT,
    engines: str | None = None,
    light: bool = False,
    light_engines: int | None = None,
) -> Path:
    """Start the cluster and return the path of the cluster config it wrote.

    `engines`: the Docker engine of each node ("20.10,26,28,28-containerd", one per node, or one kind for all;
    ENGINES); `nodes` defaults to one per named engine, else 2. With `slurm`, the nodes also run Slurm:
    munged everywhere, slurmctld on node1, slurmd on every node, one partition of all nodes; `up` returns
    once sinfo says every node is idle. `subnet` defaults to DEFAULT_SUBNET (DEFAULT_LIGHT_SUBNET with `light`).

    With `light`, the hosts are light hosts (sshd only, up to MAX_LIGHT_NODES) served by `light_engines` engine
    containers (default: default_light_engines), each running one dockerd that several hosts share: see up_light.
    """
    if light:
        if slurm:
            raise SimError("--light cannot run Slurm: use regular nodes for --slurm")
        if egress_rate:
            raise SimError("--light cannot shape egress (job traffic leaves from the engines, shared by several "
                           "hosts): use regular nodes for --egress-rate")
        return up_light(nodes=nodes if nodes is not None else 2, cluster=cluster,
                        subnet=subnet or DEFAULT_LIGHT_SUBNET, config_out=config_out, base_image=base_image,
                        seed_images=seed_images, ready_timeout=ready_timeout, engine_kind=engines,
                        light_engines=light_engines)
    if light_engines is not None:
        raise SimError("--light-engines is for light clusters: add --light")
    subnet = subnet or DEFAULT_SUBNET

    named = len((engines or DEFAULT_ENGINE).split(","))
    kinds = parse_engines(engines, nodes if nodes is not None else (None if named > 1 else 2))
    nodes = len(kinds)
    if nodes > MAX_NODES:
        raise SimError(f"--nodes {nodes}: at most {MAX_NODES} regular nodes (each runs a dockerd); "
                       f"--light gives up to {MAX_LIGHT_NODES} hosts")
    if slurm and len({k.name for k in kinds}) > 1:
        raise SimError("--slurm needs the same engine on every node (one Slurm version across the cluster)")
    layout = node_layout(cluster, nodes, subnet)
    client = engine()
    existing = _cluster_containers(client, cluster)
    if existing:
        raise SimError(
            f"sim cluster {cluster!r} already exists ({len(existing)} node(s)); run `dockerlaunch sim down` first"
        )
    if egress_rate:
        parse_rate(egress_rate)
    node_images, tools_image = ensure_images(client, base_image, kinds)
    if slurm:
        node_images = {k: ensure_slurm_image(client, v) for k, v in node_images.items()}
    seeds = [_seed_tarball(client, tools_image)] + [_seed_tarball(client, s) for s in seed_images]

    state, public = _new_state(cluster)
    labels = {SIM_LABEL: cluster}
    net = _new_network(client, cluster, subnet, labels)

    known_hosts: list[str] = []
    try:
        shared = client.volumes.create(f"{cluster}-shared", labels=labels)
        for n, kind in zip(layout, kinds):
            host_private, host_public = _new_ed25519()
            known_hosts.append(f"{n.ip} {host_public}")
            client.volumes.create(n.volume, labels=labels)
            node_labels = {**labels, NODE_LABEL: str(n.index), ENGINE_LABEL: kind.name}
            if slurm:
                node_labels[SLURM_LABEL] = "slurmctld,slurmd" if n.index == 1 else "slurmd"
            container = client.containers.create(
                node_images[kind.name],
                name=n.name,
                hostname=f"node{n.index}",
                # Slurm names nodes by hostname (srun, job output, node lists): every node resolves every other
                extra_hosts={f"node{m.index}": m.ip for m in layout if m is not n} if slurm else None,
                labels=node_labels,
                **_engine_options(n.volume, shared.name),
                network=net.name,
                detach=True,
            )
            net.disconnect(container)
            net.connect(container, ipv4_address=n.ip)
            files = {
                "etc/ssh/ssh_host_ed25519_key": (host_private, 0o600),
                "etc/ssh/ssh_host_ed25519_key.pub": (host_public.encode() + b"\n", 0o644),
                "root/.ssh/authorized_keys": (public.encode() + b"\n", 0o600),
            }
            if kind.containerd_store:  # what a user writes to turn it on (Docker 29 has it on by default)
                files["etc/docker/daemon.json"] = (CONTAINERD_STORE_DAEMON_JSON, 0o644)
            container.put_archive("/", _tar_of(files))
            container.start()
        (state / "known_hosts").write_text("\n".join(known_hosts) + "\n")
        with cf.ThreadPoolExecutor(max_workers=len(layout)) as pool:
            list(pool.map(lambda n: _wait_ready(client, n, ready_timeout), layout))
            list(pool.map(lambda n: _seed(client, n, seeds), layout))
        if slurm:
            start_slurm(client, cluster, layout, slurm_timeout)
        if egress_rate:
            shape(cluster, egress_rate)
    except BaseException:
        _log("start failed; removing what was created")
        down(cluster, quiet=True)
        raise

    out = _write_config(client, cluster, layout, layout[0].name, state, tools_image, config_out)
    _log(f"{nodes} node(s) up{' with Slurm' if slurm else ''}: {', '.join(n.ip for n in layout)}; config: {out}")
    return out


def _engine_options(data_volume: str, shared_volume: str, more_volumes: dict | None = None) -> dict:
    """What a Docker-in-Docker engine container needs from the local engine (testbed.md)."""
    return {
        "cap_add": NODE_CAPS,
        "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
        "cgroupns": "host",
        "device_cgroup_rules": ["a *:* rwm"],
        "volumes": {
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            data_volume: {"bind": "/var/lib/docker", "mode": "rw"},
            **(more_volumes or {}),
            shared_volume: {"bind": SHARED_DIR, "mode": "rw"},
            str(cache_root()): {"bind": SEED_DIR_IN_NODE, "mode": "ro"},
        },
        "init": True,
        "shm_size": NODE_SHM,  # job containers use --ipc host: they share the engine's /dev/shm
    }


def _new_state(cluster: str) -> tuple[Path, str]:
    """The cluster's state folder with a fresh user key; returns it and the public key."""
    state = state_root() / cluster
    state.mkdir(parents=True, exist_ok=True)
    private, public = _new_ed25519()
    _write_private(state / "id_ed25519", private)
    (state / "id_ed25519.pub").write_text(public + f" dockerlaunch-sim-{cluster}\n")
    return state, public


def _new_network(client, cluster: str, subnet: str, labels: dict):
    import docker

    try:
        return client.networks.create(
            network_name(cluster), driver="bridge", labels=labels,
            ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)]),
        )
    except docker.errors.APIError as e:
        raise SimError(f"cannot create network {network_name(cluster)} on {subnet}: {e.explanation}") from None


def _write_config(client, cluster: str, hosts, engine_name: str, state: Path, tools_image: str,
                  config_out: str | None) -> Path:
    """The cluster's config, with the open-files limit its engines can give (see engine_nofile)."""
    out = Path(config_out) if config_out else state / "cluster.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    nofile = engine_nofile(client.containers.get(engine_name))
    out.write_text(render_cluster_config(cluster, hosts, state, tools_image, nofile))
    return out


def _pooled_client():
    """A second client to the local engine whose connection pool fits LIGHT_POOL threads (the default pool of 10
    connections would be outgrown, and urllib3 warns on each connection it then drops)."""
    import docker

    engine()  # the one-line error when there is no engine
    return docker.from_env(timeout=600, max_pool_size=LIGHT_POOL + 4)


def _fixed_ip(client, net, ip: str) -> dict:
    return {"network": net.name,
            "networking_config": {net.name: client.api.create_endpoint_config(ipv4_address=ip)}}


def up_light(
    nodes: int,
    cluster: str = DEFAULT_NAME,
    subnet: str = DEFAULT_LIGHT_SUBNET,
    config_out: str | None = None,
    base_image: str | None = None,
    seed_images: tuple[str, ...] = (),
    ready_timeout: float = 90.0,
    engine_kind: str | None = None,
    light_engines: int | None = None,
) -> Path:
    """A light cluster: `nodes` light hosts (sshd only, each with its own IP, host key and OpenSSH's default
    limits) served by E engine containers (dockerd, Docker-in-Docker as regular nodes). Host i's
    /var/run/docker.sock is engine ((i-1) % E) + 1's socket, so the docker CLI over SSH on it drives that engine.
    The config gives each host its engine's IP as advertise_addr: job containers use --network host, so they
    live in the engine's network namespace. Returns the path of the cluster config."""

    kinds = parse_engines(engine_kind, None)
    if len({k.name for k in kinds}) > 1:
        raise SimError("--light takes one engine kind for the whole cluster (e.g. --engine 26), not a list")
    kind = kinds[0]
    hosts, engine_list = light_layout(cluster, nodes, subnet, light_engines)
    t0 = time.monotonic()
    client = _pooled_client()
    existing = _cluster_containers(client, cluster, sparse=True)
    if existing:
        raise SimError(
            f"sim cluster {cluster!r} already exists ({len(existing)} container(s)); run `dockerlaunch sim down` first"
        )
    node_images, tools_image = ensure_images(client, base_image, [kind])
    image = node_images[kind.name]
    seeds = [_seed_tarball(client, tools_image)] + [_seed_tarball(client, s) for s in seed_images]

    state, public = _new_state(cluster)
    authorized = public.encode() + b"\n"
    labels = {SIM_LABEL: cluster}
    net = _new_network(client, cluster, subnet, labels)

    def keyed(container, ip: str, is_engine: bool) -> str:
        """Give the container its own host key and the cluster's user key; return its known_hosts line."""
        host_private, host_public = _new_ed25519()
        files = {
            "etc/ssh/ssh_host_ed25519_key": (host_private, 0o600),
            "etc/ssh/ssh_host_ed25519_key.pub": (host_public.encode() + b"\n", 0o644),
            "root/.ssh/authorized_keys": (authorized, 0o600),
        }
        if kind.containerd_store and is_engine:
            files["etc/docker/daemon.json"] = (CONTAINERD_STORE_DAEMON_JSON, 0o644)
        container.put_archive("/", _tar_of(files))
        return f"{ip} {host_public}"

    def start_engine(e: SimEngine) -> str:
        client.volumes.create(e.volume, labels=labels)
        client.volumes.create(e.sock_volume, labels=labels)
        container = client.containers.create(
            image,
            name=e.name,
            hostname=f"engine{e.index}",
            labels={**labels, ROLE_LABEL: "engine", ENGINE_INDEX_LABEL: str(e.index), ENGINE_LABEL: kind.name},
            environment={"DOCKERD_EXTRA_ARGS": f"-H unix:///var/run/docker.sock -H unix://{LIGHT_SOCK_DIR}/docker.sock"},
            **_engine_options(e.volume, shared.name, {e.sock_volume: {"bind": LIGHT_SOCK_DIR, "mode": "rw"}}),
            detach=True,
            **_fixed_ip(client, net, e.ip),
        )
        line = keyed(container, e.ip, True)
        container.start()
        return line

    def start_host(n: SimNode) -> str:
        container = client.containers.create(
            image,
            name=n.name,
            hostname=f"node{n.index}",
            labels={**labels, NODE_LABEL: str(n.index), ENGINE_LABEL: kind.name, ROLE_LABEL: "light",
                    SERVED_BY_LABEL: n.served_by},
            environment={"SIM_LIGHT": "1"},
            volumes={
                f"{n.served_by}-sock": {"bind": LIGHT_SOCK_DIR, "mode": "rw"},
                shared.name: {"bind": SHARED_DIR, "mode": "rw"},  # doctor checks mount sources on the SSH host
                # the engine's docker root, read-only: `df` of DockerRootDir on the SSH host (doctor's disk row)
                # gives the free space its engine really has
                f"{n.served_by}-docker": {"bind": "/var/lib/docker", "mode": "ro"},
            },
            init=True,
            detach=True,
            **_fixed_ip(client, net, n.ip),
        )
        line = keyed(container, n.ip, False)
        container.start()
        return line

    try:
        shared = client.volumes.create(f"{cluster}-shared", labels=labels)
        with cf.ThreadPoolExecutor(max_workers=LIGHT_POOL) as pool:
            engine_lines = list(pool.map(start_engine, engine_list))
            host_lines = list(pool.map(start_host, hosts))
            (state / "known_hosts").write_text("\n".join(host_lines + engine_lines) + "\n")
            _log(f"{len(engine_list)} engine(s) and {len(hosts)} light host(s) started in "
                 f"{time.monotonic() - t0:.0f}s; waiting for sshd and dockerd")
            engine_nodes = [SimNode(e.index, e.name, e.ip, e.volume) for e in engine_list]
            list(pool.map(lambda n: _wait_ready(client, n, ready_timeout), engine_nodes))
            list(pool.map(lambda n: _wait_ready(client, n, ready_timeout, dockerd=False), hosts))
            list(pool.map(lambda n: _seed(client, n, seeds), engine_nodes))
            # one host per engine: its plain `docker` reaches its engine through the socket volume
            list(pool.map(lambda e: _check_served(client, hosts[e.hosts[0] - 1], e), engine_list))
    except BaseException:
        _log("start failed; removing what was created")
        down(cluster, quiet=True)
        raise

    out = _write_config(client, cluster, hosts, engine_list[0].name, state, tools_image, config_out)
    _log(f"{len(hosts)} light host(s) up ({hosts[0].ip} .. {hosts[-1].ip}), served by {len(engine_list)} "
         f"engine(s) ({', '.join(e.ip for e in engine_list)}) in {time.monotonic() - t0:.0f}s; config: {out}")
    return out


def _check_served(client, host: SimNode, e: SimEngine) -> None:
    """The light host's docker CLI answers with its engine's daemon (named by the engine's hostname)."""
    code, out = client.containers.get(host.name).exec_run(["docker", "info", "--format", "{{.Name}}"])
    text = out.decode(errors="replace").strip()
    if code != 0 or text != f"engine{e.index}":
        raise SimError(f"light host {host.name}: `docker info` should answer from {e.name}, got ({code}) {text[:200]}")


def light_engines(cluster: str = DEFAULT_NAME) -> list[tuple[str, str, list[int]]]:
    """A light cluster's engines: (engine container name, engine IP, [indexes of the hosts it serves]), by k.
    Run a container straight on engine k with `docker exec {cluster}-engine{k} docker run ...`."""
    check_name(cluster)
    client = engine()
    containers = _cluster_containers(client, cluster)
    served: dict[str, list[int]] = {}
    for c in containers:
        if c.labels.get(ROLE_LABEL) == "light":
            served.setdefault(c.labels.get(SERVED_BY_LABEL, "?"), []).append(int(c.labels.get(NODE_LABEL, "0")))
    rows = []
    for c in containers:
        if c.labels.get(ROLE_LABEL) == "engine":
            rows.append((int(c.labels.get(ENGINE_INDEX_LABEL, "0")), c.name, _container_ip(c),
                         sorted(served.get(c.name, []))))
    return [(name, ip, idx) for _, name, ip, idx in sorted(rows)]


def _container_ip(c) -> str:
    nets = c.attrs.get("NetworkSettings", {}).get("Networks", {})
    return next((v.get("IPAddress") for v in nets.values() if v.get("IPAddress")), "-")


def engine_nofile(container) -> int | None:
    """The open-files hard limit of a node's dockerd: an engine without CAP_SYS_RESOURCE (these nodes) cannot give
    a container more, and refuses the launcher's default (job/spec.NOFILE) at start."""
    code, out = container.exec_run(["sh", "-c", 'grep "^Max open files" "/proc/$(pidof dockerd)/limits"'])
    words = out.decode(errors="replace").split()
    return int(words[-2]) if code == 0 and len(words) >= 2 and words[-2].isdigit() else None


def render_cluster_config(cluster: str, layout: list[SimNode], state: Path, image: str,
                          nofile: int | None = None) -> str:
    data = {
        # a light host: advertise_addr is its engine's IP, where its job containers (--network host) listen
        "hosts": [{"address": n.ip, **({"advertise_addr": n.advertise_addr} if n.advertise_addr else {})}
                  for n in layout],
        "ssh": {
            "user": "root",
            "identity_file": str(state / "id_ed25519"),
            "known_hosts": str(state / "known_hosts"),
            "host_key_policy": "strict",
            "config_file": None,
        },
        "image": image,
        # Sim nodes have no GPUs or InfiniBand, and these VMs refuse memlock=-1 (testbed.md); /shared is one
        # volume in every node; no model hub answers from the nodes.
        "container": {"gpus": "none", "infiniband": "off",
                      "mounts": [{"source": SHARED_DIR, "target": SHARED_DIR, "shared": True}]},
        "job": {"name": f"{cluster}-job", "offline": True},
    }
    if nofile is not None and nofile < NOFILE.hard:  # the nodes' dockerd cannot raise its own open-files limit
        data["container"]["ulimits"] = {"nofile": str(nofile)}
    header = f"# Written by `dockerlaunch sim up` for sim cluster {cluster!r}; host keys pinned at creation.\n"
    engines = {n.served_by for n in layout if n.served_by}
    if engines:
        header += (f"# Light cluster: {len(layout)} hosts run sshd only; their docker CLI drives one of "
                   f"{len(engines)} shared engine(s), whose IP is each host's advertise_addr.\n")
    return header + yaml.safe_dump(data, sort_keys=False)


# ---------------------------------------------------------------- slurm

# What `slurmd -C` reports that slurm.conf takes for a node (RealMemory is left out: every node shares this
# machine's memory, and nothing here is scheduled by memory).
_HW_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")


def parse_slurmd_hw(text: str) -> dict[str, str]:
    """The hardware fields of `slurmd -C` ("NodeName=x CPUs=2 Boards=1 ... RealMemory=...")."""
    fields = dict(kv.split("=", 1) for kv in text.split() if "=" in kv)
    hw = {k: fields[k] for k in _HW_KEYS if k in fields}
    if not hw.get("CPUs", "").isdigit():
        raise SimError(f"`slurmd -C` gave no CPU count: {text.strip()[:200]!r}")
    return hw


def render_slurm_conf(cluster: str, layout: list[SimNode], hw: dict[str, str]) -> str:
    """Pure: slurm.conf for a sim cluster whose nodes are unprivileged containers on one machine."""
    hw_text = " ".join(f"{k}={v}" for k, v in hw.items())
    name = re.sub(r"[^a-z0-9]", "", cluster.lower())[:30] or "sim"
    ctld = layout[0]
    lines = [
        f"# Written by `dockerlaunch sim up --slurm` for sim cluster {cluster!r}.",
        f"ClusterName={name}",
        f"SlurmctldHost=node{ctld.index}({ctld.ip})",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        # The nodes are containers without systemd or a delegated cgroup: track a job's processes by
        # parentage, bind nothing, gather no accounting, keep no database.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # The submitter's rlimits cannot all be raised in an unprivileged node (memlock: testbed.md)
        "PropagateResourceLimits=NONE",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        "MailProg=/bin/true",  # no mail here; the default (/usr/bin/mail) is absent and slurmctld logs an error
    ]
    lines += [f"NodeName=node{n.index} NodeAddr={n.ip} {hw_text} State=UNKNOWN" for n in layout]
    lines.append("PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _exec(container, cmd: list[str], what: str) -> str:
    code, out = container.exec_run(cmd)
    text = out.decode(errors="replace")
    if code != 0:
        raise SimError(f"node {container.name}: {what} failed ({code}): {text.strip()[-300:]}")
    return text


def start_slurm(client, cluster: str, layout: list[SimNode], timeout: float = SLURM_READY_TIMEOUT) -> None:
    """One munge key and one slurm.conf into every node, then munged, slurmctld (node1) and slurmd; wait for idle."""
    t0 = time.monotonic()
    containers = [client.containers.get(n.name) for n in layout]
    first = containers[0]
    hw = parse_slurmd_hw(_exec(first, ["slurmd", "-C"], "slurmd -C").splitlines()[0])
    uid, gid = (int(x) for x in _exec(first, ["sh", "-c", "id -u munge; id -g munge"], "id munge").split())
    conf = render_slurm_conf(cluster, layout, hw).encode()
    key = secrets.token_bytes(1024)  # what `mungekey` makes: 1024 random bytes
    archive = _tar_of({SLURM_CONF: (conf, 0o644), MUNGE_KEY: (key, 0o400, uid, gid)})
    for c in containers:
        c.put_archive("/", archive)
    _exec(first, ["sim-slurm-start", "ctld"], "starting munged and slurmctld")
    with cf.ThreadPoolExecutor(max_workers=len(containers)) as pool:
        list(pool.map(lambda c: _exec(c, ["sim-slurm-start", "slurmd"], "starting slurmd"), containers))
    _wait_slurm_idle(containers, layout, timeout)
    _log(f"Slurm: {len(layout)} node(s) idle in {time.monotonic() - t0:.1f}s (partition sim, slurmctld on node1)")


def slurm_node_states(container) -> dict[str, str] | None:
    """sinfo's state of each node, asked on a node of the cluster (None if sinfo does not answer in 3 s: it
    retries for about 10 s when slurmctld is down)."""
    code, out = container.exec_run(["timeout", "3", "sinfo", "--noheader", "--Node", "--format", "%N %T"])
    if code != 0:
        return None
    states: dict[str, str] = {}
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _wait_slurm_idle(containers, layout: list[SimNode], timeout: float) -> None:
    want = {f"node{n.index}" for n in layout}
    deadline = time.monotonic() + timeout
    states: dict[str, str] | None = None
    while time.monotonic() < deadline:
        states = slurm_node_states(containers[0])
        if states is not None and set(states) == want and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    logs = []
    for c, n in zip(containers, layout):
        if states is None or states.get(f"node{n.index}") != "idle":
            files = "/var/log/slurm/slurmd.log" + (" /var/log/slurm/slurmctld.log" if n.index == 1 else "")
            tail = c.exec_run(["sh", "-c", f"tail -q -n 2 {files} 2>&1"])[1].decode(errors="replace")
            logs.append(f"node{n.index}: " + " / ".join(line[:200] for line in tail.strip().splitlines()))
    raise SimError(f"Slurm not ready after {timeout:.0f}s: sinfo says {states or 'nothing'}; "
                   f"log tails (/var/log/slurm in the nodes): {' | '.join(logs)}")


def _wait_ready(client, node: SimNode, timeout: float, dockerd: bool = True) -> None:
    """Until the node's sshd sends its banner and (with `dockerd`) its dockerd answers."""
    deadline = time.monotonic() + timeout
    container = client.containers.get(node.name)
    last = "not started"
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=5).decode(errors="replace").strip().replace("\n", " | ")
            raise SimError(f"node {node.name} stopped while starting ({container.status}): {logs}")
        try:
            with socket.create_connection((node.ip, 22), timeout=2) as s:
                s.settimeout(2)
                if not s.recv(64).startswith(b"SSH-"):
                    last = "port 22 answers without an SSH banner"
                    continue
        except OSError as e:
            last = f"sshd on {node.ip}:22: {e.strerror or e}"
            time.sleep(0.5)
            continue
        if not dockerd:
            return
        code, out = container.exec_run(["docker", "info", "--format", "{{.ServerVersion}}"])
        if code == 0:
            return
        last = "dockerd: " + out.decode(errors="replace").strip().splitlines()[-1][:160]
        time.sleep(0.5)
    log = "/var/log/dockerd.log" if dockerd else "/var/log/sshd.log"
    tail = container.exec_run(["tail", "-n", "5", log])[1].decode(errors="replace")
    raise SimError(f"node {node.name} not ready after {timeout:.0f}s: {last} ({tail.strip()[-300:]})")


def _seed(client, node: SimNode, seeds: list[Path]) -> None:
    container = client.containers.get(node.name)
    for path in seeds:
        code, out = container.exec_run(["docker", "load", "-q", "-i", f"{SEED_DIR_IN_NODE}/{path.name}"])
        if code != 0:
            raise SimError(
                f"node {node.name}: loading {path.name} failed: {out.decode(errors='replace').strip()[:200]}"
            )


def parse_rate(rate: str) -> str:
    import re

    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)", rate):
        raise SimError(f"egress rate {rate!r}: use tc units, e.g. 200mbit or 1gbit")
    return rate


def tbf_argv(dev: str, rate: str) -> list[str]:
    """tc command limiting a device's egress to `rate` with a token bucket (netem is not available here)."""
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", parse_rate(rate),
            "burst", "256kb", "latency", "50ms"]


def shape(cluster: str = DEFAULT_NAME, rate: str | None = None, nodes: list[int] | None = None) -> None:
    """Shape (or, with rate None, unshape) each node's egress on eth0 with a token bucket."""
    check_name(cluster)
    client = engine()
    containers = _cluster_containers(client, cluster)
    if not containers:
        raise SimError(f"no sim cluster {cluster!r} (dockerlaunch sim up first)")
    if any(c.labels.get(ROLE_LABEL) for c in containers):
        raise SimError(f"sim cluster {cluster!r} is a light cluster: its hosts share engines, whose traffic "
                       "cannot be shaped per host (use regular nodes)")
    for c in containers:
        idx = int(c.labels.get(NODE_LABEL, "0"))
        if nodes and idx not in nodes:
            continue
        if rate:
            cmd = tbf_argv("eth0", rate)
        else:
            cmd = ["sh", "-c", "tc qdisc del dev eth0 root 2>/dev/null || true"]
        code, out = c.exec_run(cmd)
        if code != 0:
            raise SimError(f"node {c.name}: tc failed: {out.decode(errors='replace').strip()[:200]}")


def down(cluster: str = DEFAULT_NAME, quiet: bool = False) -> dict[str, int]:
    """Remove every container, network and volume of the cluster, and its state directory."""
    check_name(cluster)
    import docker

    client = _pooled_client()
    removed = {"containers": 0, "networks": 0, "volumes": 0}

    networks = client.networks.list(filters={"label": f"{SIM_LABEL}={cluster}"})

    def remove(c) -> None:
        # out of the cluster's network first, while it runs: dockerd 20.10 removing many containers of one bridge
        # at once can leave an endpoint behind (moby#42119), and the network can then never be removed
        for n in networks:
            try:
                n.disconnect(c.id, force=True)
            except docker.errors.APIError:
                pass  # not attached, or already gone
        try:
            c.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass

    containers = _cluster_containers(client, cluster, sparse=True)
    with cf.ThreadPoolExecutor(max_workers=LIGHT_POOL) as pool:  # a light cluster has hundreds
        list(pool.map(remove, containers))
    removed["containers"] = len(containers)
    for n in networks:
        for attempt in range(3):
            try:
                n.remove()
                removed["networks"] += 1
                break
            except docker.errors.NotFound:
                break
            except docker.errors.APIError as e:
                if "active endpoints" not in str(e):
                    raise
                if attempt == 2:
                    _log(f"network {n.name} keeps an endpoint of a removed container (a dockerd bug, moby#42119): "
                         "restarting dockerd removes it; later clusters need another --subnet")
                time.sleep(1)
    for v in client.volumes.list(filters={"label": f"{SIM_LABEL}={cluster}"}):
        try:
            v.remove(force=True)
            removed["volumes"] += 1
        except docker.errors.NotFound:
            pass
    shutil.rmtree(state_root() / cluster, ignore_errors=True)
    if not quiet:
        _log(
            f"removed {removed['containers']} container(s), {removed['networks']} network(s), "
            f"{removed['volumes']} volume(s)"
        )
    return removed


def status(cluster: str | None = None) -> list[dict[str, str]]:
    if cluster is not None:
        check_name(cluster)
    client = engine()
    containers = sorted(_cluster_containers(client, cluster), key=_status_order)
    # Slurm clusters: sinfo, asked once per cluster on its slurmctld node
    sinfo: dict[str, dict[str, str] | None] = {}
    for c in containers:
        if "slurmctld" in c.labels.get(SLURM_LABEL, "") and c.status == "running":
            sinfo[c.labels.get(SIM_LABEL, "?")] = slurm_node_states(c)
    # `docker info` once per dockerd: a light host shows the answer of the engine that serves it
    asked = [c for c in containers if c.labels.get(ROLE_LABEL) != "light"]
    with cf.ThreadPoolExecutor(max_workers=min(16, len(asked) or 1)) as pool:
        answers = dict(zip((c.name for c in asked), pool.map(node_engine, asked)))
    images: dict[str, str] = {}
    rows = []
    for c in containers:
        name = c.labels.get(SIM_LABEL, "?")
        if c.labels.get(ROLE_LABEL) == "light":
            served_by = c.labels.get(SERVED_BY_LABEL, "?")
            version, store = answers.get(served_by, ("?", "?")) if c.status == "running" else ("-", "-")
            short = served_by[len(name) + 1:] if served_by.startswith(f"{name}-") else served_by
            version = f"{short}: {version}"
        else:
            version, store = answers[c.name]
        slurm = "-"
        if c.labels.get(SLURM_LABEL):
            states = sinfo.get(name)
            slurm = (states or {}).get(f"node{c.labels.get(NODE_LABEL, '?')}", "?")
        image_id = c.attrs.get("Image", "")
        if image_id not in images:  # one lookup per image, not per container
            image = c.image
            images[image_id] = image.tags[0] if image.tags else image.short_id
        rows.append({
            "cluster": name,
            "node": c.name,
            "ip": _container_ip(c),
            "state": c.status,
            "image": images[image_id],
            "engine": version,
            "store": store,
            "slurm": slurm,
        })
    return rows


def _status_order(c) -> tuple:
    """By cluster, a light cluster's engines first, then nodes by number (node2 before node10)."""
    labels = c.labels
    if labels.get(ROLE_LABEL) == "engine":
        return labels.get(SIM_LABEL, ""), 0, int(labels.get(ENGINE_INDEX_LABEL, "0") or 0), c.name
    index = labels.get(NODE_LABEL, "")
    return labels.get(SIM_LABEL, ""), 1, int(index) if index.isdigit() else 0, c.name


def parse_engine_info(text: str) -> tuple[str, str]:
    """Pure: `docker info` "VERSION|DRIVER|DRIVERSTATUS-JSON" -> (version, image store)."""
    version, _, rest = text.strip().partition("|")
    if not version:
        return "?", "?"
    driver, _, status = rest.partition("|")
    if "io.containerd.snapshotter" in status:  # the containerd image store reports its snapshotter as the driver
        return version or "?", f"containerd ({driver or '?'})"
    return version or "?", driver or "?"


def node_engine(container) -> tuple[str, str]:
    """The engine version and image store a node's dockerd reports ("-" when the node is not running)."""
    if container.status != "running":
        return "-", "-"
    code, out = container.exec_run(
        ["docker", "info", "--format", "{{.ServerVersion}}|{{.Driver}}|{{json .DriverStatus}}"])
    return parse_engine_info(out.decode(errors="replace")) if code == 0 else ("?", "?")
