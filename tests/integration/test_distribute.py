"""push / save / load on a real 2-node sim cluster, with images made here (unique IDs)."""

import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from dockerlaunch.backends.docker.doctor.observations import listening_ports
from dockerlaunch.errors import TransferError
from dockerlaunch.sim.measure import engine_reads, received, staged_bytes, wait_fills
from dockerlaunch.transfer import cache_server, chain, layer_cache, push, staging
from dockerlaunch.transfer.image_facts import local_image
from dockerlaunch.transfer.oci import chain_ids
from dockerlaunch.transfer.push import push_to_host
from tests import cli
from tests.integration.helpers import ids_on_nodes, nc_listeners

# alone: the thin-push tests count this machine's engine reads; the cut and chain tests stage on the nodes' disk,
# which is this machine's (tests/integration/conftest.py runs them after scripts/test's other process)
pytestmark = [pytest.mark.integration, pytest.mark.alone]


def dl(*args, timeout=900):
    return cli.dl(*args, timeout=timeout)


# What a host was sent is counted where it arrives: the node's eth0 rx_bytes (dockerlaunch.sim.measure.received),
# never the push's own bytes_sent, on_bytes or detail text. The counter holds more than the stream:
#  - each TCP segment's Ethernet, IP and TCP headers: 14 + 20 + 32 (timestamps) = 66 bytes a segment of at most
#    1448 payload bytes at MTU 1500, 4.6% were every segment its own frame (the sim's veth pairs pass segments
#    coalesced up to 64 KB: ~0.1% is what comes);
#  - the SSH packets' own framing (length, padding, MAC, channel header: under 300 bytes a packet of up to 32 KiB,
#    under 1%); the two worst cases together are under FRAMING;
#  - the push's SSH session: key exchange, authentication, its commands and scripts: 8 kB for a push that skips,
#    20-30 kB beside a stream, measured; SESSION is 256 KiB, several times that;
#  - on a relay, the ACKs of what it sends on (1% of it, measured).
# Measured here the stream's framing and the session together came to 0.6-0.8% of an 8 MiB stream, 2% of a 2 MiB one.
# So: stream <= wire <= FRAMING x stream + SESSION; where the stream is random bytes, no compression shrinks it.
FRAMING = 1.06
SESSION = 256 << 10


@pytest.fixture(scope="module")
def nodes(sim_cluster, remotes) -> list[str]:
    """The sim node containers, in `remotes`' order: whose eth0 counts what each host received."""
    by_ip = {n.ip: n.name for n in sim_cluster[2]}
    return [by_ip[r.target.hostname] for r in remotes]


def new_bytes(engine, ref: str, under: str) -> int:
    """The bytes `ref` adds to `under` (its parent, which the hosts have), as the launcher's engine counts the
    images' sizes: the least a thin stream of it can carry (the tests' layers are random: no compression shrinks
    them)."""
    return engine.images.get(ref).attrs["Size"] - engine.images.get(under).attrs["Size"]


def load_bytes_read(remote) -> int:
    """Bytes the host's `docker load` client processes have read so far (0: none runs). A load that ends between
    pgrep and the read (what the callers wait for) counts as none."""
    script = ('for p in $(pgrep -x docker); do case "$(tr "\\0" " " 2>/dev/null < /proc/$p/cmdline)" in '
              '"docker load "*) sed -n "s/^rchar: //p" /proc/$p/io 2>/dev/null || true;; esac; done')
    r = remote.run(["sh", "-c", script])
    assert r.ok, r.stderr
    return sum(int(x) for x in r.stdout.split())


def test_push_to_two_nodes_then_skip(sim_cluster, engine, remotes, nodes, fresh_image, tools_image):
    ref = fresh_image()
    local_id = engine.images.get(ref).id
    layer = new_bytes(engine, ref, tools_image)  # 8 MiB: what a push of it sends each host at the least
    try:
        with received(engine, nodes) as wire:
            r = dl("push", ref, "--config", str(sim_cluster[1]), "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(r.stdout)["hosts"]
        assert [h["status"] for h in rows] == ["pushed", "pushed"], rows
        assert all(h["detail"].startswith("zstd") for h in rows), rows  # sim nodes have zstd
        assert all(w >= layer for w in wire), (wire, layer)  # random bytes: zstd keeps them whole
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        # the report's 0 bytes, and on each node's eth0 no stream: only the push's SSH session
        with received(engine, nodes) as wire:
            again = dl("push", ref, "--config", str(sim_cluster[1]), "--output", "json")
        rows = json.loads(again.stdout)["hosts"]
        assert again.returncode == 0 and [h["status"] for h in rows] == ["skipped", "skipped"], again.stdout
        assert all("already has" in h["detail"] and h["bytes_sent"] == 0 for h in rows), rows
        assert all(w <= SESSION for w in wire), (wire, layer)
        # present on a host under another name only: a tag, no transfer
        remotes[1].check(["docker", "tag", ref, "dlt-dist/keep:1"], "second tag")
        remotes[1].check(["docker", "rmi", ref], "untag")
        with received(engine, nodes) as wire:
            third = dl("push", ref, "--config", str(sim_cluster[1]), "--compress", "none", "--output", "json")
        rows = json.loads(third.stdout)["hosts"]
        assert third.returncode == 0 and [h["status"] for h in rows] == ["skipped", "tagged"], third.stdout
        assert rows[1]["detail"].startswith("had ") and rows[1]["bytes_sent"] == 0
        assert all(w <= SESSION for w in wire), (wire, layer)
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        print(f"\n[wire] a push that skips or tags: {[round(w / 1e3, 1) for w in wire]} kB into the nodes' eth0 "
              f"(layer {layer / 2**20:.0f} MiB)")
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, "dlt-dist/keep:1", local_id])


def test_push_killed_mid_stream_leaves_tag_absent_or_unchanged(sim_cluster, engine, remotes, fresh_image,
                                                               tools_image, monkeypatch):
    """The launcher SIGKILLed mid-stream: no tag moves, no load outlives it, and the next push resumes on each
    host from the prefix it staged (zstd both times, the default: a stage holds the stream as it travels, and the
    launcher's zstd makes the same bytes again)."""
    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")  # stage this 400 MB image as if it were a big one
    ref = fresh_image(mb=400)
    local_id = engine.images.get(ref).id
    old_id = engine.images.get(tools_image).id
    remotes[0].check(["docker", "tag", tools_image, ref], "pre-tag")  # node1's tag points at another image
    try:
        p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "push", ref, "--config", str(sim_cluster[1])],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        size = engine.images.get(ref).attrs["Size"]
        deadline = time.monotonic() + 120
        read = [0, 0]
        while time.monotonic() < deadline and p.poll() is None:  # until both loads have read some MB
            read = [load_bytes_read(rm) for rm in remotes]
            if all(n >= 20 << 20 for n in read):
                break
            time.sleep(0.1)
        assert all(20 << 20 <= n < size for n in read), f"no load mid-stream on both nodes: read {read} of {size}"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(load_bytes_read(rm) for rm in remotes) and time.monotonic() < deadline:
            time.sleep(0.2)  # each remote load ends once its SSH channel closes
        assert not any(load_bytes_read(rm) for rm in remotes), "a docker load outlived the killed push"
        assert ids_on_nodes(remotes, ref) == [old_id, None]  # unchanged on node1, absent on node2

        staged = [staged_bytes(rm) for rm in remotes]
        # a host stages only with room for the stage, the load and a reserve (staging.stage_choice): a full disk
        # here is the machine's, and its free space says so
        assert all(n >= 20 << 20 for n in staged), (staged, [rm.run(["sh", "-c", 'df -Pk "$HOME"']).stdout
                                                             for rm in remotes])
        r = dl("push", ref, "--config", str(sim_cluster[1]), "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(r.stdout)["hosts"]
        assert all(h["status"] == "pushed" and "resumed at" in h["detail"] for h in rows), rows
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        assert [staged_bytes(rm) for rm in remotes] == [0, 0]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, local_id])
            rm.run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])


