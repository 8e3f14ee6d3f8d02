"""The launcher's registry as a thin push's layer source: what it refuses to serve, and that a blob is only ever
streamed as the layer its diff ID names (real gzip, real files)."""

import gzip
import hashlib
import os
import time
from pathlib import Path

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer import cache_server, layer_cache
from dockerlaunch.transfer.image_facts import CONTAINERD, DOCKER_SAVE, GRAPHDRIVER, LocalImage


def image(store=GRAPHDRIVER) -> LocalImage:
    return LocalImage("r:1", "sha256:" + "a" * 64, 1, ("sha256:" + "b" * 64,), store=store)


def test_a_rootless_launcher_engine_is_named_as_the_reason(monkeypatch):
    """`docker info` of a rootless engine (Docker 28 under rootlesskit): its loopback is its own namespace's."""
    monkeypatch.delenv(cache_server.MODE_ENV, raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    rootless = {"SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"]}
    assert "rootless" in cache_server.unavailable(image(), rootless)
    assert cache_server.unavailable(image(), {"SecurityOptions": ["name=seccomp,profile=builtin", "name=cgroupns"]}
                                    ) is None


def test_where_the_registry_cannot_serve_it_says_why(monkeypatch):
    monkeypatch.setenv(cache_server.MODE_ENV, "save")
    assert cache_server.unavailable(image()) == "DOCKERLAUNCH_LAYER_SOURCE=save"
    monkeypatch.delenv(cache_server.MODE_ENV)
    assert cache_server.unavailable(image(CONTAINERD)) is None  # its blobs are pushed as they are (issue 43)
    monkeypatch.setenv("DOCKER_HOST", "ssh://root@gpu-host")
    assert "not on this machine" in cache_server.unavailable(image(CONTAINERD))
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "no docker-registry on this machine" in cache_server.unavailable(image())
    monkeypatch.undo()
    monkeypatch.delenv(cache_server.MODE_ENV, raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(cache_server, "TCP_TABLES", ("/nonexistent/net/tcp", "/nonexistent/net/tcp6"))
    assert "could not prove the registry's port" in cache_server.unavailable(image())  # issue 50, finding 4


def test_a_blob_streams_as_its_layer_and_is_refused_as_another(tmp_path):
    layer = b"layer bytes " * 100000
    blob = tmp_path / "data"
    blob.write_bytes(gzip.compress(layer))
    right = "sha256:" + hashlib.sha256(layer).hexdigest()
    assert layer_cache._measure(blob, right) == len(layer)
    raw = layer_cache._Gunzip(blob, "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest(), raw=True)
    assert raw.read() == blob.read_bytes()  # a content-store blob: as it is, checked against its own digest
    with pytest.raises(TransferError, match="is not layer"):
        layer_cache._Gunzip(blob, right, raw=True).read()
    g = layer_cache._Gunzip(blob, right)
    got = b""
    while chunk := g.read(4096):
        got += chunk
    assert got == layer
    with pytest.raises(TransferError, match=r"is not layer cccccccccccc \(its sha256 is "):
        layer_cache._measure(blob, "sha256:" + "c" * 64)


def test_the_registry_answers_only_with_its_one_push_password(tmp_path, monkeypatch):
    """Another login on the launcher machine reaches 127.0.0.1 too: without the password, nothing (the real
    docker-registry process, installed by scripts/install-docker)."""
    import urllib.error
    import urllib.request

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    with cache_server.serve() as reg:
        port, password = reg.port, reg.password
        url = f"http://127.0.0.1:{port}/v2/_catalog"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(cache_server._authorized(url, "not-" + password), timeout=5)
        assert e.value.code == 401
        with urllib.request.urlopen(cache_server._authorized(url, password), timeout=5) as r:
            assert r.status == 200
    assert oct((tmp_path / "cache" / "registry").stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in (tmp_path / "cache" / "registry").iterdir()) == ["registry.log"]  # no password left


def _blob(tmp_path, hexd: str, size: int, age: float):
    data = layer_cache.blob_path("sha256:" + hexd)
    data.parent.mkdir(parents=True)
    data.write_bytes(b"x" * size)
    os.utime(data, (time.time() - age, time.time() - age))
    return data


def test_a_registry_over_its_cap_drops_the_least_recently_used_blobs_but_never_the_pushed_images(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path))
    old, mid, new, used = (_blob(tmp_path, h * 64, 4000, age) for h, age in (("a", 300), ("b", 200), ("c", 100),
                                                                            ("d", 400)))
    upload = tmp_path / "registry" / "store" / "docker" / "registry" / "v2" / "repositories" / "r" / "_uploads" / "u"
    upload.mkdir(parents=True)
    (upload / "data").write_bytes(b"half a layer a killed push left")
    monkeypatch.setenv(layer_cache.CAP_ENV, "0.000016")  # 16 kB: all four fit
    layer_cache._cap(set())
    assert all(p.is_file() for p in (old, mid, new, used))
    monkeypatch.setenv(layer_cache.CAP_ENV, "0.000009")  # 9 kB: two go, the oldest not just used
    layer_cache._cap({"sha256:" + "d" * 64})  # the push used d (the oldest): it is kept and now the newest
    assert [p.is_file() for p in (old, mid, new, used)] == [False, False, True, True]
    assert used.stat().st_mtime > new.stat().st_mtime
    layer_cache._clean_uploads()
    assert not upload.parent.exists()
    monkeypatch.setenv(layer_cache.CAP_ENV, "0")  # nothing fits: all but what the push used go
    layer_cache._cap({"sha256:" + "c" * 64})
    assert [p.is_file() for p in (new, used)] == [True, False]


@pytest.mark.parametrize("bad", ["thirty", "-1", "1e3", "30GB"])
def test_a_cap_that_is_not_a_number_is_named_with_the_fix(monkeypatch, bad):
    monkeypatch.setenv(layer_cache.CAP_ENV, bad)
    with pytest.raises(TransferError) as e:
        layer_cache._limit()
    assert str(e.value).startswith(f"{layer_cache.CAP_ENV}={bad!r}: give the registry's cap in GB, e.g. "), e.value


def test_evictions_take_the_oldest_first_until_enough_is_freed():
    blobs = [(Path("/s") / h, size, mtime) for h, size, mtime in (("x", 10, 3), ("y", 10, 1), ("z", 10, 2))]
    assert layer_cache.evictions(blobs, set(), 15) == [Path("/s/y"), Path("/s/z")]
    assert layer_cache.evictions(blobs, {"sha256:y"}, 15) == [Path("/s/z"), Path("/s/x")]
    assert layer_cache.evictions(blobs, set(), 0) == []
    assert layer_cache.evictions(blobs, {"sha256:x", "sha256:y", "sha256:z"}, 100) == []


def test_a_launcher_killed_outright_takes_its_registry_with_it(tmp_path):
    """SIGKILL leaves no `finally`: the registry must still go (it would hold the port and the storage)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    code = ("import os, signal\nfrom dockerlaunch.transfer import cache_server as l\n"
            "with l.serve() as reg:\n    print(reg.port, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DOCKERLAUNCH_CACHE_DIR": str(tmp_path)})
    assert p.returncode == -9, p.stderr
    port = int(p.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the registry still listens on {port} after its launcher was killed")


# ------------------------------------------------------------- issue 50, finding 4: a squatter on the registry's port

SQUATTER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print(s.getsockname()[1], file=sys.stderr, flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    # what a registry says: a challenge first, then 200 to anything that brings credentials
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
              if b"authorization:" in data.lower() else
              b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="x"\r\nContent-Length: 0\r\n'
              b"Connection: close\r\n\r\n")
    c.close()
"""


class Squatter:
    """Another login's process on the launcher machine listening on 127.0.0.1 (as `nobody` where the tests run as
    root): it answers like a registry and keeps every byte it receives."""

    def __init__(self, tmp_path: Path, port: int = 0):
        import shutil
        import subprocess
        import sys

        self.record = tmp_path / f"squatter-{port}.bytes"
        self.uid = 65534 if os.getuid() == 0 else os.getuid()
        python = shutil.which("python3", path="/usr/bin:/bin") if os.getuid() == 0 else sys.executable
        with open(self.record, "wb") as out:
            self.proc = subprocess.Popen([python, "-I", "-c", SQUATTER, str(port)], stdout=out,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/",
                                         user=self.uid if os.getuid() == 0 else None)
        line = self.proc.stderr.readline()
        assert line.strip().isdigit(), (line, self.proc.stderr.read())
        self.port = int(line)

    def received(self) -> bytes:
        return self.record.read_bytes()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stderr.close()


def scratch_image(client, name: str, mb: int) -> str:
    """A one-layer image of random bytes in the real engine (FROM scratch: nothing to pull)."""
    import io
    import tarfile

    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as t:
        for member, data in (("Dockerfile", b"FROM scratch\nCOPY blob /\n"), ("blob", os.urandom(mb << 20))):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    tag = f"dlt-layer-source/{os.getpid()}:{name}"
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
    return tag


def test_a_squatter_on_the_registrys_port_gets_neither_the_password_nor_a_request(tmp_path, monkeypatch):
    """The launcher lost the race for the port it picked: the registry cannot bind it and exits, the squatter
    answers. Nothing, the push password least of all, may reach it; the refusal names the port and the squatter."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    squatter = Squatter(tmp_path)
    monkeypatch.setattr(cache_server, "_free_port", lambda: squatter.port)
    try:
        err = None
        try:
            with cache_server.serve():
                pass
        except TransferError as e:
            err = str(e)
        assert b"Authorization: Basic" not in squatter.received()  # the push password, base64
        assert squatter.received() == b""
        assert err is not None and "\n" not in err, err
        assert err.startswith(f"127.0.0.1:{squatter.port} is held by another listener (uid {squatter.uid}"), err
        assert "not the launcher's registry (pid " in err and err.endswith("nothing was sent to it"), err
    finally:
        squatter.stop()
    assert sorted(p.name for p in (tmp_path / "cache" / "registry").iterdir()) == ["registry.log"]  # no password left


def test_a_registry_that_exited_is_caught_before_the_engine_pushes_to_its_port(tmp_path, monkeypatch):
    """The registry passed its proof, then exited (killed, crashed), and a squatter took its port before the
    engine's push: the check _engine_push makes first (and on every progress line) stops it, in one line."""
    import signal

    import docker

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    with cache_server.serve() as reg:
        reg.check()  # its own listener: no complaint
        reg.proc.send_signal(signal.SIGKILL)
        reg.proc.wait(10)
        squatter = Squatter(tmp_path, reg.port)
        try:
            with pytest.raises(TransferError) as e:
                reg.check()
            with pytest.raises(TransferError, match=f"^127.0.0.1:{reg.port} is held by another listener"):
                cache_server.engine_push(docker.from_env(), image(), reg)  # the real engine is never asked
            assert squatter.received() == b""
        finally:
            squatter.stop()
        msg = str(e.value)
        assert msg.startswith(f"127.0.0.1:{reg.port} is held by another listener (uid {squatter.uid}"), msg
        assert f"pid {reg.proc.pid}, exited" in msg and "\n" not in msg, msg
        with pytest.raises(TransferError, match=f"registry .*127.0.0.1:{reg.port} exited"):
            reg.check()  # the squatter gone too: still no registry there


def test_a_registry_killed_mid_push_stops_the_engines_push_in_one_line(tmp_path, monkeypatch):
    """The real engine pushes a real image; the registry is killed as its first upload lands: the push stops at
    the engine's next progress line, not ~50 s of retries later (while its port was anyone's to take)."""
    import contextlib
    import signal
    import threading

    import docker

    from dockerlaunch.transfer.image_facts import local_image

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    client = docker.from_env()
    tag = scratch_image(client, "killed", 48)
    uploads = tmp_path / "cache" / "registry" / "store" / "docker" / "registry" / "v2" / "repositories"
    killed: list[int] = []

    def kill_at_first_upload() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(uploads.glob("**/_uploads/*")):
            time.sleep(0.01)
        for pid in os.listdir("/proc"):  # the registry: this process's docker-registry child
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                if "(docker-registry)" in stat and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))

    try:
        killer = threading.Thread(target=kill_at_first_upload, daemon=True)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(TransferError) as e:
            layer_cache.registry_image(client, local_image(client, tag, facts=False))
        took = time.monotonic() - t0
        killer.join(5)
    finally:
        client.images.remove(tag, force=True)
    assert killed, "the registry was never seen uploading"
    msg = str(e.value)
    assert msg.startswith("the launcher's registry for 127.0.0.1:") and " exited (see " in msg, msg
    assert "\n" not in msg and took < 30, (took, msg)
    assert not [r for img in client.api.images() for r in img.get("RepoTags") or [] if layer_cache.REPO in r]


