"""Every reader of a tar from elsewhere (bundles, image streams, dump's tars, source archives) refuses long-name,
pax and GNU sparse headers it would have to hold in memory, in one line naming the member (issue 50, finding 5)."""

import gzip
import io
import tarfile

import pytest
import zstandard

from dockerlaunch.errors import TransferError
from dockerlaunch.tars import MAX_HEADER
from tests.unit.transfer.test_bundle import verify_bundle_peak


def _chksum(block: bytearray) -> bytearray:
    """The ustar checksum of a hand-edited header block (tarfile's own rule: the field counted as spaces)."""
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return block


def old_gnu_sparse(name: str, blocks: int) -> bytes:
    """An old-GNU sparse member (type S) followed by `blocks` extension blocks of 21 sparse entries each: tarfile
    keeps every entry as a tuple, about 2.6 bytes of memory per byte of header."""
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
    head = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    head[482] = 1 if blocks else 0  # isextended
    head[483:495] = b"%011o\0" % 1  # realsize
    ext = bytearray(512)
    for i in range(21):
        ext[i * 24:i * 24 + 24] = b"%011o\0%011o\0" % (1, 1)
    ext[504] = 1
    last = bytearray(ext)
    last[504] = 0
    return bytes(_chksum(head)) + bytes(ext) * max(blocks - 1, 0) + (bytes(last) if blocks else b"")