def test_push_dry_run_inspects_and_plans_but_sends_and_tags_nothing(sim_cluster, engine, remotes, fresh_image):
    ref = fresh_image(mb=8)
    local_id = engine.images.get(ref).id
    try:
        r = dl("push", ref, "--config", str(sim_cluster[1]), "--dry-run", "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        plan = json.loads(r.stdout)
        assert plan["image_id"] == local_id and plan["strategy"] == "star"  # 2 hosts: star
        hosts = plan["hosts"]
        assert [h["action"] for h in hosts] == ["send", "send"], hosts
        assert all(h["compression"] == "zstd" and h["strategy"] == "star" for h in hosts), hosts
        # the tools image is on every node: only the new layer travels, and the plan says so in bytes
        assert all(h["layers_skipped"] == h["layers"] - 1 for h in hosts), hosts
        assert all(8 << 20 <= h["bytes_to_send"] < 9 << 20 for h in hosts), hosts
        assert plan["launcher_bytes"] == sum(h["bytes_to_send"] for h in hosts)
        assert ids_on_nodes(remotes, ref) == [None, None]  # nothing sent, nothing tagged
        assert ids_on_nodes(remotes, local_id) == [None, None]

        text = dl("push", ref, "--config", str(sim_cluster[1]), "--dry-run")
        assert text.returncode == 0, text.stderr
        ips = {n.ip for n in sim_cluster[2]}
        rows = [line.split() for line in text.stdout.splitlines() if line.split()[:1] and line.split()[0] in ips]
        assert [r[1:3] for r in rows] == [["send", "star"]] * 2, text.stdout
        assert "nothing was sent or tagged" in text.stdout
        assert ids_on_nodes(remotes, ref) == [None, None]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, local_id])


def test_push_of_missing_image_is_a_clear_error(sim_cluster):
    r = dl("push", "no/such:image", "--config", str(sim_cluster[1]))
    assert r.returncode == 1 and "no/such:image is not in the local Docker engine" in r.stderr


def test_bundle_round_trip_locally_and_onto_hosts(sim_cluster, engine, remotes, fresh_image, tmp_path):
    a, b = fresh_image(scratch=True), fresh_image(scratch=True)
    ids = {ref: engine.images.get(ref).id for ref in (a, b)}
    bundle = tmp_path / "images.dlb"
    r = dl("save", a, b, "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    for ref in (a, b):
        engine.images.remove(ref, force=True)
    r = dl("load", str(bundle))
    assert r.returncode == 0, r.stderr
    assert {ref: engine.images.get(ref).id for ref in (a, b)} == ids
    try:
        r = dl("load", str(bundle), "--config", str(sim_cluster[1]))
        assert r.returncode == 0, r.stdout + r.stderr
        for ref in (a, b):
            assert ids_on_nodes(remotes, ref) == [ids[ref], ids[ref]]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", a, b, *ids.values()])


# flips at several places: where they land (tar header, layer bytes, zstd frame) decides whether docker load,
# the tar reader or the checksum notices first; every one must read as a corrupted bundle
@pytest.mark.parametrize("damage", ["flip@0.2", "flip@0.5", "flip@0.8", "truncate", "inner-header"])
def test_corrupted_bundle_is_a_clear_error_and_tags_nothing(engine, fresh_image, tmp_path, damage):
    ref = fresh_image(scratch=True)
    image_id = engine.images.get(ref).id
    bundle = tmp_path / "one.dlb"
    assert dl("save", ref, "-o", str(bundle)).returncode == 0
    data = bytearray(bundle.read_bytes())
    if damage.startswith("flip@"):
        mid = int(len(data) * float(damage[5:]))
        data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    elif damage == "inner-header":
        # valid zstd and outer tar; the first header of the image's own tar is broken, so docker load fails first
        import zstandard

        plain = bytearray(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(data))).read())
        plain[512 + 148:512 + 156] = b"99999999"  # header checksum field of the inner tar's first member
        data = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(plain))
    else:
        data = data[: len(data) * 2 // 3]
    bundle.write_bytes(bytes(data))
    engine.images.remove(ref, force=True)
    r = dl("load", str(bundle))
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert ("corrupted" in r.stderr or "truncated" in r.stderr or "checksum" in r.stderr), r.stderr
    tags = [t for img in engine.images.list() for t in img.tags]
    assert ref not in tags  # no half-loaded image under the real tag
    try:
        engine.images.remove(image_id, force=True)
    except Exception:
        pass


def test_thin_repush_sends_only_the_changed_layer(sim_cluster, engine, remotes, nodes, fresh_image):
    base = fresh_image(mb=16)
    top = f"dlt-dist/top-{secrets.token_hex(3)}:1"
    engine.images.build(fileobj=io.BytesIO(f"FROM {base}\nRUN head -c 8M /dev/urandom > /top\n".encode()),
                        tag=top, network_mode="host", rm=True)
    top_id = engine.images.get(top).id
    changed = new_bytes(engine, top, base)  # the 8 MiB layer, as the engine counts it
    try:
        assert dl("push", base, "--config", str(sim_cluster[1]), "--compress", "none").returncode == 0
        image = local_image(engine, top)
        results, wire = [], []
        for rm, node in zip(remotes, nodes):
            with received(engine, [node]) as got:
                results.append(push_to_host(engine, rm, image, "none"))
            wire += got
        for res, w in zip(results, wire):
            assert res.status == "pushed" and "thin: 3 of 4 layers already there" in res.detail, res
            # into the host's eth0: the 8 MiB layer, its tar headers, json, config and manifest, the framing (with
            # the base's 16 MiB layer too it would be 3 times the bound)
            assert changed <= w <= FRAMING * changed + SESSION, (w, changed)
            assert res.bytes_sent <= w, (res.bytes_sent, w)  # the report claims no byte the host did not receive
        print(f"\n[wire] a thin push of an 8 MiB layer: {[round(w / 2**20, 3) for w in wire]} MiB into the "
              f"nodes' eth0; reported {[round(r.bytes_sent / 2**20, 3) for r in results]} MiB")
        assert ids_on_nodes(remotes, top) == [top_id, top_id]
        top_chains = chain_ids(list(engine.images.get(top).attrs["RootFS"]["Layers"]))
        base_chains = chain_ids(list(engine.images.get(base).attrs["RootFS"]["Layers"]))
        assert top_chains[:3] == base_chains and len(top_chains) == 4  # exactly the top layer was new
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", top, base])
        engine.images.remove(top, force=True)


def push_counting_reads(monkeypatch, cfg: str, host: str, ref: str, **env: str) -> tuple[str, int]:
    """`push REF` to one host (star, uncompressed) with `env` set for it: its output, and the bytes the launcher's
    engines read meanwhile."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = engine_reads()
    r = dl("push", ref, "--config", cfg, "--hosts", host, "--compress", "none", "--strategy", "star")
    read = engine_reads() - before
    for k in env:
        monkeypatch.delenv(k)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, read


def test_a_thin_push_reads_only_the_new_layers_from_the_launchers_engine(sim_cluster, engine, remotes, fresh_image,
                                                                        tmp_path, monkeypatch):
    """issue 43: after a bump the launcher's engine reads about the new layer's bytes, not the image's: the engine
    pushes into the launcher's registry (which holds the base: the first push of the lineage filled it in the
    background after its hosts were done, issue 58), and the hosts' stream is made from its blobs. The same push
    through `docker save` (DOCKERLAUNCH_LAYER_SOURCE=save) reads the whole image: the count can tell them apart. Over
    its cap, the registry drops the least recently used blobs but the pushed image's; a later image that needs a
    dropped layer has the engine push it again."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))  # a registry of this test's own
    base = fresh_image(mb=96)
    bumps = []
    for parent in (base, base, base, None):
        tag = f"dlt-dist/bump-{secrets.token_hex(3)}:1"
        engine.images.build(fileobj=io.BytesIO(f"FROM {parent or bumps[0]}\nRUN head -c 8M /dev/urandom > "
                                               f"/top-{tag[-8:-2]}\n".encode()), tag=tag, network_mode="host", rm=True)
        bumps.append(tag)
    host = remotes[0].name
    cfg = str(sim_cluster[1])

    def push(ref: str, **env) -> tuple[str, int]:
        out, read = push_counting_reads(monkeypatch, cfg, host, ref, **env)
        assert ids_on_nodes(remotes[:1], ref) == [engine.images.get(ref).id], out
        assert wait_fills() == []  # a fill the push left in the background: its reads are not the next push's
        return out, read

    try:
        out, _ = push(base)  # the host has the tools image under it; the cold cache is filled after the push
        assert "(docker save read the whole image;" in out, out  # the cache lacked the base: filled after
        assert "Layer cache: filling it in the background with " in out, out
        out, _ = push(bumps[0])  # the registry holds the base: only the new layer is read
        assert "thin: 3 of 4 layers already there (new layers read through the launcher's registry" in out, out
        out, read = push(bumps[1], DOCKERLAUNCH_LAYER_CACHE_GB="0")  # then all but this image's blobs go
        assert "thin: 3 of 4 layers already there (new layers read through the launcher's registry" in out, out
        assert read < 40 * 2**20, (read, out)  # ~8 MiB read; the image is 104 MiB
        assert len(layer_cache._blobs()) == 5  # its config and 4 layers: bumps[0]'s top layer went
        out, read_save = push(bumps[2], DOCKERLAUNCH_LAYER_SOURCE="save")
        assert "(docker save read the whole image (DOCKERLAUNCH_LAYER_SOURCE=save))" in out, out
        assert read_save > 96 * 2**20, (read_save, out)
        out, read_again = push(bumps[3])  # on bumps[0], whose top layer the registry dropped: pushed again
        assert "thin: 4 of 5 layers already there (new layers read through the launcher's registry" in out, out
        assert read_again < 40 * 2**20, (read_again, out)  # the dropped 8 MiB and the new 8 MiB
        print(f"\n[thin] the launcher's engine read {read / 2**20:.1f} MiB through its registry, "
              f"{read_save / 2**20:.1f} MiB through docker save (image 104 MiB, new layer 8 MiB)")
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", *bumps, base])
        for tag in bumps:
            engine.images.remove(tag, force=True)


