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
import shutil
import socket
import time
from pathlib import Path

import docker

from dockerlaunch import hints
from dockerlaunch.engine import engine
from dockerlaunch.job.plan import DIAG_ROOT
from dockerlaunch.sim.images import (
    _new_ed25519,
    _seed_tarball,
    _tar_of,
    _write_private,
    ensure_images,
    ensure_slurm_image,
)
from dockerlaunch.sim.layout import (
    CONTAINERD_STORE_DAEMON_JSON,
    DEFAULT_ENGINE,
    DEFAULT_LIGHT_SUBNET,
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    ENGINE_INDEX_LABEL,
    ENGINE_LABEL,
    LIGHT_POOL,
    LIGHT_SOCK_DIR,
    MAX_LIGHT_NODES,
    MAX_NODES,
    NODE_CAPS,
    NODE_LABEL,
    NODE_NOFILE,
    NODE_SHM,
    ROLE_LABEL,
    SEED_DIR_IN_NODE,
    SERVED_BY_LABEL,
    SHARED_DIR,
    SIM_LABEL,
    SIM_USERS,
    SLURM_LABEL,
    SLURM_READY_TIMEOUT,
    SimEngine,
    SimError,
    SimNode,
    _log,
    cache_root,
    check_name,
    containers_of,
    light_layout,
    network_name,
    node_layout,
    parse_engine_info,
    parse_engines,
    render_cluster_config,
    state_root,
)
from dockerlaunch.sim.shaping import parse_rate, shape
from dockerlaunch.sim.slurm import slurm_node_states, start_slurm


