"""The launcher's registry as a thin push's layer source: what it refuses to serve, and that a blob is only ever
streamed as the layer its diff ID names (real gzip, real files)."""

import gzip
import hashlib

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer import layer_source
from dockerlaunch.transfer.streams import CONTAINERD, GRAPHDRIVER, LocalImage


def image(store=GRAPHDRIVER) -> LocalImage:
    return LocalImage("r:1", "sha256:" + "a" * 64, 1, ("sha256:" + "b" * 64,), store=store)


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


def test_a_registry_over_its_cap_starts_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path))
    blob = tmp_path / "registry" / "store" / "docker" / "registry" / "v2" / "blobs" / "sha256" / "ab" / "x" / "data"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 5000)
    (tmp_path / "registry" / "sizes.json").write_text("{}")
    monkeypatch.setenv(layer_source.CAP_ENV, "0.00001")  # 10 kB: kept
    layer_source._cap()
    assert blob.is_file()
    monkeypatch.setenv(layer_source.CAP_ENV, "0.000001")  # 1 kB: emptied
    layer_source._cap()
    assert not (tmp_path / "registry" / "store").exists() and not (tmp_path / "registry" / "sizes.json").exists()


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
