"""`dockerlaunch cache`: what the layer cache holds, read from a registry's storage on disk, and its pruning."""

import hashlib
import json
import os
import time

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer import layer_cache


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DOCKERLAUNCH_LAYER_CACHE_GB", raising=False)
    return tmp_path / "registry"


def blob(data: bytes, age: float = 0) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = layer_cache.blob_path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    used = time.time() - age
    os.utime(path, (used, used))
    return digest


def image(tag: str, layers: list[bytes], age: float = 0) -> list[str]:
    config = blob(b"config-" + tag.encode(), age)
    digests = [blob(data, age) for data in layers]
    manifest = blob(json.dumps({"config": {"digest": config},
                                "layers": [{"digest": d} for d in digests]}).encode(), age)
    link = (layer_cache.root() / "store/docker/registry/v2/repositories" / layer_cache.REPO / "_manifests/tags"
            / tag / "current/link")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.write_text(manifest)
    return [config, *digests, manifest]


def test_an_empty_cache_says_so(store):
    facts = layer_cache.cache_facts()
    assert (facts.where, facts.bytes, facts.blobs, facts.images) == (str(store), 0, 0, ())
    assert facts.cap == 30e9
    assert layer_cache.prune() == layer_cache.Pruned(0, 0, 0, 0)


def test_facts_count_every_blob_once_and_each_image_its_own(store, monkeypatch):
    monkeypatch.setenv("DOCKERLAUNCH_LAYER_CACHE_GB", "2")
    image("aaaaaaaaaaaa", [b"base" * 100, b"top-a" * 10], age=3 * 86400)
    image("bbbbbbbbbbbb", [b"base" * 100, b"top-b" * 20])  # shares the base layer (now just used)
    facts = layer_cache.cache_facts()
    assert facts.blobs == 3 + 3 + 2 - 1 and facts.cap == 2e9  # 2 configs, 3 layers, 2 manifests; base once
    assert facts.bytes == sum(p.stat().st_size for p in store.glob("store/**/data"))
    assert [i.id for i in facts.images] == ["bbbbbbbbbbbb", "aaaaaaaaaaaa"]  # most recently used first
    b, a = facts.images
    assert (b.layers, b.cached, a.layers, a.cached) == (2, 2, 2, 2)
    assert b.bytes == len(b"config-bbbbbbbbbbbb") + 400 + 100  # a shared layer counts in each image
    assert facts.newest - facts.oldest > 2 * 86400


def test_prune_older_than_takes_only_blobs_no_push_used_since(store):
    old = image("aaaaaaaaaaaa", [b"old" * 50], age=8 * 86400)
    new = image("bbbbbbbbbbbb", [b"new" * 50], age=60)
    got = layer_cache.prune(older_than=7 * 86400)
    assert (got.blobs, got.kept_blobs) == (3, 3)
    assert not any(layer_cache.blob_path(d).exists() for d in old)
    assert all(layer_cache.blob_path(d).exists() for d in new)
    a = {i.id: i for i in layer_cache.cache_facts().images}["aaaaaaaaaaaa"]
    assert (a.cached, a.bytes) == (0, 0)  # its tag is left, its blobs are gone: a later push sends them again
    got = layer_cache.prune()
    assert (got.blobs, got.kept_blobs, got.kept_bytes) == (3, 0, 0)
    assert layer_cache.cache_facts().blobs == 0 and (store / "lock").exists()


def test_prune_is_refused_while_a_push_holds_the_cache(store):
    image("aaaaaaaaaaaa", [b"x" * 10])
    with layer_cache._locked():
        with pytest.raises(TransferError, match=r"a push is using the layer cache \(.*\) now; prune it after"):
            layer_cache.prune()
    assert layer_cache.prune().blobs == 3


def test_unused_since_is_oldest_first():
    blobs = [("a", 1, 30.0), ("b", 1, 10.0), ("c", 1, 50.0)]
    assert [b[0] for b in layer_cache.unused_since(blobs, 40.0)] == ["b", "a"]
