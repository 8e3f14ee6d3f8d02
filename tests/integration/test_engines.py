"""The compatibility suite: one sim cluster whose nodes run Docker 20.10, 26, 28 and 28 with the containerd image
store (what users' hosts run, side by side), and the launcher's own engine both ways (local 20.10, and a Docker 28
containerd-store engine reached with DOCKER_HOST=ssh://)."""

import io
import json
import os
import secrets
import subprocess
import tarfile

import pytest
import yaml

from dockerlaunch import sim
from dockerlaunch.sim.measure import received, wait_fills
from tests.integration.helpers import dl, job_name, own_sim_state

pytestmark = pytest.mark.integration

ENGINES = "20.10,26,28,28-containerd"


@pytest.fixture(scope="module")
def mixed(engine, tmp_path_factory):
    """(config path, layout, state dir) of a 4-node cluster, one node per engine kind."""
    name = f"dle{os.getpid()}"
    subnet = f"172.31.{100 + os.getpid() % 100}.0/24"
    with own_sim_state(tmp_path_factory, "engines-state") as state:
        config = state / "cluster.yaml"
        try:
            sim.create(cluster=name, subnet=subnet, config_out=str(config), engines=ENGINES)
            yield config, sim.node_layout(name, 4, subnet), sim.state_root() / name
        finally:
            sim.remove(name, quiet=True)


def node_docker(engine, node, *argv) -> tuple[int, str]:
    code, out = engine.containers.get(node.name).exec_run(["docker", *argv])
    return code, out.decode(errors="replace")


# What a host was sent is counted where it arrives: the node's eth0 rx_bytes, never the push's own bytes_sent or
# detail text. Above the stream it holds the framing (Ethernet, IP and TCP headers: 66 bytes a segment of 1448, 4.6%
# were each its own frame; the SSH packets' own, under 1%: FRAMING) and the push's SSH session (key exchange,
# authentication, commands, the verify step: 25-30 kB measured; SESSION is several times that). test_distribute.py
# gives the same figures at more length.
FRAMING = 1.06
SESSION = 256 << 10


def new_bytes(engine, ref: str, under: str) -> int:
    """The bytes `ref` adds to `under`, as the launcher's engine counts the images' sizes (random bytes: the least a
    thin stream of it carries)."""
    return engine.images.get(ref).attrs["Size"] - engine.images.get(under).attrs["Size"]


def subset(mixed, tmp_path, indexes) -> str:
    data = yaml.safe_load(open(mixed[0]))
    data["hosts"] = [data["hosts"][i] for i in indexes]
    path = tmp_path / f"cfg-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def image_pair(engine, mixed):
    """A fresh image (8 MB random layer on the nodes' seeded tools image) and a child of it that changes
    100 KB: what a re-push after a code change looks like."""
    tools = yaml.safe_load(open(mixed[0]))["image"]
    repo = f"dlt-eng/{secrets.token_hex(4)}"
    parent, child = f"{repo}:1", f"{repo}:2"
    for tag, text in ((parent, f"FROM {tools}\nRUN head -c 8M /dev/urandom > /blob && echo one > /which\n"),
                      (child, f"FROM {parent}\nRUN head -c 100K /dev/urandom > /small && echo two > /which\n")):
        engine.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, network_mode="host", rm=True)
    yield parent, child
    for tag in (child, parent):
        engine.images.remove(tag, force=True)


def test_each_node_runs_the_engine_it_was_asked_for(mixed):
    rows = {r["node"]: r for r in sim.inventory(mixed[1][0].name.rsplit("-", 1)[0])}
    got = [(rows[n.name]["engine"].split(".")[0], rows[n.name]["store"]) for n in mixed[1]]
    assert got == [("20", "overlay2"), ("26", "overlay2"), ("28", "overlay2"), ("28", "containerd (overlayfs)")]
    st = dl("sim", "status", "--name", mixed[1][0].name.rsplit("-", 1)[0])
    assert st.returncode == 0 and "containerd (overlayfs)" in st.stdout and "26.1" in st.stdout, st.stdout


