"""Bundles are checked whole before anything is loaded; image tars lose their own tags on the way in."""

import hashlib
import io
import json
import subprocess
import sys
import tarfile

import pytest
import zstandard

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.bundle import BUNDLE_FORMAT, load_bundle, verify_bundle
from dockerlaunch.transfer.restream import untagged_chunks

ID = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def image_tar(tags=("evil/retag:latest",), names=("layer/layer.tar", "manifest.json", "repositories"),
              extra=()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in [(names[0], b"x" * 3000),
                           (names[1], json.dumps([{"Config": "c.json", "RepoTags": list(tags),
                                                   "Layers": ["layer/layer.tar"]}]).encode()),
                           (names[2], b'{"evil/retag": {"latest": "abc"}}'), *extra]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def bundle(tmp_path, members, manifest=None, name="b.dlb"):
    """members: (name, bytes); manifest: the dict to store (default: one entry per image member)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for n, data in members:
            info = tarfile.TarInfo(n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        if manifest is not False:
            if manifest is None:
                manifest = {"format": BUNDLE_FORMAT, "images": [
                    {"ref": "app:1", "id": "sha256:" + n[7:-4], "size": 1, "file": n,
                     "sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
                    for n, d in members if n.startswith("images/")]}
            raw = json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    path = tmp_path / name
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


GOOD = (f"images/{ID[7:]}.tar", image_tar())


def test_a_good_bundle_verifies(tmp_path):
    [e] = verify_bundle(bundle(tmp_path, [GOOD]))
    assert e.ref == "app:1" and e.id == ID


@pytest.mark.parametrize("members, manifest, words", [
    ([GOOD, (f"images/{OTHER[7:]}.tar", b"junk")], "listed-first", "is not in the manifest"),
    ([GOOD, GOOD], None, "appears twice"),
    ([GOOD, ("../../etc/cron.d/x", b"* * * * * root id")], None, "unexpected member"),
    ([GOOD, ("images/notanid.tar", b"x")], None, "unexpected member"),
    ([GOOD], False, "no dockerlaunch-bundle/1 manifest"),
    ([GOOD], {"format": BUNDLE_FORMAT, "images": [], "extra": 1}, "extra"),
    ([GOOD], {"format": "other/9", "images": []}, "format 'other/9'"),
    ([GOOD], {"format": BUNDLE_FORMAT, "images": [{"ref": "-x", "id": ID, "size": 1, "file": GOOD[0],
                                                   "sha256": "0" * 64, "bytes": 1}]}, "images[0].ref"),
    ([GOOD], {"format": BUNDLE_FORMAT, "images": [{"ref": "a:1", "id": OTHER, "size": 1, "file": GOOD[0],
                                                   "sha256": hashlib.sha256(GOOD[1]).hexdigest(),
                                                   "bytes": len(GOOD[1])}]}, "not under its Image ID"),
    ([GOOD], {"format": BUNDLE_FORMAT, "images": [{"ref": "a:1", "id": ID, "size": 1, "file": GOOD[0],
                                                   "sha256": "0" * 64, "bytes": len(GOOD[1])}]}, "checksum mismatch"),
    ([], {"format": BUNDLE_FORMAT, "images": [{"ref": "a:1", "id": ID, "size": 1, "file": GOOD[0],
                                               "sha256": "0" * 64, "bytes": 1}]}, "listed but missing"),
])
def test_malformed_bundles_are_one_line_errors_and_nothing_is_loaded(tmp_path, members, manifest, words):
    if manifest == "listed-first":
        manifest = None
        path = bundle(tmp_path, members[:1])  # a valid manifest for the first image only ...
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read()
        tin = tarfile.open(fileobj=io.BytesIO(raw))
        extra = members[1]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as t:  # ... and an image it does not list
            for m in tin.getmembers():
                t.addfile(m, tin.extractfile(m))
            info = tarfile.TarInfo(extra[0])
            info.size = len(extra[1])
            t.addfile(info, io.BytesIO(extra[1]))
        path.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
    else:
        path = bundle(tmp_path, members, manifest)
    loads = []
    with pytest.raises(TransferError) as err:
        load_bundle(path, lambda stream, piece: loads.append(stream) or (0, ""), lambda argv: (0, ""))
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert loads == []  # docker load never ran


def test_an_oversized_manifest_is_refused_without_reading_it(tmp_path):
    path = bundle(tmp_path, [GOOD], manifest={"format": BUNDLE_FORMAT, "images": [], "pad": "x" * (2 << 20)})
    with pytest.raises(TransferError, match="at most"):
        verify_bundle(path)


def test_image_tars_lose_their_own_tags_before_docker_load():
    out = b"".join(untagged_chunks(iter([image_tar()[i:i + 1000] for i in range(0, len(image_tar()), 1000)])))
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        names = t.getnames()
        manifest = json.loads(t.extractfile("manifest.json").read())
        layer = t.extractfile("layer/layer.tar").read()
    assert "repositories" not in names and manifest[0]["RepoTags"] is None
    assert manifest[0]["Layers"] == ["layer/layer.tar"] and layer == b"x" * 3000


@pytest.mark.parametrize("names, extra, words", [
    (("layer/layer.tar", "./manifest.json", "repositories"), (), "'./manifest.json' is not a canonical name"),
    (("layer/layer.tar", "manifest.json", "./repositories"), (), "'./repositories' is not a canonical name"),
    (("layer/layer.tar", "manifest.json", "repositories"), (("./index.json", b"{}"),),
     "'./index.json' is not a canonical name"),
    (("layer/layer.tar", "manifest.json", "repositories"), (("manifest.json", b"[]"),),
     "'manifest.json' is in the image tar twice"),
    (("layer//layer.tar", "manifest.json", "repositories"), (), "'layer//layer.tar' is not a canonical name"),
])
def test_an_image_tar_with_a_non_canonical_or_repeated_name_is_refused(names, extra, words):
    """Docker's loader reads `./manifest.json` as manifest.json: matched by exact name, its RepoTags would reach
    `docker load` and set any tag (issue 42, finding 5)."""
    tar = image_tar(names=names, extra=extra)
    with pytest.raises(TransferError) as err:
        b"".join(untagged_chunks(iter([tar])))
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_stream_is_a_one_line_error_before_any_load(tmp_path, damage):
    big = (f"images/{ID[7:]}.tar", image_tar() + bytes(range(256)) * 4000)
    path = bundle(tmp_path, [big])
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        mid = len(data) // 2
        data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))
    loads = []
    with pytest.raises(TransferError) as err:
        load_bundle(path, lambda stream, piece: loads.append(stream) or (0, ""), lambda argv: (0, ""))
    assert "corrupted" in str(err.value) or "checksum" in str(err.value), str(err.value)
    assert loads == []


def test_a_split_bundle_verifies_from_its_parts_and_names_a_missing_or_damaged_one(tmp_path):
    """`save --split`: parts of at most SIZE bytes beside an index; `load` checks every part's size and sha256
    before reading the bundle, and takes a part's name for the index (`load x.dlb.002`)."""
    import os
    import random

    from dockerlaunch.transfer.bundle_parts import bundle_path, split_bundle

    noisy = (f"images/{ID[7:]}.tar", image_tar() + random.Random(1).randbytes(200_000))
    path = bundle(tmp_path, [noisy], manifest={"format": BUNDLE_FORMAT, "images": [
        {"ref": "app:1", "id": ID, "size": 1, "file": noisy[0], "sha256": hashlib.sha256(noisy[1]).hexdigest(),
         "bytes": len(noisy[1])}]})
    whole = path.read_bytes()
    parts = split_bundle(path, 64 * 1024)
    assert len(parts) == -(-len(whole) // (64 * 1024)) and all(p.stat().st_size <= 64 * 1024 for p in parts)
    assert b"".join(p.read_bytes() for p in parts) == whole
    [e] = verify_bundle(path)
    assert e.ref == "app:1"
    assert bundle_path(str(parts[1])) == path and bundle_path(str(path)) == path
    damaged = bytearray(parts[1].read_bytes())
    damaged[100] ^= 1
    saved = parts[1].read_bytes()
    parts[1].write_bytes(bytes(damaged))
    with pytest.raises(TransferError, match=rf"part {parts[1].name} is damaged .* nothing was loaded"):
        verify_bundle(path)
    parts[1].write_bytes(saved)
    os.rename(parts[-1], tmp_path / "elsewhere")
    with pytest.raises(TransferError, match=rf"part {parts[-1].name} is missing \(of {len(parts)}\)"):
        verify_bundle(path)


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE])
def test_a_tiny_bundle_with_a_huge_long_name_header_is_refused_before_it_is_read(tmp_path, kind):
    """A long-name (or pax) header makes tarfile read its whole payload into memory: 300 MB of name compress to a
    few KB. The launcher refuses any over 64 KiB before reading it, in one line naming it, and stays under 100 MB
    (issue 42, finding 6)."""

    size = 300 << 20
    header = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "./PaxHeaders/x")
    header.type, header.size = kind, size
    raw = header.tobuf(format=tarfile.GNU_FORMAT if kind == tarfile.GNUTYPE_LONGNAME else tarfile.USTAR_FORMAT)
    cctx = zstandard.ZstdCompressor(level=19)
    with open(tmp_path / "evil.dlb", "wb") as f, cctx.stream_writer(f) as z:
        z.write(raw)
        chunk = b"a" * (1 << 20)
        for _ in range(size >> 20):
            z.write(chunk)
        z.write(b"\0" * 1024)
    assert (tmp_path / "evil.dlb").stat().st_size < 100_000
    peak_mb, lines = verify_bundle_peak(tmp_path / "evil.dlb")
    assert peak_mb < 100, (peak_mb, lines)
    assert lines[0].startswith("TransferError bundle") and "header of 314572800 bytes" in lines[0] and \
        "65536" in lines[0], lines


def verify_bundle_peak(path) -> tuple[float, list[str]]:
    """verify_bundle(path) in a new process -> (its own peak memory in MB, what it printed: the error first).
    VmHWM, not ru_maxrss, which Linux carries over exec from the parent."""
    code = ("import sys\nfrom pathlib import Path\nfrom dockerlaunch.transfer.bundle import verify_bundle\n"
            "try:\n    verify_bundle(Path(sys.argv[1]))\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('peak', next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM')))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    lines = r.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("peak "), (r.stdout, r.stderr)
    return int(lines[-1].split()[1]) / 1024, lines