def test_a_bump_whose_layers_the_cache_never_saw_goes_by_docker_save_and_the_cache_fills_after_the_push(
        sim_cluster, engine, remotes, nodes, fresh_image, tools_image, tmp_path, monkeypatch):
    """issue 58 item 6: the first push after a 2 kB change took 2 min 20 s, filling the layer cache with the whole
    image (the engine read and gzipped 1.2 GB) before a byte went. With the cache cold, the plan takes docker save
    (one read of the image per stream and one for the layer map: less than the fill), the hosts get the new layer
    only, with the right Image ID, and the cache fills in the background after the hosts are done; the next bump
    then reads only its new layer. Counted from outside: the launcher's engine reads (rchar), what each node's eth0
    received, the cache's blobs on disk (stat), the Image IDs asked over SSH."""
    from dockerlaunch.sim.measure import background_fills

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))  # a cache that never saw this lineage
    new = fresh_image(mb=8)  # the tools image, which both nodes have, and 8 MiB: a bump of a base the cache lacks
    size = local_image(engine, new, facts=False).size
    bump = f"dlt-dist/bump-{secrets.token_hex(3)}:1"
    engine.images.build(fileobj=io.BytesIO(f"FROM {new}\nRUN head -c 2M /dev/urandom > /top2\n".encode()),
                        tag=bump, network_mode="host", rm=True)
    cfg = str(sim_cluster[1])

    def push(ref: str) -> tuple[dict, int, list[int]]:
        before = engine_reads()
        with received(engine, nodes) as wire:
            r = dl("push", ref, "--config", cfg, "--compress", "none", "--output", "json")
        read = engine_reads() - before
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        got = json.loads(r.stdout)
        assert ids_on_nodes(remotes, ref) == [engine.images.get(ref).id] * 2, got  # over SSH, by each host
        return got, read, wire

    def blobs_on_disk() -> int:  # the registry's blobs under the test's cache folder, by stat
        return sum(f.stat().st_size for f in (tmp_path / "cache").rglob("data") if "blobs" in f.parts)

    layer, top = new_bytes(engine, new, tools_image), new_bytes(engine, bump, new)  # 8 MiB, 2 MiB

    try:
        out, read, wire = push(new)
        route = out["layer_route"]
        assert (route["route"], route["holds"], route["fill_later"]) == ("save", 0, True), route
        assert route["lacks"] >= 0.9 * size and route["save_reads"] == 3, route  # the layer map, 2 star streams
        assert out["layer_source"]["via"] == "save", out["layer_source"]
        for h in out["hosts"]:
            assert h["status"] == "pushed", h
            assert "docker save read the whole image; the layer cache lacked " in h["detail"], h
        # into each node's eth0: the new 8 MiB layer, the tar's and the wire's framing, not the image (its tools
        # image would be hundreds of MiB more)
        assert all(layer <= w <= FRAMING * layer + SESSION for w in wire), (wire, layer)
        assert read >= 2.7 * size, (read, size)  # docker save read the whole image 3 times; the cache route reads it
        # once and gzips it, which costs more (benchmarks/RESULTS.md, issue 58)
        pid = out["cache_fill"]["pid"]
        assert pid in background_fills() or not os.path.exists(f"/proc/{pid}"), pid  # it may have ended already
        assert wait_fills(pids=[pid]) == []
        cached = json.loads(dl("cache", "--output", "json").stdout)
        (entry,) = [i for i in cached["images"] if new in i["names"]]
        assert entry["cached"] == entry["layers"] > 1 and cached["filling"] is None, cached
        assert not subprocess.run(["pgrep", "-f", str(tmp_path / "cache")], capture_output=True).stdout  # no registry

        stored = blobs_on_disk()
        out, read, wire = push(bump)  # the next bump of the lineage: only its new layer is read, through the cache
        route = out["layer_route"]
        assert (route["route"], route["fill_later"], out["cache_fill"]) == ("cache", False, None), out
        assert route["holds"] >= 0.9 * size and 2 << 20 <= route["lacks"] <= 3 << 20, route
        assert out["layer_source"]["via"] == "cache", out["layer_source"]
        assert all(top <= w <= FRAMING * top + SESSION for w in wire), (wire, top)  # the 2 MiB layer, not 8 more
        grown = blobs_on_disk() - stored
        assert top <= grown <= top + (1 << 20), grown  # the engine pushed the new 2 MiB layer (random: gzip keeps it)
        # and its config and manifest (a few kB)
        # (the engine's reads are printed, not asserted: this machine's dockerd serves other sessions too)
        print(f"\n[issue 58] the engine read {read / 2**20:.1f} MiB for the bump through the cache, which grew "
              f"{grown / 2**20:.1f} MiB; image {size / 2**20:.0f} MiB; into the nodes' eth0 "
              f"{[round(w / 2**20, 3) for w in wire]} MiB for its {top / 2**20:.3f} MiB layer")
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", bump, new])
        engine.images.remove(bump, force=True)


