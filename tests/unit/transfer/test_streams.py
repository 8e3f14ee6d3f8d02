import hashlib
import io
import json
import tarfile
from dataclasses import replace

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.image_facts import LocalImage
from dockerlaunch.transfer.oci import chain_ids
from dockerlaunch.transfer.pipes import CountingReader
from dockerlaunch.transfer.restream import image_chunks


def test_chain_ids_follow_the_oci_definition():
    a, b, c = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (b"a", b"b", b"c"))
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert chain_ids([a, b, c]) == [a, ab, abc]
    assert chain_ids([]) == []


def chunked(data: bytes, n: int = 700):
    for i in range(0, len(data), n):
        yield data[i:i + n]


def test_counting_reader_counts_and_reassembles():
    seen = []
    r = CountingReader(iter([b"abc", b"", b"defg"]), seen.append)
    assert r.read(2) + r.read(-1) + r.read(10) + r.read(10) == b"abcdefg"
    assert r.count == 7 and sum(seen) == 7


# ---------------------------------------------------------------- the stream every engine loads (image_chunks)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


L1, L2 = b"x" * 5000, b"\x1f\x8b" + b"z" * 3000  # the second one gzip-compressed, as Docker 29 saves
CFG = b'{"rootfs": {"type": "layers"}}'


def save_tar(layout: str) -> bytes:
    """`docker save` of a two-layer image as 20.10 writes it (legacy) or as Docker 25+ does (OCI blobs,
    the legacy paths links to them, its own index.json, a repositories file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name, data=None, link=None):
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if layout == "legacy":
            add("aaa/layer.tar", L1)
            add("bbb/layer.tar", L2)
            add(f"{sha(CFG)[7:]}.json", CFG)
            add("manifest.json", json.dumps([{"Config": f"{sha(CFG)[7:]}.json", "RepoTags": ["app:1"],
                                             "Layers": ["aaa/layer.tar", "bbb/layer.tar"]}]).encode())
        else:
            for data in (L1, L2, CFG):
                add(f"blobs/sha256/{sha(data)[7:]}", data)
            add("aaa/layer.tar", link=f"../blobs/sha256/{sha(L1)[7:]}")
            add("index.json", b'{"manifests": [{"annotations": {"io.containerd.image.name": "app:1"}}]}')
            add("repositories", b'{"app": {"1": "aaa"}}')
            add("manifest.json", json.dumps([{"Config": f"blobs/sha256/{sha(CFG)[7:]}", "RepoTags": ["app:1"],
                                             "Layers": ["aaa/layer.tar", f"blobs/sha256/{sha(L2)[7:]}"]}]).encode())
    return buf.getvalue()


IMAGE = LocalImage("app:1", sha(CFG), 8000, diff_ids=(sha(L1), sha(b"uncompressed L2")))


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_every_stream_ends_with_our_index_and_manifest_and_sets_no_tag(layout):
    got = []
    out = b"".join(image_chunks(chunked(save_tar(layout)), IMAGE, on_facts=got.append))
    [facts] = got
    assert facts.config.digest == sha(CFG) and facts.config.size == len(CFG)
    assert [(b.size, b.media_type.rsplit(".", 1)[-1]) for b in facts.layers] == [(5000, "tar"), (len(L2), "tar+gzip")]
    assert facts.layers[0].digest == sha(L1)  # legacy layer.tar: uncompressed, its digest is the diff ID
    if layout == "oci":  # a blob is named by its digest; the legacy path was a link to it
        assert facts.layers[0].path == f"blobs/sha256/{sha(L1)[7:]}" and facts.layers[1].digest == sha(L2)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        names = tar.getnames()
        assert "repositories" not in names and names.count("index.json") == 1
        assert json.loads(tar.extractfile("manifest.json").read())[0]["RepoTags"] is None
        index = json.loads(tar.extractfile("index.json").read())
        [entry] = index["manifests"]
        assert entry["digest"] == facts.manifest_digest and "annotations" not in entry  # no name: no tag
        assert entry["platform"] == {"os": "linux", "architecture": "amd64"}
        manifest = tar.extractfile("blobs/sha256/" + facts.manifest_digest[7:]).read()
        assert sha(manifest) == facts.manifest_digest
        assert json.loads(manifest)["config"]["digest"] == sha(CFG)


def test_a_thin_stream_leaves_the_layer_out_and_still_names_it_from_the_saves_facts():
    full = []
    b"".join(image_chunks(chunked(save_tar("legacy")), IMAGE, on_facts=full.append))
    image = replace(IMAGE, facts=full[0])
    thin = []
    out = b"".join(image_chunks(chunked(save_tar("legacy")), image, {"aaa/layer.tar"}, on_facts=thin.append))
    assert thin[0].manifest_digest == full[0].manifest_digest  # the same ID in containerd's store either way
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        assert "aaa/layer.tar" not in tar.getnames() and "bbb/layer.tar" in tar.getnames()
    assert len(out) < len(save_tar("legacy")) - 5000 + 3 * 1024  # the layer's bytes are gone; ours add ~2 KB
    with pytest.raises(TransferError, match="layer file aaa/layer.tar is missing"):  # no facts: refused, not guessed
        b"".join(image_chunks(chunked(save_tar("legacy")), IMAGE, {"aaa/layer.tar"}))


def test_prefetched_keeps_order_raises_upstream_errors_and_stops_its_thread_when_closed():
    import threading
    import time

    from dockerlaunch.transfer.pipes import prefetched

    chunks = [bytes([i]) * 1000 for i in range(200)]
    assert list(prefetched(iter(chunks), depth=3)) == chunks

    def broken():
        yield b"x"
        raise ValueError("docker save broke")

    with pytest.raises(ValueError, match="docker save broke"):
        list(prefetched(broken()))

    closed = threading.Event()

    def endless():
        try:
            while True:
                yield b"y" * 10
        finally:
            closed.set()

    before = threading.active_count()
    g = prefetched(endless())
    next(g)
    g.close()  # a cut push: the producer stops and closes the upstream (the save's HTTP stream)
    assert closed.wait(5)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
