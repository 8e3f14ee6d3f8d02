import hashlib
import io
import tarfile

from dockerlaunch.transfer.streams import CountingReader, chain_ids, thin_chunks


def test_chain_ids_follow_the_oci_definition():
    a, b, c = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (b"a", b"b", b"c"))
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert chain_ids([a, b, c]) == [a, ab, abc]
    assert chain_ids([]) == []


def make_save_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("l1/VERSION", b"1.0"), ("l1/layer.tar", b"x" * 5000), ("l2/layer.tar", b"y" * 3000),
                           ("manifest.json", b'[{"Layers": ["l1/layer.tar", "l2/layer.tar"]}]')]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def chunked(data: bytes, n: int = 700):
    for i in range(0, len(data), n):
        yield data[i:i + n]


def test_thin_chunks_drops_exactly_the_layers_the_target_has():
    out = b"".join(thin_chunks(chunked(make_save_tar()), {"l1/layer.tar"}))
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        names = tar.getnames()
        assert names == ["l1/VERSION", "l2/layer.tar", "manifest.json"]
        assert tar.extractfile("l2/layer.tar").read() == b"y" * 3000
    assert len(out) < len(make_save_tar()) - 5000 + 1024


def test_counting_reader_counts_and_reassembles():
    seen = []
    r = CountingReader(iter([b"abc", b"", b"defg"]), seen.append)
    assert r.read(2) + r.read(-1) + r.read(10) + r.read(10) == b"abcdefg"
    assert r.count == 7 and sum(seen) == 7