def test_a_containerd_store_launcher_reads_only_the_new_layers_too(sim_cluster, engine, remotes, tmp_path,
                                                                   monkeypatch):
    """issue 43 on a launcher whose engine keeps images in containerd's store (Docker 28 with the store Docker 29
    makes the default, a second dockerd here): its push into the launcher's registry sends the content store's
    blobs as they are, the facts come from the pushed manifest, not from a read of the save (which such a launcher
    made on every push of a new image), and they are exactly the save's: hosts give the image the same ID."""
    import docker

    from dockerlaunch.transfer import layer_cache
    from dockerlaunch.transfer.image_facts import with_facts
    from tests.integration.helpers import local_containerd_engine

    with local_containerd_engine(engine, tmp_path / "c8d") as host_url:
        c8d = docker.DockerClient(base_url=host_url)
        monkeypatch.setenv("DOCKER_HOST", host_url)
        monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))

        def build(tag: str, dockerfile: str, files: dict[str, bytes]) -> None:
            ctx = io.BytesIO()
            with tarfile.open(fileobj=ctx, mode="w") as t:
                for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
            ctx.seek(0)
            c8d.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)

        base = f"dlt-c8d/{secrets.token_hex(3)}:base"
        build(base, "FROM scratch\nCOPY blob /blob\n", {"blob": os.urandom(96 << 20)})
        bumps = []
        for i in range(3):
            bumps.append(base.replace(":base", f":bump{i}"))
            build(bumps[-1], f"FROM {base}\nCOPY top /top\n", {"top": os.urandom(8 << 20)})
        node = remotes[0].name
        cfg = str(sim_cluster[1])

        def push(ref: str, **env) -> tuple[str, int]:
            return push_counting_reads(monkeypatch, cfg, node, ref, **env)

        try:
            push(base)
            out, _ = push(bumps[0])  # fills the launcher's registry with the base (the engine reads it once)
            assert "thin: 1 of 2 layers already there (new layers read through the launcher's registry" in out, out
            out, read = push(bumps[1])
            assert "thin: 1 of 2 layers already there (new layers read through the launcher's registry" in out, out
            assert read < 40 * 2**20, (read, out)  # ~8 MiB; the image is 104 MiB
            out, read_save = push(bumps[2], DOCKERLAUNCH_LAYER_SOURCE="save")
            assert "docker save read the whole image" in out, out
            assert read_save > 96 * 2**20, (read_save, out)
            # the registry's facts are the save's: the ID every host gives the image is the one it always gave
            for ref in (base, *bumps):
                img = local_image(c8d, ref, facts=False)
                from_registry = layer_cache.registry_image(c8d, img).facts
                assert from_registry == with_facts(c8d, img).facts, ref
                got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
                assert got == from_registry.config.digest, (ref, got)  # the node's classic store: the config digest
            print(f"\n[thin, containerd-store launcher] the engines read {read / 2**20:.1f} MiB through the registry, "
                  f"{read_save / 2**20:.1f} MiB through docker save (image 104 MiB, new layer 8 MiB)")
        finally:
            for rm in remotes:
                rm.run(["docker", "rmi", "-f", *bumps, base])