def test_doctor_up_fail_fast_status_logs_down_across_engines(mixed):
    cfg = str(mixed[0])
    doc = dl("doctor", "--config", cfg, timeout=300)
    assert doc.returncode == 0 and " 0 FAIL" in doc.stdout, doc.stdout[-3000:] + doc.stderr[-1000:]

    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--",
           "sh", "-c", 'echo "hello from $NODE_RANK"; sleep 600', timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        st = dl("status", "--config", cfg, "--name", job)
        assert st.returncode == 0 and st.stdout.count("running") == 4, st.stdout
        for _ in range(20):
            lg = dl("logs", "--config", cfg, "--name", job)
            if all(f"hello from {k}" in lg.stdout for k in range(4)):
                break
        assert all(f"hello from {k}" in lg.stdout for k in range(4)), lg.stdout
    finally:
        d = dl("down", "--config", cfg, "--name", job)
    assert d.returncode == 0 and "removed 4 container(s)" in d.stdout, d.stdout + d.stderr

    job = job_name()  # the containerd-store node's rank fails: every other engine's container is stopped
    r = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--", "sh", "-c",
           'if [ "$NODE_RANK" = 3 ]; then sleep 1; exit 3; fi; sleep 600', timeout=180)
    assert r.returncode == 3 and "rank 3 (" in r.stdout, r.stdout[-2000:] + r.stderr[-1000:]
    st = dl("status", "--config", cfg, "--name", job)
    assert "no containers on 4 host(s)" in st.stdout and "attempt 0: rank failed: rank 3 (" in st.stdout, st.stdout


def test_label_disable_is_taken_by_every_engine(engine, mixed, tmp_path):
    """container.selinux disable on the engines users run (20.10, 26, 28, 28 with the containerd store; none of them
    labels containers, as Docker CE's default and this kernel have it): doctor's probe containers start with
    --security-opt label=disable, the job's containers run with it (each engine records it; ipc private, so it is
    dockerlaunch's flag and not Docker's own choice for --ipc host), and dump's sidecar and sandbox argv start
    beside them. An engine that labels (SELinux) is not here: docs/STATUS.md says so."""
    from dockerlaunch.docker_run import sandbox_argv, sidecar_argv

    data = yaml.safe_load(open(mixed[0]))
    container = {k: v for k, v in (data.get("container") or {}).items() if k != "ipc"}
    data["container"] = {**container, "selinux": "disable", "shm_size": "256m"}
    cfg = tmp_path / "selinux-disable.yaml"
    cfg.write_text(yaml.safe_dump(data))
    doc = dl("doctor", "--config", str(cfg), "--output", "json", timeout=300)
    assert doc.returncode == 0, doc.stdout[-3000:] + doc.stderr[-1000:]
    report = json.loads(doc.stdout)
    assert report["ok"] and not [c for c in report["checks"] if c["check"] == "selinux"]  # no engine labels here
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", str(cfg), "--name", job, "--", "sleep", "600",
           timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    try:
        for rank, node in enumerate(mixed[1]):
            code, out = node_docker(engine, node, "inspect", "--format",
                                    "{{.HostConfig.IpcMode}} {{json .HostConfig.SecurityOpt}}", f"{job}-{rank}")
            assert code == 0 and out.split(" ", 1)[0] == "private" and "label=disable" in out, (node.name, out)
            sidecar = sidecar_argv(f"{job}-{rank}", data["image"], ["-c", "echo sidecar"], caps=["SYS_PTRACE"],
                                   volumes=[], env={}, labels={"dockerlaunch.dump": job}, entrypoint="sh",
                                   label_disable=True)
            sandbox = sandbox_argv(f"{job}-fr-{rank}", data["image"], ["-c", "ls /fr >/dev/null && echo sandbox"],
                                   ro_volumes=["/tmp:/fr"], labels={"dockerlaunch.dump": "1"}, label_disable=True)
            for argv, said in ((sidecar, "sidecar"), (sandbox, "sandbox")):
                code, out = engine.containers.get(node.name).exec_run(argv)
                assert code == 0 and out.decode().strip().endswith(said), (node.name, said, out)
    finally:
        d = dl("down", "--config", str(cfg), "--name", job)
    assert d.returncode == 0 and "removed 4 container(s)" in d.stdout, d.stdout + d.stderr


