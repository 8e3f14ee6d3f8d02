"""The copy of the job's image onto a spare (issue 60, finding 6): `copy_between` takes the Image ID the caller
expects, never the source host's word for it; the source's `docker save` is re-streamed through untagged_chunks, so
no tag of its stream reaches the spare's engine; and the spare is read back to hold exactly that ID under the tag.

The two hosts are stand-ins of `Remote` (its `run` is the real one, over their `stream`): the source answers
`docker image inspect` and `docker save` with a tar it chose, the spare takes load.sh's stdin and answers for
what it holds afterwards."""

import hashlib
import io
import json
import tarfile
import threading

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.transfer.push import copy_between


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CFG = b'{"rootfs": {"type": "layers"}, "n": 1}'
RUN_ID = sha(CFG)  # the classic store's Image ID: its config's digest
OTHER_ID = sha(b'{"rootfs": {"type": "layers"}, "n": 2}')
LAYER = b"L" * 5000
MANIFEST = json.dumps({"schemaVersion": 2, "config": {"digest": RUN_ID}}).encode()


def tar_of(*members: tuple[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def hostile_save() -> bytes:
    """`docker save` as a source host could write it: the image, plus tags of its own for the spare's engine (in
    manifest.json's RepoTags, `repositories` and the index's name annotations)."""
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(MANIFEST), "size": len(MANIFEST),
         "annotations": {"io.containerd.image.name": "docker.io/library/victim:latest",
                         "org.opencontainers.image.ref.name": "latest"}}]}
    return tar_of(("layer/layer.tar", LAYER), (f"blobs/sha256/{RUN_ID[7:]}", CFG),
                  (f"blobs/sha256/{sha(MANIFEST)[7:]}", MANIFEST),
                  ("repositories", json.dumps({"victim": {"latest": RUN_ID[7:]}}).encode()),
                  ("index.json", json.dumps(index).encode()),
                  ("manifest.json", json.dumps([{"Config": f"blobs/sha256/{RUN_ID[7:]}",
                                                 "RepoTags": ["victim:latest", "app:1"],
                                                 "Layers": ["layer/layer.tar"]}]).encode()))


class Host(Remote):
    """A stand-in host: `stream` answers by the command; everything asked is in `asked`."""

    def __init__(self, name: str, holds: str = "", save: bytes = b"", after: str | None = None,
                 load_fails: bool = False):
        self.host, self.holds, self.save, self.after, self.load_fails = name, holds, save, after, load_fails
        self.asked: list[list[str]] = []
        self.loaded, self.loaded_as = b"", ""

    @property
    def name(self) -> str:
        return self.host

    def stream(self, command, on_stdout=None, on_stderr=None, stdin=None, timeout=None, stop=None, bulk=False):
        argv = list(command)
        self.asked.append(argv)
        if argv[:3] == ["docker", "image", "inspect"]:
            held = (self.after or self.loaded_as) if self.loaded else self.holds  # load.sh tagged what it checked
            if not held:
                on_stderr(b"Error: No such image: " + argv[-1].encode())
                return 1
            on_stdout(held.encode() + b"\n")
            return 0
        if argv[:2] == ["docker", "save"]:
            for i in range(0, len(self.save), 700):
                if stop is not None and stop.is_set():
                    return -1
                on_stdout(self.save[i:i + 700])
            return 0
        if argv[:2] == ["sh", "-c"] and argv[5:] == ["app:1", "none"] and self.load_fails:
            stdin.read(4096)
            on_stderr(b"load failed: write /var/lib/docker/tmp/x: no space left on device\n")
            return 3
        if argv[:2] == ["sh", "-c"] and argv[5:] == ["app:1", "none"]:  # load.sh IMAGE_ID REF none
            self.loaded = b"".join(iter(lambda: stdin.read(1 << 16), b""))
            self.loaded_as = argv[4]
            on_stdout(b"ok " + argv[4].encode() + b"\n")
            return 0
        raise AssertionError(f"{self.name} was asked {argv}")


def loaded_tar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


@pytest.mark.parametrize("expect", [RUN_ID, None], ids=["the runs id", "as cli jobs calls it"])
def test_the_copy_onto_a_spare_applies_no_tag_of_the_sources_stream(expect):
    """A source's stream that names tags (RepoTags, `repositories`, the index's names) reaches the spare's
    `docker load` without any: the tag the spare gets is load.sh's, set on the ID once it is checked. Both as up
    calls it with the run's Image ID and as cli/jobs.py calls it (`copy_between(src, dst, ref)`)."""
    src, dst = Host("node1", RUN_ID, hostile_save()), Host("node2")
    kw = {"expect_id": expect} if expect else {}
    said = copy_between(src, dst, "app:1", **kw)
    assert said.startswith("app:1 copied from node1 to node2: ") and f"Image ID {RUN_ID[7:19]} verified" in said
    assert ["docker", "save", RUN_ID] in src.asked, src.asked
    got = loaded_tar(dst.loaded)
    assert "repositories" not in got, sorted(got)
    assert json.loads(got["manifest.json"]) == [{"Config": f"blobs/sha256/{RUN_ID[7:]}", "RepoTags": None,
                                                 "Layers": ["layer/layer.tar"]}]
    assert b"victim" not in got["index.json"] and b"annotations" not in got["index.json"], got["index.json"]
    assert got["layer/layer.tar"] == LAYER
    # the spare was read back: exactly the expected ID under the tag
    assert dst.asked[-1] == ["docker", "image", "inspect", "--format", "{{.Id}}", "app:1"], dst.asked