def test_a_push_streams_whole_when_another_launcher_prunes_the_cache_meanwhile(engine, remotes, fresh_image,
                                                                               tmp_path, monkeypatch):
    """A push reads the image's blobs from the launcher's registry long after it filled it (the registry's lock is
    not held through the stream: the layers go one after another, for minutes). Another launcher's `cache prune`
    (or its cap) in between removed the blobs, and the push failed on a file that was gone. The push holds the
    files it will stream open from the fill: the node loads the whole image, the Image ID the engine gives it."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path))
    ref = fresh_image(mb=8, scratch=True)
    want = engine.images.get(ref).id
    img = layer_cache.registry_image(engine, local_image(engine, ref, facts=False))  # this launcher's fill
    assert list(tmp_path.glob("registry/store/**/data")), "the fill left no blob in the registry"
    other = dl("cache", "prune")  # a second launcher, now
    assert other.returncode == 0, other.stdout + other.stderr
    assert not list(tmp_path.glob("registry/store/**/data")), other.stdout
    body = b"".join(img.tar_source.tar(engine, img, set()))
    try:
        loaded = remotes[0].run(["docker", "load"], stdin=body, timeout=300)
        assert loaded.ok and f"Loaded image ID: {want}" in loaded.stdout, loaded.stdout + loaded.stderr
    finally:
        remotes[0].run(["docker", "rmi", "-f", want])


def test_chain_push_relays_host_to_host(sim_cluster, engine, remotes, fresh_image):
    ref = fresh_image(mb=16)
    local_id = engine.images.get(ref).id
    try:
        r = dl("push", ref, "--config", str(sim_cluster[1]), "--strategy", "chain")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "chain (head of chain)" in r.stdout and f"relayed from {sim_cluster[2][0].ip}" in r.stdout
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, local_id])



def tcp_listening(remote) -> set[int]:
    return listening_ports(remote.check(["cat", "/proc/net/tcp", "/proc/net/tcp6"], "reading /proc/net/tcp").stdout)


def test_kill_listener_ends_only_the_relays_own_listener(sim_cluster, remotes):
    """A closed SSH channel does not end `nc -l`; the chain's cleanup kills its relay's listener by the pid the
    relay reported: another `nc -l` on the same port pattern lives, and a pid that is no `nc -l` is left alone."""
    node, ip = remotes[1], sim_cluster[2][1].ip
    port = 40000 + secrets.randbelow(20000)
    pids = node.check(["sh", "-c", f"nohup nc -l {ip} {port} >/dev/null 2>&1 & echo $!; "
                                   f"nohup nc -l {ip} {port + 1} >/dev/null 2>&1 & echo $!; "
                                   "nohup sleep 60 >/dev/null 2>&1 & echo $!"], "starting listeners").stdout.split()
    mine, other, sleeper = (int(x) for x in pids)
    try:
        deadline = time.monotonic() + 10
        while not {port, port + 1} <= tcp_listening(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {port, port + 1} <= tcp_listening(node)
        chain.kill_listener(node, mine)
        chain.kill_listener(node, sleeper)  # not an `nc -l`: untouched
        chain.kill_listener(node, None)  # a relay that never reported one
        deadline = time.monotonic() + 10
        while port in tcp_listening(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port not in tcp_listening(node) and port + 1 in tcp_listening(node)
        assert node.run(["kill", "-0", str(sleeper)]).ok
    finally:
        node.run(["kill", str(mine), str(other), str(sleeper)])


def test_a_chain_that_fails_after_a_listener_is_up_kills_it(sim_cluster, engine, remotes, fresh_image):
    """Three links -- node1 (head), node2, node1 again (tail): the tail's listener comes up first (the test sees
    it), then node2 cannot listen and passes nothing on; the live listener on node1 must be killed and its port
    closed, and nothing loaded or tagged."""
    from dockerlaunch.transfer.push_plan import Action, HostTransfer, Strategy

    ref = fresh_image(mb=8)
    image = local_image(engine, ref)
    ip1 = sim_cluster[2][0].ip
    nowhere = ip1.rsplit(".", 1)[0] + ".200"  # node2 cannot listen there
    port = 40000 + secrets.randbelow(20000)
    links = [HostTransfer(rm.name, Action.SEND, address=addr, strategy=Strategy.CHAIN, compression="none", link=i)
             for i, (rm, addr) in enumerate([(remotes[0], ip1), (remotes[1], nowhere), (remotes[0], ip1)])]
    seen_listening = []

    def watch():  # proves the tail's listener was really up before the cleanup
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not seen_listening:
            if port in tcp_listening(remotes[0]):
                seen_listening.append(True)
            time.sleep(0.05)

    import threading

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        results = chain.push_chain(engine, [remotes[0], remotes[1], remotes[0]], image, links, port=port)
        watcher.join(timeout=30)
        assert seen_listening, "the tail never listened: the cleanup branch was not exercised"
        assert all(r.status == "failed" and "chain could not start at" in r.detail for r in results), results
        deadline = time.monotonic() + 10
        while (nc_listeners(remotes[0]) or port in tcp_listening(remotes[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert nc_listeners(remotes[0]) == [] and port not in tcp_listening(remotes[0])
        assert nc_listeners(remotes[1]) == []
        assert ids_on_nodes(remotes, ref) == [None, None]  # nothing loaded, nothing tagged
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", f"pkill -f '^nc -l [^ ]+ {port}$' || true"])  # the test's own port, if any is left
            rm.run(["docker", "rmi", "-f", ref, image.id])


def test_hosts_a_broken_chain_did_not_reach_get_a_star_push(sim_cluster, engine, remotes, fresh_image):
    ref = fresh_image(mb=8)
    local_id = engine.images.get(ref).id
    ip1 = sim_cluster[2][0].ip
    nowhere = ip1.rsplit(".", 1)[0] + ".200"  # node2 cannot listen there: the chain cannot start
    try:
        results = push.push(engine, remotes, ref, compress="none", strategy="chain", addresses=[ip1, nowhere])
        for res in results:
            assert res.status == "pushed", res
            assert res.detail.startswith("star after the chain failed (chain could not start at "), res.detail
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        assert nc_listeners(remotes[1]) == [] and nc_listeners(remotes[0]) == []  # no listener left behind
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, local_id])


def test_a_relay_dying_mid_stream_is_resumed_by_a_second_chain(sim_cluster, engine, remotes, nodes, fresh_image,
                                                                 tools_image, monkeypatch):
    """Node2's listener is killed once node2 has staged a third of the (zstd) stream: node1 still loads its copy;
    node2 is not sent a star push but a second chain that starts where its stage ends, so the bytes sent to it
    again are at most 1.1 x what it lacked. Both counted by node2's eth0, as benchmarks/chain_cut.py counts them:
    what came in after the cut (the second chain's feed, framing and all) against the stream less all that came
    in before it."""
    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    ref = fresh_image(mb=400)
    local_id = engine.images.get(ref).id
    whole = new_bytes(engine, ref, tools_image)  # 400 MiB of random bytes: the least the thin stream carries
    ips = [n.ip for n in sim_cluster[2]]
    out: list = []
    t = threading.Thread(target=lambda: out.append(push.push(engine, remotes, ref, compress="zstd",
                                                                   strategy="chain", addresses=ips)), daemon=True)
    try:
        with received(engine, nodes[1:]) as before_cut:
            t.start()
            deadline = time.monotonic() + 180
            while staged_bytes(remotes[1]) < 140 << 20 and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            at = staged_bytes(remotes[1])
            assert at >= 140 << 20, f"node2 never staged 140 MiB of the chain's stream ({at})"
            remotes[1].check(["sh", "-c", "pkill -f '^nc -l'"], "killing node2's relay listener")
        # ended after the kill: the relay's bytes are all in, those its dead listener never read too
        with received(engine, nodes[1:]) as after_cut:
            t.join(timeout=600)
        assert not t.is_alive(), "push hung after a relay died"
        results = out[0]
        assert all(r.status == "pushed" for r in results), results
        assert results[0].detail.startswith("chain (head of chain)"), results[0].detail  # its own load went on
        second = results[1].detail
        assert second.startswith("chain again after a cut (cut: the stream stopped after "), second
        assert "star" not in second and "resumed at" in second, second
        kept = int(second.split("stopped after ", 1)[1].split()[0])
        # the host's own figures hold the report's: it staged `at` before the kill and received `before_cut`
        assert at <= kept <= before_cut[0], (at, kept, before_cut)
        # node2 lacked at least the stream less all it received before the cut: its kept bytes and what its dead
        # listener had not read, the framing, the chain's commands (1 to 2.5 MiB more than it kept, measured)
        lacked = whole - before_cut[0]
        assert after_cut[0] <= 1.1 * lacked, (after_cut, whole, before_cut, kept)
        print(f"\n[wire] relay cut at {kept / 2**20:.0f} MiB of {whole / 2**20:.0f} MiB: "
              f"{after_cut[0] / 2**20:.1f} MiB into node2's eth0 after the cut for {lacked / 2**20:.1f} MiB lacked "
              f"(stream less {before_cut[0] / 2**20:.1f} MiB before it): {after_cut[0] / lacked:.3f} x; "
              f"{(whole - kept) / 2**20:.1f} MiB less what it kept; reported {results[1].bytes_sent / 2**20:.1f} MiB")
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        assert nc_listeners(remotes[0]) == [] and nc_listeners(remotes[1]) == []
        assert [staged_bytes(rm) for rm in remotes] == [0, 0]  # both stages went once their image was tagged
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", "pkill -f '^nc -l' || true"])
            rm.run(["docker", "rmi", "-f", ref, local_id])
            rm.run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])


def test_a_chain_head_whose_stream_arrived_but_did_not_load_loses_its_stage(sim_cluster, engine, remotes,
                                                                              fresh_image, monkeypatch):
    """A thin chain planned while both hosts had the base; the head loses it before the stream comes, so its load
    of the whole stream fails (a layer it lacks). Its stage goes, as a star host's does (a stage of a stream that
    cannot load is no prefix worth keeping), the tail loads, and the head gets the star fallback in full."""
    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    monkeypatch.setenv(cache_server.MODE_ENV, "save")  # the stream's shape is the same; no registry to fill
    base = fresh_image(mb=8)
    top = f"dlt-dist/top-{secrets.token_hex(3)}:1"
    engine.images.build(fileobj=io.BytesIO(f"FROM {base}\nRUN head -c 8M /dev/urandom > /top\n".encode()),
                        tag=top, network_mode="host", rm=True)
    top_id = engine.images.get(top).id
    ips = [n.ip for n in sim_cluster[2]]
    try:
        assert dl("push", base, "--config", str(sim_cluster[1]), "--compress", "none").returncode == 0
        image = local_image(engine, top)
        job = push.Push(engine, remotes, image, addresses=ips, strategy="chain", compress="none", thin=True)
        plan = job.plan()
        assert [t.host for t in plan.sending(push.Strategy.CHAIN)] == [rm.name for rm in remotes], plan
        assert all(t.skip_files for t in plan.hosts), plan  # thin: both had the base
        remotes[0].check(["docker", "rmi", base], "removing the base on the head")
        results = job.apply()
        assert [r.status for r in results] == ["pushed", "pushed"], results
        head = results[0].detail
        assert head.startswith("star after the chain failed (load failed") and "thin stream was refused" in head, head
        assert results[1].detail.startswith("chain"), results[1].detail
        assert ids_on_nodes(remotes, top) == [top_id, top_id]
        assert [staged_bytes(rm) for rm in remotes] == [0, 0]  # the head's chain stage went with its failed load
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", top, base])
            rm.run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])
        engine.images.remove(top, force=True)


def test_a_chain_whose_launcher_was_killed_resumes_on_every_host(sim_cluster, engine, remotes, nodes, fresh_image,
                                                                 tools_image, monkeypatch):
    """The launcher SIGKILLed mid-chain: each host keeps the prefix it got (the tail's stage is not thrown away
    though no checksum ever came); the next chain push sends the head only what it lacks, and the head feeds
    the tail from its own stage where the tail's ends (each counted by the host's eth0 against the stream less its
    stage). Nothing is tagged by the cut push."""
    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    ref = fresh_image(mb=400)
    local_id = engine.images.get(ref).id
    whole = new_bytes(engine, ref, tools_image)  # 400 MiB: the least the (uncompressed, thin) stream carries
    config = str(sim_cluster[1])
    try:
        p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "push", ref, "--config", config,
                              "--strategy", "chain", "--compress", "none"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while staged_bytes(remotes[1]) < 120 << 20 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None, (f"the push ended (exit {p.returncode}) before node2 staged 120 MiB "
                                  f"({staged_bytes(remotes[1])}): a host that does not stage (low disk?) cannot "
                                  "show a resume")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(load_bytes_read(rm) for rm in remotes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ids_on_nodes(remotes, ref) == [None, None]
        staged = [staged_bytes(rm) for rm in remotes]
        assert staged[1] >= 120 << 20 and staged[0] >= staged[1], staged

        with received(engine, nodes) as wire:
            r = dl("push", ref, "--config", config, "--strategy", "chain", "--compress", "none", "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(r.stdout)["hosts"]
        assert [h["status"] for h in rows] == ["pushed", "pushed"], rows
        assert rows[0]["detail"].startswith("chain (head of chain)") and "resumed at" in rows[0]["detail"], rows
        assert rows[1]["detail"].startswith("chain (relayed from") and "resumed at" in rows[1]["detail"], rows
        # what each host received against what it lacked (the stream less its stage): the head, fed over SSH by the
        # launcher (its eth0 also has the ACKs of its relay to the tail), and the tail, fed by the head's relay
        lacked = [whole - n for n in staged]
        assert all(w <= 1.1 * x for w, x in zip(wire, lacked)), (wire, lacked, staged)
        print(f"\n[wire] resumed chain: {[round(w / 2**20, 1) for w in wire]} MiB into the nodes' eth0 for "
              f"{[round(x / 2**20, 1) for x in lacked]} MiB lacked "
              f"({', '.join(f'{w / x:.3f}' for w, x in zip(wire, lacked))} x)")
        assert ids_on_nodes(remotes, ref) == [local_id, local_id]
        assert [staged_bytes(rm) for rm in remotes] == [0, 0]
        assert nc_listeners(remotes[0]) == [] and nc_listeners(remotes[1]) == []
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", "pkill -f '^nc -l' || true"])
            rm.run(["docker", "rmi", "-f", ref, local_id])
            rm.run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])


def test_a_bundle_image_cannot_retag_anything(engine, fresh_image, tmp_path):
    """An image tar inside a bundle whose own manifest says `RepoTags: [victim]`: loading the bundle sets only
    the manifest's tag; the victim tag keeps pointing where it pointed."""
    import hashlib
    import tarfile

    import zstandard

    from dockerlaunch.transfer.bundle import BUNDLE_FORMAT

    ref, victim = fresh_image(mb=1, scratch=True), fresh_image(mb=1, scratch=True)
    image_id, victim_id = engine.images.get(ref).id, engine.images.get(victim).id
    inner = b"".join(engine.api.get_image(ref))  # named save: RepoTags [ref]
    assert len(victim) == len(ref)  # same-length names: the tar's member sizes stay right
    inner = inner.replace(ref.encode(), victim.encode())
    assert victim.encode() in inner and ref.encode() not in inner, "the crafted tar must carry the victim tag"
    good = f"dlt-dist/good-{secrets.token_hex(3)}:1"
    manifest = json.dumps({"format": BUNDLE_FORMAT, "images": [{
        "ref": good, "id": image_id, "size": 1, "file": f"images/{image_id[7:]}.tar",
        "sha256": hashlib.sha256(inner).hexdigest(), "bytes": len(inner)}]}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in [(f"images/{image_id[7:]}.tar", inner), ("manifest.json", manifest)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    path = tmp_path / "crafted.dlb"
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    engine.images.remove(ref, force=True)
    try:
        r = dl("load", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        assert engine.images.get(good).id == image_id
        assert engine.images.get(victim).id == victim_id  # not moved by the tar's own RepoTags
    finally:
        try:
            engine.images.remove(good, force=True)
        except Exception:
            pass


def test_a_tag_a_load_moves_is_put_back_and_the_load_fails(engine, fresh_image, tmp_path):
    """Were an engine's loader to set a tag the re-streaming did not see (here a loader that tags after its real
    `docker load`, moving a victim tag and adding one), the engine's tags compared before and after the load catch
    it: both put back, the bundle's own tag not set, one line naming the tag."""
    from dockerlaunch.errors import TransferError
    from dockerlaunch.transfer.bundle import load_bundle, local_loader, local_runner

    ref, victim = fresh_image(mb=1, scratch=True), fresh_image(mb=1, scratch=True)
    image_id, victim_id = engine.images.get(ref).id, engine.images.get(victim).id
    planted = f"dlt-dist/planted-{secrets.token_hex(3)}:1"
    bystander = f"dlt-dist/bystander-{secrets.token_hex(3)}:1"
    bundle = tmp_path / "b.dlb"
    assert dl("save", ref, "-o", str(bundle)).returncode == 0
    engine.images.remove(ref, force=True)
    real = local_loader()

    def tagging_loader(stream, piece):
        status, out = real(stream, piece)
        for tag in (victim, planted):
            subprocess.run(["docker", "tag", image_id, tag], check=True, capture_output=True)
        # someone else's tagging on the same engine meanwhile (not onto the loaded image): left as it is
        subprocess.run(["docker", "tag", victim_id, bystander], check=True, capture_output=True)
        return status, out

    try:
        with pytest.raises(TransferError) as e:
            load_bundle(bundle, tagging_loader, local_runner)
        msg = str(e.value)
        assert msg.startswith(f"local: tag {victim} changed during the load (was {victim_id[7:19]}, the load made "
                              f"it {image_id[7:19]}) with 1 more: "), msg  # the victim sorts before `planted-`
        assert msg.endswith("put back as it was, nothing of the bundle was tagged") and "\n" not in msg, msg
        assert engine.images.get(victim).id == victim_id
        tags = {t for i in engine.images.list() for t in i.tags}
        assert planted not in tags and ref not in tags and engine.images.get(bystander).id == victim_id
    finally:
        for tag in (planted, ref, bystander):
            subprocess.run(["docker", "rmi", tag], capture_output=True)


def test_a_delta_bundle_carries_only_the_new_layers_and_needs_its_base(sim_cluster, engine, remotes, fresh_image,
                                                                      tmp_path):
    """`save NEW --base OLD` after a top-layer change (an ms-swift bump's shape): the bundle holds only the new
    layer; it loads onto a host that has OLD (Image ID checked, tag set), and is refused in one line, with
    nothing loaded, where OLD's layers are missing. The bundle's own manifest serves as the next base."""
    old = fresh_image(mb=16)
    new_tag = f"dlt-dist/{secrets.token_hex(4)}:2"
    engine.images.build(fileobj=io.BytesIO(f"FROM {old}\nRUN echo {secrets.token_hex(8)} > /bump\n".encode()),
                        tag=new_tag, network_mode="host", rm=True)
    full, delta = tmp_path / "old.bundle", tmp_path / "new.delta"
    try:
        assert dl("save", old, "-o", str(full)).returncode == 0
        r = dl("save", new_tag, "--base", old, "-o", str(delta))
        assert r.returncode == 0 and f"delta on {old}" in r.stdout, r.stdout + r.stderr
        assert delta.stat().st_size < full.stat().st_size / 20, (delta.stat().st_size, full.stat().st_size)
        # a host without OLD: refused before anything is loaded
        r = dl("load", str(delta), "--config", str(sim_cluster[1]), "--hosts", remotes[0].name)
        assert r.returncode == 1 and f"delta on {old}" in r.stdout and "load " + old in r.stdout, r.stdout
        assert not remotes[0].run(["docker", "image", "inspect", new_tag]).ok
        # with OLD loaded first: the delta loads, with the right Image ID
        assert dl("load", str(full), "--config", str(sim_cluster[1]), "--hosts", remotes[0].name).returncode == 0
        r = dl("load", str(delta), "--config", str(sim_cluster[1]), "--hosts", remotes[0].name)
        assert r.returncode == 0, r.stdout + r.stderr
        got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", new_tag]).stdout.strip()
        assert got == engine.images.get(new_tag).id
        # the full bundle as the base of the next delta: the same size as against the image
        again = tmp_path / "again.delta"
        assert dl("save", new_tag, "--base", str(full), "-o", str(again)).returncode == 0
        assert abs(again.stat().st_size - delta.stat().st_size) < 4096
    finally:
        remotes[0].run(["docker", "rmi", "-f", new_tag, old])
        engine.images.remove(new_tag, force=True)


def test_a_push_cut_mid_stream_resumes_from_what_the_host_staged(sim_cluster, engine, remotes, nodes, fresh_image,
                                                                  monkeypatch):
    """The connection is cut at 40% of the stream (the launcher's channel closed at a chosen byte): nothing is
    tagged, the host keeps the prefix it received; the next push sends only the rest (the image less what was
    staged, counted by the host's eth0), the Image ID checks out, and the staged file is gone."""
    import threading

    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    ref = fresh_image(mb=48, scratch=True)
    image = local_image(engine, ref)
    plan = push.Push(engine, [remotes[0]], image, strategy="star", compress="none", thin=False).plan()
    [t] = plan.hosts
    cut, sent = threading.Event(), [0]

    def count(n: int) -> None:
        sent[0] += n
        if sent[0] >= 0.4 * image.size:
            cut.set()

    try:
        first = push.send_star(engine, remotes[0], image, t, on_bytes=count, stop=cut)
        assert first.status == "failed", first
        assert not remotes[0].run(["docker", "image", "inspect", ref]).ok  # nothing tagged
        staged = staged_bytes(remotes[0])  # what was in flight when the channel closed arrived too
        assert 0.3 * image.size <= staged <= 0.9 * image.size, staged
        with received(engine, nodes[:1]) as wire:
            second = push_to_host(engine, remotes[0], image, compress="none", thin=False)
        assert second.status == "pushed" and "resumed at" in second.detail, second
        # image.size: the engine's count of the image (48 MiB of random bytes): its save stream is a few kB more
        lacked = image.size - staged
        assert wire[0] <= FRAMING * lacked + SESSION, (wire, image.size, staged)  # sent from byte 0: 48 MiB
        print(f"\n[wire] star push resumed: {wire[0] / 2**20:.2f} MiB into the node's eth0 for "
              f"{lacked / 2**20:.2f} MiB lacked; reported {second.bytes_sent / 2**20:.2f} MiB")
        got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
        assert got == image.id and staged_bytes(remotes[0]) == 0
    finally:
        remotes[0].run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])
        remotes[0].run(["docker", "rmi", "-f", ref, image.id])


def test_load_hosts_cut_mid_stream_resumes_from_what_the_host_staged(sim_cluster, engine, remotes, nodes, fresh_image,
                                                                     tmp_path, monkeypatch):
    """`load --hosts` of a bundle, cut at 40% of its image's stream: nothing is tagged and the host keeps what it
    received; the next load (through the CLI, as a user runs it again) sends only the rest, says it resumed, checks
    the Image ID and tags; the staged file is gone. A stage that does not match the bundle's bytes is sent again."""
    from dockerlaunch.transfer import bundle as bundlelib

    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    ref = fresh_image(mb=48, scratch=True)
    image_id = engine.images.get(ref).id
    size = engine.images.get(ref).attrs["Size"]  # 48 MiB of random bytes: the least the image's tar carries
    path = tmp_path / "one.dlb"
    assert dl("save", ref, "-o", str(path)).returncode == 0
    [entry] = bundlelib.read_manifest(path)
    cut, sent = threading.Event(), [0]

    def count(n: int) -> None:
        sent[0] += n
        if sent[0] >= 0.4 * entry.bytes:
            cut.set()

    host = remotes[0].target.hostname
    try:
        with pytest.raises(TransferError):
            bundlelib.load_bundle(path, bundlelib.remote_loader(remotes[0], stop=cut, on_bytes=count),
                                  bundlelib.remote_runner(remotes[0]), where=f"host {host}")
        assert not remotes[0].run(["docker", "image", "inspect", ref]).ok  # nothing tagged
        staged = staged_bytes(remotes[0])
        assert 0.3 * size <= staged <= 0.9 * size, (staged, size)
        notes: list[str] = []
        with received(engine, nodes[:1]) as wire:
            bundlelib.load_bundle(path, bundlelib.remote_loader(remotes[0], notes),
                                  bundlelib.remote_runner(remotes[0]), where=f"host {host}")
        assert notes == [f"{ref}: resumed at {staged / 1e6:.0f} MB staged on the host"], notes
        assert wire[0] <= FRAMING * (size - staged) + SESSION, (wire, size, staged)  # sent from byte 0: 48 MiB
        resumed = wire[0]
        got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
        assert got == image_id and staged_bytes(remotes[0]) == 0
        # again through the CLI after a cut whose stage was tampered with: sent from byte 0, still checked
        remotes[0].run(["docker", "rmi", "-f", ref, image_id])
        cut.clear()
        sent[0] = 0
        with pytest.raises(TransferError):
            bundlelib.load_bundle(path, bundlelib.remote_loader(remotes[0], stop=cut, on_bytes=count),
                                  bundlelib.remote_runner(remotes[0]), where=f"host {host}")
        remotes[0].check(["sh", "-c", 'for f in "$HOME"/.cache/dockerlaunch/push/*.tar; do '
                          'printf X | dd of="$f" bs=1 seek=1000 conv=notrunc 2>/dev/null; done'], "tampering")
        with received(engine, nodes[:1]) as wire:
            r = dl("load", str(path), "--config", str(sim_cluster[1]), "--hosts", host)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "resumed at" not in r.stdout and ref in r.stdout, r.stdout
        assert wire[0] >= size, (wire, size)  # all of it again: a resume from the cut would be ~40% less
        print(f"\n[wire] load --hosts resumed: {resumed / 2**20:.2f} MiB into the node's eth0 for "
              f"{(size - staged) / 2**20:.2f} MiB lacked; after a tampered stage {wire[0] / 2**20:.2f} MiB of "
              f"{size / 2**20:.2f} MiB")
        got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
        assert got == image_id and staged_bytes(remotes[0]) == 0
    finally:
        remotes[0].run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])
        remotes[0].run(["docker", "rmi", "-f", ref, image_id])