def test_push_chain_then_thin_star_to_every_engine(engine, mixed, image_pair):
    cfg = str(mixed[0])
    parent, child = image_pair
    r = dl("push", parent, "--config", cfg, "--strategy", "chain", timeout=600)
    assert r.returncode == 0 and r.stdout.count("pushed") == 4, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.count("verified") == 4
    assert wait_fills() == []  # a cold layer cache is filled after the push, in the background (issue 58)
    # the thin re-push: each engine gets about the changed layer only, in both stores
    small = new_bytes(engine, child, parent)  # the 100 KB layer
    with received(engine, [n.name for n in mixed[1]]) as wire:
        r = dl("push", child, "--config", cfg, "--strategy", "star", "--compress", "none", "--output", "json",
               timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    results = json.loads(r.stdout)["hosts"]
    assert [x["status"] for x in results] == ["pushed"] * 4, results
    # into each node's eth0: the 100 KB layer, the config and the tar framing, the push's session; the parent's
    # 8 MiB layer would be 8 times the bound
    assert all(small <= w <= FRAMING * small + SESSION for w in wire), (wire, small)
    print(f"\n[wire] thin push of a {small / 1e3:.0f} kB layer: {[round(w / 1e3) for w in wire]} kB into the "
          f"nodes' eth0; reported {[x['bytes_sent'] // 1000 for x in results]} kB")
    for x in results:
        assert "thin: 3 of 4 layers" in x["detail"] and "verified" in x["detail"], x
        # the stream made from the launcher's registry (issue 43) loads in both stores
        assert "new layers read through the launcher's registry" in x["detail"], x
    for n in mixed[1]:
        code, out = node_docker(engine, n, "run", "--rm", child, "cat", "/which")
        assert (code, out.strip()) == (0, "two"), (n.name, out)
    # a second push finds every host up to date, whatever its store names the image by
    again = dl("push", child, "--config", cfg)
    assert again.returncode == 0 and again.stdout.count("skipped") == 4, again.stdout


def test_a_delta_bundle_loads_on_every_engine_that_has_its_base(engine, mixed, image_pair, tmp_path):
    """`save CHILD --base PARENT` carries the changed layer only; every engine (20.10, 26, 28, containerd store)
    that has PARENT loads it with the right Image ID and runs it; one that lacks PARENT refuses in one line."""
    cfg = str(mixed[0])
    parent, child = image_pair
    r = dl("push", parent, "--config", cfg, "--strategy", "star", timeout=600)
    assert r.returncode == 0 and r.stdout.count("verified") == 4, r.stdout[-3000:] + r.stderr[-2000:]
    full, delta = tmp_path / "child.dlb", tmp_path / "child.delta"
    assert dl("save", child, "-o", str(full)).returncode == 0
    s = dl("save", child, "--base", parent, "-o", str(delta))
    assert s.returncode == 0 and f"delta on {parent}" in s.stdout, s.stdout + s.stderr
    assert delta.stat().st_size < full.stat().st_size / 10, (delta.stat().st_size, full.stat().st_size)
    ld = dl("load", str(delta), "--config", cfg)
    assert ld.returncode == 0 and ld.stdout.count("loaded") >= 4, ld.stdout + ld.stderr
    for n in mixed[1]:
        code, out = node_docker(engine, n, "run", "--rm", child, "cat", "/which")
        assert (code, out.strip()) == (0, "two"), (n.name, out)
    # an engine without the base (each store): one line naming it, nothing loaded
    for i in (0, 3):
        node_docker(engine, mixed[1][i], "rmi", "-f", child, parent)
        bad = dl("load", str(delta), "--config", subset(mixed, tmp_path, [i]))
        assert bad.returncode == 1 and f"delta on {parent}" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
        assert "Traceback" not in bad.stdout + bad.stderr
        code, _ = node_docker(engine, mixed[1][i], "image", "inspect", child)
        assert code != 0, mixed[1][i].name


def _containerd_launcher(mixed, tmp_path) -> dict:
    """Environment for a CLI whose local engine is the containerd-store node's, over ssh:// (the docker SDK and
    CLI both honour DOCKER_HOST; the SDK reads ~/.ssh/config and ~/.ssh/known_hosts, so HOME is a scratch one)."""
    node = mixed[1][3]
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {node.ip}\n  User root\n  IdentityFile {mixed[2] / 'id_ed25519'}\n"
        f"  UserKnownHostsFile {home / '.ssh' / 'known_hosts'}\n")
    known = [line for line in (mixed[2] / "known_hosts").read_text().splitlines() if line.startswith(node.ip + " ")]
    (home / ".ssh" / "known_hosts").write_text("\n".join(known) + "\n")
    return {**os.environ, "HOME": str(home), "DOCKER_HOST": f"ssh://root@{node.ip}",
            "DOCKERLAUNCH_CACHE_DIR": str(tmp_path / "cache")}