def pax_sparse(name: str, version: str) -> bytes:
    """A member whose pax header declares it sparse, in each of GNU tar's three pax sparse formats."""
    headers = {"0.0": {"GNU.sparse.size": "1", "GNU.sparse.numblocks": "1", "GNU.sparse.offset": "0",
                       "GNU.sparse.numbytes": "1"},
               "0.1": {"GNU.sparse.size": "1", "GNU.sparse.map": "0,1"},
               "1.0": {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                       "GNU.sparse.realsize": "1"},
               "name": {"GNU.sparse.name": name}}[version]
    data = b"1\n0\n1\n".ljust(512, b"\0") + b"x" if version == "1.0" else b"x"
    info = tarfile.TarInfo(name if version != "1.0" else "GNUSparseFile.0/" + name.rsplit("/", 1)[-1])
    info.size, info.pax_headers = len(data), headers
    return info.tobuf(format=tarfile.PAX_FORMAT) + data.ljust(-(-len(data) // 512) * 512, b"\0")


def long_header(name: str, kind: bytes) -> bytes:
    """A long-name or pax header over MAX_HEADER (its payload: a valid record set, so only the size is wrong)."""
    size = MAX_HEADER + 512
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "./PaxHeaders/" + name)
    info.type, info.size = kind, size
    fmt = tarfile.GNU_FORMAT if kind == tarfile.GNUTYPE_LONGNAME else tarfile.USTAR_FORMAT
    payload = b"a" * size if kind == tarfile.GNUTYPE_LONGNAME else (b"%d path=" % size).ljust(size - 1, b"a") + b"\n"
    member = tarfile.TarInfo(name)
    return info.tobuf(format=fmt) + payload + member.tobuf(format=tarfile.USTAR_FORMAT)


BAD = {
    "old-gnu-sparse": (lambda n: old_gnu_sparse(n, 3), "sparse"),
    "pax-sparse-0.0": (lambda n: pax_sparse(n, "0.0"), "sparse"),
    "pax-sparse-0.1": (lambda n: pax_sparse(n, "0.1"), "sparse"),
    "pax-sparse-1.0": (lambda n: pax_sparse(n, "1.0"), "sparse"),
    "pax-sparse-name": (lambda n: pax_sparse(n, "name"), "sparse"),
    "long-name": (lambda n: long_header(n, tarfile.GNUTYPE_LONGNAME), "long-name header of"),
    "pax-header": (lambda n: long_header(n, tarfile.XHDTYPE), "pax header of"),
}


def tar_with(bad: bytes, first: bool, good_name: str = "top/ok.txt") -> bytes:
    """A small tar holding one regular member and the bad one (first or after it), then the end blocks."""
    good = tarfile.TarInfo(good_name)
    good.size = 2
    ok = good.tobuf(format=tarfile.USTAR_FORMAT) + b"ok".ljust(512, b"\0")
    return (bad + ok if first else ok + bad) + b"\0" * 1024


def read_bundle(tmp_path, tar):
    """The good member named as a bundle's image tar: a bundle refuses any other name."""
    from dockerlaunch.transfer.bundle import verify_bundle

    path = tmp_path / "b.dlb"
    path.write_bytes(zstandard.ZstdCompressor().compress(tar(f"images/{'ab' * 32}.tar")))
    with pytest.raises(TransferError) as e:
        verify_bundle(path)
    return str(e.value)


def read_stream(tmp_path, make):
    from dockerlaunch.transfer.restream import untagged_chunks

    tar = make()
    with pytest.raises(TransferError) as e:
        b"".join(untagged_chunks(iter([tar[i:i + 700] for i in range(0, len(tar), 700)])))
    return str(e.value)


def read_dump(tmp_path, make):
    from dockerlaunch.diagnostics.dump import safe_extract

    tar = make()
    with pytest.raises(tarfile.TarError) as e:
        safe_extract(tar, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("evil*"))
    return str(e.value)


def read_source(tmp_path, make):
    from dockerlaunch.images.sources import SourceError, tree_sha256

    tar = make()
    path = tmp_path / "src.tar.gz"
    path.write_bytes(gzip.compress(tar))
    with pytest.raises(SourceError) as e:
        tree_sha256(path)
    return str(e.value)


def read_source_unpack(tmp_path, make):
    from dockerlaunch.images.compiles import WheelError, unpack

    tar = make()
    path = tmp_path / "src.tar.gz"
    path.write_bytes(gzip.compress(tar))
    with pytest.raises(WheelError) as e:
        unpack(path, tmp_path / "build" / "src")
    return str(e.value)


READERS = {"bundle": read_bundle, "image-stream": read_stream, "dump": read_dump, "source-hash": read_source,
           "source-unpack": read_source_unpack}


@pytest.mark.parametrize("first", [True, False], ids=["first", "later"])
@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_untrusted_tar_reader_refuses_long_and_sparse_headers_in_one_line(tmp_path, reader, kind, first):
    """`docker save` never writes sparse members, and no member of ours has a name near 64 KiB: each reader says
    which member, in one line (a bad first member too, where tarfile.open's format probing would otherwise bury
    the reason in a list of every method it tried)."""
    make, words = BAD[kind]
    msg = READERS[reader](tmp_path, lambda *good: tar_with(make("top/evil-member"), first, *good))
    named = "'././@LongLink'" if kind == "long-name" else "evil-member"  # a long name's member: in what is refused
    assert words in msg and named in msg and "\n" not in msg, msg


def test_a_tiny_bundle_with_a_huge_old_gnu_sparse_map_is_refused_before_it_is_read(tmp_path):
    """Old-GNU sparse extension blocks: tarfile reads them all before the member is handed out, keeping a tuple
    per entry (before the fix, 128 MiB of blocks in a 12 KB bundle took this process to 1,068 MB). Refused at
    the header, in one line naming the member, well under 100 MB."""
    blocks = 128 << 11  # 128 MiB of 512-byte extension blocks
    head = old_gnu_sparse("images/evil-sparse.tar", 1)[:512]
    ext = old_gnu_sparse("x", 2)[512:1024]
    last = old_gnu_sparse("x", 1)[512:1024]
    with open(tmp_path / "evil.dlb", "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as z:
        z.write(head)
        chunk = ext * 2048
        for _ in range(blocks // 2048):
            z.write(chunk)
        z.write(last + b"\0" * 1024)
    assert (tmp_path / "evil.dlb").stat().st_size < 100_000
    peak_mb, lines = verify_bundle_peak(tmp_path / "evil.dlb")
    assert peak_mb < 100, (peak_mb, lines)
    assert lines[0].startswith("TransferError bundle") and "sparse" in lines[0] and \
        "images/evil-sparse.tar" in lines[0], lines


def test_a_plain_tar_still_reads_through_the_bounded_reader():
    """The refusals are for what a docker save or a source archive never holds: an ordinary tar reads as before."""
    from dockerlaunch.tars import open_untrusted

    with open_untrusted(fileobj=io.BytesIO(tar_with(b"", True))) as t:
        assert t.getnames() == ["top/ok.txt"] and t.extractfile("top/ok.txt").read() == b"ok"