def test_a_push_whose_registry_port_is_squatted_goes_by_docker_save_and_says_who_holds_the_port(tmp_path,
                                                                                                   monkeypatch):
    """What the user sees: the push still works, its layers read by `docker save` (nothing of the image, and no
    password, reaches the squatter), and the summary names the port and its holder."""
    import docker

    from dockerlaunch.transfer import push
    from dockerlaunch.transfer.image_facts import local_image

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cache_server.MODE_ENV, raising=False)
    client = docker.from_env()
    tag = scratch_image(client, "squatted", 2)
    squatter = Squatter(tmp_path)
    monkeypatch.setattr(cache_server, "_free_port", lambda: squatter.port)
    try:
        got = push.thin_source(client, local_image(client, tag, facts=False))
        assert b"Authorization: Basic" not in squatter.received()
        assert squatter.received() == b""
    finally:
        squatter.stop()
        client.images.remove(tag, force=True)
    assert got.facts is not None and got.tar_source == DOCKER_SAVE
    assert got.source_note.startswith(f"docker save read the whole image (127.0.0.1:{squatter.port} is held by "
                                      f"another listener (uid {squatter.uid}"), got.source_note


def test_the_engines_progress_lines_count_the_bytes_it_reads_once_and_its_layer_sizes():
    """The fill's bar: `Pushing` lines carry how far the engine has read each layer, `Pushed` ends one, a retried
    upload starts again from 0 (not counted twice); `Layer already exists` reads nothing."""
    heard, sizes = [], {}
    count = cache_server._ReadCount(heard.append, sizes)
    for line in [{"status": "Preparing", "progressDetail": {}, "id": "aaa"},
                 {"status": "Layer already exists", "progressDetail": {}, "id": "bbb"},
                 {"status": "Pushing", "progressDetail": {"current": 100, "total": 1000}, "id": "aaa"},
                 {"status": "Pushing", "progressDetail": {"current": 600, "total": 1000}, "id": "aaa"},
                 {"status": "Pushing", "progressDetail": {"current": 50, "total": 1000}, "id": "aaa"},  # a retry
                 {"status": "Pushing", "progressDetail": {"current": 700, "total": 1000}, "id": "aaa"},
                 {"status": "Pushed", "progressDetail": {}, "id": "aaa"},
                 {"status": "Pushed", "progressDetail": {}, "id": "ccc"},  # never seen pushing: nothing to add
                 {"status": "x: digest: sha256:abc size: 528"}, {"aux": {"Tag": "x"}}]:
        count.see(line)
    assert heard == [100, 500, 100, 300] and sizes == {"aaa": 1000}