def test_a_containerd_store_launcher_pushes_and_bundles_to_classic_engines(engine, mixed, image_pair, tmp_path):
    parent, child = image_pair
    r = dl("push", child, "--config", subset(mixed, tmp_path, [3]), timeout=600)  # the launcher-to-be has it
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for n in mixed[1][:3]:  # the classic nodes lack it (and its parent): the base layers are all they share
        node_docker(engine, n, "rmi", "-f", child, parent)
    env = _containerd_launcher(mixed, tmp_path)

    def cli(*args, timeout=600):
        return dl(*args, timeout=timeout, env=env)

    three = subset(mixed, tmp_path, [0, 1, 2])
    r = cli("push", child, "--config", three, "--strategy", "star")
    assert r.returncode == 0 and r.stdout.count("verified") == 3, r.stdout[-3000:] + r.stderr[-2000:]
    local_id = engine.images.get(child).id  # the classic store's ID: what the containerd launcher's push gave them
    for n in mixed[1][:3]:
        code, out = node_docker(engine, n, "image", "inspect", "--format", "{{.Id}}", child)
        assert (code, out.strip()) == (0, local_id), n.name

    bundle = tmp_path / "c8d.dlb"
    s = cli("save", child, "-o", str(bundle))
    assert s.returncode == 0, s.stderr[-2000:]
    node_docker(engine, mixed[1][0], "rmi", "-f", child)
    ld = dl("load", str(bundle), "--config", subset(mixed, tmp_path, [0]))
    assert ld.returncode == 0 and "loaded" in ld.stdout, ld.stdout + ld.stderr
    code, out = node_docker(engine, mixed[1][0], "run", "--rm", child, "cat", "/which")
    assert (code, out.strip()) == (0, "two")


def test_a_bundle_from_the_classic_launcher_loads_into_the_containerd_store(engine, mixed, image_pair, tmp_path):
    _, child = image_pair
    bundle = tmp_path / "classic.dlb"
    assert dl("save", child, "-o", str(bundle)).returncode == 0
    node = mixed[1][3]
    node_docker(engine, node, "rmi", "-f", child)
    ld = dl("load", str(bundle), "--config", subset(mixed, tmp_path, [3]))
    assert ld.returncode == 0 and "loaded" in ld.stdout, ld.stdout + ld.stderr
    code, out = node_docker(engine, node, "run", "--rm", child, "cat", "/which")
    assert (code, out.strip()) == (0, "two")


