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


# ---------------------------------------------------------------- what a push's route reads of it (issue 58)


def real_image(tag: str, layers: list[bytes], index: bool = False) -> tuple[list[str], list[str]]:
    """An image as the engine pushes it: a config naming its diff IDs, a manifest (or an index over it) naming the
    config and the layer blobs. (diff IDs, blob digests)."""
    diffs = ["sha256:" + hashlib.sha256(b"diff-" + data).hexdigest() for data in layers]
    config = blob(json.dumps({"rootfs": {"type": "layers", "diff_ids": diffs}, "tag": tag}).encode())
    digests = [blob(data) for data in layers]
    top = blob(json.dumps({"config": {"digest": config}, "layers": [{"digest": d} for d in digests]}).encode())
    if index:
        top = blob(json.dumps({"manifests": [{"digest": top, "platform": {"os": "linux"}}]}).encode())
    link = (layer_cache.root() / "store/docker/registry/v2/repositories" / layer_cache.REPO / "_manifests/tags"
            / tag / "current/link")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.write_text(top)
    return diffs, digests


def test_holdings_are_the_layers_a_stored_image_names_whose_blobs_are_still_there(store):
    a_diffs, a_blobs = real_image("aaaaaaaaaaaa", [b"base" * 100, b"top-a" * 10])
    b_diffs, _ = real_image("bbbbbbbbbbbb", [b"base" * 100, b"top-b" * 20], index=True)  # followed through its index
    image("cccccccccccc", [b"not an image config"])  # a config without diff IDs names nothing
    held = layer_cache.holdings()
    assert held == {a_diffs[0]: 400, a_diffs[1]: 50, b_diffs[1]: 100}  # the blob's bytes, where nothing better
    (store / "sizes.json").write_text(json.dumps({a_diffs[0]: 1024}))  # the layer as a tar, measured by a push
    layer_cache._remember_engine_sizes(replace_ids(a_diffs), {a_diffs[1][7:19]: 42})  # the engine's own, by id
    assert layer_cache.holdings() == {a_diffs[0]: 1024, a_diffs[1]: 42, b_diffs[1]: 100}
    layer_cache.blob_path(a_blobs[1]).unlink()  # evicted: a push would have the engine read it again
    assert a_diffs[1] not in layer_cache.holdings()


def replace_ids(diffs: list[str]):
    from dockerlaunch.transfer.image_facts import LocalImage

    return LocalImage("x", "sha256:" + "0" * 64, 1, diff_ids=tuple(diffs))


def test_a_fill_in_the_background_is_seen_while_it_holds_the_cache_and_a_stale_one_is_not(store):
    assert layer_cache.filling() is None
    layer_cache.private_root()
    said = {"pid": 12345, "image": "app:2", "id": "sha256:" + "1" * 64, "since": time.time() - 5, "read": 3_000_000}
    (store / layer_cache.FILLING).write_text(json.dumps(said))
    with layer_cache._locked():  # the fill holds the lock while it runs
        assert layer_cache.filling() == said
        assert layer_cache.filling_text(said) == "pid 12345, app:2, 3 MB read in 5 s"
        with pytest.raises(TransferError, match=r"^a fill \(pid 12345, app:2, 3 MB read in 5 s\) is using the layer "
                                                r"cache \(.*\) now; prune it after that$"):
            layer_cache.prune()
        with layer_cache._locked(wait=False) as got:
            assert got is False  # a background fill does not queue behind another
    assert layer_cache.filling() is None  # its writer is gone: the file was stale, and goes
    assert not (store / layer_cache.FILLING).exists()


def test_cache_state_reads_the_source_setting_and_refuses_a_wrong_one_in_one_line(store, monkeypatch):
    from dockerlaunch.transfer.image_facts import LocalImage

    img = LocalImage("app:1", "sha256:" + "2" * 64, 10)
    monkeypatch.setenv("DOCKERLAUNCH_LAYER_SOURCE", "save")
    assert layer_cache.cache_state(img, {}).unavailable == "DOCKERLAUNCH_LAYER_SOURCE=save"
    monkeypatch.setenv("DOCKERLAUNCH_LAYER_SOURCE", "registry")
    with pytest.raises(TransferError, match=r"^DOCKERLAUNCH_LAYER_SOURCE='registry': give auto \(the default\), "
                                            r"cache or save$"):
        layer_cache.cache_state(img, {})
    monkeypatch.setenv("DOCKERLAUNCH_LAYER_SOURCE", "cache")
    if layer_cache.unavailable(img, {}) is None:  # docker-registry installed here
        assert layer_cache.cache_state(img, {}).forced
        monkeypatch.setenv("DOCKERLAUNCH_LAYER_SOURCE", "auto")
        state = layer_cache.cache_state(img, {})
        assert (state.forced, state.held, state.filling, state.copies) == (False, {}, "", False)


def test_a_layer_a_push_read_is_held_while_its_blob_is_there_even_when_its_manifest_was_evicted(store):
    """DOCKERLAUNCH_LAYER_CACHE_GB keeps the blobs of the image just pushed, not the manifests of others: the base
    under the next bump is still there, and must count."""
    diffs, digests = real_image("aaaaaaaaaaaa", [b"base" * 100, b"top" * 10])
    layer_cache._remember_layer_blobs(replace_ids(diffs), [str(layer_cache.blob_path(d)) for d in digests])
    for manifest in (store / "store").glob("**/_manifests/tags/*/current/link"):
        layer_cache.blob_path(manifest.read_text()).unlink()
    assert layer_cache.holdings() == {diffs[0]: 400, diffs[1]: 30}
    layer_cache.blob_path(digests[0]).unlink()
    assert layer_cache.holdings() == {diffs[1]: 30}