def test_a_staged_prefix_that_is_not_the_streams_own_is_sent_again(sim_cluster, engine, remotes, nodes, fresh_image,
                                                                   monkeypatch):
    """A tampered staged file (same name, other bytes): its sha256 does not match this stream's prefix, so the
    push starts from byte 0 and the image still checks out."""
    monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
    ref = fresh_image(mb=8, scratch=True)
    image = local_image(engine, ref)
    plan = push.Push(engine, [remotes[0]], image, strategy="star", compress="none", thin=False).plan()
    key = staging.stage_key(plan.hosts[0])
    try:
        remotes[0].check(["sh", "-c", 'mkdir -p "$HOME/.cache/dockerlaunch/push" && head -c 1000000 /dev/urandom '
                          '> "$HOME/.cache/dockerlaunch/push/$1.tar"', "sh", key], "planting")
        with received(engine, nodes[:1]) as wire:
            r = push_to_host(engine, remotes[0], image, compress="none", thin=False)
        assert r.status == "pushed" and "resumed" not in r.detail, r
        # the whole image into the host's eth0: a resume after the planted 1,000,000 bytes would bring ~1 MB less,
        # which the framing (under 6%, ~0.5 MB of 8 MiB at most) and the session's commands (tens of kB) cannot fill
        assert wire[0] >= image.size, (wire, image.size)
        print(f"\n[wire] a stage not the stream's own: {wire[0] / 2**20:.3f} MiB into the node's eth0 for the "
              f"{image.size / 2**20:.3f} MiB image")
        got = remotes[0].run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
        assert got == image.id and staged_bytes(remotes[0]) == 0
    finally:
        remotes[0].run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])
        remotes[0].run(["docker", "rmi", "-f", ref, image.id])