def test_a_source_holding_another_build_is_refused_in_one_line_naming_both():
    src, dst = Host("node1", OTHER_ID, hostile_save()), Host("node2")
    with pytest.raises(TransferError) as e:
        copy_between(src, dst, "app:1", expect_id=RUN_ID)
    msg = str(e.value)
    assert OTHER_ID in msg and RUN_ID in msg and "node1" in msg and "\n" not in msg, msg
    assert not any(a[:2] == ["docker", "save"] for a in src.asked) and dst.asked == [], (src.asked, dst.asked)


def test_a_spare_that_does_not_then_hold_the_expected_id_fails_the_copy():
    src, dst = Host("node1", RUN_ID, hostile_save()), Host("node2", after=OTHER_ID)
    with pytest.raises(TransferError) as e:
        copy_between(src, dst, "app:1", expect_id=RUN_ID)
    msg = str(e.value)
    assert "after the load" in msg and OTHER_ID in msg and RUN_ID in msg and "\n" not in msg, msg


def test_a_source_stream_of_two_images_is_refused_and_nothing_is_tagged():
    """One image per copy: a save that names a second image (whatever it claims) is refused while it streams."""
    members = loaded_tar(hostile_save())
    manifest = json.loads(members["manifest.json"])
    manifest.append({"Config": f"blobs/sha256/{OTHER_ID[7:]}", "RepoTags": ["x:1"], "Layers": []})
    members["manifest.json"] = json.dumps(manifest).encode()
    save = tar_of(*members.items())
    src, dst = Host("node1", RUN_ID, save), Host("node2")
    with pytest.raises(TransferError) as e:
        copy_between(src, dst, "app:1", expect_id=RUN_ID)
    msg = str(e.value)
    assert "was refused" in msg and "names 2 images" in msg and "nothing was tagged" in msg and "\n" not in msg, msg
    assert not any(a[:3] == ["docker", "image", "inspect"] for a in dst.asked), dst.asked


def test_a_load_that_ends_early_fails_the_copy_and_leaves_no_thread_behind():
    """The spare's load stops reading (a full disk): its line is the error, the source's save is stopped, and the
    re-streaming ends (no thread left holding the stream)."""
    import time

    members = loaded_tar(hostile_save())
    members["layer/layer.tar"] = b"L" * (8 << 20)
    src, dst = Host("node1", RUN_ID, tar_of(*members.items())), Host("node2", load_fails=True)
    with pytest.raises(TransferError) as e:
        copy_between(src, dst, "app:1", expect_id=RUN_ID)
    assert str(e.value) == ("copying app:1 from node1 to node2: load failed: write /var/lib/docker/tmp/x: no space "
                            "left on device"), str(e.value)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(t.name == "dl-copy-save" or "(produce)" in t.name
                                              for t in threading.enumerate()):
        time.sleep(0.05)
    assert not any(t.name == "dl-copy-save" or "(produce)" in t.name for t in threading.enumerate())


def test_a_containerd_hosts_image_index_is_kept_as_the_id_it_must_load_as():
    """A containerd store's Image ID is the digest of its image index (an image built with attestations): the
    re-streamed tar keeps that one index entry, without its names, so the spare loads the same ID; any other
    entry of the source's index is dropped."""
    index_blob = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(MANIFEST),
         "size": len(MANIFEST)}]}).encode()
    index_id = sha(index_blob)
    members = loaded_tar(hostile_save())
    members[f"blobs/sha256/{index_id[7:]}"] = index_blob
    members["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": index_id, "size": len(index_blob),
         "annotations": {"io.containerd.image.name": "docker.io/library/victim:latest"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(MANIFEST), "size": len(MANIFEST),
         "annotations": {"io.containerd.image.name": "docker.io/library/other:1"}}]}).encode()
    src, dst = Host("node1", index_id, tar_of(*members.items())), Host("node2")
    said = copy_between(src, dst, "app:1", expect_id=index_id)
    assert f"Image ID {index_id[7:19]} verified" in said, said
    assert json.loads(loaded_tar(dst.loaded)["index.json"])["manifests"] == [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": index_id, "size": len(index_blob)}]
