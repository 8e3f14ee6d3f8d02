"""Files in the cache are written whole or not at all, by any number of writers at once (a push fills one image's
facts from every host's thread: with a shared `.part` name the first rename took the second writer's file away, and
the second host failed with "No such file or directory")."""

from __future__ import annotations

import hashlib
import io
import threading

import pytest

from dockerlaunch.cache import HashMismatch, replacing, write_checked, write_whole
from dockerlaunch.transfer.image_facts import LocalImage, _cached_facts, remember_facts
from dockerlaunch.transfer.oci import Blob, SaveFacts


def test_two_writers_of_one_path_each_finish_and_the_last_to_finish_wins(tmp_path):
    path = tmp_path / "entry.json"
    with replacing(path) as first:
        with replacing(path) as second:
            second.write(b"second")
        first.write(b"first")
    assert path.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]


def test_a_writer_that_raises_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "entry.json"
    write_whole(path, "old")
    with pytest.raises(RuntimeError), replacing(path) as f:
        f.write(b"half")
        raise RuntimeError("the stream broke")
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]


def test_the_file_takes_the_users_umask_like_any_file_they_write(tmp_path):
    write_whole(tmp_path / "bundle", b"x")
    import os

    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "bundle").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_push_whose_hosts_remember_one_images_facts_at_once_all_succeed(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path))
    image = LocalImage(ref="job:1", id="sha256:" + "ab" * 32, size=10, diff_ids=("sha256:" + "cd" * 32,))
    facts = SaveFacts(Blob("cfg.json", image.id, 1234, "application/vnd.oci.image.config.v1+json"),
                      (Blob("layer.tar", image.diff_ids[0], 10),))
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def host() -> None:
        start.wait()
        try:
            for _ in range(100):
                remember_facts(image, facts)
        except BaseException as e:  # noqa: BLE001 - any failure of a writer is the finding
            errors.append(e)

    threads = [threading.Thread(target=host) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _cached_facts(image) == facts
    assert [p.name for p in (tmp_path / "layers").iterdir()] == [f"{'ab' * 32}.v3.json"]


def test_a_download_is_kept_only_with_the_pinned_hash_and_an_old_copy_survives_a_bad_one(tmp_path):
    path = tmp_path / "tool.whl"
    good = b"the pinned bytes" * 100_000
    write_checked(io.BytesIO(good), path, hashlib.sha256(good).hexdigest())
    assert path.read_bytes() == good
    with pytest.raises(HashMismatch) as info:
        write_checked(io.BytesIO(b"a proxy's page"), path, hashlib.sha256(good).hexdigest())
    assert info.value.got == hashlib.sha256(b"a proxy's page").hexdigest()
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["tool.whl"]