def test_push_clean_removes_staged_pushes_but_not_one_a_push_is_loading(sim_cluster, remotes):
    """`push --clean`: the staged prefixes go on every host; one whose lock a running load holds stays."""
    plant = ('d="$HOME/.cache/dockerlaunch/push" && mkdir -p "$d" && chmod 700 "$d" && '
             'head -c 3000000 /dev/zero > "$d/$1.tar" && head -c 1000000 /dev/zero > "$d/$2.tar"')
    busy = "b" * 32
    try:
        for rm in remotes:
            rm.check(["sh", "-c", plant, "sh", "a" * 32, busy], "planting")
        # a load of `busy` under way on node 1: its lock held for 60 s
        holder = remotes[0].check(["sh", "-c", 'd="$HOME/.cache/dockerlaunch/push"; '
                                   '(flock "$d/$1.lock" sleep 60 >/dev/null 2>&1 &) ; sleep 0.5', "sh", busy],
                                  "holding a lock")
        assert holder.ok
        r = dl("push", "--clean", "--config", str(sim_cluster[1]), "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
        first, second = (rows[rm.name] for rm in remotes)
        assert (first["files"], first["bytes"], first["in_use"]) == (1, 3000000, 1), first
        assert (second["files"], second["bytes"], second["in_use"]) == (2, 4000000, 0), second
        assert staged_bytes(remotes[0]) == 1000000 and staged_bytes(remotes[1]) == 0
        text = dl("push", "--clean", "--config", str(sim_cluster[1]))
        assert text.returncode == 0 and "in use by a push now: kept" in text.stdout, text.stdout
        bad = dl("push", "some/image:1", "--clean", "--config", str(sim_cluster[1]))
        assert bad.returncode == 2 and "drop IMAGE" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", 'pkill -f "sleep 60"; rm -rf "$HOME/.cache/dockerlaunch/push"'])


def test_a_lock_file_is_never_deleted_and_a_host_without_flock_stages_nothing(sim_cluster, remotes, fresh_image,
                                                                               engine, monkeypatch):
    """issue 42, finding 8: a lock whose file is deleted while a load waits on it stops being exclusive (the next
    load makes a new file and locks that). `push --clean` and load.sh's 7-day sweep leave lock files alone; a host
    without flock gets no staged push at all, and the summary says why."""
    key = "c" * 32
    plant = ('d="$HOME/.cache/dockerlaunch/push" && mkdir -p "$d" && chmod 700 "$d" && '
             'head -c 1000 /dev/zero > "$d/$1.tar" && : > "$d/$1.lock" && touch -d "10 days ago" "$d/$1.lock" && '
             'stat -c %i "$d/$1.lock"')
    inode = "stat -c %i \"$HOME/.cache/dockerlaunch/push/$1.lock\""
    try:
        before = remotes[0].check(["sh", "-c", plant, "sh", key], "planting").stdout.strip()
        r = dl("push", "--clean", "--config", str(sim_cluster[1]), "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        after = remotes[0].run(["sh", "-c", inode, "sh", key])
        assert after.ok and after.stdout.strip() == before, "push --clean deleted a lock file"
        # the 7-day sweep of a staged push (any push's load.sh) keeps it too
        monkeypatch.setenv(staging.STAGE_MIN_ENV, "0")
        ref = fresh_image(mb=2)
        p = dl("push", ref, "--config", str(sim_cluster[1]), "--compress", "none")
        assert p.returncode == 0, p.stdout + p.stderr
        swept = remotes[0].run(["sh", "-c", inode, "sh", key])
        assert swept.ok and swept.stdout.strip() == before, "load.sh's sweep deleted a 10-day-old lock file"
        # no flock on node 2: nothing staged there, and the push says so
        where = remotes[1].check(["sh", "-c", 'p=$(command -v flock) && mv "$p" "$p.away" && echo "$p"'],
                                 "hiding flock").stdout.strip()
        try:
            other = fresh_image(mb=2)
            q = dl("push", other, "--config", str(sim_cluster[1]), "--compress", "none", "--output", "json")
        finally:
            remotes[1].check(["mv", f"{where}.away", where], "restoring flock")
        assert q.returncode == 0, q.stdout + q.stderr
        row = {h["host"]: h for h in json.loads(q.stdout)["hosts"]}[remotes[1].name]
        assert row["status"] == "pushed" and "not staged (no flock on the host" in row["detail"], row
        assert staged_bytes(remotes[1]) == 0
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", 'rm -rf "$HOME/.cache/dockerlaunch/push"'])


def test_a_broken_ssh_client_falls_back_to_paramiko_or_is_one_line_when_required(sim_cluster, remotes, fresh_image,
                                                                                  tmp_path):
    """The OpenSSH bulk path is used only after its probe worked: an `ssh` first on PATH that cannot connect leaves
    the stream on paramiko, and the summary says why; DOCKERLAUNCH_SSH_BULK=openssh then fails in one line."""
    import os

    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "ssh").write_text("#!/bin/sh\necho 'ssh: this client is broken on purpose' >&2\nexit 255\n")
    (broken / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{broken}:{os.environ['PATH']}"}
    ref = fresh_image(mb=2, scratch=True)
    try:
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "push", ref, "--config", str(sim_cluster[1]),
                            "--strategy", "star", "--output", "json"], capture_output=True, text=True, timeout=600,
                           env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        for h in json.loads(r.stdout)["hosts"]:
            assert h["status"] == "pushed" and "over paramiko (ssh: this client is broken on purpose)" in h["detail"], h
        other = fresh_image(mb=2, scratch=True)
        q = subprocess.run([sys.executable, "-m", "dockerlaunch", "push", other, "--config", str(sim_cluster[1]),
                            "--strategy", "star", "--output", "json"], capture_output=True, text=True, timeout=600,
                           env={**env, "DOCKERLAUNCH_SSH_BULK": "openssh"})
        assert q.returncode != 0 and "Traceback" not in q.stderr, q.stdout + q.stderr
        for h in json.loads(q.stdout)["hosts"]:  # each host's row: one line with the reason and the fix
            assert h["status"] == "failed" and "\n" not in h["detail"], h
            assert "DOCKERLAUNCH_SSH_BULK=openssh, but the ssh client cannot run a command there (ssh: this client " \
                   "is broken on purpose); unset DOCKERLAUNCH_SSH_BULK" in h["detail"], h
    finally:
        for rm in remotes:
            rm.run(["sh", "-c", f"docker rmi -f {ref} 2>/dev/null; true"])