# long: the regular cluster's steps in order (checks, images, network, volumes, nodes, seeds, Slurm, config);
# every container is started by _start_node, which create_light shares, as it shares the steps around it.
def create(
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
    containers (default: default_light_engines), each running one dockerd that several hosts share: see create_light.
    """
    if light:
        if slurm:
            raise SimError("--light cannot run Slurm: use regular nodes for --slurm")
        if egress_rate:
            raise SimError("--light cannot shape egress (job traffic leaves from the engines, shared by several "
                           "hosts): use regular nodes for --egress-rate")
        return create_light(nodes=nodes if nodes is not None else 2, cluster=cluster,
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
    existing = containers_of(client, cluster)
    if existing:
        raise SimError(
            f"sim cluster {cluster!r} already exists ({len(existing)} node(s)); run "
            f"`{hints.dockerlaunch('sim', 'down', '--name', cluster, hint='sim.down')}` first"
        )
    if egress_rate:
        parse_rate(egress_rate)
    node_images, tools_image = ensure_images(client, base_image, kinds)
    if slurm:
        node_images = {k: ensure_slurm_image(client, v) for k, v in node_images.items()}
    seeds = [_seed_tarball(client, tools_image)] + [_seed_tarball(client, s) for s in seed_images]

    state, public = _new_state(cluster)
    authorized = public.encode() + b"\n"
    labels = {SIM_LABEL: cluster}
    net = _new_network(client, cluster, subnet, labels)

    known_hosts: list[str] = []
    try:
        shared = client.volumes.create(f"{cluster}-shared", labels=labels)
        for n, kind in zip(layout, kinds):
            client.volumes.create(n.volume, labels=labels)
            node_labels = {**labels, NODE_LABEL: str(n.index), ENGINE_LABEL: kind.name}
            if slurm:
                node_labels[SLURM_LABEL] = "slurmctld,slurmd" if n.index == 1 else "slurmd"
            known_hosts.append(_start_node(
                client, net, node_images[kind.name], n.name, f"node{n.index}", n.ip, node_labels, authorized,
                daemon_json=kind.containerd_store,
                # Slurm names nodes by hostname (srun, job output, node lists): every node resolves every other
                extra_hosts={f"node{m.index}": m.ip for m in layout if m is not n} if slurm else None,
                **_engine_options(n.volume, shared.name)))
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
        remove(cluster, quiet=True)
        raise

    out = _write_config(client, cluster, layout, layout[0].name, state, tools_image, config_out)
    _log(f"{nodes} node(s) up{' with Slurm' if slurm else ''}: {', '.join(n.ip for n in layout)}; config: {out}")
    return out


def _engine_options(data_volume: str, shared_volume: str, more_volumes: dict | None = None) -> dict:
    """What a Docker-in-Docker engine container needs from the local engine (docs/ARCHITECTURE.md, simulated
    cluster)."""
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
        "ulimits": [docker.types.Ulimit(name="nofile", soft=NODE_NOFILE, hard=NODE_NOFILE)],
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


def _start_node(client, net, image: str, name: str, hostname: str, ip: str, labels: dict, authorized: bytes, *,
                daemon_json: bool, **create) -> str:
    """One sim container -- a regular node, a light host or a light cluster's engine: created on the cluster's
    network at its fixed IP, given a host key of its own and the cluster's user key (and the containerd image
    store's daemon.json where asked), started. Returns its known_hosts line."""
    container = client.containers.create(image, name=name, hostname=hostname, labels=labels, detach=True,
                                         **create, **_fixed_ip(client, net, ip))
    host_private, host_public = _new_ed25519()
    files = {
        "etc/ssh/ssh_host_ed25519_key": (host_private, 0o600),
        "etc/ssh/ssh_host_ed25519_key.pub": (host_public.encode() + b"\n", 0o644),
        "root/.ssh/authorized_keys": (authorized, 0o600),
        **{f"home/{user}/.ssh/authorized_keys": (authorized, 0o600, uid, uid) for user, uid in SIM_USERS.items()},
    }
    if daemon_json:  # what a user writes to turn the containerd store on (Docker 29 has it on by default)
        files["etc/docker/daemon.json"] = (CONTAINERD_STORE_DAEMON_JSON, 0o644)
    container.put_archive("/", _tar_of(files))
    container.start()
    return f"{ip} {host_public}"


# long: like `up`, plus the shared engines and the pooled creation of hundreds of sshd-only hosts.
def create_light(
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
    existing = containers_of(client, cluster, sparse=True)
    if existing:
        raise SimError(
            f"sim cluster {cluster!r} already exists ({len(existing)} container(s)); run "
            f"`{hints.dockerlaunch('sim', 'down', '--name', cluster, hint='sim.down')}` first"
        )
    node_images, tools_image = ensure_images(client, base_image, [kind])
    image = node_images[kind.name]
    seeds = [_seed_tarball(client, tools_image)] + [_seed_tarball(client, s) for s in seed_images]

    state, public = _new_state(cluster)
    authorized = public.encode() + b"\n"
    labels = {SIM_LABEL: cluster}
    net = _new_network(client, cluster, subnet, labels)

    def start_engine(e: SimEngine) -> str:
        client.volumes.create(e.volume, labels=labels)
        client.volumes.create(e.sock_volume, labels=labels)
        client.volumes.create(f"{e.name}-jobs", labels=labels)
        return _start_node(
            client, net, image, e.name, f"engine{e.index}", e.ip,
            {**labels, ROLE_LABEL: "engine", ENGINE_INDEX_LABEL: str(e.index), ENGINE_LABEL: kind.name},
            authorized, daemon_json=kind.containerd_store,
            environment={"DOCKERD_EXTRA_ARGS": f"-H unix:///var/run/docker.sock -H unix://{LIGHT_SOCK_DIR}/docker.sock"},
            **_engine_options(e.volume, shared.name, {e.sock_volume: {"bind": LIGHT_SOCK_DIR, "mode": "rw"},
                                                       f"{e.name}-jobs": {"bind": DIAG_ROOT, "mode": "rw"}}))

    def start_host(n: SimNode) -> str:
        return _start_node(
            client, net, image, n.name, f"node{n.index}", n.ip,
            {**labels, NODE_LABEL: str(n.index), ENGINE_LABEL: kind.name, ROLE_LABEL: "light",
             SERVED_BY_LABEL: n.served_by},
            authorized, daemon_json=False,
            environment={"SIM_LIGHT": "1"},
            volumes={
                f"{n.served_by}-sock": {"bind": LIGHT_SOCK_DIR, "mode": "rw"},
                shared.name: {"bind": SHARED_DIR, "mode": "rw"},  # doctor checks mount sources on the SSH host
                # the engine's docker root, read-only: `df` of DockerRootDir on the SSH host (doctor's disk row)
                # gives the free space its engine really has
                f"{n.served_by}-docker": {"bind": "/var/lib/docker", "mode": "ro"},
                # the job folders (diagnostics.dir's default): on a real host the engine mounts what the SSH login
                # wrote there (the supervisor's files, the run's records), so its engine sees this folder too
                f"{n.served_by}-jobs": {"bind": DIAG_ROOT, "mode": "rw"},
            },
            init=True)

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
        remove(cluster, quiet=True)
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
    containers = containers_of(client, cluster)
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
    a container more, and refuses the launcher's default (container.NOFILE) at start."""
    code, out = container.exec_run(["sh", "-c", 'grep "^Max open files" "/proc/$(pidof dockerd)/limits"'])
    words = out.decode(errors="replace").split()
    return int(words[-2]) if code == 0 and len(words) >= 2 and words[-2].isdigit() else None


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


def remove(cluster: str = DEFAULT_NAME, quiet: bool = False) -> dict[str, int]:
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

    containers = containers_of(client, cluster, sparse=True)
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


def inventory(cluster: str | None = None) -> list[dict[str, str]]:
    if cluster is not None:
        check_name(cluster)
    client = engine()
    containers = sorted(containers_of(client, cluster), key=_status_order)
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


def node_engine(container) -> tuple[str, str]:
    """The engine version and image store a node's dockerd reports ("-" when the node is not running)."""
    if container.status != "running":
        return "-", "-"
    code, out = container.exec_run(
        ["docker", "info", "--format", "{{.ServerVersion}}|{{.Driver}}|{{json .DriverStatus}}"])
    return parse_engine_info(out.decode(errors="replace")) if code == 0 else ("?", "?")