def test_a_layer_the_containerd_store_never_unpacked_is_sent_again(engine, mixed, image_pair, tmp_path):
    """containerd's store can hold an image it never unpacked (a load whose layer it lacked: it says so and exits
    0). Such a layer must not count as there: the thin push sends it, and the image runs."""
    from dockerlaunch.transfer import image_facts, restream

    parent, child = image_pair
    node = mixed[1][3]
    tools = yaml.safe_load(open(mixed[0]))["image"]
    image = image_facts.with_facts(engine, image_facts.local_image(engine, parent))
    top = {image.facts.layers[-1].path}
    stream = restream.image_chunks(image_facts.save_stream(engine, image.id), image, top)
    broken = subprocess.run(["docker", "exec", "-i", node.name, "docker", "load"], capture_output=True,
                            input=b"".join(stream))
    assert broken.returncode == 0 and b"rror unpacking image" in broken.stdout + broken.stderr  # exit 0 regardless
    with received(engine, [node.name]) as wire:
        r = dl("push", child, "--config", subset(mixed, tmp_path, [3]), "--strategy", "star", "--output", "json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    [res] = json.loads(r.stdout)["hosts"]
    # the seeded tools image's 2 layers are there; the parent's top layer (never unpacked) and the child's are sent
    assert res["status"] == "pushed" and "thin: 2 of 4 layers already there" in res["detail"], res
    assert "verified" in res["detail"], res
    both = new_bytes(engine, child, tools)  # the parent's 8 MiB and the child's 100 KB (random: zstd keeps them)
    assert both <= wire[0] <= FRAMING * both + SESSION, (wire, both)  # the tools image's layers stayed
    print(f"\n[wire] the never-unpacked layer and the child's: {wire[0] / 2**20:.3f} MiB into the node's eth0 for "
          f"{both / 2**20:.3f} MiB; reported {res['bytes_sent'] / 2**20:.3f} MiB")
    code, out = node_docker(engine, node, "run", "--rm", child, "cat", "/which")
    assert (code, out.strip()) == (0, "two")
    node_docker(engine, node, "rmi", "-f", child, image.facts.manifest_digest)


def test_a_containerd_host_holding_the_image_under_another_name_is_only_tagged(engine, mixed, image_pair, tmp_path):
    """The first push of an image whose save this machine never read: its ID in containerd's store (the digest of
    our stream's manifest) is not known when the host is asked, so the host lists its image IDs and is judged from
    that list once the save is read, not asked again (issue 61). One that holds the image under another name is
    only tagged."""
    from dockerlaunch.transfer import image_facts

    parent, _ = image_pair
    node, cfg = mixed[1][3], subset(mixed, tmp_path, [3])
    r = dl("push", parent, "--config", cfg, "--strategy", "star", timeout=600)
    assert r.returncode == 0 and "verified" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    other = f"{parent.split(':')[0]}-other:1"
    assert node_docker(engine, node, "tag", parent, other)[0] == 0
    assert node_docker(engine, node, "rmi", parent)[0] == 0
    image_facts._cache_path(image_facts.local_image(engine, parent, facts=False)).unlink()  # read by this push
    assert not image_facts.facts_known(image_facts.local_image(engine, parent, facts=False))
    r = dl("push", parent, "--config", cfg, "--output", "json", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    [res] = json.loads(r.stdout)["hosts"]
    assert (res["status"], res["bytes_sent"]) == ("tagged", 0), res
    assert res["detail"].startswith("had ") and res["detail"].endswith(f"untagged; tagged {parent}"), res
    code, out = node_docker(engine, node, "run", "--rm", parent, "cat", "/which")
    assert (code, out.strip()) == (0, "one")
    node_docker(engine, node, "rmi", "-f", other, parent)


def test_cdi_is_judged_by_what_each_real_engine_reads(engine, mixed):
    """probe.sh on the real engines: Docker 26.1 lists no CDI spec dirs (CDI off), 28.5 reads /etc/cdi and
    /var/run/cdi; a spec naming nvidia.com/gpu there makes CDI usable (no GPU needed to judge it)."""
    from dockerlaunch.backends.docker.probe import parse_probe, script
    from dockerlaunch.gpu.access import cdi_state

    def judge(node):
        code, out = engine.containers.get(node.name).exec_run(["sh", "-c", script("probe.sh"), "sh", mixed[1][0].ip])
        assert code == 0, out
        return cdi_state(parse_probe(out.decode()).access)

    n20, n26, n28 = mixed[1][0], mixed[1][1], mixed[1][2]
    usable, why = judge(n20)
    assert not usable and why.startswith("Docker 20.10.") and why.endswith("has no CDI (it needs 25 or later)"), why
    usable, why = judge(n26)
    assert not usable and "CDI is off in Docker 26.1" in why and '"features": {"cdi": true}' in why, why
    usable, why = judge(n28)
    assert not usable and "no CDI spec names nvidia.com/gpu in /etc/cdi, /var/run/cdi" in why, why
    spec = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"
    node = engine.containers.get(n28.name)
    node.exec_run(["sh", "-c", 'mkdir -p /etc/cdi && printf "%s" "$1" > /etc/cdi/nvidia.yaml', "sh", spec])
    try:
        usable, why = judge(n28)
        assert usable and why.startswith("CDI spec /etc/cdi/nvidia.yaml, Docker 28."), why
    finally:
        node.exec_run(["rm", "-f", "/etc/cdi/nvidia.yaml"])


# ---------------------------------------------------------------- image tars that try to tag (issue 50, finding 2)


def _scratch_image(engine, tag: str) -> None:
    """A tiny FROM-scratch image of one random file (unique ID, a few KB to save and load)."""
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as t:
        for name, data in (("Dockerfile", b"FROM scratch\nCOPY token /\n"), ("token", secrets.token_bytes(4096))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    engine.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)


def _members(tar: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for m, data in members:
            t.addfile(m, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
    return info, None


@pytest.fixture(scope="module")
def tagging_tars(engine):
    """The image tar dockerlaunch saves for a tiny image (`good`), plus a second tiny image (`attacker`) that each
    crafted tar asks to tag `victim`: the attacker's files, a manifest.json naming both images (the attacker's
    RepoTags: the victim) and an index.json naming both manifests (the attacker's with the victim as its name).
    (the bundle entry's facts, {attack: inner tar bytes}, the victim tag)."""
    from dockerlaunch.transfer import image_facts, restream

    good, attacker = (f"dlt-eng/tag-{secrets.token_hex(4)}:1" for _ in range(2))
    victim = f"dlt-victim/{secrets.token_hex(4)}:1"
    for tag in (good, attacker):
        _scratch_image(engine, tag)
    imgs = [image_facts.with_facts(engine, image_facts.local_image(engine, t)) for t in (good, attacker)]
    saved = [_members(b"".join(restream.image_chunks(image_facts.save_stream(engine, i.id), i))) for i in imgs]
    meta = {"manifest.json", "index.json", "oci-layout", "repositories"}
    body = [(m, d) for members in saved for m, d in members if m.name not in meta]
    entries = [json.loads(next(d for m, d in members if m.name == "manifest.json"))[0] for members in saved]
    entries[1]["RepoTags"] = [victim]
    descs = [json.loads(next(d for m, d in members if m.name == "index.json"))["manifests"][0] for members in saved]
    descs[1]["annotations"] = {"io.containerd.image.name": "docker.io/" + victim}
    evil = json.dumps(entries).encode()
    index = _file("index.json", json.dumps({"schemaVersion": 2, "manifests": descs}).encode())
    layout = _file("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    tars = {
        "symlinked manifest": _tar([*body, layout, index, _file("evil.json", evil),
                                    _link("manifest.json", "evil.json")]),
        "hardlinked manifest": _tar([*body, layout, index, _file("evil.json", evil),
                                     _link("manifest.json", "evil.json", hard=True)]),
        "linked parent folder": _tar([*body, layout, index, _link("d", "."), _file("d/manifest.json", evil)]),
        "a second tagged image": _tar([*body, layout, index, _file("manifest.json", evil)]),
    }
    facts = imgs[0].facts
    yield good, imgs[0].config_digest, facts.manifest_digest, imgs[1], tars, victim
    for tag in (good, attacker):
        engine.images.remove(tag, force=True)


def _bundle(path, ref, image_id, manifest_id, inner: bytes) -> None:
    import hashlib

    import zstandard

    from dockerlaunch.transfer.bundle import BUNDLE_FORMAT

    manifest = json.dumps({"format": BUNDLE_FORMAT, "images": [{
        "ref": ref, "id": image_id, "manifest_id": manifest_id, "size": 1, "file": f"images/{image_id[7:]}.tar",
        "sha256": hashlib.sha256(inner).hexdigest(), "bytes": len(inner)}]}).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(_tar([_file(f"images/{image_id[7:]}.tar", inner),
                                                              _file("manifest.json", manifest)])))


@pytest.fixture(params=range(4), ids=ENGINES.split(","))
def victim_node(request, engine, mixed, tagging_tars, tmp_path):
    """(node, its container, a config of that node alone, victim's Image ID, a reader of its tags) with the victim
    tag set on the node's tools image; afterwards the victim and every image of the tars removed there."""
    good, image_id, manifest_id, attacker, tars, victim = tagging_tars
    n = mixed[1][request.param]
    tools = yaml.safe_load(open(mixed[0]))["image"]
    assert node_docker(engine, n, "tag", tools, victim)[0] == 0
    victim_id = node_docker(engine, n, "image", "inspect", "--format", "{{.Id}}", victim)[1].strip()

    def tags() -> dict[str, str]:
        code, out = node_docker(engine, n, "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
        assert code == 0, out
        return dict(line.rsplit(" ", 1) for line in out.splitlines() if "<none>" not in line)

    yield n, engine.containers.get(n.name), subset(mixed, tmp_path, [request.param]), victim_id, tags
    node_docker(engine, n, "rmi", victim)
    node_docker(engine, n, "rmi", "-f", image_id, manifest_id, attacker.id, attacker.facts.manifest_digest)


@pytest.mark.parametrize("attack", ["symlinked manifest", "hardlinked manifest", "linked parent folder"])
def test_an_image_tar_that_tags_through_links_is_refused_and_every_tag_stays(tmp_path, tagging_tars, victim_node,
                                                                             attack):
    """A bundle's image tar whose manifest.json is a symlink or a hardlink, or sits under `d -> .`, naming a second
    image tagged as the user's `victim`: Docker's classic loader followed them and moved the tag while the load
    said it succeeded. On each engine kind: refused in one line, the victim where it was, the bundle's tag not
    set."""
    good, image_id, manifest_id, _, tars, victim = tagging_tars
    n, _, cfg, victim_id, tags = victim_node
    path = tmp_path / f"{attack.replace(' ', '-')}.dlb"
    _bundle(path, good, image_id, manifest_id, tars[attack])
    before = tags()
    r = dl("load", str(path), "--config", cfg)
    out = " ".join((r.stdout + r.stderr).split())  # the host's row of the summary table, wrapped as it fits
    assert tags() == before and tags()[victim] == victim_id and good not in tags(), out
    assert r.returncode == 1 and f"{good} (images/{image_id[7:]}.tar) in bundle" in out, out
    assert "was refused: image tar member" in out and "link" in out and "Traceback" not in out, out
    assert "nothing of the bundle was tagged" in out and "sending input failed" not in out, out


def test_a_tag_a_second_image_of_the_tar_takes_is_put_back_and_the_load_fails(tmp_path, tagging_tars, victim_node):
    """Were an engine's loader to read a tar otherwise than the re-streaming did (a stand-in: the re-streamed tar
    read to its end, then the raw one loaded), a second image in it that takes the victim's tag is caught though
    the load was not meant to create it: the engine's tags compared before and after, the victim put back, the
    load failed in one line naming it, the bundle's tag not set."""
    from dockerlaunch.transfer.bundle import load_bundle

    good, image_id, manifest_id, _, tars, victim = tagging_tars
    n, box, _, victim_id, tags = victim_node
    path = tmp_path / "second.dlb"
    _bundle(path, good, image_id, manifest_id, tars["a second tagged image"])

    def raw_loader(stream, piece):
        while stream.read(1 << 20):
            pass
        p = subprocess.run(["docker", "exec", "-i", n.name, "docker", "load"], capture_output=True,
                           input=tars["a second tagged image"])
        return p.returncode, (p.stdout + p.stderr).decode(errors="replace")

    def run(argv):
        code, out = box.exec_run(argv)
        return code, out.decode(errors="replace")

    before = tags()
    with pytest.raises(Exception) as e:
        load_bundle(path, raw_loader, run, where=n.name)
    msg = str(e.value)
    assert tags() == before and tags()[victim] == victim_id and good not in tags(), msg
    assert msg.startswith(f"{n.name}: tag {victim} changed during the load (was {victim_id[7:19]}") and \
        "put back as it was, nothing of the bundle was tagged" in msg and "\n" not in msg, msg
