"""The launcher's registry as a thin push's layer source: what it refuses to serve, and that a blob is only ever
streamed as the layer its diff ID names (real gzip, real files)."""

import gzip
import hashlib
import os
import time
from pathlib import Path

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer import layer_source
from dockerlaunch.transfer.streams import CONTAINERD, GRAPHDRIVER, LocalImage


def image(store=GRAPHDRIVER) -> LocalImage:
    return LocalImage("r:1", "sha256:" + "a" * 64, 1, ("sha256:" + "b" * 64,), store=store)


def test_a_rootless_launcher_engine_is_named_as_the_reason(monkeypatch):
    """`docker info` of a rootless engine (Docker 28 under rootlesskit): its loopback is its own namespace's."""
    monkeypatch.delenv(layer_source.MODE_ENV, raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    rootless = {"SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"]}
    assert "rootless" in layer_source.unavailable(image(), rootless)
    assert layer_source.unavailable(image(), {"SecurityOptions": ["name=seccomp,profile=builtin", "name=cgroupns"]}
                                    ) is None


def test_where_the_registry_cannot_serve_it_says_why(monkeypatch):
    monkeypatch.setenv(layer_source.MODE_ENV, "save")
    assert layer_source.unavailable(image()) == "DOCKERLAUNCH_LAYER_SOURCE=save"
    monkeypatch.delenv(layer_source.MODE_ENV)
    assert layer_source.unavailable(image(CONTAINERD)) is None  # its blobs are pushed as they are (issue 43)
    monkeypatch.setenv("DOCKER_HOST", "ssh://root@gpu-host")
    assert "not on this machine" in layer_source.unavailable(image(CONTAINERD))
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "no docker-registry on this machine" in layer_source.unavailable(image())


def test_a_blob_streams_as_its_layer_and_is_refused_as_another(tmp_path):
    layer = b"layer bytes " * 100000
    blob = tmp_path / "data"
    blob.write_bytes(gzip.compress(layer))
    right = "sha256:" + hashlib.sha256(layer).hexdigest()
    assert layer_source._measure(blob, right) == len(layer)
    raw = layer_source._Gunzip(blob, "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest(), raw=True)
    assert raw.read() == blob.read_bytes()  # a content-store blob: as it is, checked against its own digest
    with pytest.raises(TransferError, match="is not layer"):
        layer_source._Gunzip(blob, right, raw=True).read()
    g = layer_source._Gunzip(blob, right)
    got = b""
    while chunk := g.read(4096):
        got += chunk
    assert got == layer
    with pytest.raises(TransferError, match=r"is not layer cccccccccccc \(its sha256 is "):
        layer_source._measure(blob, "sha256:" + "c" * 64)


def test_the_registry_answers_only_with_its_one_push_password(tmp_path, monkeypatch):
    """Another login on the launcher machine reaches 127.0.0.1 too: without the password, nothing (the real
    docker-registry process, installed by scripts/install-docker)."""
    import urllib.error
    import urllib.request

    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    with layer_source._registry() as (port, password):
        url = f"http://127.0.0.1:{port}/v2/_catalog"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(layer_source._authorized(url, "not-" + password), timeout=5)
        assert e.value.code == 401
        with urllib.request.urlopen(layer_source._authorized(url, password), timeout=5) as r:
            assert r.status == 200
    assert oct((tmp_path / "cache" / "registry").stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in (tmp_path / "cache" / "registry").iterdir()) == ["registry.log"]  # no password left


def _blob(tmp_path, hexd: str, size: int, age: float):
    data = layer_source.blob_path("sha256:" + hexd)
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
    monkeypatch.setenv(layer_source.CAP_ENV, "0.000016")  # 16 kB: all four fit
    layer_source._cap(set())
    assert all(p.is_file() for p in (old, mid, new, used))
    monkeypatch.setenv(layer_source.CAP_ENV, "0.000009")  # 9 kB: two go, the oldest not just used
    layer_source._cap({"sha256:" + "d" * 64})  # the push used d (the oldest): it is kept and now the newest
    assert [p.is_file() for p in (old, mid, new, used)] == [False, False, True, True]
    assert used.stat().st_mtime > new.stat().st_mtime
    layer_source._clean_uploads()
    assert not upload.parent.exists()
    monkeypatch.setenv(layer_source.CAP_ENV, "0")  # nothing fits: all but what the push used go
    layer_source._cap({"sha256:" + "c" * 64})
    assert [p.is_file() for p in (new, used)] == [True, False]


@pytest.mark.parametrize("bad", ["thirty", "-1", "1e3", "30GB"])
def test_a_cap_that_is_not_a_number_is_named_with_the_fix(monkeypatch, bad):
    monkeypatch.setenv(layer_source.CAP_ENV, bad)
    with pytest.raises(TransferError) as e:
        layer_source._limit()
    assert str(e.value).startswith(f"{layer_source.CAP_ENV}={bad!r}: give the registry's cap in GB, e.g. "), e.value


def test_evictions_take_the_oldest_first_until_enough_is_freed():
    blobs = [(Path("/s") / h, size, mtime) for h, size, mtime in (("x", 10, 3), ("y", 10, 1), ("z", 10, 2))]
    assert layer_source.evictions(blobs, set(), 15) == [Path("/s/y"), Path("/s/z")]
    assert layer_source.evictions(blobs, {"sha256:y"}, 15) == [Path("/s/z"), Path("/s/x")]
    assert layer_source.evictions(blobs, set(), 0) == []
    assert layer_source.evictions(blobs, {"sha256:x", "sha256:y", "sha256:z"}, 100) == []


def test_a_launcher_killed_outright_takes_its_registry_with_it(tmp_path):
    """SIGKILL leaves no `finally`: the registry must still go (it would hold the port and the storage)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    code = ("import os, signal\nfrom dockerlaunch.transfer import layer_source as l\n"
            "with l._registry() as (port, password):\n    print(port, flush=True)\n"
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
